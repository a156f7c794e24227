"""The tutorial's manifests (examples/tutorial/): they parse, the Deployment runs the project's
own program with flags its parser has, ``kubectl apply -k`` deploys the provisioner without the
demo claim, and the RBAC is exactly what the running program asks the API server for (plus the
paths it did not exercise, each named), which is also the table docs/operations.md shows."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from kubernetes_asyncio.client import CoreV1Api, StorageV1Api, V1PersistentVolumeClaim
from manifest_support import LEADER_ELECTION_RULE, PROVISIONER_RULES, Manifests, Rule
from module_support import load_file

from pyprovlib import testing
from pyprovlib.kube import _resources as resources
from pyprovlib.kube._config import DEFAULT_USER_AGENT
from pyprovlib.testing._server import ApiServer

TUTORIAL = Manifests("tutorial")
ROOT = Path(__file__).resolve().parents[2]
PROGRAM = TUTORIAL.root / "my_provisioner.py"
KUBECTL = Path(sys.executable).parent / "kubectl"

NOT_EXERCISED: dict[tuple[str, str, str], str] = {
    ("storage.k8s.io", "storageclasses", "get"): "nothing: list reads every class already",
    # Granted by rbac.yaml but not asked for by one claim provisioned and deleted, each with
    # the code path that needs it. Anything else granted but unused, or used but not granted,
    # fails the test.
    ("", "persistentvolumes", "get"): "a PV's existence before it is saved again after a failure",
    ("", "persistentvolumes", "patch"): "the provisioned-volume finalizer (add_finalizer=True)",
    ("", "persistentvolumeclaims", "get"): "nothing: list reads every claim already",
    ("", "persistentvolumeclaims", "update"): "dropping selected-node to reschedule a claim",
    ("", "persistentvolumeclaims", "patch"): "the provisioning-protection finalizer",
    ("", "events", "patch"): "a repeated event's count (the recorder's aggregation)",
}


def program() -> ModuleType:
    return load_file("my_provisioner", PROGRAM)


def test_the_rbac_is_a_provisioners_and_nothing_more() -> None:
    assert TUTORIAL.rules("ClusterRole", "my-provisioner") == PROVISIONER_RULES
    TUTORIAL.assert_no_wildcard_or_privilege()
    (binding,) = TUTORIAL.by_kind("ClusterRoleBinding")
    (account,) = TUTORIAL.by_kind("ServiceAccount")
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]


def test_the_deployment_runs_the_projects_program_with_its_flags() -> None:
    (deployment,) = TUTORIAL.by_kind("Deployment")
    spec = deployment["spec"]
    assert (spec["replicas"], spec["strategy"]["type"]) == (1, "Recreate")
    pod = spec["template"]["spec"]
    (account,) = TUTORIAL.by_kind("ServiceAccount")
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    container = TUTORIAL.container("Deployment")
    scripts = tomllib.loads((TUTORIAL.root / "pyproject.toml").read_text())["project"]["scripts"]
    assert container["command"] == list(scripts)
    args = program().build_parser().parse_args(container["args"])
    assert args.leader_election is False  # one replica
    # The PVs name host directories: the host's path is mounted at the same path.
    (volume,) = pod["volumes"]
    (mount,) = container["volumeMounts"]
    assert volume["hostPath"]["path"] == mount["mountPath"] == args.root
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert args.http_endpoint == f":{ports['http']}"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}


def test_the_class_names_the_provisioner_and_the_claim_the_class() -> None:
    (storage_class,) = TUTORIAL.by_kind("StorageClass")
    assert storage_class["provisioner"] == program().PROVISIONER_NAME
    assert TUTORIAL.claim()["spec"]["storageClassName"] == storage_class["metadata"]["name"]


@pytest.mark.kubectl
def test_apply_k_deploys_the_provisioner_without_the_demo_claim() -> None:
    if not KUBECTL.is_file():
        pytest.skip(f"no kubectl beside {sys.executable}: pip install -e '.[test]'")
    built = subprocess.run(
        [str(KUBECTL), "kustomize", str(TUTORIAL.root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(built) if d)
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Namespace",
        "ServiceAccount",
        "StorageClass",
    ]


def documented_rules(section: str) -> set[Rule]:
    """The rules of the table that follows ``section`` in docs/operations.md's RBAC part."""
    text = (ROOT / "docs" / "operations.md").read_text()
    rbac = text.split("\n## RBAC\n", 1)[1].split("\n## ", 1)[0]
    after = rbac.split(section, 1)[1].splitlines()
    start = next(i for i, line in enumerate(after) if line.startswith("|"))
    table = []
    for line in after[start:]:
        if not line.startswith("|"):
            break
        table.append(line)
    rules: set[Rule] = set()
    for line in table[2:]:  # the header and its rule
        group, resource, verbs = (cell.strip() for cell in line.strip("|").split("|")[:3])
        rules.add(
            (group.strip('`"'), resource.strip("`"), frozenset(re.findall(r"`(\w+)`", verbs)))
        )
    return rules


