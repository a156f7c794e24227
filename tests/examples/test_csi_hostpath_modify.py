"""The example CSI driver's mutable parameters (VolumeAttributesClasses): CreateVolume keeps
them, ControllerModifyVolume changes the keys it is given and keeps the others, keys outside
``--accepted-mutable-parameter-names`` are INVALID_ARGUMENT (what makes a claim Infeasible), and
``--enable-controller-modify-volume=false`` takes MODIFY_VOLUME away."""

from __future__ import annotations

import contextlib
import json
import pathlib
from collections.abc import AsyncIterator
from typing import Any

from csi_hostpath_support import MOUNT, serving
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from pyprovlib.csi._proto.csi import v1
from pyprovlib.examples.csi_hostpath._cli import build_parser


@contextlib.asynccontextmanager
async def driver(directory: pathlib.Path, **options: Any) -> AsyncIterator[v1.ControllerStub]:
    async with serving(directory, **options) as channel:
        yield v1.ControllerStub(channel)


async def code_of(call: Any) -> tuple[Status, str] | None:
    try:
        await call
    except GRPCError as err:
        return err.status, str(err.message)
    return None


def saved(directory: pathlib.Path) -> dict[str, Any]:
    data = json.loads((directory / "state" / "state.json").read_text())
    return {v["volume_id"]: v["mutable_parameters"] for v in data["volumes"]}


async def capabilities(ctrl: v1.ControllerStub) -> set[Any]:
    response = await ctrl.controller_get_capabilities(v1.ControllerGetCapabilitiesRequest())
    return {c.rpc.type for c in response.capabilities if c.rpc is not None}


async def test_mutable_parameters_are_kept_and_changed(short_dir: pathlib.Path) -> None:
    async with driver(short_dir) as ctrl:  # accepts iops and throughput
        assert v1.ControllerServiceCapabilityRpcType.MODIFY_VOLUME in await capabilities(ctrl)
        created = await ctrl.create_volume(
            v1.CreateVolumeRequest(
                name="pvc-1", volume_capabilities=[MOUNT], mutable_parameters={"iops": "100"}
            )
        )
        assert created.volume is not None
        volume_id = created.volume.volume_id
        assert saved(short_dir) == {volume_id: {"iops": "100"}}
        await ctrl.controller_modify_volume(
            v1.ControllerModifyVolumeRequest(
                volume_id=volume_id, mutable_parameters={"throughput": "50"}
            )
        )
        # Keys not given keep their values (the spec: no change from an absent key).
        assert saved(short_dir) == {volume_id: {"iops": "100", "throughput": "50"}}
        refused = await code_of(
            ctrl.controller_modify_volume(
                v1.ControllerModifyVolumeRequest(
                    volume_id=volume_id, mutable_parameters={"colour": "blue"}
                )
            )
        )
        assert refused is not None
        assert refused[0] is Status.INVALID_ARGUMENT
        assert "colour" in refused[1]
        assert saved(short_dir) == {volume_id: {"iops": "100", "throughput": "50"}}
        refused_create = await code_of(
            ctrl.create_volume(
                v1.CreateVolumeRequest(
                    name="pvc-2",
                    volume_capabilities=[MOUNT],
                    mutable_parameters={"colour": "blue"},
                )
            )
        )
        assert refused_create is not None
        assert refused_create[0] is Status.INVALID_ARGUMENT
        missing = await code_of(
            ctrl.controller_modify_volume(
                v1.ControllerModifyVolumeRequest(
                    volume_id="00000000-0000-0000-0000-000000000000",
                    mutable_parameters={"iops": "1"},
                )
            )
        )
        assert missing is not None
        assert missing[0] is Status.NOT_FOUND
        # No parameters: nothing to change (what csi-sanity sends without its mutable
        # parameters file).
        await ctrl.controller_modify_volume(v1.ControllerModifyVolumeRequest(volume_id=volume_id))
        assert saved(short_dir) == {volume_id: {"iops": "100", "throughput": "50"}}
        assert await code_of(ctrl.controller_modify_volume(v1.ControllerModifyVolumeRequest())) == (
            Status.INVALID_ARGUMENT,
            "ControllerModifyVolumeRequest: volume_id is required",
        )


async def test_without_modify_volume(short_dir: pathlib.Path) -> None:
    async with driver(short_dir, enable_controller_modify_volume=False) as ctrl:
        assert v1.ControllerServiceCapabilityRpcType.MODIFY_VOLUME not in await capabilities(ctrl)
        refused = await code_of(
            ctrl.create_volume(
                v1.CreateVolumeRequest(
                    name="pvc-1", volume_capabilities=[MOUNT], mutable_parameters={"iops": "1"}
                )
            )
        )
        assert refused is not None
        assert refused[0] is Status.INVALID_ARGUMENT


async def test_every_key_when_none_is_named(short_dir: pathlib.Path) -> None:
    async with driver(short_dir, accepted_mutable_parameter_names=()) as ctrl:
        created = await ctrl.create_volume(
            v1.CreateVolumeRequest(
                name="pvc-1", volume_capabilities=[MOUNT], mutable_parameters={"colour": "blue"}
            )
        )
        assert created.volume is not None
        assert saved(short_dir) == {created.volume.volume_id: {"colour": "blue"}}


def test_flags() -> None:
    args = build_parser().parse_args(
        ["--nodeid", "n", "--accepted-mutable-parameter-names", "iops, throughput"]
    )
    assert args.accepted_mutable_parameter_names == ("iops", "throughput")
    assert args.enable_controller_modify_volume is True
    args = build_parser().parse_args(
        [
            "--nodeid",
            "n",
            "--enable-controller-modify-volume=false",
            "--accepted-mutable-parameter-names=",
        ]
    )
    assert args.enable_controller_modify_volume is False
    assert args.accepted_mutable_parameter_names == ()  # every key
