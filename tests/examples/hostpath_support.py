"""What the hostpath example's tests share: the Node a node-mode provisioner reads, its
StorageClass, the options of one provisioning and a local PV as the provisioner wrote it, on
kubernetes-asyncio models (the examples' own object convention)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kubernetes_asyncio.client import (
    ApiClient,
    CoreV1Api,
    V1LocalVolumeSource,
    V1Node,
    V1NodeSpec,
    V1ObjectMeta,
    V1PersistentVolume,
    V1PersistentVolumeClaim,
    V1PersistentVolumeSpec,
    V1StorageClass,
    V1Taint,
)

from pyprovlib._provisioner import ProvisionOptions
from pyprovlib.examples.hostpath._provisioner import ANNOTATION_SELECTED_NODE

DEDICATED = V1Taint(key="dedicated", value="storage", effect="NoSchedule")


async def create_node(
    client: ApiClient, name: str, hostname: str | None, taints: Sequence[V1Taint] = ()
) -> None:
    """The Node ``name``, labelled with its ``hostname`` (unless None), with ``taints``."""
    labels = {"kubernetes.io/hostname": hostname} if hostname else None
    spec = V1NodeSpec(taints=list(taints)) if taints else None
    await CoreV1Api(client).create_node(
        V1Node(metadata=V1ObjectMeta(name=name, labels=labels), spec=spec)
    )


def hostpath_class(
    params: Mapping[str, str] | None = None,
    binding: str | None = "WaitForFirstConsumer",
    *,
    reclaim_policy: str | None = None,
) -> V1StorageClass:
    """The ``local`` class of ``pyprovlib.io/hostpath`` with ``params`` and ``binding``."""
    return V1StorageClass(
        metadata=V1ObjectMeta(name="local"),
        provisioner="pyprovlib.io/hostpath",
        parameters=dict(params) if params is not None else None,
        volume_binding_mode=binding,
        reclaim_policy=reclaim_policy,
    )


def provision_options(
    sc: V1StorageClass, pvc: V1PersistentVolumeClaim, pv: str = "pvc-0001"
) -> ProvisionOptions:
    """Provisioning ``pv`` for ``pvc`` of ``sc``, on the node the claim's annotation selects."""
    selected = (pvc.metadata.annotations or {}).get(ANNOTATION_SELECTED_NODE)
    return ProvisionOptions(storage_class=sc, pv_name=pv, pvc=pvc, selected_node_name=selected)


def local_volume(
    name: str, path: str, annotations: Mapping[str, str], storage_class: str | None = "local"
) -> V1PersistentVolume:
    """A local PV ``name`` at ``path`` of ``storage_class``, with ``annotations`` (the node and
    delete policy the provisioner records)."""
    return V1PersistentVolume(
        metadata=V1ObjectMeta(name=name, annotations=dict(annotations) or None),
        spec=V1PersistentVolumeSpec(
            local=V1LocalVolumeSource(path=path), storage_class_name=storage_class
        ),
    )
