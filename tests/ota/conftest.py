"""The Docker suites need root, a Docker engine and a registry: they run with `make test-ota`
(EDGE_TEST_OTA=1), not in `make test`, so CI does not depend on a container engine. The DDI client,
update lock and upload tests beside them need none of that and run in `make test`."""

from __future__ import annotations

import os

import pytest

from tests.ota.docker_support import engine, registry  # noqa: F401 - the Docker suites' fixtures

DOCKER_SUITES = ("test_ota.py", "test_hawkbit_fleet.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("EDGE_TEST_OTA") == "1":
        return
    skip = pytest.mark.skip(reason="OTA tests need a Docker engine: run `make test-ota`")
    for item in items:
        if "tests/ota/" in str(item.fspath) and item.fspath.basename in DOCKER_SUITES:
            item.add_marker(skip)

