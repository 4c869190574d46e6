"""Parts of benchmarks/peers.py: the peer build, the servers as processes, the one client, the launcher."""
