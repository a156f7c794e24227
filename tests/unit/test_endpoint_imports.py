"""The diagnostics server's aiohttp server side (~2 MB of modules) loads when a server starts,
not when a controller or sidecar module is imported: most sidecar processes serve no HTTP
endpoint. Checked in a fresh interpreter, since this one imported aiohttp.web long ago."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

_CODE = """
import asyncio, json, sys
import pyprovlib.csi.provisioner._main, pyprovlib.csi.attacher, pyprovlib.csi.resizer
import pyprovlib.controller._provision, pyprovlib.controller._attach, pyprovlib.controller._resize
import pyprovlib.runtime
from pyprovlib.controller._endpoint import EndpointServer

before = "aiohttp.web" in sys.modules

async def serve():
    async with EndpointServer("127.0.0.1", 0, healthz={}) as server:
        return server.port > 0

served = asyncio.run(serve())
print(json.dumps([before, served, "aiohttp.web" in sys.modules]))
"""


def test_the_server_side_of_aiohttp_loads_when_a_server_starts() -> None:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CODE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    before, served, after = json.loads(out.stdout.strip().splitlines()[-1])
    assert (before, served, after) == (False, True, True)
