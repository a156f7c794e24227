"""Tests for pyprovlib.examples._paths: path validation and symlink-safe directory operations
on real temporary directories."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from example_support import umask
from hypothesis import given
from hypothesis import strategies as st

from pyprovlib.examples._paths import (
    UnsafePathError,
    archive_beneath,
    make_directory_beneath,
    remove_beneath,
    split_relative_path,
    validate_base_path,
    validate_component,
)


@pytest.mark.parametrize(
    "value",
    [
        "/var/pyprovlib/local",
        "/a",
        "/mnt/disk-1/volumes",
    ],
)
def test_valid_base_paths(value: str) -> None:
    assert validate_base_path(value) == value


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("/", "root directory"),
        ("relative/path", "absolute"),
        ("", "absolute"),
        ("/a/../b", "'..'"),
        ("/a/..", "'..'"),
        ("/a/./b", "not normalized"),
        ("/a//b", "not normalized"),
        ("//a", "not normalized"),
        ("/a/", "not normalized"),
        ("/a\x00b", "NUL"),
        ("/" + "x" * 300, "longer than 255"),
        ("/a" * 2100, "longer than 4096"),
    ],
)
def test_invalid_base_paths(value: str, fragment: str) -> None:
    with pytest.raises(UnsafePathError, match=fragment.replace(".", r"\.")):
        validate_base_path(value, "basePath")


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a\x00", "x" * 256])
def test_invalid_components(name: str) -> None:
    with pytest.raises(UnsafePathError):
        validate_component(name)


def test_component_limit_counts_bytes() -> None:
    assert validate_component("x" * 255) == "x" * 255
    with pytest.raises(UnsafePathError):
        validate_component("é" * 128)  # 256 bytes in UTF-8


@pytest.mark.parametrize(
    ("value", "parts"),
    [
        ("a", ("a",)),
        ("a/b", ("a", "b")),
        ("a//b/", ("a", "b")),
        ("./a/./b", ("a", "b")),
        ("", ()),
    ],
)
def test_split_relative(value: str, parts: tuple[str, ...]) -> None:
    assert split_relative_path(value) == parts


@pytest.mark.parametrize("value", ["../x", "a/../../x", "/etc", "a/\x00", "a/" + "y" * 300])
def test_split_relative_rejects(value: str) -> None:
    with pytest.raises(UnsafePathError):
        split_relative_path(value)


@given(st.text(alphabet=st.sampled_from(["a", "/", ".", "\x00", "é"]), max_size=30))
def test_split_never_yields_escaping_components(value: str) -> None:
    try:
        parts = split_relative_path(value)
    except UnsafePathError:
        return
    for part in parts:
        assert part not in ("", ".", "..")
        assert "/" not in part
        assert "\x00" not in part


def test_make_directory_sets_mode_despite_umask(tmp_path: Path) -> None:
    with umask(0o077):
        made = make_directory_beneath(str(tmp_path), ["a", "b"], 0o777)
    assert made == str(tmp_path / "a" / "b")
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o777
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o777
    # Idempotent, and applies a new mode to the existing leaf.
    make_directory_beneath(str(tmp_path), ["a", "b"], 0o750)
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o750


def test_make_directory_refuses_symlink_escape(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        make_directory_beneath(str(root), ["link", "victim"], 0o777)
    assert list(outside.iterdir()) == []


def test_make_directory_refuses_file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(UnsafePathError, match="not a directory"):
        make_directory_beneath(str(tmp_path), ["f", "d"], 0o777)


def test_make_directory_needs_root(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        make_directory_beneath(str(tmp_path / "missing"), ["d"], 0o777)
    assert not (tmp_path / "missing").exists()


def test_refuses_the_root_itself(tmp_path: Path) -> None:
    with pytest.raises(UnsafePathError):
        remove_beneath(str(tmp_path), [])


def test_remove(tmp_path: Path) -> None:
    (tmp_path / "v" / "sub").mkdir(parents=True)
    (tmp_path / "v" / "sub" / "file").write_text("data")
    assert remove_beneath(str(tmp_path), ["v"]) is True
    assert not (tmp_path / "v").exists()
    assert remove_beneath(str(tmp_path), ["v"]) is False
    assert remove_beneath(str(tmp_path), ["no", "such"]) is False


def test_remove_does_not_follow_symlinks(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    (root / "v").mkdir(parents=True)
    outside.mkdir()
    (outside / "precious").write_text("keep")
    (root / "v" / "escape").symlink_to(outside)
    (root / "alias").symlink_to(outside)
    assert remove_beneath(str(root), ["v"]) is True
    assert remove_beneath(str(root), ["alias"]) is True  # the link goes, not its target
    assert (outside / "precious").read_text() == "keep"
    (root / "alias").symlink_to(outside)
    with pytest.raises(UnsafePathError):
        remove_beneath(str(root), ["alias", "precious"])
    assert (outside / "precious").exists()


def test_archive(tmp_path: Path) -> None:
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "f").write_text("data")
    dest = archive_beneath(str(tmp_path), ["v"], "archived-v")
    assert dest == str(tmp_path / "archived-v")
    assert (tmp_path / "archived-v" / "f").read_text() == "data"
    assert archive_beneath(str(tmp_path), ["v"], "archived-v") is None
    (tmp_path / "v").mkdir()
    with pytest.raises(FileExistsError):
        archive_beneath(str(tmp_path), ["v"], "archived-v")
    with pytest.raises(UnsafePathError):
        archive_beneath(str(tmp_path), ["v"], "../escape")


def test_missing_root_is_an_error_not_success(tmp_path: Path) -> None:
    # "Already gone" must not be reported when the root itself is missing (an unmounted
    # volume would otherwise look like a successful delete).
    with pytest.raises(FileNotFoundError):
        remove_beneath(str(tmp_path / "unmounted"), ["v"])
    with pytest.raises(FileNotFoundError):
        archive_beneath(str(tmp_path / "unmounted"), ["v"], "archived-v")
