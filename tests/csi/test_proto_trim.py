"""The generated ``google.protobuf`` package holds only the well-known types the CSI messages
use, not descriptor.proto's messages, which csi.proto imports only to declare its custom
options (issue 19: ~2,500 generated lines and ~2.4 MB RSS in every sidecar that imports them).
"""

from __future__ import annotations

import datetime
import importlib.util
import pathlib
import subprocess
import sys
from typing import Any

import pytest
from proto_support import generate_proto as _generate

from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi._proto.google import protobuf

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "proto"

toolchain = pytest.mark.skipif(
    any(importlib.util.find_spec(n) is None for n in ("grpc_tools", "betterproto2_compiler")),
    reason="proto toolchain not installed: pip install '.[proto]'",
)
needs_protobuf = pytest.mark.skipif(
    importlib.util.find_spec("google.protobuf") is None, reason="protobuf not installed"
)


def test_descriptor_messages_are_not_generated() -> None:
    for name in (
        "FieldOptions",
        "FileDescriptorProto",
        "DescriptorProto",
        "FieldDescriptorProto",
        "MessageOptions",
        "FeatureSet",
        "Edition",
        "UninterpretedOption",
    ):
        assert not hasattr(protobuf, name), f"google.protobuf.{name} is generated again"
    assert set(protobuf.__all__) == {"BoolValue", "Int64Value", "Timestamp"}


def test_the_kept_types_carry_their_own_docstrings() -> None:
    # Source comments are addressed by index: pruning renumbers them with the types.
    assert "A Timestamp represents a point in time" in (protobuf.Timestamp.__doc__ or "")
    assert "Wrapper message for `int64`" in (protobuf.Int64Value.__doc__ or "")
    assert "Wrapper message for `bool`" in (protobuf.BoolValue.__doc__ or "")


def test_csi_messages_using_well_known_types_round_trip() -> None:
    when = datetime.datetime(2025, 6, 7, 8, 9, 10, 123456, tzinfo=datetime.UTC)
    capacity = v1.GetCapacityResponse(
        available_capacity=5, maximum_volume_size=1 << 40, minimum_volume_size=0
    )
    parsed = v1.GetCapacityResponse.parse(bytes(capacity))
    assert (parsed.maximum_volume_size, parsed.minimum_volume_size) == (1 << 40, 0)
    assert v1.GetCapacityResponse.parse(b"").maximum_volume_size is None
    assert v1.ProbeResponse.parse(bytes(v1.ProbeResponse(ready=False))).ready is False
    assert v1.ProbeResponse.parse(b"").ready is None
    snapshot = v1.VolumeGroupSnapshot(group_snapshot_id="g", creation_time=when)
    assert v1.VolumeGroupSnapshot.parse(bytes(snapshot)).creation_time == when


def test_importing_the_bindings_loads_no_descriptor_classes() -> None:
    code = (
        "import sys\n"
        "import pyprovlib.csi._proto.csi.v1\n"
        "m = sys.modules['pyprovlib.csi._proto.google.protobuf']\n"
        "print(sorted(n for n in vars(m) if isinstance(getattr(m, n), type)"
        " and getattr(m, n).__module__ == m.__name__))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "['BoolValue', 'Int64Value', 'Timestamp']"


@toolchain
def test_the_kept_types_are_exactly_those_the_spec_references(tmp_path: pathlib.Path) -> None:
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    out = tmp_path / "set.pb"
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{_generate._grpc_tools_include()}",
        "--include_imports",
        f"--descriptor_set_out={out}",
        str(PROTO_DIR / "csi.proto"),
    ]
    assert protoc.main(args) == 0
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (csi,) = [f for f in fds.file if f.name == "csi.proto"]
    # The full set still has descriptor.proto, with the options csi_secret extends.
    assert "google/protobuf/descriptor.proto" in [f.name for f in fds.file]
    assert {e.extendee for e in csi.extension} >= {".google.protobuf.FieldOptions"}

    def referenced(messages: Any) -> set[str]:
        names: set[str] = set()
        for m in messages:
            names |= {f.type_name for f in m.field if f.type_name.startswith(".google.")}
            names |= referenced(m.nested_type)
        return names

    wkt = {name.removeprefix(".google.protobuf.") for name in referenced(csi.message_type)}
    assert wkt == set(protobuf.__all__)


# prune_request on a request built by hand: what stays, what goes, and the bookkeeping
# (source comments, dependency indices) that has to follow.


