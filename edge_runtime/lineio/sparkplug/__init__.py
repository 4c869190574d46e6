"""Sparkplug B: the payload code generated from the specification's schema (sparkplug_b.proto ->
sparkplug_b_pb2.py, `make sparkplug-proto`), the station metrics (payload.py) and the edge node (node.py)."""
