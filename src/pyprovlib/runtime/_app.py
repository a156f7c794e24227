"""Run a controller as a process: parse flags, configure logging, build the API client, serve
``/metrics`` ``/healthz`` ``/readyz``, and turn SIGTERM/SIGINT into a graceful stop.

Shutdown follows the Kubernetes sidecars: the first signal asks the controller to stop (no
new work; in-flight operations finish; the Lease is released) and waits up to
``--shutdown-grace-period``; a second signal cancels everything at once and the process exits
with ``128 + signal number``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, Unpack

from prometheus_client import REGISTRY

from pyprovlib._errors import PyprovlibError
from pyprovlib._version import __version__
from pyprovlib.runtime._flags import CommonOptions, common_parser, format_duration, parse_common
from pyprovlib.runtime._http import Check, HttpServer, controller_checks
from pyprovlib.runtime._logging import configure_logging, get_logger
from pyprovlib.runtime._protocols import Controller, LeaderElected

if TYPE_CHECKING:
    from typing import TextIO

    import structlog
    from kubernetes_asyncio.client import ApiClient
    from prometheus_client.registry import CollectorRegistry

__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "Controller",
    "ControllerFactory",
    "LeaderElected",
    "RunOptions",
    "RuntimeContext",
    "StartupError",
    "run",
    "run_async",
]

EXIT_OK = 0
"""Exit code after a graceful stop."""
EXIT_FAILURE = 1
"""Exit code when the controller (or the startup) failed, or the grace period ran out."""

_T = TypeVar("_T")


class StartupError(PyprovlibError):
    """A controller factory cannot start for a reason its message explains (a flag naming
    something that cannot work, say): the runtime logs the message as one error line, without
    a traceback, and exits with :data:`EXIT_FAILURE`."""


@dataclass(frozen=True)
class RuntimeContext:
    """What a controller factory gets: the parsed flags, an API client and a logger.

    ``args`` is the whole argparse namespace, including the entry point's own flags.
    ``api_client`` is owned by the runtime and closed after the controller stops.
    ``log`` is a logger named after the program. ``registry`` is where ``/metrics`` reads
    from.
    """

    options: CommonOptions
    args: argparse.Namespace
    api_client: ApiClient
    log: structlog.stdlib.BoundLogger
    registry: CollectorRegistry = field(default=REGISTRY)


ControllerFactory = Callable[[RuntimeContext], Controller | Awaitable[Controller]]
"""Builds the controller from the runtime context; may be a plain or an ``async`` function."""


class _Signals:
    """Counts SIGTERM/SIGINT deliveries; the loop calls :meth:`received` for each."""

    def __init__(self) -> None:
        self.first = asyncio.Event()
        self.second = asyncio.Event()
        self.first_signal: int | None = None
        self.second_signal: int | None = None
        self.after_second: Callable[[], None] | None = None

    def received(self, signum: int) -> None:
        if self.first_signal is None:
            self.first_signal = signum
            self.first.set()
        elif self.second_signal is None:
            self.second_signal = signum
            self.second.set()
            if self.after_second is not None:
                self.after_second()


def _install_signal_handlers(
    loop: asyncio.AbstractEventLoop, signals: _Signals, log: structlog.stdlib.BoundLogger
) -> dict[int, Any]:
    """Route SIGTERM/SIGINT to ``signals``; return the previous handlers to restore."""
    installed: dict[int, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            previous = signal.getsignal(sig)
            loop.add_signal_handler(sig, signals.received, int(sig))
        except (NotImplementedError, RuntimeError, ValueError) as err:
            # Not the main thread, or a platform without loop signal support.
            log.warning(
                "cannot handle signal; it will not stop gracefully",
                signal=sig.name,
                error=str(err),
            )
        else:
            installed[int(sig)] = previous
    return installed


def _remove_signal_handlers(loop: asyncio.AbstractEventLoop, installed: dict[int, Any]) -> None:
    # asyncio resets to SIG_DFL; put back whatever was there (an embedding app's handler).
    for sig, previous in list(installed.items()):
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(sig)
            if previous is not None:
                signal.signal(sig, previous)
    installed.clear()


async def _race(
    aw: Awaitable[_T], event: asyncio.Event, limit: float | None = None
) -> asyncio.Task[_T]:
    """Run ``aw`` as a task until it finishes, ``event`` is set or ``limit`` seconds pass; return
    the task (done or still running — the caller owns it)."""
    task: asyncio.Task[_T] = aw if isinstance(aw, asyncio.Task) else asyncio.ensure_future(aw)
    waiter = asyncio.create_task(event.wait())
    try:
        await asyncio.wait({task, waiter}, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        await asyncio.wait({task})
        raise
    finally:
        waiter.cancel()
        await asyncio.wait({waiter})
    return task


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    await asyncio.wait({task})


def _signal_name(signum: int | None) -> str:
    if signum is None:
        return "none"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


async def _supervise(
    controller: Controller,
    options: CommonOptions,
    signals: _Signals,
    log: structlog.stdlib.BoundLogger,
) -> int:
    run_task: asyncio.Task[None] = asyncio.create_task(controller.run(), name="controller.run")
    try:
        await _race(run_task, signals.first)
        if run_task.done():
            return _outcome(run_task, log, stopping=False)

        log.info(
            "signal received: stopping gracefully",
            signal=_signal_name(signals.first_signal),
            grace_period=format_duration(options.shutdown_grace_period),
        )
        try:
            controller.stop()
        except Exception:
            log.exception("controller.stop() failed; cancelling the controller")
            await _cancel(run_task)
            return EXIT_FAILURE

        await _race(run_task, signals.second, limit=options.shutdown_grace_period)
        if run_task.done():
            return _outcome(run_task, log, stopping=True)
        if signals.second_signal is not None:
            code = 128 + signals.second_signal
            log.warning(
                "second signal received: cancelling in-flight work and exiting at once",
                signal=_signal_name(signals.second_signal),
                exit_code=code,
            )
        else:
            code = EXIT_FAILURE
            log.error(
                "shutdown grace period expired: cancelling in-flight work",
                grace_period=format_duration(options.shutdown_grace_period),
            )
        await _cancel(run_task)
        return code
    finally:
        if not run_task.done():
            await _cancel(run_task)


def _outcome(task: asyncio.Task[None], log: structlog.stdlib.BoundLogger, *, stopping: bool) -> int:
    if task.cancelled():
        log.error("the controller was cancelled")
        return EXIT_FAILURE
    err = task.exception()
    if err is not None:
        log.error("the controller failed", error=str(err), exc_info=err)
        return EXIT_FAILURE
    if stopping:
        log.info("stopped gracefully")
    else:
        log.info("the controller returned on its own: exiting")
    return EXIT_OK


def _exit_code(code: object) -> int:
    if code is None:
        return EXIT_OK
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # what sys.exit("message") would print
    return EXIT_FAILURE


def _default_prog() -> str:
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "pyprovlib"


class RunOptions(TypedDict, total=False):
    """What :func:`run` and :func:`run_async` take besides the controller factory, each
    optional.

    ``argv``: the arguments to parse (default ``sys.argv[1:]``). ``parser``: the flags
    (default :func:`~pyprovlib.runtime.common_parser` named ``prog``, default the program's
    file name, and described by ``description``). ``registry``: where the process's metrics
    are registered and served from (default prometheus_client's). ``log_stream``: where logs
    go (default ``sys.stderr``).
    """

    argv: Sequence[str] | None
    parser: argparse.ArgumentParser | None
    prog: str | None
    description: str | None
    registry: CollectorRegistry | None
    log_stream: TextIO | None


async def run_async(controller_factory: ControllerFactory, **options: Unpack[RunOptions]) -> int:
    """Run the controller built by ``controller_factory`` until it stops; return the exit code.

    ``options`` are :class:`RunOptions`. ``--help``/``--version``/usage errors return
    argparse's status (0 or 2). Exit codes: 0 after a graceful stop (or when ``run()``
    returns on its own), 1 when startup or the controller fails or the grace period runs out,
    ``128 + signal`` after a second signal. The API client and the HTTP server are always
    closed.
    """
    parser = options.get("parser")
    if parser is None:
        parser = common_parser(
            options.get("prog") or _default_prog(),
            options.get("description") or "A Kubernetes storage controller.",
        )
    try:
        common, args = parse_common(parser, options.get("argv"))
    except SystemExit as exc:
        return _exit_code(exc.code)

    configure_logging(common.log_format, common.log_level, stream=options.get("log_stream"))
    log: structlog.stdlib.BoundLogger = get_logger("pyprovlib.runtime")
    program_version = getattr(parser, "version", None)
    log.info(
        "starting",
        program=parser.prog,
        **({"version": program_version} if program_version else {}),
        pyprovlib=__version__,
        options=asdict(common),
    )

    loop = asyncio.get_running_loop()
    signals = _Signals()
    installed = _install_signal_handlers(loop, signals, log)
    # After the second signal the default dispositions come back, so a third one kills the
    # process even if cancellation itself is stuck (e.g. in a thread).
    signals.after_second = lambda: _remove_signal_handlers(loop, installed)
    try:
        return await _run_process(
            controller_factory,
            options=common,
            args=args,
            signals=signals,
            log=log,
            program_log=get_logger(parser.prog),
            registry=options.get("registry"),
        )
    finally:
        _remove_signal_handlers(loop, installed)


async def _run_process(
    controller_factory: ControllerFactory,
    *,
    options: CommonOptions,
    args: argparse.Namespace,
    signals: _Signals,
    log: structlog.stdlib.BoundLogger,
    program_log: structlog.stdlib.BoundLogger,
    registry: CollectorRegistry | None,
) -> int:
    from pyprovlib.kube._config import new_client

    try:
        api_client = await new_client(options.client_settings())
    except Exception as err:
        log.error("cannot build the Kubernetes API client", error=str(err))
        return EXIT_FAILURE

    server: HttpServer | None = None
    try:
        context = RuntimeContext(
            options=options,
            args=args,
            api_client=api_client,
            log=program_log,
            registry=registry if registry is not None else REGISTRY,
        )
        controller = await _build(controller_factory, context, signals, log)
        if controller is None:
            return EXIT_FAILURE if signals.first_signal is None else EXIT_OK

        address = options.http_address
        if address is not None:
            healthz: dict[str, Check] | None = None
            readyz: dict[str, Check] | None = None
            if options.serve_health:
                healthz, readyz = controller_checks(controller)

                def not_stopping() -> str | None:
                    return "shutting down" if signals.first.is_set() else None

                readyz["shutdown"] = not_stopping
            server = HttpServer(
                address,
                registry=context.registry,
                metrics_path=options.metrics_path,
                healthz=healthz,
                readyz=readyz,
            )
            try:
                await server.start()
            except OSError as err:
                server = None
                log.error("cannot start the HTTP server", address=str(address), error=str(err))
                return EXIT_FAILURE
        return await _supervise(controller, options, signals, log)
    finally:
        if server is not None:
            await server.stop()
        await api_client.close()


async def _build(
    controller_factory: ControllerFactory,
    context: RuntimeContext,
    signals: _Signals,
    log: structlog.stdlib.BoundLogger,
) -> Controller | None:
    """Call the factory; a signal while an async factory is still working (e.g. waiting for a
    CSI driver) cancels it. ``None`` means no controller: failed or interrupted."""
    try:
        made = controller_factory(context)
    except StartupError as refused:
        log.error(str(refused))
        return None
    except Exception:
        log.exception("the controller factory failed")
        return None
    if not inspect.isawaitable(made):
        if signals.first.is_set():
            log.info("signal received during startup: exiting")
            return None
        return _as_controller(made, log)
    awaitable: Awaitable[object] = made

    async def await_made() -> object:
        return await awaitable

    task = await _race(await_made(), signals.first)
    if not task.done():
        log.info("signal received during startup: exiting")
        await _cancel(task)
        return None
    if task.cancelled():
        log.error("the controller factory was cancelled")
        return None
    err = task.exception()
    if isinstance(err, StartupError):
        log.error(str(err))
        return None
    if err is not None:
        log.error("the controller factory failed", error=str(err), exc_info=err)
        return None
    return _as_controller(task.result(), log)


def _as_controller(made: object, log: structlog.stdlib.BoundLogger) -> Controller | None:
    if isinstance(made, Controller):
        return made
    log.error(
        "the controller factory returned something that is not a Controller "
        "(it needs run(), stop(), healthy() and ready())",
        returned=type(made).__name__,
    )
    return None


def run(controller_factory: ControllerFactory, **options: Unpack[RunOptions]) -> int:
    """Synchronous :func:`run_async`, for ``sys.exit(run(factory))`` in a ``main``."""
    try:
        return asyncio.run(run_async(controller_factory, **options))
    except KeyboardInterrupt:
        # SIGINT before the handlers were installed or after they were removed.
        return 128 + int(signal.SIGINT)
