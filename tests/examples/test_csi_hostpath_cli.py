"""``python -m pyprovlib.examples.csi_hostpath``'s command line on pyprovlib.runtime's parser:
``--help`` shows every default and environment variable, Go-style booleans, the variables
upstream's manifests set, and a bad endpoint or state directory ends in one line naming the
flag, the path and the fix (issue 30: they said ``[Errno 2] No such file or directory``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from example_support import help_documents_every_flag, run_module

from pyprovlib import __version__
from pyprovlib.examples.csi_hostpath._cli import PROG, build_parser, main

MODULE = "pyprovlib.examples.csi_hostpath"


async def test_help_shows_defaults_environment_and_go_booleans() -> None:
    text = await help_documents_every_flag("csi_hostpath", build_parser())
    assert "--enable-attach [true|false]" in text
    assert "[ENABLE_ATTACH]" not in text
    assert "(default: unix:///tmp/csi.sock; env: PYPROVLIB_ENDPOINT, CSI_ENDPOINT)" in text
    assert "env: PYPROVLIB_NODEID, KUBE_NODE_NAME" in text
    assert "(default: 1Ti; env: PYPROVLIB_CAPACITY)" in text


async def test_version() -> None:
    code, out, _ = await run_module("-m", MODULE, "--version")
    assert code == 0
    assert out.strip() == f"{PROG} 0.1.0 (pyprovlib {__version__})"


def test_flags_come_from_the_environment_and_the_command_line_wins() -> None:
    parser = build_parser()
    parser.environ = {
        "CSI_ENDPOINT": "unix:///csi/csi.sock",
        "KUBE_NODE_NAME": "node-7",
        "PYPROVLIB_ENABLE_ATTACH": "true",
        "PYPROVLIB_CAPACITY": "10Gi",
    }
    args = parser.parse_args([])
    assert (args.endpoint, args.nodeid, args.enable_attach) == (
        "unix:///csi/csi.sock",
        "node-7",
        True,
    )
    assert args.capacity == 10 * 1024**3
    assert parser.parse_args(["--nodeid=n1", "--enable-attach=false"]).nodeid == "n1"
    assert parser.parse_args(["--enable-attach=false"]).enable_attach is False


def one_line(capsys: pytest.CaptureFixture[str], code: int) -> str:
    assert code == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"{PROG}: error: ")
    return lines[0]


def test_an_endpoint_in_a_missing_directory_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = f"unix://{tmp_path}/nonexistent/dir/x.sock"
    code = main(["--nodeid", "n", "--endpoint", endpoint, "--statedir", str(tmp_path / "s")])
    line = one_line(capsys, code)
    assert f"--endpoint {endpoint}: the socket's directory {tmp_path}/nonexistent/dir " in line
    assert "does not exist; create it" in line


def test_a_state_directory_that_is_a_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    base = ["--nodeid", "n", "--endpoint", f"unix://{tmp_path}/csi.sock"]
    line = one_line(capsys, main([*base, "--statedir", str(a_file)]))
    assert line.endswith(f"--statedir {a_file}: exists and is not a directory; name a directory")
    below = a_file / "state"
    line = one_line(capsys, main([*base, "--statedir", str(below)]))
    assert f"--statedir {below}: cannot make the directory (not a directory)" in line


def test_a_missing_node_id_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser_env_free = ["--endpoint", f"unix://{tmp_path}/csi.sock", "--nodeid", " "]
    line = one_line(capsys, main(parser_env_free))
    assert "--nodeid is required (or KUBE_NODE_NAME)" in line


async def test_the_process_says_it_in_one_line_without_a_traceback(tmp_path: Path) -> None:
    code, out, err = await run_module(
        "-m",
        MODULE,
        "--nodeid=n",
        "--endpoint=unix:///nonexistent/dir/x.sock",
        f"--statedir={tmp_path / 'state'}",
    )
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    assert "/nonexistent/dir does not exist" in err
    assert not (tmp_path / "state").exists()  # nothing made before the endpoint was checked
