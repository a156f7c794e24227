"""Fixtures of the tests of pyprovlib.testing."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubectl_support import KUBECTL, MANIFESTS, Kubectl
from standalone_support import standalone


@pytest.fixture
async def kubectl(tmp_path: Path) -> AsyncIterator[Kubectl]:
    if KUBECTL is None:
        pytest.skip("kubectl not found")
    kubeconfig = tmp_path / "kubeconfig"
    async with standalone(kubeconfig, "--port", "0", "--no-binder"):
        assert kubeconfig.exists()
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(tmp_path),
            "KUBECONFIG": str(kubeconfig),
            "KUBECACHEDIR": str(tmp_path / "cache"),
        }
        k = Kubectl(env, tmp_path)
        (tmp_path / "objs.yaml").write_text(MANIFESTS)
        yield k
