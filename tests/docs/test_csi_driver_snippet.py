"""docs/csi-driver.md's driver runs as written, with the CSI messages from their public home
(``pyprovlib.csi.messages``): the snippet serves on a socket and answers CreateVolume and
DeleteVolume as the page says. And no page of the documentation imports a private module
(issue 30: the page imported ``pyprovlib.csi._proto.csi.v1``)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import betterproto2
import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from pyprovlib.csi import messages
from pyprovlib.csi._proto.csi import v1
from pyprovlib.testing import eventually

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "csi-driver.md"
PRIVATE_IMPORT = re.compile(
    r"^\s*(?:from\s+pyprovlib(?:\.\w+)*\._\w+|import\s+pyprovlib(?:\.\w+)*\._\w+)", re.M
)


def code_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def pages() -> list[Path]:
    return [
        *sorted(ROOT.glob("docs/**/*.md")),
        ROOT / "README.md",
        *sorted(ROOT.glob("examples/*/README.md")),
        *sorted(ROOT.glob("examples/*/*.py")),
    ]


def test_no_page_imports_a_private_module() -> None:
    offenders = []
    for page in pages():
        text = page.read_text()
        blocks = [text] if page.suffix == ".py" else code_blocks(text)
        offenders += [
            f"{page.relative_to(ROOT)}: {m.strip()}"
            for b in blocks
            for m in PRIVATE_IMPORT.findall(b)
        ]
    assert offenders == []


def test_messages_are_every_generated_message_and_enum() -> None:
    generated = {
        name
        for name in v1.__all__
        if isinstance(getattr(v1, name), type)
        and issubclass(getattr(v1, name), betterproto2.Message | betterproto2.Enum)
    }
    assert set(messages.__all__) == generated
    for name in messages.__all__:
        assert getattr(messages, name) is getattr(v1, name)


@pytest.fixture
def socket_path() -> Iterator[Path]:
    """A socket path short enough for AF_UNIX (pytest's tmp_path can be too long)."""
    directory = Path(tempfile.mkdtemp(prefix="csi-doc-", dir="/tmp"))
    yield directory / "csi.sock"
    shutil.rmtree(directory)


async def test_the_page_driver_serves_create_and_delete(socket_path: Path) -> None:
    (snippet,) = [b for b in code_blocks(PAGE.read_text()) if "class Controller(" in b]
    assert '"unix:///csi/csi.sock"' in snippet
    namespace: dict[str, object] = {"__name__": "csi_driver_page"}
    exec(compile(snippet.replace("/csi/csi.sock", str(socket_path)), str(PAGE), "exec"), namespace)
    main = namespace["main"]
    assert callable(main)
    served = asyncio.create_task(main())
    try:
        await eventually(socket_path.exists, message="the page's driver listens")
        channel = Channel(path=str(socket_path))
        try:
            info = await v1.IdentityStub(channel).get_plugin_info(v1.GetPluginInfoRequest())
            assert info.name == "my.csi.example.com"
            controller = v1.ControllerStub(channel)
            mount = messages.VolumeCapability(
                mount=messages.VolumeCapabilityMountVolume(),
                access_mode=messages.VolumeCapabilityAccessMode(
                    mode=messages.VolumeCapabilityAccessModeMode.SINGLE_NODE_WRITER
                ),
            )
            created = await controller.create_volume(
                messages.CreateVolumeRequest(name="pvc-1", volume_capabilities=[mount])
            )
            assert created.volume is not None
            assert (created.volume.volume_id, created.volume.capacity_bytes) == ("pvc-1", 1 << 30)
            with pytest.raises(GRPCError) as refused:
                await controller.create_volume(messages.CreateVolumeRequest(name="pvc-2"))
            assert refused.value.status is Status.INVALID_ARGUMENT
            with pytest.raises(GRPCError) as in_use:
                await controller.delete_volume(messages.DeleteVolumeRequest(volume_id="pvc-1"))
            assert in_use.value.status is Status.FAILED_PRECONDITION
        finally:
            channel.close()
    finally:
        served.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await served
