"""Fixtures for the CSI tests: a directory short enough for a unix socket."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest
from csi_driver import short_socket_dir


@pytest.fixture
def sock_dir(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    with short_socket_dir(tmp_path) as directory:
        yield directory
