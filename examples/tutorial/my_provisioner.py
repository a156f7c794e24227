"""A provisioner whose volumes are directories ``<root>/<pv name>`` (the tutorial's code)."""

import asyncio
import shutil
import sys
from pathlib import Path

from kubernetes_asyncio.client import (
    V1HostPathVolumeSource,
    V1ObjectMeta,
    V1PersistentVolume,
    V1PersistentVolumeSpec,
)

from pyprovlib import ProvisionController, Provisioner, ProvisionOptions
from pyprovlib.runtime import (
    RuntimeArgumentParser,
    RuntimeContext,
    add_flag,
    common_parser,
    provision_controller_options,
    run,
)

__version__ = "0.1.0"
PROVISIONER_NAME = "example.com/directory"


class DirectoryProvisioner(Provisioner):
    """Creates one directory per volume under ``root`` and removes it again."""

    def __init__(self, root: Path) -> None:
        self.root = root

    async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
        # The PV name is pvc-<claim uid>: never build paths from what users write in claims.
        path = self.root / options.pv_name
        await asyncio.to_thread(path.mkdir, parents=True, exist_ok=True)
        return V1PersistentVolume(
            metadata=V1ObjectMeta(name=options.pv_name),
            spec=V1PersistentVolumeSpec(
                capacity={"storage": options.pvc.spec.resources.requests["storage"]},
                access_modes=options.pvc.spec.access_modes,
                host_path=V1HostPathVolumeSource(path=str(path)),
            ),
        )

    async def delete(self, volume: V1PersistentVolume) -> None:
        path = self.root / volume.metadata.name
        if await asyncio.to_thread(path.exists):  # already gone counts as deleted
            await asyncio.to_thread(shutil.rmtree, path)


def make_controller(ctx: RuntimeContext) -> ProvisionController:
    """Build the controller from the flags the runtime parsed."""
    options = provision_controller_options(ctx.options)
    provisioner = DirectoryProvisioner(Path(ctx.args.root).absolute())
    return ProvisionController(ctx.api_client, PROVISIONER_NAME, provisioner, options)


def build_parser() -> RuntimeArgumentParser:
    """The program's flags: the runtime's, and --root."""
    parser = common_parser(
        "my-provisioner", "Provisions volumes as local directories.", version=__version__
    )
    add_flag(parser, "--root", default="/var/lib/my-volumes", help="directory holding volumes")
    return parser


def main() -> int:
    """The program: parse the flags, then run the controller until SIGTERM."""
    return run(make_controller, parser=build_parser())


if __name__ == "__main__":
    sys.exit(main())
