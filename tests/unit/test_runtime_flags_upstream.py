"""Drop-in use with upstream manifests: full flag names only, klog's -v, and the upstream
flags pyprovlib does not implement rejected by name in one line."""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyprovlib.runtime import common_parser
from pyprovlib.runtime._flags import KLOG_DEBUG_VERBOSITY, UNSUPPORTED_UPSTREAM_FLAGS, parse_common

SRC = Path(__file__).resolve().parents[2] / "src" / "pyprovlib"


def parser() -> argparse.ArgumentParser:
    p = common_parser("test-prog", "A test.")
    p.environ = {}
    return p


def test_a_prefix_of_a_flag_is_an_error_not_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    p = parser()
    p.add_argument("--timeout")
    with pytest.raises(SystemExit) as exit_info:
        parse_common(p, ["--time=1s"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --time=1s" in capsys.readouterr().err
    # --v is a flag of its own, not an ambiguous prefix of --version/--volume-name-prefix.
    options, _ = parse_common(parser(), ["--v=2"])
    assert options.v == 2


def test_every_argument_parser_in_src_turns_abbreviations_off() -> None:
    offenders = []
    for path in SRC.rglob("*.py"):
        if "_proto" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "ArgumentParser"
                and not any(k.arg == "allow_abbrev" for k in node.keywords)
            ):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert offenders == []


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        ([], "info"),
        (["--v=5"], "debug"),
        (["--v", "4"], "debug"),
        (["-v", "4"], "debug"),
        (["-v=6"], "debug"),
        (["-v3"], "info"),
        (["--v=2"], "info"),
        (["--v=0", "--log-level=warning"], "warning"),
        (["--v=3", "--log-level=debug"], "debug"),
        (["--v=5", "--log-level=error"], "debug"),
    ],
)
def test_klog_verbosity_maps_onto_the_log_level(argv: list[str], level: str) -> None:
    options, _ = parse_common(parser(), argv)
    assert options.log_level == level


def test_klog_verbosity_threshold_is_the_debug_level_of_the_conventions() -> None:
    assert KLOG_DEBUG_VERBOSITY == 4
    options, _ = parse_common(parser(), [f"--v={KLOG_DEBUG_VERBOSITY - 1}"])
    assert options.log_level == "info"


