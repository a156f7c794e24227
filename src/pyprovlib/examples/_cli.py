"""What the example provisioners' command lines (hostpath, NFS, RBD) share, written once: the
parser they start from (the common flags and a group with ``--provisioner-name``), the
``--dir-mode`` flag, the ProvisionController a ``make_controller``
returns, and ``main``'s parse, check and run."""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pyprovlib._provisioner import Provisioner
from pyprovlib.controller._provision import ProvisionController
from pyprovlib.runtime import (
    CommonOptions,
    ControllerFactory,
    RuntimeArgumentParser,
    RuntimeContext,
    add_flag,
    common_parser,
    provision_controller_options,
    run,
)
from pyprovlib.runtime._flag_parser import ENV_PREFIX

if TYPE_CHECKING:
    from pyprovlib.controller._options import ProvisionControllerOptions

__all__ = [
    "add_dir_mode_flag",
    "add_provisioner_name_flag",
    "deprecated_controller_options",
    "parse_checked",
    "parse_mode",
    "provision_controller",
    "provisioner_parser",
    "run_checked",
]

ArgumentCheck = Callable[[argparse.ArgumentParser, argparse.Namespace], None]
"""A ``check_arguments``: rejects flag combinations that cannot work with ``parser.error``."""


def parse_mode(text: str) -> int:
    """Parse an octal permission mode such as ``0777`` or ``750``."""
    try:
        mode = int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an octal mode such as 0777") from None
    if not 0 <= mode <= 0o7777:
        raise argparse.ArgumentTypeError(f"{text!r} is out of range (0000..7777)")
    return mode


def add_provisioner_name_flag(
    parser: RuntimeArgumentParser, group: argparse._ArgumentGroup, default: str
) -> None:
    """``--provisioner-name`` (or ``PROVISIONER_NAME``), defaulting to ``default``."""
    add_flag(
        parser,
        "--provisioner-name",
        default=default,
        help="the name StorageClasses give in 'provisioner:'",
        extra_env=("PROVISIONER_NAME",),
        metavar="NAME",
        group=group,
    )


def provisioner_parser(
    prog: str,
    description: str,
    *,
    title: str,
    default_name: str,
    leader_election: bool = False,
) -> tuple[RuntimeArgumentParser, argparse._ArgumentGroup]:
    """The runtime's common flags (``--leader-election`` defaulting to ``leader_election``),
    then the group ``title`` with ``--provisioner-name`` (default ``default_name``). Returns
    the parser and the group, for the example's own flags."""
    parser = common_parser(
        prog, description, env_prefix=ENV_PREFIX, defaults={"leader_election": leader_election}
    )
    group = parser.add_argument_group(title)
    add_provisioner_name_flag(parser, group, default_name)
    return parser, group


def add_dir_mode_flag(
    parser: RuntimeArgumentParser, group: argparse._ArgumentGroup, default: int
) -> None:
    """``--dir-mode``: the octal permissions of new volume directories."""
    add_flag(
        parser,
        "--dir-mode",
        default=default,
        type=parse_mode,
        help="permissions of new volume directories, octal",
        default_text=f"{default:04o}",
        metavar="MODE",
        group=group,
    )


def provision_controller(
    ctx: RuntimeContext, provisioner: Provisioner, **fields: Any
) -> ProvisionController:
    """The ProvisionController of ``--provisioner-name`` over ``provisioner``, its options
    from the runtime's flags and ``fields``."""
    return ProvisionController(
        ctx.api_client,
        ctx.args.provisioner_name,
        provisioner,
        provision_controller_options(ctx.options, **fields),
    )


def deprecated_controller_options(
    module: str, options: CommonOptions
) -> ProvisionControllerOptions:
    """The body of the examples' deprecated ``controller_options`` aliases (``module`` names
    the alias's module in the warning)."""
    warnings.warn(
        f"{module}.controller_options is deprecated: use "
        "pyprovlib.runtime.provision_controller_options",
        DeprecationWarning,
        stacklevel=3,
    )
    return provision_controller_options(options)


def parse_checked(
    parser: argparse.ArgumentParser, check_arguments: ArgumentCheck, argv: Sequence[str] | None
) -> tuple[list[str], argparse.Namespace]:
    """``argv`` (default ``sys.argv[1:]``) as a list and parsed, rejected with a usage error
    when ``check_arguments`` finds it unusable."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(args_list)
    check_arguments(parser, args)
    return args_list, args


def run_checked(
    parser: argparse.ArgumentParser,
    check_arguments: ArgumentCheck,
    make_controller: ControllerFactory,
    argv: Sequence[str] | None,
) -> int:
    """An example's ``main``: :func:`parse_checked`, then the runtime runs
    ``make_controller``; returns the exit code."""
    args_list, _ = parse_checked(parser, check_arguments, argv)
    return run(make_controller, argv=args_list, parser=parser)
