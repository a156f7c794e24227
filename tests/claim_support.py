"""Claims and volumes as raw JSON on a :class:`~pyprovlib.testing._cluster.TestCluster`: the
create/get/delete helpers the provisioning tests of tests/integration and tests/csi share, and
the bodies of the storage objects many suites create (here at the root of ``tests/``, which
pytest puts on ``sys.path``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio.client import ApiClient

from pyprovlib.kube._errors import is_not_found
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES
from pyprovlib.kube._rest import ApiException, ResourceClient
from pyprovlib.testing._cluster import TestCluster


async def create_claim(
    cluster: TestCluster,
    class_name: str,
    *,
    name: str | None = None,
    size: str = "1Gi",
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> Obj:
    """A ReadWriteOnce claim of ``size`` in the cluster's namespace (a unique name unless
    ``name``); ``spec`` adds or overrides spec fields."""
    body = claim_body(
        name or cluster.unique_name("claim"),
        class_name,
        namespace=cluster.namespace,
        size=size,
        annotations=annotations,
        **spec,
    )
    return await ResourceClient(cluster.api_client, PERSISTENT_VOLUME_CLAIMS).create(body)


async def get_claim(cluster: TestCluster, name: str) -> Obj | None:
    """The claim ``name`` of the cluster's namespace; None when it does not exist."""
    try:
        return await ResourceClient(cluster.api_client, PERSISTENT_VOLUME_CLAIMS).get(
            name, cluster.namespace
        )
    except ApiException as err:
        if is_not_found(err):
            return None
        raise


async def get_volume(api: ApiClient, name: str) -> Obj | None:
    """The PV ``name``; None when it does not exist."""
    try:
        return await ResourceClient(api, PERSISTENT_VOLUMES).get(name)
    except ApiException as err:
        if is_not_found(err):
            return None
        raise


async def delete_claim(cluster: TestCluster, name: str) -> None:
    """Delete the claim ``name`` of the cluster's namespace."""
    await ResourceClient(cluster.api_client, PERSISTENT_VOLUME_CLAIMS).delete(
        name, cluster.namespace
    )


def class_body(name: str, provisioner: str, /, **fields: Any) -> Obj:
    """A StorageClass ``name`` of ``provisioner``, with ``fields`` (parameters, binding mode,
    reclaim policy, ...) added."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": provisioner,
        **fields,
    }


def claim_body(
    name: str,
    class_name: str | None = None,
    *,
    namespace: str | None = None,
    size: str = "1Gi",
    annotations: Mapping[str, str] | None = None,
    uid: str | None = None,
    **spec: Any,
) -> Obj:
    """A ReadWriteOnce claim ``name`` of ``size``; of the class ``class_name``, in ``namespace``,
    with ``annotations`` and with ``uid`` (as read back from a server) when they are given;
    ``spec`` adds or overrides spec fields."""
    metadata: Obj = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    if uid is not None:
        metadata["uid"] = uid
    if annotations:
        metadata["annotations"] = dict(annotations)
    class_field = {} if class_name is None else {"storageClassName": class_name}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata,
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            **class_field,
            "resources": {"requests": {"storage": size}},
            **spec,
        },
    }


def volume_body(name: str, **spec: Any) -> Obj:
    """A PV (1Gi, ReadWriteOnce, on a host path unless ``spec`` gives a ``csi`` source) for
    tests, with ``spec`` added."""
    source = {} if "csi" in spec else {"hostPath": {"path": f"/tmp/{name}"}}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            **source,
            **spec,
        },
    }


def attachment_body(name: str, attacher: str, node: str, volume: str) -> Obj:
    """A VolumeAttachment ``name`` asking ``attacher`` to attach the PV ``volume`` to ``node``."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "VolumeAttachment",
        "metadata": {"name": name},
        "spec": {
            "attacher": attacher,
            "nodeName": node,
            "source": {"persistentVolumeName": volume},
        },
    }


def vac_body(name: str, driver: str, **fields: Any) -> Obj:
    """A VolumeAttributesClass ``name`` of ``driver`` (``iops: 3000``), ``fields`` added or
    replaced."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "VolumeAttributesClass",
        "metadata": {"name": name},
        "driverName": driver,
        "parameters": {"iops": "3000"},
        **fields,
    }
