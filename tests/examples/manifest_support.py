"""Reading what examples/<backend>/ ships: its YAML documents by file and by kind, the RBAC a
role grants, the one container of a workload and its arguments checked against the entry
point's parser."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

Rule = tuple[str, str, frozenset[str]]


class Manifests:
    """The manifests of ``examples/<directory>/``, parsed afresh on every call (a test may
    change what it gets)."""

    def __init__(self, directory: str) -> None:
        self.root = EXAMPLES / directory

    def files(self) -> list[str]:
        """Every file name in the directory, sorted (bytecode caches left out: importing the
        tutorial's program may write one)."""
        return sorted(p.name for p in self.root.iterdir() if p.name != "__pycache__")

    def yaml_files(self) -> list[str]:
        """The YAML files, below the directory too (hostpath's base/, node/, helper-pod/), as
        paths relative to it, sorted."""
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*.yaml"))

    def text(self) -> str:
        """All the YAML files' text."""
        return "".join((self.root / name).read_text() for name in self.yaml_files())

    def docs(self, name: str) -> list[dict[str, Any]]:
        """The documents of one file (a path relative to the directory)."""
        return [d for d in yaml.safe_load_all((self.root / name).read_text()) if d]

    def by_kind(self, kind: str) -> list[dict[str, Any]]:
        """The documents of ``kind`` across all the files."""
        return [d for name in self.yaml_files() for d in self.docs(name) if d["kind"] == kind]

    def claim(self) -> dict[str, Any]:
        """The PersistentVolumeClaim of claim-and-pod.yaml."""
        return next(
            d for d in self.docs("claim-and-pod.yaml") if d["kind"] == "PersistentVolumeClaim"
        )

    def rules(self, kind: str, name: str) -> set[Rule]:
        """(API group, resource, verbs) for every resource the role ``name`` grants."""
        (role,) = [d for d in self.by_kind(kind) if d["metadata"]["name"] == name]
        return {
            (group, resource, frozenset(rule["verbs"]))
            for rule in role["rules"]
            for group in rule["apiGroups"]
            for resource in rule["resources"]
        }

    def container(self, kind: str) -> dict[str, Any]:
        """The one container of the one workload of ``kind``."""
        (workload,) = self.by_kind(kind)
        (c,) = workload["spec"]["template"]["spec"]["containers"]
        return c

    def assert_no_wildcard_or_privilege(self) -> None:
        """No ``"*"`` anywhere (verbs, resources) and no privileged container."""
        text = self.text()
        assert '"*"' not in text
        assert "privileged: true" not in text


def parse_container_args(
    container: dict[str, Any], module: str, parser: argparse.ArgumentParser
) -> argparse.Namespace:
    """``container`` runs ``python -m module`` with arguments that are all ``parser``'s own
    flags; returns them parsed."""
    assert container["command"] == ["python", "-m", module]
    known = {s for a in parser._actions for s in a.option_strings}
    for arg in container["args"]:
        assert arg.split("=", 1)[0] in known, arg
    return parser.parse_args(container["args"])


# What every example's provisioner needs, and nothing more: what a ProvisionController asks
# the API server for (tests/examples/test_tutorial_manifests.py checks it against a running
# program), which docs/operations.md's RBAC table shows.
PROVISIONER_RULES: set[Rule] = {
    ("", "persistentvolumes", frozenset({"get", "list", "watch", "create", "delete", "patch"})),
    ("", "persistentvolumeclaims", frozenset({"get", "list", "watch", "update", "patch"})),
    ("storage.k8s.io", "storageclasses", frozenset({"get", "list", "watch"})),
    ("", "events", frozenset({"create", "patch"})),
}
LEADER_ELECTION_RULE: Rule = (
    "coordination.k8s.io",
    "leases",
    frozenset({"get", "create", "update"}),
)
