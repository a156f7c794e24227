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


def test_hostpath_has_one_kustomization_per_mode_over_a_shared_base() -> None:
    """Two modes: ``kubectl apply -k examples/hostpath/<mode>`` applies one of them, the
    namespace, RBAC and class coming from base/; a plain ``kubectl apply -f`` of the directory
    no longer applies both workloads at once (only the claim and pod are at the top)."""
    hostpath = Manifests("hostpath")
    assert hostpath.files() == ["README.md", "base", "claim-and-pod.yaml", "helper-pod", "node"]
    assert hostpath.yaml_files() == [
        "base/kustomization.yaml",
        "base/namespace.yaml",
        "base/rbac.yaml",
        "base/storageclass.yaml",
        "claim-and-pod.yaml",
        "helper-pod/deployment.yaml",
        "helper-pod/kustomization.yaml",
        "node/daemonset.yaml",
        "node/kustomization.yaml",
    ]
