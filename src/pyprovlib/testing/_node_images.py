"""Container images for a test node without a registry: docker-archive tarballs (one
uncompressed layer, a linux/amd64 image config, a ``manifest.json`` naming the image) that
``ctr images import`` loads into containerd, built from files already on the machine.

Three images, under the names Kubernetes' e2e suite v1.36 asks for:

- busybox: Debian's static ``busybox`` with a symlink per applet, ``/etc/passwd`` and
  ``/etc/group`` (root, nobody), a world-writable ``/tmp``; and, where the host has them, GNU
  ``dd`` and ``bash`` as ``/bin/sh`` with the glibc files they load: Debian's busybox 1.35
  ``dd`` lacks ``oflag=nocache``, which the e2e suite's block-volume tests use, and its shell
  runs its own applets before any binary on ``PATH``, so the shell must be another one, which
  also takes the suite's ``let`` and ``echo -n`` (dash does not);
- pause: the same files, running ``sleep`` as the pod sandbox's process (containerd stops a
  sandbox with SIGKILL, so it needs no signal handling of its own);
- agnhost: the e2e suite's test binary at ``/agnhost`` on top of the busybox files.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "AGNHOST_IMAGE",
    "BUSYBOX_IMAGE",
    "GLIBC_IMAGE",
    "NGINX_IMAGE",
    "PAUSE_IMAGE",
    "ImageSpec",
    "node_images",
]

PAUSE_IMAGE = "registry.k8s.io/pause:3.10.2"
BUSYBOX_IMAGE = "registry.k8s.io/e2e-test-images/busybox:1.37.0-1"
# The e2e suite's pods with an fsGroup run a shell loop in this one, and its "exec of files
# on the volume" test a shell script in the nginx one: busybox serves for both.
GLIBC_IMAGE = "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.0.0"
NGINX_IMAGE = "registry.k8s.io/e2e-test-images/nginx:1.15-4"
AGNHOST_IMAGE = "registry.k8s.io/e2e-test-images/agnhost:2.63.0"

_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PASSWD = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
_GROUP = b"root:x:0:\nnobody:x:65534:\n"


@dataclass(frozen=True)
class ImageSpec:
    """One image: its names, the files of its single layer (destination -> source path),
    and its entrypoint."""

    names: tuple[str, ...]
    files: dict[str, Path] = field(default_factory=dict)
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    user: str = ""


# GNU dd, bash as the shell (busybox's shell would run its own dd applet) and what they load
# (Debian's paths); used when all are there.
_GLIBC_TOOLS = {
    "bin/dd": Path("/bin/dd"),
    "bin/sh": Path("/bin/bash"),
    "lib/x86_64-linux-gnu/libtinfo.so.6": Path("/lib/x86_64-linux-gnu/libtinfo.so.6"),
    "lib/x86_64-linux-gnu/libc.so.6": Path("/lib/x86_64-linux-gnu/libc.so.6"),
    "lib64/ld-linux-x86-64.so.2": Path("/lib64/ld-linux-x86-64.so.2"),
}


def _glibc_tools() -> dict[str, Path]:
    if all(path.exists() for path in _GLIBC_TOOLS.values()):
        return dict(_GLIBC_TOOLS)
    return {}


def node_images(
    busybox: Path, agnhost: Path | None, extras: dict[str, Path] | None = None
) -> list[ImageSpec]:
    """The images a test node needs, from a static ``busybox`` binary and (optionally) the
    ``agnhost`` binary. ``extras`` (default: GNU ``dd`` and ``bash`` as ``sh`` where the host
    has them) go into the busybox and agnhost images and win over busybox's applets of the
    same name."""
    tools = {"bin/busybox": busybox, **(_glibc_tools() if extras is None else extras)}
    images = [
        ImageSpec(
            names=(PAUSE_IMAGE,),
            files={"bin/busybox": busybox},
            entrypoint=("/bin/busybox", "sleep", "2147483647"),
            user="65535",
        ),
        ImageSpec(names=(BUSYBOX_IMAGE, GLIBC_IMAGE, NGINX_IMAGE), files=dict(tools), cmd=("sh",)),
    ]
    if agnhost is not None:
        images.append(
            ImageSpec(
                names=(AGNHOST_IMAGE,),
                files={**tools, "agnhost": agnhost},
                entrypoint=("/agnhost",),
            )
        )
    return images


def _applets(busybox: Path) -> list[str]:
    out = subprocess.run(  # noqa: S603 - argv list, the binary the caller named
        [str(busybox), "--list"], check=True, capture_output=True, text=True
    ).stdout
    return sorted({line.strip() for line in out.splitlines() if line.strip()} - {"busybox"})


def _entry(name: str, *, kind: bytes = tarfile.REGTYPE, mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    return info


def _layer(spec: ImageSpec) -> bytes:
    """The layer tar: reproducible (mtime 0, owner root)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        directories = {"bin": 0o755, "etc": 0o755, "tmp": 0o1777}
        for dest in spec.files:
            parts = dest.split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                directories.setdefault("/".join(parts[:depth]), 0o755)
        for directory, mode in sorted(directories.items()):
            tar.addfile(_entry(directory, kind=tarfile.DIRTYPE, mode=mode))
        for name, data in (("etc/passwd", _PASSWD), ("etc/group", _GROUP)):
            info = _entry(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for dest, source in sorted(spec.files.items()):
            data = source.read_bytes()
            info = _entry(dest, mode=0o755)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        busybox = spec.files.get("bin/busybox")
        if busybox is not None:
            for applet in _applets(busybox):
                if f"bin/{applet}" in spec.files:
                    continue  # a real tool of that name is in the image
                link = _entry(f"bin/{applet}", kind=tarfile.SYMTYPE, mode=0o777)
                link.linkname = "busybox"
                tar.addfile(link)
    return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = _entry(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_image(spec: ImageSpec, target: Path) -> Path:
    """Write ``spec`` as a docker-archive tarball at ``target``; returns ``target``."""
    layer = _layer(spec)
    layer_id = hashlib.sha256(layer).hexdigest()
    settings: dict[str, object] = {"Env": [_PATH]}
    if spec.entrypoint:
        settings["Entrypoint"] = list(spec.entrypoint)
    if spec.cmd:
        settings["Cmd"] = list(spec.cmd)
    if spec.user:
        settings["User"] = spec.user
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": settings,
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_id}"]},
        },
        sort_keys=True,
    ).encode()
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = [
        {"Config": config_name, "RepoTags": list(spec.names), "Layers": [f"{layer_id}/layer.tar"]}
    ]
    with tarfile.open(target, "w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(_entry(layer_id, kind=tarfile.DIRTYPE, mode=0o755))
        _add(tar, f"{layer_id}/layer.tar", layer)
        _add(tar, config_name, config)
        _add(tar, "manifest.json", json.dumps(manifest).encode())
    return target


def write_images(specs: Iterable[ImageSpec], directory: Path) -> Sequence[Path]:
    """Write each image into ``directory``; returns the tarballs' paths."""
    directory.mkdir(parents=True, exist_ok=True)
    return [write_image(spec, directory / f"image-{i}.tar") for i, spec in enumerate(specs)]
