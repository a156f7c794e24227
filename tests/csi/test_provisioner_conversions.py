"""CSIProvisioner works on the controller's JSON dicts (issue 20): a claim goes from the cache
to a bound PV without one conversion to or from a kubernetes-asyncio model."""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import pytest
from csi_e2e import (
    create_claim,
    create_class,
    create_secret,
    csi_env,
    delete_claim,
    wait_bound,
    wait_volume_gone,
)

from pyprovlib._provisioner import ProvisionOptions
from pyprovlib.csi.provisioner import CSIProvisionerOptions
from pyprovlib.csi.provisioner._secrets import PROVISIONER_SECRET
from pyprovlib.kube import _convert as convert
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e


def count_conversions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts every call of :mod:`pyprovlib.kube._convert`'s conversions, wherever pyprovlib
    imported them (``from pyprovlib.kube._convert import to_model`` binds the name in the
    importing module, so each binding is wrapped)."""
    calls: list[str] = []
    for name in ("to_model", "from_model"):
        original = getattr(convert, name)

        def counting(*args: Any, _name: str = name, _original: Any = original) -> Any:
            what = args[1].__name__ if _name == "to_model" else type(args[0]).__name__
            calls.append(f"{_name}({what})")
            return _original(*args)

        for module in list(sys.modules.values()):
            module_name = getattr(module, "__name__", "")
            if module_name.startswith("pyprovlib") and getattr(module, name, None) is original:
                monkeypatch.setattr(module, name, counting)
    return calls


async def test_provisioning_converts_no_model(
    kube_cluster: TestCluster, sock_dir: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = CSIProvisionerOptions(extra_create_metadata=True)
    async with csi_env(kube_cluster, sock_dir, options=options) as env:
        await create_secret(env, "prov-secret", {"user": "admin"})
        class_name = await create_class(
            env,
            parameters={
                "type": "fast",
                PROVISIONER_SECRET.name_key: "prov-secret",
                PROVISIONER_SECRET.namespace_key: "${pvc.namespace}",
            },
            mountOptions=["noatime"],
        )
        calls = count_conversions(monkeypatch)
        claim = await create_claim(env, class_name)
        bound = await wait_bound(env, claim["metadata"]["name"])
        assert bound["spec"]["volumeName"]
        [request] = env.driver.requests("CreateVolume")
        assert request.secrets == {"user": "admin"}
        assert calls == [], f"the provision path converted models: {calls}"

        # The counter sees a conversion where one happens (the claim as a model, on demand).
        options_of_claim = ProvisionOptions({"metadata": {"name": class_name}}, "pv-1", bound)
        assert options_of_claim.pvc.metadata.name == claim["metadata"]["name"]
        assert calls == ["to_model(V1PersistentVolumeClaim)"]


async def test_deleting_converts_no_model(
    kube_cluster: TestCluster, sock_dir: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CSIProvisioner is an ObjectDeleter: the controller hands it the PV's JSON, and the
    DeleteVolume path converts nothing either."""
    async with csi_env(kube_cluster, sock_dir) as env:
        class_name = await create_class(env)
        claim = await create_claim(env, class_name)
        bound = await wait_bound(env, claim["metadata"]["name"])
        calls = count_conversions(monkeypatch)
        await delete_claim(env, claim["metadata"]["name"])
        await wait_volume_gone(env, bound["spec"]["volumeName"])
        assert [r.volume_id for r in env.driver.requests("DeleteVolume")]
        assert calls == [], f"the delete path converted models: {calls}"
