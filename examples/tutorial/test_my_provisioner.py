"""The provisioner through the real controller against pyprovlib's in-memory API server."""

import pytest
from kubernetes_asyncio.client import CoreV1Api, StorageV1Api
from my_provisioner import PROVISIONER_NAME, DirectoryProvisioner

from pyprovlib import ProvisionController, ProvisionControllerOptions
from pyprovlib.testing import eventually, running

CLAIM = {
    "metadata": {"name": "data"},
    "spec": {
        "storageClassName": "directories",
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
    },
}


@pytest.mark.asyncio
async def test_a_claim_gets_a_directory_that_goes_with_it(apiserver_with_binder, tmp_path):
    async with apiserver_with_binder.api_client() as client:
        core = CoreV1Api(client)
        await StorageV1Api(client).create_storage_class(
            {"metadata": {"name": "directories"}, "provisioner": PROVISIONER_NAME}
        )
        await core.create_namespaced_persistent_volume_claim("default", CLAIM)
        controller = ProvisionController(
            client,
            PROVISIONER_NAME,
            DirectoryProvisioner(tmp_path),
            ProvisionControllerOptions(leader_election=False),
        )
        async with running(controller):

            async def bound_volume():
                claim = await core.read_namespaced_persistent_volume_claim("data", "default")
                return claim.spec.volume_name if claim.status.phase == "Bound" else None

            # Wait for the state, never sleep for it.
            volume = await eventually(bound_volume, message="claim data Bound")
            assert (tmp_path / volume).is_dir()

            await core.delete_namespaced_persistent_volume_claim("data", "default")

            async def volume_gone():
                return not (await core.list_persistent_volume()).items

            await eventually(volume_gone, message=f"PV {volume} deleted")
            assert not (tmp_path / volume).exists()
