"""The wheel with the ``abridge`` binary inside (``pip install`` gives the client, the
adapters and the command, no Rust needed).

Set ``ABRIDGE_WHEEL_BINARY`` to a built ``abridge`` (``cargo build --release`` makes
``target/release/abridge``) when building the wheel: the binary goes into the wheel's scripts,
so the installer puts ``abridge`` beside ``python`` in the environment, and the wheel is tagged
for this platform (``ABRIDGE_WHEEL_PLATFORM`` overrides the tag, e.g. when the binary was built
for another one). Without it the wheel is the pure-Python client, for users of their own
server.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class BinaryWheel(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        binary = os.environ.get("ABRIDGE_WHEEL_BINARY")
        if self.target_name != "wheel" or version == "editable" or not binary:
            return
        # The build runs in the package's folder: a relative path is read from there.
        path = (Path(self.root) / binary).resolve()
        if not path.is_file() or not os.access(path, os.X_OK):
            raise RuntimeError(
                f"ABRIDGE_WHEEL_BINARY={binary} is not an executable file (read as {path}): "
                "build it with `cargo build --release` and give its absolute path, "
                "e.g. ABRIDGE_WHEEL_BINARY=$PWD/target/release/abridge from the repository's root"
            )
        platform = os.environ.get("ABRIDGE_WHEEL_PLATFORM") or self._platform(path)
        name = "abridge.exe" if platform.startswith("win") else "abridge"
        build_data["pure_python"] = False
        build_data["tag"] = f"py3-none-{platform}"
        build_data["shared_scripts"][str(path)] = name
        mode = path.stat().st_mode
        if not mode & stat.S_IXOTH:
            raise RuntimeError(f"{path} is not executable by everyone (mode {oct(mode)})")

    @staticmethod
    def _platform(binary: Path) -> str:
        # On Linux: manylinux with the newest glibc the binary asks for (its versioned symbols,
        # GLIBC_2.34 say), which pip accepts on any Linux with that glibc or a newer one — not
        # the build machine's own, which may be newer than the binary needs. Elsewhere: the
        # most specific tag this machine matches.
        import platform
        import sys

        if sys.platform.startswith("linux"):
            needed = glibc_needed(binary.read_bytes())
            if needed is not None:
                return f"manylinux_{needed[0]}_{needed[1]}_{platform.machine()}"
            libc, ver = platform.libc_ver()
            if libc == "glibc" and ver:
                major, minor = ver.split(".")[:2]
                return f"manylinux_{major}_{minor}_{platform.machine()}"
        from packaging.tags import platform_tags

        return next(iter(platform_tags()))


def glibc_needed(elf: bytes) -> "tuple[int, int] | None":
    """The newest glibc version an ELF binary's symbol versions name (``GLIBC_2.34``), or
    ``None`` when it names none (a static binary, or not an ELF one)."""
    import re

    if not elf.startswith(b"\x7fELF"):
        return None
    found = [(int(a), int(b)) for a, b in re.findall(rb"GLIBC_(\d+)\.(\d+)", elf)]
    return max(found) if found else None
