"""Line I/O: the station handshake (`station/`) and the protocols a PLC speaks to it (docs/line-io.md)."""
