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

from pyprovlib.runtime.app import (
    EXIT_FAILURE,
    EXIT_OK,
    Controller,
    ControllerFactory,
    LeaderElected,
    RunOptions,
    RuntimeContext,
    StartupError,
    run,
    run_async,
)
from pyprovlib.runtime.composite import CompositeController
from pyprovlib.runtime.controller_options import (
    attach_controller_options,
    provision_controller_options,
    resize_controller_options,
)
from pyprovlib.runtime.flags import (
    ENV_PREFIX,
    CommonOptions,
    HttpAddress,
    RuntimeArgumentParser,
    add_bool_flag,
    add_duration_flag,
    add_flag,
    common_parser,
    env_name,
    env_prefix_for,
    format_duration,
    parse_bool,
    parse_common,
    parse_duration,
    parse_http_address,
    version_text,
)
from pyprovlib.runtime.http import Check, HttpServer, controller_checks
from pyprovlib.runtime.logging import (
    REDACTED,
    bind,
    bound,
    configure_logging,
    get_logger,
    is_secret_key,
    redact,
    redact_value,
    scrub_text,
    unbind,
)

__all__ = [
    "ENV_PREFIX",
    "EXIT_FAILURE",
    "EXIT_OK",
    "REDACTED",
    "Check",
    "CommonOptions",
    "CompositeController",
    "Controller",
    "ControllerFactory",
    "HttpAddress",
    "HttpServer",
    "LeaderElected",
    "RunOptions",
    "RuntimeArgumentParser",
    "RuntimeContext",
    "StartupError",
    "add_bool_flag",
    "add_duration_flag",
    "add_flag",
    "attach_controller_options",
    "bind",
    "bound",
    "common_parser",
    "configure_logging",
    "controller_checks",
    "env_name",
    "env_prefix_for",
    "format_duration",
    "get_logger",
    "is_secret_key",
    "parse_bool",
    "parse_common",
    "parse_duration",
    "parse_http_address",
    "provision_controller_options",
    "redact",
    "redact_value",
    "resize_controller_options",
    "run",
    "run_async",
    "scrub_text",
    "unbind",
    "version_text",
]
