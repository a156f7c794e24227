"""``workers`` is the worker count of every options class and controller constructor (issue
29); the former names (``threadiness``, ``worker_threads``, ``threads``) still work for one
release, with a DeprecationWarning that names ``workers``; the command-line flags keep
upstream's names and set ``workers``."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import pytest

from pyprovlib._errors import InvalidOptionsError
from pyprovlib.controller._attach import AttachControllerOptions
from pyprovlib.controller._capacity.options import CapacityControllerOptions
from pyprovlib.controller._modify import ModifyControllerOptions
from pyprovlib.controller._options import ProvisionControllerOptions
from pyprovlib.controller._resize import ResizeControllerOptions
from pyprovlib.csi.attacher._options import parser as attacher_parser
from pyprovlib.csi.resizer._options import parser as resizer_parser
from pyprovlib.runtime import (
    CommonOptions,
    attach_controller_options,
    common_parser,
    provision_controller_options,
    resize_controller_options,
)
from pyprovlib.runtime._flags import parse_common

OPTIONS: list[Any] = [
    ProvisionControllerOptions,
    AttachControllerOptions,
    ResizeControllerOptions,
    ModifyControllerOptions,
    CapacityControllerOptions,
]

# fields without a default, given as any caller must
REQUIRED: dict[Any, dict[str, Any]] = {CapacityControllerOptions: {"namespace": "kube-system"}}


def make(cls: Any, **fields: Any) -> Any:
    return cls(**REQUIRED.get(cls, {}), **fields)


RENAMED = [
    pytest.param(ProvisionControllerOptions, "threadiness", id="provision"),
    pytest.param(AttachControllerOptions, "worker_threads", id="attach"),
    pytest.param(CapacityControllerOptions, "threads", id="capacity"),
    pytest.param(CommonOptions, "worker_threads", id="flags"),
]


@pytest.mark.parametrize("cls", OPTIONS, ids=lambda cls: cls.__name__)
def test_every_options_class_takes_workers(cls: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        options = make(cls, workers=3)
        assert options.workers == 3
        assert dataclasses.replace(options, workers=5).workers == 5


@pytest.mark.parametrize("cls", OPTIONS, ids=lambda cls: cls.__name__)
def test_no_worker_is_refused_naming_workers(cls: Any) -> None:
    with pytest.raises(InvalidOptionsError, match="workers must be at least 1, got 0"):
        make(cls, workers=0)


@pytest.mark.parametrize(("cls", "old"), RENAMED)
def test_the_former_name_still_sets_and_reads_workers_with_a_warning(cls: Any, old: str) -> None:
    with pytest.warns(
        DeprecationWarning, match=rf"{cls.__name__}\({old}=\.\.\.\) is deprecated: use workers="
    ):
        options = make(cls, **{old: 7})
    assert options.workers == 7
    with pytest.warns(
        DeprecationWarning, match=rf"{cls.__name__}\.{old} is deprecated: read workers"
    ):
        assert getattr(options, old) == 7


@pytest.mark.parametrize(("cls", "old"), RENAMED)
def test_both_names_at_once_are_refused(cls: Any, old: str) -> None:
    with pytest.raises(TypeError, match=rf"got both workers= and {old}=: give workers= only"):
        make(cls, **{old: 2, "workers": 3})


@pytest.mark.parametrize(
    ("build", "argv"),
    [
        pytest.param(provision_controller_options, ["--worker-threads=6"], id="provision"),
        pytest.param(attach_controller_options, ["--worker-threads=6"], id="attach"),
        pytest.param(resize_controller_options, ["--worker-threads=6"], id="resize"),
    ],
)
def test_worker_threads_sets_workers(build: Any, argv: list[str]) -> None:
    parser = common_parser("test-prog", "A test.")
    parser.environ = {}
    flags, _ = parse_common(parser, argv)
    assert flags.workers == 6
    assert build(flags).workers == 6


def test_the_sidecars_worker_flags_set_workers() -> None:
    # external-attacher's --worker-threads; external-resizer's --workers (and --worker-threads)
    attacher = attacher_parser()
    attacher.environ = {}
    flags, _ = parse_common(attacher, ["--worker-threads=5"])
    assert attach_controller_options(flags).workers == 5
    resizer = resizer_parser()
    resizer.environ = {}
    flags, _ = parse_common(resizer, ["--workers", "3"])
    assert resize_controller_options(flags).workers == 3


def test_a_former_name_beside_the_flags_is_refused_naming_the_flag() -> None:
    parser = common_parser("test-prog", "A test.")
    parser.environ = {}
    flags, _ = parse_common(parser, [])
    with pytest.raises(TypeError, match=r"threadiness \(from --worker-threads\)"):
        provision_controller_options(flags, threadiness=2)