def test_the_operations_page_shows_these_rules() -> None:
    """The RBAC table of docs/operations.md is the manifests' rules (the examples' and the
    tutorial's), not a list of its own."""
    assert documented_rules("What a `ProvisionController` calls") == PROVISIONER_RULES | {
        LEADER_ELECTION_RULE
    }


async def test_the_rbac_is_what_the_running_program_asks_for(tmp_path: Path) -> None:
    granted = {
        (group, resource, verb)
        for group, resource, verbs in TUTORIAL.rules("ClusterRole", "my-provisioner")
        for verb in verbs
    }
    (storage_class,) = TUTORIAL.by_kind("StorageClass")
    claim = TUTORIAL.claim()
    name, namespace = claim["metadata"]["name"], claim["metadata"]["namespace"]
    async with ApiServer(binder=True) as server, server.api_client() as client:
        client.user_agent = "tutorial-manifest-test"  # the test's own requests, told apart
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        core = CoreV1Api(client)
        async with testing.child_process(
            str(PROGRAM),
            "--kubeconfig",
            str(kubeconfig),
            "--root",
            str(tmp_path / "volumes"),
            "--log-format",
            "json",
            terminate_timeout=15,
        ) as process:
            await process.wait_for("starting")
            await StorageV1Api(client).create_storage_class(storage_class)
            await core.create_namespaced_persistent_volume_claim(namespace, claim)
            pvc = await testing.eventually(
                lambda: bound_claim(core, name, namespace), message=f"claim {name} Bound"
            )
            volume = pvc.spec.volume_name
            assert (tmp_path / "volumes" / volume).is_dir()
            await core.delete_namespaced_persistent_volume_claim(name, namespace)
            await testing.eventually(
                lambda: no_volumes(core), message=f"PV {volume} deleted with its claim"
            )
            assert not (tmp_path / "volumes" / volume).exists()
            await process.wait_for("PersistentVolume deleted")
        requests = server.requests.snapshot(DEFAULT_USER_AGENT)
    groups: dict[str, str] = {}
    for resource in sorted(resources.RESOURCES, key=lambda r: r.group != ""):
        groups.setdefault(resource.plural, resource.group)
    used = {(groups[resource.partition("/")[0]], resource, verb) for verb, resource in requests}
    assert used - granted == set(), "requests rbac.yaml does not allow"
    assert granted - used == set(NOT_EXERCISED), "grants that nothing uses"


async def bound_claim(core: CoreV1Api, name: str, namespace: str) -> V1PersistentVolumeClaim | None:
    claim = await core.read_namespaced_persistent_volume_claim(name, namespace)
    return claim if claim.status.phase == "Bound" else None


async def no_volumes(core: CoreV1Api) -> bool:
    return not (await core.list_persistent_volume()).items
