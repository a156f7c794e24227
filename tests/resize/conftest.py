"""Fixtures of the resizer's and modifier's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sidecar_support import short_socket_dir


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A directory for a driver's unix socket."""
    with short_socket_dir() as directory:
        yield directory
