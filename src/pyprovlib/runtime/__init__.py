"""Process concerns shared by every entry point: flags and environment variables, logging,
the ``/metrics`` ``/healthz`` ``/readyz`` endpoint, signals and graceful shutdown.

A complete program — flags, JSON logs, health endpoints, SIGTERM handling — is a controller
factory handed to :func:`run`::

    import sys

    from pyprovlib.runtime import RuntimeContext, common_parser, run
    from my_driver import MyController  # implements pyprovlib.runtime.Controller

    def make_controller(ctx: RuntimeContext) -> MyController:
        return MyController(ctx.api_client, workers=ctx.options.workers)

    if __name__ == "__main__":
        parser = common_parser(
            "my-provisioner", "Provisions volumes on my storage.", version="1.0.0"
        )
        sys.exit(run(make_controller, parser=parser))

Run it with e.g. ``--kubeconfig ~/.kube/config --http-endpoint :8080 --leader-election``;
``--help`` lists every flag with its default and environment variable (``MY_PROVISIONER_*``:
the prefix comes from the program's name unless ``env_prefix=`` says otherwise).
"""

from pyprovlib.runtime._app import (
    Controller,
    ControllerFactory,
    LeaderElected,
    RuntimeContext,
    StartupError,
    run,
    run_async,
)
from pyprovlib.runtime._composite import (
    CompositeController,
)
from pyprovlib.runtime._controller_options import (
    attach_controller_options,
    provision_controller_options,
    resize_controller_options,
)
from pyprovlib.runtime._flags import (
    CommonOptions,
    RuntimeArgumentParser,
    add_flag,
    common_parser,
)
from pyprovlib.runtime._logging import (
    bind,
    bound,
    configure_logging,
    get_logger,
    redact,
)

__all__ = [
    "CommonOptions",
    "CompositeController",
    "Controller",
    "ControllerFactory",
    "LeaderElected",
    "RuntimeArgumentParser",
    "RuntimeContext",
    "StartupError",
    "add_flag",
    "attach_controller_options",
    "bind",
    "bound",
    "common_parser",
    "configure_logging",
    "get_logger",
    "provision_controller_options",
    "redact",
    "resize_controller_options",
    "run",
    "run_async",
]
