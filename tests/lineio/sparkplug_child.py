"""A Sparkplug node in a process of its own, for the kill -9 test: python sparkplug_child.py PORT DIR GROUP NODE."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from edge_runtime.config.line_protocols import SparkplugConfig
from edge_runtime.config.mqtt import MqttConfig
from edge_runtime.lineio.sparkplug.node import SparkplugNode
from tests.support.line_station import Line

port, folder, group, node_id = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
line = Line(folder).start()
node = SparkplugNode([line.station], SparkplugConfig(enabled=True, group_id=group, device_commands=True),
                     MqttConfig(host="127.0.0.1", port=port, keepalive=5), node_id, folder / "bdseq")
node.start()
while True:
    time.sleep(1)
