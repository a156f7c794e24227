"""Fixtures for the CSI tests: a directory short enough for a unix socket, the in-memory API
server (with its PV binder) and a kubeconfig for a process under test to reach it, and the Go
hostpathplugin binary (skips the test when there is none); the provisioner's entry points, the
sidecar and the combined process, each test taking ``entry`` running on both."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest
from csi_driver import short_socket_dir
from csi_e2e import find_hostpathplugin
from process_support import PROVISIONER_ENTRY_POINTS, EntryPoint

from pyprovlib.testing._server import ApiServer


@pytest.fixture
def sock_dir(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    with short_socket_dir(tmp_path) as directory:
        yield directory


@pytest.fixture
def server(apiserver_with_binder: ApiServer) -> ApiServer:
    """The in-memory API server with its PV binder."""
    return apiserver_with_binder


@pytest.fixture
def kubeconfig(server: ApiServer, tmp_path: pathlib.Path) -> pathlib.Path:
    """A kubeconfig for a process under test to reach :func:`server`."""
    path: pathlib.Path = server.write_kubeconfig(tmp_path / "kubeconfig")
    return path


@pytest.fixture(scope="session")
def hostpathplugin_binary(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    binary = find_hostpathplugin(tmp_path_factory.mktemp("hostpathplugin"))
    if binary is None:
        pytest.skip(
            "no Go hostpathplugin: put it (kubernetes-csi/csi-driver-host-path) in the assets "
            "directory PYPROVLIB_KUBE_ASSETS names (docs/testing.md, 'The assets directory')"
        )
    return binary


@pytest.fixture(params=PROVISIONER_ENTRY_POINTS, ids=lambda entry: entry.module)
def entry(request: pytest.FixtureRequest) -> EntryPoint:
    """The provisioner as the sidecar, then as the combined process."""
    point: EntryPoint = request.param
    return point
