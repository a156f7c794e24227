"""kubectl against the standalone in-memory API server: the :class:`Kubectl` runner and the
:data:`MANIFESTS` that tests/testing's kubectl tests share (their ``kubectl`` fixture is in
conftest.py). :data:`KUBECTL` is None where kubectl is not installed."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Kubectl:
    env: dict[str, str]
    tmp: Path

    async def start(self, *args: str) -> asyncio.subprocess.Process:
        assert KUBECTL is not None
        return await asyncio.create_subprocess_exec(
            KUBECTL,
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
        )

    async def run(self, *args: str, check: bool = True) -> tuple[int, str, str]:
        proc = await self.start(*args)
        out, err = await asyncio.wait_for(proc.communicate(), 20)
        code = proc.returncode
        assert code is not None
        if check:
            assert code == 0, f"kubectl {' '.join(args)} failed: {err.decode()}"
        return code, out.decode(), err.decode()

    async def patch(
        self, obj: str, patch_type: str, patch: str, *, check: bool = True
    ) -> tuple[int, str, str]:
        """``kubectl patch <obj> --type <patch_type> -p <patch>``; ``obj`` is "kind name"."""
        return await self.run("patch", *obj.split(), "--type", patch_type, "-p", patch, check=check)

    async def json(self, *args: str) -> dict[str, Any]:
        _, out, _ = await self.run(*args, "-o", "json")
        data: dict[str, Any] = json.loads(out)
        return data


def _find_kubectl() -> str | None:
    beside = Path(sys.executable).parent / "kubectl"
    if beside.exists():
        return str(beside)
    return shutil.which("kubectl")


KUBECTL = _find_kubectl()


MANIFESTS = """\
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: fast
provisioner: example.com/hostpath
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: claim1
  labels: {app: demo}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: fast
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: pv1
spec:
  capacity: {storage: 2Gi}
  accessModes: [ReadWriteOnce]
  hostPath: {path: /tmp/pv1}
"""
