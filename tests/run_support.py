"""Python run to its end as a child process, for the tests of an entry point's ``--help``,
``--version`` or usage errors. Here at the root of ``tests/``, which pytest puts on
``sys.path``, because the CSI, examples, integration, resize and testing suites all do this."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping


async def run_python(
    *argv: str, timeout: float = 60, env: Mapping[str, str] | None = None
) -> tuple[int, str, str]:
    """Run ``python argv...`` to its end, in ``env`` (else this process's environment), within
    ``timeout`` seconds; returns (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=None if env is None else dict(env),
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
