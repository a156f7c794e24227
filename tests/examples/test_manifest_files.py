"""Every example directory ships a README and the same set of manifests — a namespace, RBAC, a
StorageClass and a claim with a pod to try it — plus its own workloads; nothing else."""

from __future__ import annotations

import pytest
from manifest_support import Manifests

EVERY_EXAMPLE = [
    "README.md",
    "claim-and-pod.yaml",
    "namespace.yaml",
    "rbac.yaml",
    "storageclass.yaml",
]


@pytest.mark.parametrize(
    ("directory", "own"),
    [
        ("hostpath", ["daemonset.yaml", "deployment-helper-pod.yaml"]),
        ("nfs", ["deployment.yaml"]),
        ("rbd", ["deployment.yaml", "secret.yaml"]),
        ("csi-hostpath", ["csidriver.yaml", "deployment-single-process.yaml", "deployment.yaml"]),
        (
            "tutorial",
            [
                ".dockerignore",
                "Dockerfile",
                "deployment.yaml",
                "kustomization.yaml",
                "my_provisioner.py",
                "pyproject.toml",
                "test_my_provisioner.py",
            ],
        ),
    ],
)
def test_readme_and_manifests_exist(directory: str, own: list[str]) -> None:
    assert Manifests(directory).files() == sorted(EVERY_EXAMPLE + own)
