"""The conformance run's selection and driver definitions, checked without a node: the focus
that ``PYPROVLIB_CONFORMANCE_FOCUS`` narrows, and the VolumeAttributesClass each stack's
definition hands the suite's volume-modify tests (its driver, the one mutable parameter the
node plugins accept)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import stacks
import yaml
from conformance import DEFINITIONS, FOCUS_VARIABLE, SKIPPED, focus_regex, narrowed_by

NAME = (
    "External Storage [Driver: {driver}] [Testpattern: Dynamic PV (default fs)] volume-modify "
    "[FeatureGate:VolumeAttributesClass] [Feature:VolumeAttributesClass] should modify volume "
    "with no VAC"
)
OTHER = (
    "External Storage [Driver: {driver}] [Testpattern: Dynamic PV (default fs)] volumes "
    "should store data"
)


@pytest.mark.parametrize("stack", list(stacks.STACKS.values()), ids=list(stacks.STACKS))
def test_focus_is_the_stacks_tests_narrowed_by_the_variable(stack: stacks.Stack) -> None:
    ours = NAME.format(driver=stack.driver)
    others = NAME.format(driver="another.csi.example.com")
    whole = focus_regex(stack)
    assert re.search(whole, ours)
    assert re.search(whole, OTHER.format(driver=stack.driver))
    assert not re.search(whole, others)
    narrow = focus_regex(stack, "volume-modify|VolumeAttributesClass")
    assert re.search(narrow, ours)
    assert not re.search(narrow, OTHER.format(driver=stack.driver))
    assert not re.search(narrow, others)


def test_focus_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FOCUS_VARIABLE, raising=False)
    assert narrowed_by() is None
    monkeypatch.setenv(FOCUS_VARIABLE, "")
    assert narrowed_by() is None
    monkeypatch.setenv(FOCUS_VARIABLE, "volume-modify")
    assert narrowed_by() == "volume-modify"


def test_a_broken_focus_is_refused_naming_the_variable() -> None:
    with pytest.raises(ValueError, match=FOCUS_VARIABLE):
        focus_regex(stacks.GO, "volume-modify[")


def test_volume_attributes_class_tests_are_selected() -> None:
    assert not any(re.search(pattern, NAME) for pattern in SKIPPED)


def _load(path: Path) -> dict[str, object]:
    loaded = yaml.safe_load(path.read_text())
    assert isinstance(loaded, dict), path
    return loaded


@pytest.mark.parametrize("stack", list(stacks.STACKS.values()), ids=list(stacks.STACKS))
def test_definitions_give_a_class_the_node_plugin_accepts(stack: stacks.Stack) -> None:
    definition = _load(DEFINITIONS / f"{stack.key}.yaml")
    info = definition["DriverInfo"]
    assert isinstance(info, dict)
    assert info["Name"] == stack.driver
    assert info["VolumeModifyStressTestOptions"]["NumPods"] > 0
    vac = definition["VolumeAttributesClass"]
    assert isinstance(vac, dict)
    # relative: e2e.test resolves it against --repo-root, which the run sets to DEFINITIONS
    path = DEFINITIONS / vac["FromFile"]
    assert not Path(vac["FromFile"]).is_absolute()
    assert path.is_file()
    attributes_class = _load(path)
    assert attributes_class["kind"] == "VolumeAttributesClass"
    assert attributes_class["driverName"] == stack.driver
    assert attributes_class["parameters"] == {stacks.MUTABLE_PARAMETER: "test-value"}


def test_docs_list_every_test_left_out() -> None:
    """docs/testing.md's table of what the run leaves out names each pattern of SKIPPED (and
    names nothing else as left out)."""
    page = (DEFINITIONS.parents[2] / "docs" / "testing.md").read_text()
    table = page.split("| left out | why |", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"^\| `([^`]+)` \|", table, flags=re.MULTILINE)
    assert sorted(listed) == sorted(pattern.replace("\\", "") for pattern in SKIPPED)
