"""Fixtures of the attacher tests."""

from __future__ import annotations

import pytest
from attach_support import Scenario

from pyprovlib.testing._cluster import TestCluster


@pytest.fixture
async def sc(kube_cluster: TestCluster) -> Scenario:
    scenario = Scenario(kube_cluster)
    await scenario.setup_node()
    return scenario
