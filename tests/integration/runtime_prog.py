"""The ~10-line user program of pyprovlib.runtime's docstring, with a small demo controller;
run as a real process by tests/integration/test_runtime_process.py.

The controller lists namespaces (so it really uses the API client the runtime built), then
holds one in-flight operation that finishes ``--finish-after`` after ``stop()`` is called —
the shape of a provisioning call that must complete before the process exits.
"""

from __future__ import annotations

import asyncio
import sys

from kubernetes_asyncio.client import CoreV1Api
from prometheus_client import Counter

from pyprovlib.runtime import RuntimeContext, common_parser, run
from pyprovlib.runtime._flag_parser import add_bool_flag, add_duration_flag

OPERATIONS = Counter("runtime_prog_operations_total", "Operations started by the demo controller")


class DemoController:
    """A trivial :class:`pyprovlib.runtime.Controller`."""

    def __init__(self, ctx: RuntimeContext) -> None:
        self._ctx = ctx
        self._log = ctx.log.bind(controller="demo")
        self._stopping = asyncio.Event()
        self._ready = False

    async def run(self) -> None:
        namespaces = await CoreV1Api(self._ctx.api_client).list_namespace()
        if self._ctx.args.fail:
            raise RuntimeError("demo failure requested with --fail")
        self._ready = True
        self._log.info("controller running", namespaces=len(namespaces.items))
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._operation())

    async def _operation(self) -> None:
        OPERATIONS.inc()
        self._log.info("operation started")
        await self._stopping.wait()
        await asyncio.sleep(self._ctx.args.finish_after)  # the operation's remaining work
        self._log.info("operation finished")

    def stop(self) -> None:
        self._log.info("stop requested")
        self._stopping.set()

    def healthy(self) -> bool:
        return True

    def ready(self) -> bool:
        return self._ready and not self._stopping.is_set()


def main() -> int:
    """The user's program: common flags plus its own, then run."""
    parser = common_parser("runtime-prog", "Demo controller for pyprovlib.runtime's tests.")
    add_duration_flag(parser, "--finish-after", default=0.2, help="in-flight work after stop")
    add_bool_flag(parser, "--fail", default=False, help="make run() raise")
    return run(DemoController, parser=parser)


if __name__ == "__main__":
    sys.exit(main())
