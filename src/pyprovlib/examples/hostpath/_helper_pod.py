"""Helper-pod mode of the hostpath provisioner: reach a node's disk through a short-lived Pod.

One provisioner serves the whole cluster. To create or remove ``<basePath>/<pv name>`` it
launches a Pod pinned to the volume's node (node affinity on its hostname label, tolerations
for its taints) with basePath mounted at ``/data`` and a single command given as an argv list
(never a shell), waits for the Pod to finish, and deletes it. Pod names are derived from the
operation and the PV name, so a retry or a restarted provisioner finds the Pod it already
launched instead of starting a second one.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from kubernetes_asyncio.client import (
    ApiClient,
    CoreV1Api,
    V1Affinity,
    V1Container,
    V1ContainerState,
    V1ContainerStateTerminated,
    V1ContainerStateWaiting,
    V1HostPathVolumeSource,
    V1NodeAffinity,
    V1NodeSelector,
    V1NodeSelectorRequirement,
    V1NodeSelectorTerm,
    V1ObjectMeta,
    V1Pod,
    V1PodSpec,
    V1PodStatus,
    V1Toleration,
    V1Volume,
    V1VolumeMount,
)
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib._errors import PyprovlibError
from pyprovlib._logging import get_logger
from pyprovlib._provisioner import ProvisioningError, ProvisioningState
from pyprovlib.examples._paths import UnsafePathError, validate_base_path
from pyprovlib.examples.hostpath._provisioner import (
    DEFAULT_DIR_MODE,
    HOSTNAME_LABEL,
    NodeInfo,
    archived_name,
)
from pyprovlib.kube._clock import Clock, RealClock
from pyprovlib.kube._errors import is_already_exists, is_not_found
from pyprovlib.kube._objects import is_dns1123_subdomain

__all__ = [
    "DEFAULT_HELPER_IMAGE",
    "DEFAULT_HELPER_TIMEOUT",
    "HELPER_MOUNT_PATH",
    "LABEL_HELPER_OPERATION",
    "LABEL_MANAGED_BY",
    "HelperPodDirectories",
    "HelperPodError",
    "helper_command",
    "helper_pod_name",
]

DEFAULT_HELPER_IMAGE = "busybox:1.36"
"""Image of the helper pods: anything with ``mkdir``, ``rm``, ``find`` and ``mv``."""

DEFAULT_HELPER_TIMEOUT = 120.0
"""Seconds to wait for a helper pod to finish before reporting a timeout."""

HELPER_MOUNT_PATH = "/data"
"""Where the node's basePath is mounted inside a helper pod."""

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
"""Label set on every helper pod (value ``pyprovlib-hostpath``)."""

LABEL_HELPER_OPERATION = "pyprovlib.io/helper-operation"
"""Label naming a helper pod's operation: ``create``, ``delete`` or ``archive``."""

ANNOTATION_HELPER_PV = "pyprovlib.io/helper-pv"

_MANAGED_BY = "pyprovlib-hostpath"
_MAX_POD_NAME = 63

log = get_logger("pyprovlib.examples.hostpath._helper_pod")


