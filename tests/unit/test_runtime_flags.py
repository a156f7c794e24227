"""Flags and environment variables of pyprovlib.runtime: Go syntax, precedence, --help."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyprovlib._version import __version__
from pyprovlib.kube._config import ClientSettings
from pyprovlib.kube._leaderelection import LeaderElectionConfig
from pyprovlib.runtime import CommonOptions, RuntimeArgumentParser, add_flag, common_parser
from pyprovlib.runtime._flag_parser import (
    ENV_PREFIX,
    add_bool_flag,
    add_duration_flag,
    env_name,
    env_prefix_for,
)
from pyprovlib.runtime._flag_values import (
    HttpAddress,
    format_duration,
    parse_bool,
    parse_duration,
    parse_http_address,
)
from pyprovlib.runtime._flags import parse_common

COMMON_FLAGS = [
    "--kubeconfig",
    "--kube-api-qps",
    "--kube-api-burst",
    "--leader-election",
    "--leader-election-namespace",
    "--leader-election-lease-duration",
    "--leader-election-renew-deadline",
    "--leader-election-retry-period",
    "--http-endpoint",
    "--metrics-address",
    "--metrics-path",
    "--log-format",
    "--log-level",
    "--worker-threads",
    "--shutdown-grace-period",
]


def parser_with(env: dict[str, str] | None = None, **defaults: object) -> RuntimeArgumentParser:
    # pyprovlib's own prefix, as its entry points use it; a program's own prefix is tested below.
    parser = common_parser("test-prog", "A test.", env_prefix=ENV_PREFIX, defaults=defaults or None)
    parser.environ = env or {}
    return parser


def parse(argv: list[str], env: dict[str, str] | None = None) -> CommonOptions:
    options, _ = parse_common(parser_with(env), argv)
    return options


# --- durations -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("15s", 15.0),
        ("1m30s", 90.0),
        ("500ms", 0.5),
        ("1h", 3600.0),
        ("1.5h", 5400.0),
        ("2h45m", 9900.0),
        ("0", 0.0),
        ("0s", 0.0),
        ("300us", 0.0003),
        ("300µs", 0.0003),  # Go's micro sign
        ("10ns", 1e-8),
        ("1h1m1s1ms", 3661.001),
        ("+5s", 5.0),
        (".5s", 0.5),
    ],
)
def test_parse_duration_accepts_go_syntax(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["15", "abc", "-1s", "", "1x", "s", "1s2", "1 s", "1d"])
def test_parse_duration_rejects_invalid(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="invalid duration"):
        parse_duration(text)


def test_parse_duration_reports_missing_unit() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="missing unit"):
        parse_duration("30")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (15.0, "15s"),
        (90.0, "1m30s"),
        (0.5, "500ms"),
        (3600.0, "1h0m0s"),
        (0.0, "0s"),
        (2.5, "2.5s"),
    ],
)
def test_format_duration_is_go_like(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.integers(min_value=0, max_value=10 * 24 * 3600 * 1000))
def test_duration_round_trip(millis: int) -> None:
    seconds = millis / 1000
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, abs=1e-9)


def test_duration_flag_error_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(["--leader-election-lease-duration=15"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--leader-election-lease-duration" in err
    assert "missing unit" in err


def test_duration_flags_parse_to_seconds() -> None:
    options = parse(
        [
            "--leader-election-lease-duration=1m",
            "--leader-election-renew-deadline",
            "45s",
            "--leader-election-retry-period=500ms",
            "--shutdown-grace-period=2m30s",
        ]
    )
    assert options.leader_election_lease_duration == 60.0
    assert options.leader_election_renew_deadline == 45.0
    assert options.leader_election_retry_period == 0.5
    assert options.shutdown_grace_period == 150.0


# --- booleans ------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["1", "t", "T", "TRUE", "true", "True"])
def test_parse_bool_true(text: str) -> None:
    assert parse_bool(text) is True


@pytest.mark.parametrize("text", ["0", "f", "F", "FALSE", "false", "False"])
def test_parse_bool_false(text: str) -> None:
    assert parse_bool(text) is False


@pytest.mark.parametrize("text", ["yes", "no", "", "tRuE", "2"])
def test_parse_bool_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_bool(text)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], False),
        (["--leader-election"], True),
        (["--leader-election=true"], True),
        (["--leader-election=false"], False),
        (["--leader-election=0"], False),
        (["--leader-election=T"], True),
        (["--leader-election", "--log-level=debug"], True),
    ],
)
def test_leader_election_is_a_go_bool_flag(argv: list[str], expected: bool) -> None:
    assert parse(argv).leader_election is expected


def test_bool_flag_rejects_garbage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(["--leader-election=maybe"])
    assert exc.value.code == 2
    assert "invalid boolean 'maybe'" in capsys.readouterr().err


# --- defaults and environment --------------------------------------------------------------


def test_defaults_match_the_sidecars() -> None:
    options = parse([])
    assert options == CommonOptions()
    assert options.kubeconfig is None
    assert options.leader_election is False
    assert options.leader_election_lease_duration == 15.0
    assert options.leader_election_renew_deadline == 10.0
    assert options.leader_election_retry_period == 2.0
    assert options.kube_api_qps == 5.0
    assert options.kube_api_burst == 10
    assert options.http_endpoint == ""
    assert options.metrics_address == ""
    assert options.metrics_path == "/metrics"
    assert options.log_format == "auto"
    assert options.log_level == "info"
    assert options.workers == 4
    assert options.shutdown_grace_period == 30.0
    assert options.http_address is None


def test_env_names_follow_the_prefix_rule() -> None:
    assert env_name("--kube-api-qps") == "PYPROVLIB_KUBE_API_QPS"
    parser = common_parser("p", "d", env_prefix=ENV_PREFIX)
    bindings = parser.env_bindings
    for flag in COMMON_FLAGS:
        dest = flag.lstrip("-").replace("-", "_")
        assert bindings[dest][0] == env_name(flag)
    assert bindings["leader_election_namespace"] == (
        "PYPROVLIB_LEADER_ELECTION_NAMESPACE",
        "POD_NAMESPACE",
    )


def test_environment_sets_values() -> None:
    env = {
        "PYPROVLIB_KUBECONFIG": "/tmp/kc",
        "PYPROVLIB_KUBE_API_QPS": "20",
        "PYPROVLIB_KUBE_API_BURST": "40",
        "PYPROVLIB_LEADER_ELECTION": "true",
        "PYPROVLIB_LEADER_ELECTION_LEASE_DURATION": "30s",
        "PYPROVLIB_LEADER_ELECTION_RENEW_DEADLINE": "20s",
        "PYPROVLIB_LEADER_ELECTION_RETRY_PERIOD": "5s",
        "PYPROVLIB_HTTP_ENDPOINT": ":9808",
        "PYPROVLIB_METRICS_PATH": "/m",
        "PYPROVLIB_LOG_FORMAT": "console",
        "PYPROVLIB_LOG_LEVEL": "debug",
        "PYPROVLIB_WORKER_THREADS": "16",
        "PYPROVLIB_SHUTDOWN_GRACE_PERIOD": "1m",
    }
    options = parse([], env)
    assert options == CommonOptions(
        kubeconfig="/tmp/kc",
        leader_election=True,
        leader_election_lease_duration=30.0,
        leader_election_renew_deadline=20.0,
        leader_election_retry_period=5.0,
        kube_api_qps=20.0,
        kube_api_burst=40,
        http_endpoint=":9808",
        metrics_path="/m",
        log_format="console",
        log_level="debug",
        workers=16,
        shutdown_grace_period=60.0,
    )


def test_flag_beats_env_beats_default() -> None:
    env = {"PYPROVLIB_KUBE_API_QPS": "20", "PYPROVLIB_LEADER_ELECTION": "true"}
    assert parse([], {}).kube_api_qps == 5.0
    assert parse([], env).kube_api_qps == 20.0
    assert parse(["--kube-api-qps=50"], env).kube_api_qps == 50.0
    assert parse(["--leader-election=false"], env).leader_election is False
    assert parse([], env).leader_election is True


def test_leader_election_namespace_precedence() -> None:
    env = {"POD_NAMESPACE": "pod-ns"}
    assert parse([], env).leader_election_namespace == "pod-ns"
    env["PYPROVLIB_LEADER_ELECTION_NAMESPACE"] = "le-ns"
    assert parse([], env).leader_election_namespace == "le-ns"
    assert parse(["--leader-election-namespace=flag-ns"], env).leader_election_namespace == (
        "flag-ns"
    )


def test_empty_env_value_counts_as_unset() -> None:
    assert parse([], {"PYPROVLIB_KUBE_API_QPS": ""}).kube_api_qps == 5.0


def test_real_process_environment_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYPROVLIB_WORKER_THREADS", "7")
    parser = common_parser(
        "p", "d", env_prefix=ENV_PREFIX
    )  # environ None: os.environ at parse time
    options, _ = parse_common(parser, [])
    assert options.workers == 7


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("PYPROVLIB_KUBE_API_QPS", "fast", "invalid number"),
        ("PYPROVLIB_LEADER_ELECTION", "yes", "invalid boolean"),
        ("PYPROVLIB_SHUTDOWN_GRACE_PERIOD", "30", "missing unit"),
        ("PYPROVLIB_LOG_FORMAT", "xml", "invalid choice"),
        ("PYPROVLIB_WORKER_THREADS", "0", "at least 1"),
    ],
)
def test_invalid_env_is_a_usage_error_naming_the_variable(
    var: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse([], {var: value})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert var in err
    assert message in err


def test_invalid_env_is_reported_even_when_a_flag_overrides_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The environment is validated even when a flag overrides it, so a broken Deployment
    # manifest is noticed instead of lurking.
    with pytest.raises(SystemExit):
        parse(["--kube-api-qps=3"], {"PYPROVLIB_KUBE_API_QPS": "fast"})
    assert "PYPROVLIB_KUBE_API_QPS" in capsys.readouterr().err


def test_entry_point_defaults_override() -> None:
    parser = parser_with(worker_threads=100, leader_election_retry_period="5s")
    options, _ = parse_common(parser, [])
    assert options.workers == 100
    assert options.leader_election_retry_period == 5.0
    help_text = parser.format_help()
    assert "default: 100" in help_text
    assert "default: 5s" in help_text


def test_unknown_default_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown default 'workers'"):
        common_parser("p", "d", defaults={"workers": 3})


def test_entry_point_flags_get_env_and_help() -> None:
    parser = parser_with({"NODE_NAME": "node-1", "PYPROVLIB_FS_TYPE": "xfs"})
    add_flag(parser, "--node-name", default="", help="this node", env=("NODE_NAME",))
    add_flag(parser, "--fs-type", default="ext4", help="filesystem")
    add_bool_flag(parser, "--extra-create-metadata", default=False, help="add metadata")
    add_duration_flag(parser, "--retry-interval-max", default=300, help="max backoff")
    options, args = parse_common(parser, ["--extra-create-metadata"])
    assert args.node_name == "node-1"
    assert args.fs_type == "xfs"
    assert args.extra_create_metadata is True
    assert args.retry_interval_max == 300.0
    assert options.workers == 4
    help_text = parser.format_help()
    assert "env: NODE_NAME" in help_text
    assert "PYPROVLIB_FS_TYPE" in help_text
    assert "default: 5m0s" in help_text


# --- validation ----------------------------------------------------------------------------


def test_http_endpoint_and_metrics_address_are_exclusive(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(["--http-endpoint=:8080", "--metrics-address=:8081"])
    assert exc.value.code == 2
    assert "only one of --metrics-address and --http-endpoint" in capsys.readouterr().err


def test_metrics_address_serves_metrics_only() -> None:
    options = parse(["--metrics-address=127.0.0.1:9090"])
    assert options.http_address == HttpAddress("127.0.0.1", 9090)
    assert options.serve_health is False
    options = parse(["--http-endpoint=:8080"])
    assert options.http_address == HttpAddress(None, 8080)
    assert options.serve_health is True


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (":8080", HttpAddress(None, 8080)),
        ("0.0.0.0:80", HttpAddress("0.0.0.0", 80)),
        ("127.0.0.1:0", HttpAddress("127.0.0.1", 0)),
        ("[::1]:9090", HttpAddress("::1", 9090)),
        ("localhost:8080", HttpAddress("localhost", 8080)),
    ],
)
def test_parse_http_address(text: str, expected: HttpAddress) -> None:
    assert parse_http_address(text) == expected
    assert parse_http_address(str(expected)) == expected


@pytest.mark.parametrize("text", ["8080", "host:", ":http", ":70000", "::1:80", "[::1]80"])
def test_parse_http_address_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="invalid address"):
        parse_http_address(text)


def test_bad_http_endpoint_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(["--http-endpoint=8080"])
    assert "--http-endpoint" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--worker-threads=0"], "at least 1"),
        (["--log-level=trace"], "invalid choice"),
        (["--metrics-path=metrics"], "must start with '/'"),
        (
            ["--leader-election", "--leader-election-lease-duration=10s"],
            "lease-duration must be greater",
        ),
        (
            ["--leader-election", "--leader-election-retry-period=9s"],
            "renew-deadline must be greater",
        ),
        (["--kube-api-burst=0"], "--kube-api-burst must be at least 1"),
    ],
)
def test_invalid_values_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_leader_election_timings_unchecked_when_off() -> None:
    # client-go only checks them when a LeaderElector is built.
    assert parse(["--leader-election-lease-duration=1s"]).leader_election is False


# --- --help and --version ------------------------------------------------------------------


def test_help_lists_every_flag_with_default_and_env(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "500")  # one line per flag
    with pytest.raises(SystemExit) as exc:
        parse(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    expected_defaults = {
        "--kubeconfig": "none",
        "--kube-api-qps": "5.0",
        "--kube-api-burst": "10",
        "--leader-election": "false",
        "--leader-election-namespace": "''",
        "--leader-election-lease-duration": "15s",
        "--leader-election-renew-deadline": "10s",
        "--leader-election-retry-period": "2s",
        "--http-endpoint": "''",
        "--metrics-address": "''",
        "--metrics-path": "/metrics",
        "--log-format": "auto",
        "--log-level": "info",
        "--worker-threads": "4",
        "--shutdown-grace-period": "30s",
    }
    assert set(expected_defaults) == set(COMMON_FLAGS)
    # One block per option: its invocation line and the indented help lines under it.
    blocks: dict[str, str] = {}
    for block in re.split(r"\n(?=  -)", out):
        match = re.match(r"\s+(--[\w-]+)", block)
        if match:
            blocks[match.group(1)] = " ".join(block.split())
    for flag, default in expected_defaults.items():
        assert flag in blocks, f"{flag} missing from --help"
        assert f"(default: {default}; env: {env_name(flag)}" in blocks[flag], blocks[flag]
    assert "--version" in out


def test_version_without_a_program_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"test-prog (pyprovlib {__version__})"


# --- a program of one's own: its name, version and environment prefix ----------------------


def test_a_program_of_its_own_has_its_name_version_and_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    parser = common_parser("my-provisioner", "Mine.", version="2.3.0")
    add_flag(parser, "--root", default="/var/lib/mine", help="where volumes go")
    parser.environ = {"MY_PROVISIONER_ROOT": "/srv", "PYPROVLIB_WORKER_THREADS": "9"}
    options, ns = parse_common(parser, [])
    assert ns.root == "/srv"
    assert options.workers == 4  # pyprovlib's own variables are not the program's
    parser.environ = {"MY_PROVISIONER_WORKER_THREADS": "9"}
    assert parse_common(parser, [])[0].workers == 9

    with pytest.raises(SystemExit):
        parser.parse_args(["--version"])
    assert capsys.readouterr().out.strip() == f"my-provisioner 2.3.0 (pyprovlib {__version__})"

    monkeypatch.setenv("COLUMNS", "500")
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    out = capsys.readouterr().out
    # The program's own flags have a section of their own, titled with its name, after the
    # common ones.
    own = out.split("\nmy-provisioner:\n", 1)[1]
    assert "--root" in own
    assert "env: MY_PROVISIONER_ROOT" in own
    assert "--kubeconfig" not in own
    assert "env: MY_PROVISIONER_KUBECONFIG" in out
    assert "PYPROVLIB_" not in out


@pytest.mark.parametrize(
    ("prog", "prefix"),
    [
        ("my-provisioner", "MY_PROVISIONER_"),
        ("my_provisioner.py", "MY_PROVISIONER_"),
        ("/usr/local/bin/nas-csi", "NAS_CSI_"),
        ("python -m acme.storage", "ACME_STORAGE_"),
    ],
)
def test_the_environment_prefix_comes_from_the_program_name(prog: str, prefix: str) -> None:
    assert env_prefix_for(prog) == prefix
    assert common_parser(prog, "x").env_prefix == prefix


def test_an_explicit_environment_prefix_wins_and_is_checked() -> None:
    assert common_parser("my-provisioner", "x", env_prefix="ACME_").env_prefix == "ACME_"
    with pytest.raises(ValueError, match="env_prefix"):
        common_parser("my-provisioner", "x", env_prefix="1-BAD")
    with pytest.raises(ValueError, match="environment prefix"):
        env_prefix_for("...")


# --- conversions to the other modules' settings --------------------------------------------


def test_client_settings() -> None:
    options = parse(["--kubeconfig=/k", "--kube-api-qps=7.5", "--kube-api-burst=15"])
    settings = options.client_settings()
    assert isinstance(settings, ClientSettings)
    assert (settings.kubeconfig, settings.qps, settings.burst) == ("/k", 7.5, 15)


def test_leader_election_config() -> None:
    options = parse(
        ["--leader-election", "--leader-election-lease-duration=20s"],
        {"POD_NAMESPACE": "storage"},
    )
    config = options.leader_election_config("example-com-provisioner")
    assert isinstance(config, LeaderElectionConfig)
    assert config.lease_name == "example-com-provisioner"
    assert config.namespace == "storage"
    assert (config.lease_duration, config.renew_deadline, config.retry_period) == (20, 10, 2)
    assert config.release_on_cancel is True


def test_leader_election_fields_fill_every_controllers_options() -> None:
    from pyprovlib import (
        AttachControllerOptions,
        ProvisionControllerOptions,
        ResizeControllerOptions,
    )

    options = parse(
        [
            "--leader-election",
            "--leader-election-lease-duration=20s",
            "--leader-election-renew-deadline=12s",
            "--leader-election-retry-period=3s",
        ],
        {"POD_NAMESPACE": "storage"},
    )
    fields = options.leader_election_fields()
    assert fields == {
        "leader_election": True,
        "leader_election_namespace": "storage",
        "lease_duration": 20.0,
        "renew_deadline": 12.0,
        "retry_period": 3.0,
    }
    for options_class in (
        ProvisionControllerOptions,
        AttachControllerOptions,
        ResizeControllerOptions,
    ):
        built = options_class(**fields)
        assert built.leader_election is True
        assert built.leader_election_namespace == "storage"
        assert (built.lease_duration, built.renew_deadline, built.retry_period) == (20, 12, 3)


def test_leader_election_namespace_falls_back_to_default() -> None:
    if Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace").exists():
        pytest.skip("running in a pod: the service account namespace applies")
    assert parse([]).resolved_leader_election_namespace() == "default"
    assert parse([]).leader_election_config("l").namespace == "default"