def test_a_negative_verbosity_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_common(parser(), ["--v=-1"])
    assert "--v" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["--enable-pprof"],
        ["--enable-pprof=true"],
        ["--logtostderr"],
    ],
)
def test_unsupported_upstream_flags_are_rejected_by_name_in_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_common(parser(), ["--v=5", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    name = argv[0].split("=", 1)[0].lstrip("-")
    assert err.count("\n") == 1, err
    assert err.startswith("test-prog: error: --" + name + " is an upstream flag")
    assert "not support" in err
    assert "usage:" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--feature-gates=Topology=true"],
        ["--feature-gates", "Topology=true"],
        ["-feature-gates=Topology=true"],
        ["--feature-gates=Topology=True,"],
    ],
)
def test_the_topology_gate_upstream_manifests_pass_is_accepted(argv: list[str]) -> None:
    options, _ = parse_common(parser(), ["--v=5", *argv, "--worker-threads=3"])
    assert (options.log_level, options.workers) == ("debug", 3)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--feature-gates=Topology=true,Foo=true"],
            "--feature-gates names 'Foo', a feature gate pyprovlib does not have "
            "(Topology=true is accepted, as always on); remove it",
        ),
        (
            ["--feature-gates", "Topology=false"],
            "--feature-gates=Topology=false cannot be honoured: topology is always on in pyprovlib",
        ),
        (["--feature-gates=Topology=maybe"], "'Topology=maybe' is not Topology=true|false"),
    ],
)
def test_other_feature_gates_are_refused_naming_the_gate_in_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_common(parser(), argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("test-prog: error: ")
    assert message in err


def test_flags_pyprovlib_implements_are_not_in_the_unsupported_table() -> None:
    from pyprovlib.csi.attacher import _options as attacher
    from pyprovlib.csi.provisioner._options import build_parser
    from pyprovlib.csi.resizer import _options as resizer

    implemented: set[str] = set()
    for p in (build_parser(), attacher.parser(), resizer.parser()):
        implemented.update(re.findall(r"--[a-z][a-z0-9-]*", p.format_help()))
    assert "--extra-create-metadata" in implemented
    assert implemented & set(UNSUPPORTED_UPSTREAM_FLAGS) == set()
    # The provisioner's upstream-compatible flags parse.
    options, ns = parse_common(
        build_parser(),
        ["--extra-create-metadata", "--v=5", "--leader-election", "--timeout=30s"],
    )
    assert ns.extra_create_metadata is True
    assert options.log_level == "debug"


def test_the_provisioner_takes_external_provisioners_capacity_flags() -> None:
    from pyprovlib.csi.provisioner._options import build_parser

    _, defaults = parse_common(build_parser(), [])
    assert (
        defaults.enable_capacity,
        defaults.capacity_threads,
        defaults.capacity_poll_interval,
        defaults.capacity_for_immediate_binding,
        defaults.capacity_ownerref_level,
        defaults.kube_api_capacity_qps,
        defaults.kube_api_capacity_burst,
    ) == (False, 1, 60.0, False, 1, 1.0, 5)
    _, ns = parse_common(
        build_parser(),
        [
            "--enable-capacity",
            "--capacity-threads=3",
            "--capacity-poll-interval=30s",
            "--capacity-for-immediate-binding=true",
            "--capacity-ownerref-level=-1",
            "--kube-api-capacity-qps=2.5",
            "--kube-api-capacity-burst=7",
        ],
    )
    assert (
        ns.enable_capacity,
        ns.capacity_threads,
        ns.capacity_poll_interval,
        ns.capacity_for_immediate_binding,
        ns.capacity_ownerref_level,
        ns.kube_api_capacity_qps,
        ns.kube_api_capacity_burst,
    ) == (True, 3, 30.0, True, -1, 2.5, 7)


@pytest.mark.parametrize(
    "module", ["pyprovlib.csi.provisioner", "pyprovlib.csi.attacher", "pyprovlib.csi.resizer"]
)
def test_sidecar_processes_reject_an_upstream_only_flag_without_a_usage_dump(module: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", module, "--v=5", "--feature-gates=Foo=true"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].endswith(
        ": error: --feature-gates names 'Foo', a feature gate pyprovlib does not have "
        "(Topology=true is accepted, as always on); remove it"
    )


# Every upstream flag still refused, each for its reason (see UNSUPPORTED_UPSTREAM_FLAGS).
# Issue 28 takes a feature's flags off as the feature lands; what stays for good is pprof,
# feature gates, klog's output flags and the flags removed upstream.
STILL_REFUSED = frozenset(
    {
        # no counterpart, or removed upstream
        "--enable-pprof",
        "--feature-gates",
        "--master",
        "--connection-timeout",
        "--provisioner",
        "--leader-election-type",
        "--enable-leader-election",
        "--max-grpc-log-length",
        # klog / component-base logging
        "--logtostderr",
        "--alsologtostderr",
        "--log-dir",
        "--log-file",
        "--log-file-max-size",
        "--log-flush-frequency",
        "--stderrthreshold",
        "--vmodule",
        "--skip-headers",
        "--skip-log-headers",
        "--add-dir-header",
        "--one-output",
        "--log-backtrace-at",
        "--log_backtrace_at",
        "--logging-format",
        "--log-json-split-stream",
        "--log-json-info-buffer-size",
    }
)


def test_the_upstream_flags_still_refused_are_these() -> None:
    assert set(UNSUPPORTED_UPSTREAM_FLAGS) == STILL_REFUSED


def test_cloning_protection_and_publish_readonly_flags_are_the_provisioners() -> None:
    from pyprovlib.csi import _combined as combined
    from pyprovlib.csi.provisioner._options import build_parser, provisioner_options

    _, ns = parse_common(build_parser(), [])
    assert ns.cloning_protection_threads == 1  # upstream's default
    assert provisioner_options(ns).controller_publish_readonly is False
    argv = ["--cloning-protection-threads=4", "--controller-publish-readonly"]
    _, ns = parse_common(build_parser(), argv)
    assert ns.cloning_protection_threads == 4
    assert provisioner_options(ns).controller_publish_readonly is True
    # python -m pyprovlib.csi hands them to its provisioner.
    _, ns = parse_common(combined.build_parser(), argv)
    assert ns.sidecar_args["provisioner"].cloning_protection_threads == 4
    assert ns.sidecar_args["provisioner"].controller_publish_readonly is True


def test_no_cloning_protection_worker_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pyprovlib.csi.provisioner._options import build_parser

    with pytest.raises(SystemExit) as exit_info:
        parse_common(build_parser(), ["--cloning-protection-threads=0"])
    assert exit_info.value.code == 2
    assert "--cloning-protection-threads" in capsys.readouterr().err


def test_extra_modify_metadata_is_the_resizers() -> None:
    from pyprovlib.csi import _combined as combined
    from pyprovlib.csi.resizer._options import parser

    _, ns = parse_common(parser(), [])
    assert ns.extra_modify_metadata is False  # upstream's default
    _, ns = parse_common(parser(), ["--extra-modify-metadata"])
    assert ns.extra_modify_metadata is True
    # python -m pyprovlib.csi hands it to its resizer (and so to the modify controller).
    _, ns = parse_common(combined.build_parser(), ["--extra-modify-metadata=true"])
    assert ns.sidecar_args["resizer"].extra_modify_metadata is True
