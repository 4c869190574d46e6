"""hawkBit's Direct Device Integration API as a release source of the update agent (docs/ota.md)."""
