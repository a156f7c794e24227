"""The tutorial's code runs: ``examples/tutorial/my_provisioner.py`` (shown on docs/tutorial.md)
is imported as a user would run it — its ``make_controller`` builds the real ProvisionController
— and driven against pyprovlib.testing's API server with the PV binder: a claim becomes Bound
and its directory exists; deleting the claim removes the PV and the directory."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import structlog
from kubernetes_asyncio.client import ApiClient, CoreV1Api, StorageV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib import testing
from pyprovlib.runtime import CommonOptions, RuntimeContext
from pyprovlib.testing import ApiServer

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "examples" / "tutorial" / "my_provisioner.py"
TUTORIAL_PAGE = ROOT / "docs" / "tutorial.md"
NAMESPACE = "tutorial"

T = TypeVar("T")


def load_tutorial() -> ModuleType:
    spec = importlib.util.spec_from_file_location("my_provisioner", TUTORIAL)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def eventually(
    probe: Callable[[], Awaitable[T | None]], what: str, timeout: float = 20.0
) -> T:
    """Poll ``probe`` until it returns something other than None."""

    async def present() -> tuple[T] | None:
        result = await probe()
        return None if result is None else (result,)

    return (await testing.eventually(present, timeout=timeout, message=what))[0]


async def setup_class_and_namespace(client: ApiClient, provisioner_name: str) -> None:
    await CoreV1Api(client).create_namespace({"metadata": {"name": NAMESPACE}})
    await StorageV1Api(client).create_storage_class(
        {
            "metadata": {"name": "directories"},
            "provisioner": provisioner_name,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        }
    )


def test_tutorial_page_shows_the_tested_file() -> None:
    """The page includes the file itself, so what readers copy is what this test runs."""
    page = TUTORIAL_PAGE.read_text(encoding="utf-8")
    assert '--8<-- "examples/tutorial/my_provisioner.py"' in page


async def test_claim_is_bound_then_deleted_with_its_directory(tmp_path: Path) -> None:
    tutorial = load_tutorial()
    async with ApiServer(binder=True) as server, server.api_client() as client:
        core = CoreV1Api(client)
        await setup_class_and_namespace(client, tutorial.PROVISIONER_NAME)
        ctx = RuntimeContext(
            options=CommonOptions(),  # the flags' defaults: no leader election, 4 workers
            args=argparse.Namespace(root=str(tmp_path)),
            api_client=client,
            log=structlog.get_logger("tutorial-test"),
        )
        controller = tutorial.make_controller(ctx)
        run = asyncio.create_task(controller.run())
        try:
            await core.create_namespaced_persistent_volume_claim(
                NAMESPACE,
                {
                    "metadata": {"name": "data"},
                    "spec": {
                        "storageClassName": "directories",
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                },
            )

            async def bound_volume() -> str | None:
                claim = await core.read_namespaced_persistent_volume_claim("data", NAMESPACE)
                return claim.spec.volume_name if claim.status.phase == "Bound" else None

            pv_name = await eventually(bound_volume, "claim data Bound")
            directory = tmp_path / pv_name
            assert directory.is_dir()
            pv = await core.read_persistent_volume(pv_name)
            assert pv.spec.host_path.path == str(directory)
            assert pv.spec.capacity == {"storage": "1Gi"}
            assert pv.spec.claim_ref.name == "data"
            assert pv.metadata.annotations["pv.kubernetes.io/provisioned-by"] == (
                tutorial.PROVISIONER_NAME
            )

            await core.delete_namespaced_persistent_volume_claim("data", NAMESPACE)

            async def volume_gone() -> bool | None:
                try:
                    await core.read_persistent_volume(pv_name)
                except ApiException as err:
                    if err.status == 404:
                        return True
                    raise
                return None

            await eventually(volume_gone, f"PV {pv_name} deleted")
            assert not directory.exists()
        finally:
            controller.stop()
            try:
                async with asyncio.timeout(15):
                    await run
            except TimeoutError:
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run
                raise
