"""The server kit's strict protobuf check (csi/_wire.py), on betterproto2's public field
metadata: nested messages, map entries and wrapped types are followed; a bad encoding anywhere
is refused before betterproto2's lenient parser could see it."""

from __future__ import annotations

import datetime

import pytest

from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi._wire import MalformedError, check_wire


def _len_field(number: int, payload: bytes) -> bytes:
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_a_valid_request_passes() -> None:
    request = v1.CreateVolumeRequest(
        name="vol",
        capacity_range=v1.CapacityRange(required_bytes=1 << 30),
        parameters={"type": "fast"},
        volume_capabilities=[
            v1.VolumeCapability(
                mount=v1.VolumeCapabilityMountVolume(fs_type="ext4"),
                access_mode=v1.VolumeCapabilityAccessMode(
                    mode=v1.VolumeCapabilityAccessModeMode.SINGLE_NODE_WRITER
                ),
            )
        ],
    )
    check_wire(bytes(request), v1.CreateVolumeRequest)


def test_a_map_value_that_is_not_utf8_is_refused() -> None:
    entry = _len_field(1, b"type") + _len_field(2, b"\xff\xfe")
    data = _len_field(1, b"vol") + _len_field(4, entry)
    with pytest.raises(MalformedError, match=r"field value \(2\) is not valid UTF-8"):
        check_wire(data, v1.CreateVolumeRequest)


def test_a_nested_message_field_of_the_wrong_wire_type_is_refused() -> None:
    # capacity_range.required_bytes (1) is a varint; here it is length-delimited.
    data = _len_field(1, b"vol") + _len_field(2, _len_field(1, b"x"))
    with pytest.raises(MalformedError, match=r"field required_bytes \(1\) has wire type 2"):
        check_wire(data, v1.CreateVolumeRequest)


def test_a_wrapped_timestamp_is_checked_as_a_timestamp() -> None:
    created = datetime.datetime(2026, 11, 26, tzinfo=datetime.UTC)
    good = v1.CreateSnapshotResponse(
        snapshot=v1.Snapshot(snapshot_id="s", source_volume_id="v", creation_time=created)
    )
    check_wire(bytes(good), v1.CreateSnapshotResponse)
    # Timestamp.seconds (1) is a varint: a length-delimited one inside creation_time (4).
    bad_snapshot = _len_field(2, b"s") + _len_field(4, _len_field(1, b"12"))
    with pytest.raises(MalformedError, match=r"field seconds \(1\) has wire type 2"):
        check_wire(_len_field(1, bad_snapshot), v1.CreateSnapshotResponse)
