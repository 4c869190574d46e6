"""The OTA tests need root, a Docker engine and a registry: they run with `make test-ota`
(EDGE_TEST_OTA=1), not in `make test`, so CI does not depend on a container engine."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("EDGE_TEST_OTA") == "1":
        return
    skip = pytest.mark.skip(reason="OTA tests need a Docker engine: run `make test-ota`")
    for item in items:
        if "tests/ota/" in str(item.fspath):
            item.add_marker(skip)
