"""Over-the-air updates: signed manifests, the health-gated update agent, and the fleet-side tools."""