class HelperPodError(PyprovlibError, RuntimeError):
    """A helper pod failed, vanished, or did not finish in time."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def helper_pod_name(operation: str, volume_name: str) -> str:
    """Deterministic pod name for ``operation`` on ``volume_name``: at most 63 characters,
    with a hash of the full name when it had to be shortened or sanitized."""
    full = f"pyprovlib-hostpath-{operation}-{volume_name}"
    clean = re.sub(r"[^a-z0-9-]", "-", full.lower())
    if clean == full and len(full) <= _MAX_POD_NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:10]
    return f"{clean[: _MAX_POD_NAME - len(digest) - 1].rstrip('-')}-{digest}"


def helper_command(operation: str, volume_name: str, dir_mode: int = DEFAULT_DIR_MODE) -> list[str]:
    """The argv a helper pod runs for ``operation`` (create, delete, archive) on
    ``/data/<volume_name>``. Each path is its own argv element; nothing is parsed by a shell."""
    # PV names are DNS-1123 subdomains; insisting on that keeps them free of glob characters
    # (they are a `find -name` pattern) and of anything a path could be bent with.
    if not is_dns1123_subdomain(volume_name):
        raise UnsafePathError(
            f"PersistentVolume name {volume_name!r} is not a DNS subdomain; refusing to use it "
            "in a helper pod"
        )
    target = f"{HELPER_MOUNT_PATH}/{volume_name}"
    if operation == "create":
        # mkdir -m sets the mode explicitly, so the helper's umask cannot narrow it.
        return ["mkdir", "-m", f"{dir_mode:04o}", "-p", target]
    if operation == "delete":
        return ["rm", "-rf", target]
    if operation == "archive":
        # mv fails on a missing source, but a directory already gone must be success: find
        # runs the mv only when the directory is there, and exits 0 either way.
        return [
            "find",
            HELPER_MOUNT_PATH,
            "-mindepth",
            "1",
            "-maxdepth",
            "1",
            "-type",
            "d",
            "-name",
            volume_name,
            "-exec",
            "mv",
            target,
            f"{HELPER_MOUNT_PATH}/{archived_name(volume_name)}",
            ";",
        ]
    raise ValueError(f"unknown helper operation {operation!r}")


class HelperPodDirectories:
    """:class:`~pyprovlib.examples.hostpath._provisioner.VolumeDirectories` that run each
    operation in a helper Pod in ``namespace``.

    ``timeout`` bounds the wait for one pod; on timeout the pod is left running so that the
    controller's retry resumes waiting on it rather than starting another.
    """

    def __init__(
        self,
        api_client: ApiClient,
        namespace: str,
        *,
        image: str = DEFAULT_HELPER_IMAGE,
        timeout: float = DEFAULT_HELPER_TIMEOUT,
        dir_mode: int = DEFAULT_DIR_MODE,
        service_account: str | None = None,
        poll_interval: float = 1.0,
        clock: Clock | None = None,
    ) -> None:
        self.namespace = namespace
        self.image = image
        self.timeout = timeout
        self.dir_mode = dir_mode
        self.service_account = service_account
        self.poll_interval = poll_interval
        self.clock: Clock = clock or RealClock()
        self._core = CoreV1Api(api_client)

    def build_pod(self, operation: str, node: NodeInfo, base_path: str, volume_name: str) -> V1Pod:
        """The helper Pod for ``operation`` on ``base_path/volume_name`` on ``node``."""
        validate_base_path(base_path, "basePath")
        command = helper_command(operation, volume_name, self.dir_mode)
        tolerations = [
            V1Toleration(key=t.key, operator="Exists", effect=t.effect) for t in node.taints
        ]
        return V1Pod(
            api_version="v1",
            kind="Pod",
            metadata=V1ObjectMeta(
                name=helper_pod_name(operation, volume_name),
                namespace=self.namespace,
                labels={LABEL_MANAGED_BY: _MANAGED_BY, LABEL_HELPER_OPERATION: operation},
                annotations={ANNOTATION_HELPER_PV: volume_name},
            ),
            spec=V1PodSpec(
                restart_policy="Never",
                service_account_name=self.service_account,
                automount_service_account_token=False,
                affinity=V1Affinity(
                    node_affinity=V1NodeAffinity(
                        required_during_scheduling_ignored_during_execution=V1NodeSelector(
                            node_selector_terms=[
                                V1NodeSelectorTerm(
                                    match_expressions=[
                                        V1NodeSelectorRequirement(
                                            key=HOSTNAME_LABEL,
                                            operator="In",
                                            values=[node.hostname],
                                        )
                                    ]
                                )
                            ]
                        )
                    )
                ),
                tolerations=tolerations or None,
                containers=[
                    V1Container(
                        name="helper",
                        image=self.image,
                        command=command,
                        volume_mounts=[V1VolumeMount(name="data", mount_path=HELPER_MOUNT_PATH)],
                    )
                ],
                volumes=[
                    V1Volume(
                        name="data",
                        host_path=V1HostPathVolumeSource(path=base_path, type="DirectoryOrCreate"),
                    )
                ],
            ),
        )

    async def create(self, node: NodeInfo, base_path: str, name: str) -> None:
        """Make ``base_path/name`` on ``node`` through a helper pod."""
        try:
            await self.run("create", node, base_path, name)
        except UnsafePathError as err:
            raise ProvisioningError(f"cannot provision volume {name}: {err}") from err
        except HelperPodError as err:
            state = ProvisioningState.IN_BACKGROUND if err.timed_out else ProvisioningState.FINISHED
            raise ProvisioningError(
                f"creating {base_path}/{name} on node {node.name}: {err}", state
            ) from err

    async def remove(self, node: NodeInfo, base_path: str, name: str) -> None:
        """Remove ``base_path/name`` on ``node`` through a helper pod."""
        await self.run("delete", node, base_path, name)

    async def archive(self, node: NodeInfo, base_path: str, name: str) -> None:
        """Rename ``base_path/name`` to ``archived-<name>`` on ``node`` through a helper pod."""
        await self.run("archive", node, base_path, name)

    async def run(self, operation: str, node: NodeInfo, base_path: str, name: str) -> None:
        """Launch (or find) the helper pod, wait for it to finish, then delete it."""
        pod = self.build_pod(operation, node, base_path, name)
        pod_name = pod.metadata.name
        bound = log.bind(pod=f"{self.namespace}/{pod_name}", operation=operation, node=node.name)
        await self._launch(pod)
        bound.info("helper pod launched")
        phase, detail = await self._wait(pod_name)
        if phase == "Succeeded":
            await self._delete(pod_name)
            bound.info("helper pod succeeded")
            return
        if phase == "Failed":
            # A failed pod is removed so that the retry starts a fresh one.
            await self._delete(pod_name)
            raise HelperPodError(
                f"helper pod {self.namespace}/{pod_name} failed ({detail}); check that the "
                f"node can write to {base_path}"
            )
        raise HelperPodError(
            f"helper pod {self.namespace}/{pod_name} did not finish within {self.timeout:g}s "
            f"(phase {phase or 'unknown'}{'; ' + detail if detail else ''}); it is left in "
            "place and waited for again on retry — check that the node is ready and the "
            f"image {self.image} can be pulled",
            timed_out=True,
        )

    async def _launch(self, pod: V1Pod) -> None:
        name = pod.metadata.name
        deadline = self.clock.monotonic() + self.timeout
        while True:
            try:
                await self._core.create_namespaced_pod(self.namespace, pod)
                return
            except ApiException as err:
                if not is_already_exists(err):
                    raise
            try:
                existing = await self._core.read_namespaced_pod(name, self.namespace)
            except ApiException as err:
                if is_not_found(err):
                    continue  # deleted meanwhile: create it again
                raise
            if _same_work(existing, pod):
                return  # launched by an earlier attempt: wait for that one
            # A pod with our name doing something else (the class's onDelete changed, the node
            # was replaced): it must not be mistaken for this operation's result.
            if not _terminating(existing):
                await self._delete(name)
            if self.clock.monotonic() >= deadline:
                raise HelperPodError(
                    f"stale helper pod {self.namespace}/{name} is still terminating",
                    timed_out=True,
                )
            await self.clock.sleep(self.poll_interval)

    async def _wait(self, name: str) -> tuple[str, str]:
        deadline = self.clock.monotonic() + self.timeout
        phase, detail = "", ""
        while True:
            try:
                pod = await self._core.read_namespaced_pod(name, self.namespace)
            except ApiException as err:
                if is_not_found(err):
                    raise HelperPodError(
                        f"helper pod {self.namespace}/{name} disappeared before finishing"
                    ) from err
                raise
            phase = (pod.status.phase if pod.status else None) or ""
            detail = _describe(pod)
            if phase in ("Succeeded", "Failed") or self.clock.monotonic() >= deadline:
                return phase, detail
            await self.clock.sleep(self.poll_interval)

    async def _delete(self, name: str) -> None:
        try:
            await self._core.delete_namespaced_pod(name, self.namespace)
        except ApiException as err:
            if not is_not_found(err):
                raise


def _command_of(pod: V1Pod) -> Sequence[str] | None:
    containers = pod.spec.containers if pod.spec else None
    return list(containers[0].command or []) if containers else None


def _terminating(pod: V1Pod) -> bool:
    # The stubs declare deletion_timestamp non-optional; on the wire it is usually absent.
    stamp: object = pod.metadata.deletion_timestamp
    return stamp is not None


def _same_work(existing: V1Pod, wanted: V1Pod) -> bool:
    if _terminating(existing):
        return False
    if _command_of(existing) != _command_of(wanted):
        return False
    ex_vols = existing.spec.volumes or []
    want_vols = wanted.spec.volumes or []
    ex_paths = [v.host_path.path for v in ex_vols if v.host_path]
    want_paths = [v.host_path.path for v in want_vols if v.host_path]
    ex_aff = existing.spec.affinity.to_dict() if existing.spec.affinity else None
    want_aff = wanted.spec.affinity.to_dict() if wanted.spec.affinity else None
    return ex_paths == want_paths and ex_aff == want_aff


def _describe(pod: V1Pod) -> str:
    """A short account of why a pod is where it is (container waiting/terminated reasons)."""
    status: V1PodStatus | None = pod.status
    if status is None:
        return ""
    parts: list[str] = []
    if status.reason:
        parts.append(str(status.reason))
    if status.message:
        parts.append(str(status.message))
    for cs in status.container_statuses or []:
        state: V1ContainerState | None = cs.state
        if state is None:
            continue
        terminated: V1ContainerStateTerminated | None = state.terminated
        waiting: V1ContainerStateWaiting | None = state.waiting
        if terminated is not None:
            t = terminated
            parts.append(
                f"exit code {t.exit_code}"
                + (f", {t.reason}" if t.reason else "")
                + (f": {t.message}" if t.message else "")
            )
        elif waiting is not None and waiting.reason:
            parts.append(f"waiting: {waiting.reason}")
    return "; ".join(parts)
