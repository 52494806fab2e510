"""``local()``: a private ``abridge serve`` for a script or a notebook."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Union

from ._client import Client
from ._errors import ServerUnreachable


def installed_binary() -> Optional[str]:
    """The ``abridge`` command the platform wheel installed beside this Python (its
    environment's scripts, or the user's with ``pip install --user``), else the one on PATH."""
    import sys
    import sysconfig

    name = "abridge.exe" if sys.platform == "win32" else "abridge"
    schemes = [sysconfig.get_path("scripts")]
    try:
        schemes.append(sysconfig.get_path("scripts", f"{os.name}_user"))
    except KeyError:
        pass
    for folder in schemes:
        if folder and (Path(folder) / name).is_file():
            return str(Path(folder) / name)
    return shutil.which("abridge")


@contextmanager
def local(
    binary: Optional[Union[str, Path]] = None,
    *,
    db: Optional[Union[str, Path]] = None,
    env: Optional[dict[str, str]] = None,
    args: tuple[str, ...] = (),
    timeout: float = 30.0,
) -> Iterator[Client]:
    """Start ``abridge serve`` on a free loopback port and yield a :class:`Client` of it; the
    server stops when the block ends.

    ``binary`` defaults to ``$ABRIDGE_BIN``, then the ``abridge`` the wheel installed beside
    this Python, then ``abridge`` on PATH; ``db`` to a temporary
    file deleted afterwards (give a path to keep the data). ``env`` adds variables (the model:
    ``EXTRACTION_URL``, ``ABRIDGE_BACKEND=extractive`` for none).
    """
    exe = str(binary or os.environ.get("ABRIDGE_BIN") or installed_binary() or "")
    if not exe or not Path(exe).exists():
        raise ServerUnreachable(
            "no abridge binary to start",
            hint="install the wheel that carries it (pip install abridge-memory on Linux "
            "x86_64/aarch64, macOS or Windows), or build it (cargo install --path host) and put "
            "it on PATH, or pass local(binary=...) / set ABRIDGE_BIN",
        )
    tmp = tempfile.TemporaryDirectory(prefix="abridge-") if db is None else None
    path = Path(db) if db is not None else Path(tmp.name) / "abridge.db"  # type: ignore[union-attr]
    full_env = {**os.environ, "ABRIDGE_DB": str(path), **(env or {})}
    proc = subprocess.Popen(
        [exe, "serve", "--listen", "127.0.0.1:0", *args],
        env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            proc.kill()
            err = proc.stderr.read()
            raise ServerUnreachable(
                f"abridge serve did not start: {err.strip() or line or 'no output'}",
                hint="run the same command in a terminal to see why",
            )
        with Client(line[len("listening on "):], timeout=timeout) as client:
            yield client
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if tmp is not None:
            tmp.cleanup()
