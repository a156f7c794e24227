"""Fixtures for the CSI tests: a directory short enough for a unix socket, and the Go
hostpathplugin binary (skips the test when there is none)."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest
from csi_driver import short_socket_dir
from csi_e2e import find_hostpathplugin


@pytest.fixture
def sock_dir(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    with short_socket_dir(tmp_path) as directory:
        yield directory


@pytest.fixture(scope="session")
def hostpathplugin_binary(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    binary = find_hostpathplugin(tmp_path_factory.mktemp("hostpathplugin"))
    if binary is None:
        pytest.skip(
            "no Go hostpathplugin: set PYPROVLIB_KUBE_ASSETS or put ../shared/kube beside the repo"
        )
    return binary