def _location(file: Any, path: list[int], comment: str) -> None:
    location = file.source_code_info.location.add()
    location.path.extend(path)
    location.leading_comments = comment


def _request() -> Any:
    from google.protobuf import descriptor_pb2
    from google.protobuf.compiler import plugin_pb2

    fdp = descriptor_pb2.FieldDescriptorProto
    request = plugin_pb2.CodeGeneratorRequest(file_to_generate=["root.proto"])

    options = request.proto_file.add(name="dep/options.proto", package="opts")
    options.message_type.add(name="Opt")

    other = request.proto_file.add(name="dep/other.proto", package="other")
    other.message_type.add(name="Unused")
    used = other.message_type.add(name="Used")
    used.nested_type.add(name="Inner")
    used.field.add(name="inner", number=1, type=fdp.TYPE_MESSAGE, type_name=".other.Used.Inner")
    used.field.add(name="chain", number=2, type=fdp.TYPE_MESSAGE, type_name=".other.Chain")
    other.message_type.add(name="Chain")
    other.enum_type.add(name="UnusedEnum").value.add(name="U", number=0)
    other.enum_type.add(name="UsedEnum").value.add(name="V", number=0)
    other.service.add(name="NotOurs")
    for index, name in enumerate(["Unused", "Used", "Chain"]):
        _location(other, [4, index], name)
        _location(other, [4, index, 1], name)
    _location(other, [4, 1, 2, 0], "Used.inner")
    for index, name in enumerate(["UnusedEnum", "UsedEnum"]):
        _location(other, [5, index], name)

    root = request.proto_file.add(name="root.proto", package="root")
    root.dependency.extend(["dep/options.proto", "dep/other.proto"])
    root.public_dependency.append(1)
    req = root.message_type.add(name="Req")
    req.field.add(name="used", number=1, type=fdp.TYPE_MESSAGE, type_name=".other.Used")
    req.field.add(name="kind", number=2, type=fdp.TYPE_ENUM, type_name=".other.UsedEnum")
    root.extension.add(name="marker", number=1000, extendee=".opts.Opt", type=fdp.TYPE_BOOL)
    root.extension.add(name="kept", number=1001, extendee=".root.Req", type=fdp.TYPE_BOOL)
    root.extension.add(
        name="typed",
        number=1002,
        extendee=".root.Req",
        type=fdp.TYPE_MESSAGE,
        type_name=".opts.Opt",
    )
    service = root.service.add(name="Svc")
    service.method.add(name="Call", input_type=".root.Req", output_type=".other.Chain")
    _location(root, [3, 0], "import options")
    _location(root, [3, 1], "import other")
    _location(root, [7, 0], "marker")
    _location(root, [7, 1], "kept")
    _location(root, [7, 2], "typed")
    _location(root, [4, 0], "Req")
    request.source_file_descriptors.add().CopyFrom(root)
    return request


def _comments(file: Any) -> dict[tuple[int, ...], str]:
    return {tuple(loc.path): loc.leading_comments for loc in file.source_code_info.location}


@needs_protobuf
def test_prune_keeps_the_generated_files_and_what_they_reference() -> None:
    request = _request()
    _generate.prune_request(request)

    assert [f.name for f in request.proto_file] == ["dep/other.proto", "root.proto"]
    other, root = request.proto_file
    assert [m.name for m in other.message_type] == ["Used", "Chain"]
    assert [m.name for m in other.message_type[0].nested_type] == ["Inner"]
    assert [e.name for e in other.enum_type] == ["UsedEnum"]
    assert list(other.service) == []
    assert _comments(other) == {
        (4, 0): "Used",
        (4, 0, 1): "Used",
        (4, 0, 2, 0): "Used.inner",
        (4, 1): "Chain",
        (4, 1, 1): "Chain",
        (5, 0): "UsedEnum",
    }

    for file in (root, request.source_file_descriptors[0]):
        assert [m.name for m in file.message_type] == ["Req"]
        assert [s.name for s in file.service] == ["Svc"]
        assert [e.name for e in file.extension] == ["kept"]
        assert list(file.dependency) == ["dep/other.proto"]
        assert list(file.public_dependency) == [0]
        assert _comments(file) == {(3, 0): "import other", (7, 0): "kept", (4, 0): "Req"}


@needs_protobuf
def test_prune_refuses_a_reference_the_request_does_not_define() -> None:
    request = _request()
    request.proto_file[2].message_type[0].field[0].type_name = ".other.Missing"
    with pytest.raises(_generate.GenerationError, match=r"\.other\.Missing"):
        _generate.prune_request(request)
