"""The parts of pyprovlib.testing._node that need no root: images built without a registry,
the manifest of what a node changes on the host and its cleanup, the reaper's node step, and
the one-line reasons a node cannot run."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
from pathlib import Path

import pytest

from pyprovlib.testing import _node_cleanup as cleanup
from pyprovlib.testing._controlplane import ControlPlane
from pyprovlib.testing._node import KubeletNode, NodeUnavailableError, node_unavailable
from pyprovlib.testing._node_images import (
    BUSYBOX_IMAGE,
    PAUSE_IMAGE,
    ImageSpec,
    node_images,
    write_image,
)
from pyprovlib.testing._reaper import reap


@pytest.fixture
def fake_busybox(tmp_path: Path) -> Path:
    """A stand-in for busybox: answers ``--list`` with three applets."""
    path = tmp_path / "busybox"
    path.write_text("#!/bin/sh\nprintf 'sh\\nls\\nbusybox\\nmkdir\\n'\n")
    path.chmod(0o755)
    return path


def _members(tarball: Path) -> tuple[dict[str, object], dict[str, tarfile.TarInfo], bytes]:
    with tarfile.open(tarball) as outer:
        manifest = json.loads(outer.extractfile("manifest.json").read())  # type: ignore[union-attr]
        config = json.loads(outer.extractfile(manifest[0]["Config"]).read())  # type: ignore[union-attr]
        layer = outer.extractfile(manifest[0]["Layers"][0]).read()  # type: ignore[union-attr]
    with tarfile.open(fileobj=io.BytesIO(layer)) as inner:
        entries = {m.name: m for m in inner.getmembers()}
    return {"manifest": manifest, "config": config}, entries, layer


def test_image_tarball_is_a_docker_archive_with_applets(fake_busybox: Path, tmp_path: Path) -> None:
    spec = ImageSpec(
        names=("example.com/busybox:1", "example.com/alias:2"),
        files={"bin/busybox": fake_busybox},
        entrypoint=("/bin/busybox", "sleep", "9"),
        user="65535",
    )
    docs, entries, layer = _members(write_image(spec, tmp_path / "image.tar"))
    manifest = docs["manifest"]
    assert isinstance(manifest, list)
    assert manifest[0]["RepoTags"] == ["example.com/busybox:1", "example.com/alias:2"]
    config = docs["config"]
    assert isinstance(config, dict)
    assert config["config"]["Entrypoint"] == ["/bin/busybox", "sleep", "9"]
    assert config["config"]["User"] == "65535"
    assert config["architecture"] == "amd64"
    assert config["os"] == "linux"
    # The image config names the layer by the digest of its bytes.
    import hashlib

    assert config["rootfs"]["diff_ids"] == [f"sha256:{hashlib.sha256(layer).hexdigest()}"]
    # One symlink per applet (busybox itself excluded), users, a sticky /tmp.
    for applet in ("sh", "ls", "mkdir"):
        assert entries[f"bin/{applet}"].issym()
        assert entries[f"bin/{applet}"].linkname == "busybox"
    assert "bin/busybox" in entries
    assert entries["bin/busybox"].mode & stat.S_IXUSR
    assert entries["tmp"].mode == 0o1777
    assert "etc/passwd" in entries
    assert "etc/group" in entries


def test_image_tarball_is_reproducible(fake_busybox: Path, tmp_path: Path) -> None:
    spec = ImageSpec(names=("a:1",), files={"bin/busybox": fake_busybox})
    first = write_image(spec, tmp_path / "one.tar").read_bytes()
    second = write_image(spec, tmp_path / "two.tar").read_bytes()
    assert first == second


def test_node_images_names_what_the_e2e_suite_asks_for(fake_busybox: Path) -> None:
    names = {n for spec in node_images(fake_busybox, None) for n in spec.names}
    assert PAUSE_IMAGE in names
    assert BUSYBOX_IMAGE in names
    with_agnhost = node_images(fake_busybox, fake_busybox)
    assert any("agnhost" in spec.files for spec in with_agnhost)


def test_manifest_round_trips(tmp_path: Path) -> None:
    manifest = cleanup.NodeManifest(
        directory=str(tmp_path),
        kubelet_root=str(tmp_path / "kubelet"),
        cgroup_root="/pyprovlib-node-test",
        containerd_address=str(tmp_path / "containerd.sock"),
        bridge="pyprovtest",
        created_paths=[str(tmp_path / "made")],
    )
    manifest.save()
    loaded = cleanup.NodeManifest.load(tmp_path)
    assert loaded == manifest
    assert cleanup.NodeManifest.load(tmp_path / "nothing") is None


def test_clean_removes_what_the_node_created_and_reports_nothing_left(tmp_path: Path) -> None:
    made_dir = tmp_path / "made-dir"
    (made_dir / "inner").mkdir(parents=True)
    made_file = tmp_path / "made-file"
    made_file.write_text("x")
    kept = tmp_path / "kept"
    kept.write_text("not the node's")
    manifest = cleanup.NodeManifest(
        directory=str(tmp_path),
        kubelet_root=str(tmp_path / "kubelet"),
        cgroup_root="/pyprovlib-node-does-not-exist",
        containerd_address=str(tmp_path / "containerd.sock"),
        bridge="pyprovnone0",
        created_paths=[str(made_dir), str(made_file)],
    )
    assert set(cleanup.leftovers(manifest)) == {f"path {made_dir}", f"path {made_file}"}
    assert cleanup.clean(manifest) == []
    assert not made_dir.exists()
    assert not made_file.exists()
    assert kept.exists()


def test_mount_points_are_matched_by_path_prefix_not_string_prefix() -> None:
    assert cleanup._under("/var/lib/kubelet/pods/x", ["/var/lib/kubelet"])
    assert cleanup._under("/var/lib/kubelet", ["/var/lib/kubelet"])
    assert not cleanup._under("/var/lib/kubelet-other", ["/var/lib/kubelet"])
    assert cleanup._unescape("/a\\040b\\134c") == "/a b\\c"
    assert "/" not in cleanup.mounts_under(["/nonexistent-root-for-this-test"])


def test_reaper_runs_the_node_cleanup_before_removing_the_directory(tmp_path: Path) -> None:
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    outside = tmp_path / "outside-made-by-node"
    outside.mkdir()
    cleanup.NodeManifest(
        directory=str(node_dir),
        kubelet_root=str(node_dir / "kubelet"),
        cgroup_root="/pyprovlib-node-does-not-exist",
        containerd_address=str(node_dir / "containerd.sock"),
        bridge="pyprovnone0",
        created_paths=[str(outside)],
    ).save()
    reap(set(), str(node_dir), grace=0.1, node=True)
    assert not outside.exists()
    assert not node_dir.exists()


def test_reaper_without_the_node_step_leaves_outside_paths(tmp_path: Path) -> None:
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    cleanup.NodeManifest(
        directory=str(node_dir),
        kubelet_root=str(node_dir / "kubelet"),
        cgroup_root="/x",
        containerd_address="",
        bridge="",
        created_paths=[str(outside)],
    ).save()
    reap(set(), str(node_dir), grace=0.1)
    assert outside.exists()


def test_node_unavailable_says_why_in_one_line(tmp_path: Path) -> None:
    why = node_unavailable(tmp_path)
    assert why is not None
    assert "\n" not in why
    if os.geteuid() != 0:
        assert "root" in why
    else:
        assert "kubelet" in why


def test_a_node_that_cannot_run_refuses_at_construction(tmp_path: Path) -> None:
    for binary in ("etcd", "kube-apiserver"):
        (tmp_path / binary).write_text("#!/bin/sh\n")
        (tmp_path / binary).chmod(0o755)
    plane = ControlPlane(tmp_path, controller_manager=False, scheduler=False)
    with pytest.raises(NodeUnavailableError) as caught:
        KubeletNode(plane)
    assert str(caught.value) == node_unavailable(tmp_path)


def test_extra_tools_replace_the_applet_of_the_same_name(
    fake_busybox: Path, tmp_path: Path
) -> None:
    dd = tmp_path / "gnu-dd"
    dd.write_bytes(b"\x7fELF")
    lib = tmp_path / "libc"
    lib.write_bytes(b"lib")
    specs = node_images(fake_busybox, None, extras={"bin/ls": dd, "lib/x/libc.so.6": lib})
    busybox = next(spec for spec in specs if BUSYBOX_IMAGE in spec.names)
    _, entries, _ = _members(write_image(busybox, tmp_path / "busybox.tar"))
    assert entries["bin/ls"].isfile()
    assert entries["bin/sh"].issym()
    assert entries["lib/x"].isdir()
    assert entries["lib/x/libc.so.6"].isfile()
    pause = next(spec for spec in specs if PAUSE_IMAGE in spec.names)
    assert set(pause.files) == {"bin/busybox"}
