"""A controller's options come from the runtime's flags in one place (issue 20: one settings
story): every flag reaches its option field, the defaults are the flags', a keyword cannot
override a flag, and the examples' removed per-module copies still work for one release."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from pyprovlib.controller._attach.options import AttachControllerOptions
from pyprovlib.controller._options import ProvisionControllerOptions
from pyprovlib.controller._resize.options import ResizeControllerOptions
from pyprovlib.runtime import (
    CommonOptions,
    attach_controller_options,
    common_parser,
    provision_controller_options,
    resize_controller_options,
)
from pyprovlib.runtime._controller_options import FLAG_OF_FIELD
from pyprovlib.runtime._flags import parse_common

# Every flag a controller option follows, set away from its default.
ARGV = [
    "--worker-threads=7",
    "--leader-election=true",
    "--leader-election-namespace=storage",
    "--leader-election-lease-duration=40s",
    "--leader-election-renew-deadline=30s",
    "--leader-election-retry-period=3s",
]

BUILDERS = [
    pytest.param(
        provision_controller_options, ProvisionControllerOptions, "workers", id="provision"
    ),
    pytest.param(attach_controller_options, AttachControllerOptions, "workers", id="attach"),
    pytest.param(resize_controller_options, ResizeControllerOptions, "workers", id="resize"),
]


def flags(argv: list[str], **defaults: object) -> CommonOptions:
    parser = common_parser("test-prog", "A test.", defaults=defaults or None)
    parser.environ = {}
    options, _ = parse_common(parser, argv)
    return options


@pytest.mark.parametrize(("build", "cls", "workers"), BUILDERS)
def test_every_flag_reaches_its_option(build: Any, cls: type[Any], workers: str) -> None:
    options = build(flags(ARGV))
    assert isinstance(options, cls)
    assert getattr(options, workers) == 7
    assert options.leader_election is True
    assert options.leader_election_namespace == "storage"
    assert options.lease_duration == 40.0
    assert options.renew_deadline == 30.0
    assert options.retry_period == 3.0


@pytest.mark.parametrize(("build", "cls", "workers"), BUILDERS)
def test_the_flags_defaults_win_over_the_dataclass_defaults(
    build: Any, cls: type, workers: str
) -> None:
    # ProvisionControllerOptions() leads by default (sig-storage-lib); --leader-election does
    # not (the CSI sidecars). Built from the flags, the flag decides: no silent disagreement.
    options = build(flags([], worker_threads=3, leader_election_retry_period="1s"))
    assert options.leader_election is False
    assert getattr(options, workers) == 3
    assert options.retry_period == 1.0


def test_the_provision_library_default_differs_from_the_flag_default() -> None:
    # Why the builder exists: the two upstream defaults differ, and both are kept.
    assert ProvisionControllerOptions().leader_election is True
    assert flags([]).leader_election is False
    assert provision_controller_options(flags([])).leader_election is False


@pytest.mark.parametrize(("build", "cls", "workers"), BUILDERS)
def test_fields_no_flag_carries_are_keywords(build: Any, cls: type, workers: str) -> None:
    options = build(flags(ARGV), resync_period=42.0)
    assert options.resync_period == 42.0
    assert getattr(options, workers) == 7


@pytest.mark.parametrize(("build", "cls", "workers"), BUILDERS)
def test_a_keyword_cannot_override_a_flag(build: Any, cls: type, workers: str) -> None:
    with pytest.raises(TypeError, match=f"{workers} \\(from --worker-threads\\) is set by"):
        build(flags([]), **{workers: 2})
    with pytest.raises(TypeError, match=r"leader_election \(from --leader-election\).*are set"):
        build(flags([]), leader_election=True, retry_period=1.0)


def test_every_field_the_flags_set_is_named_with_its_flag() -> None:
    derived = set(flags([]).leader_election_fields()) | {"threadiness", "worker_threads", "workers"}
    assert derived == set(FLAG_OF_FIELD)


def test_bad_values_are_still_checked_by_the_options() -> None:
    from pyprovlib._errors import InvalidOptionsError

    with pytest.raises(InvalidOptionsError, match="retry_interval_max"):
        provision_controller_options(flags([]), retry_interval_max=0)


def test_combined_style_flag_copies_still_drive_the_options() -> None:
    # csi/_combined.py turns leader election off per controller by replacing it in the flags.
    quiet = dataclasses.replace(flags(ARGV), leader_election=False)
    assert resize_controller_options(quiet).leader_election is False


@pytest.mark.parametrize("example", ["hostpath", "nfs", "rbd"])
def test_the_examples_controller_options_is_a_deprecated_alias(example: str) -> None:
    import importlib

    cli = importlib.import_module(f"pyprovlib.examples.{example}._cli")
    common = flags(ARGV)
    with pytest.warns(DeprecationWarning, match="provision_controller_options"):
        old = cli.controller_options(common)
    assert old == provision_controller_options(common)


# Entry points that still build a controller's options from the flags field by field instead of
# through pyprovlib.runtime.*_controller_options; each is a place a flag and an option can drift
# apart again. Take a file off when it is migrated; never add one.
BUILT_BY_HAND: set[str] = set()


def _builds_options_by_hand(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if not name.endswith("ControllerOptions"):
            continue
        for keyword in node.keywords:
            value = keyword.value
            if isinstance(value, ast.Attribute) and value.attr in {"workers", "worker_threads"}:
                return True
            if (
                keyword.arg is None
                and isinstance(value, ast.Call)
                and getattr(value.func, "attr", "") == "leader_election_fields"
            ):
                return True
    return False


def test_entry_points_build_controller_options_from_the_flags_in_one_place() -> None:
    src = Path(__file__).resolve().parents[2] / "src"
    found = {
        path.relative_to(src).as_posix()
        for path in (src / "pyprovlib").rglob("*.py")
        if _builds_options_by_hand(path)
    }
    assert not found - BUILT_BY_HAND, (
        f"build the options in {found - BUILT_BY_HAND} with pyprovlib.runtime.*_controller_options"
    )
    assert not BUILT_BY_HAND - found, f"migrated: take {BUILT_BY_HAND - found} off BUILT_BY_HAND"


def test_the_by_hand_check_sees_a_by_hand_build(tmp_path: Path) -> None:
    sample = tmp_path / "entry.py"
    sample.write_text("ProvisionControllerOptions(workers=ctx.options.workers)\n", encoding="utf-8")
    assert _builds_options_by_hand(sample)
    sample.write_text("provision_controller_options(ctx.options)\n", encoding="utf-8")
    assert not _builds_options_by_hand(sample)


def test_the_common_flag_defaults_are_the_librarys_but_for_leader_election() -> None:
    # The common flags carry sig-storage-lib-external-provisioner's defaults (4 workers,
    # Lease 15 s / 10 s / 2 s); only --leader-election differs, false as in every CSI sidecar.
    # (The sidecars raise --worker-threads and the retry period through common_parser's
    # defaults, to their own upstream values.)
    library = ProvisionControllerOptions()
    common = flags([])
    assert common.workers == library.workers == 4
    assert common.leader_election_lease_duration == library.lease_duration == 15.0
    assert common.leader_election_renew_deadline == library.renew_deadline == 10.0
    assert common.leader_election_retry_period == library.retry_period == 2.0
    assert (common.leader_election, library.leader_election) == (False, True)
