"""Fixtures of the attacher tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from attach_support import Scenario
from sidecar_support import short_socket_dir

from pyprovlib.testing._cluster import TestCluster


@pytest.fixture
async def sc(kube_cluster: TestCluster) -> Scenario:
    scenario = Scenario(kube_cluster)
    await scenario.setup_node()
    return scenario


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A directory for a driver's unix socket."""
    with short_socket_dir() as directory:
        yield directory
