"""The real binaries the Python suites run against (``python/tests`` and the frameworks' suites
in ``python/upstream``): found in the workspace's ``target/debug`` or named by environment
variables, and started on a free loopback port."""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

ROOT = Path(__file__).resolve().parents[2]


def binary(env: str, name: str) -> Optional[Path]:
    """``$env``, else ``target/debug/name``; None when neither exists."""
    p = Path(os.environ.get(env) or ROOT / "target" / "debug" / name)
    return p if p.exists() else None


def listening(proc: subprocess.Popen, what: str, log: Path) -> str:
    """The address a started server prints first (``listening on URL``)."""
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    prefix = "listening on "
    if not line.startswith(prefix):
        proc.kill()
        raise RuntimeError(f"{what} did not start: {line!r}\n{log.read_text() if log.exists() else ''}")
    return line[len(prefix):]


def start_model(bin: Path, dir: Path) -> tuple[subprocess.Popen, str]:
    """The project's Ollama-compatible test model server."""
    log = dir / "llm.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([str(bin)], stdout=subprocess.PIPE, stderr=err, text=True)
    return proc, listening(proc, "abridge-test-llm", log)


def start_serve(bin: Path, model_url: str, dir: Path,
                extra_env: Optional[dict[str, str]] = None) -> tuple[subprocess.Popen, str, dict[str, str]]:
    """``abridge serve`` with its own database in ``dir`` (open on loopback: no tokens),
    summarizing with the model server at ``model_url``: the process, its URL, its environment."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(dir),
        "ABRIDGE_DB": str(dir / "abridge.db"),
        "EXTRACTION_URL": model_url,
        "ABRIDGE_RETRY_BASE_MS": "5",
    }
    env.update(extra_env or {})
    log = dir / "serve.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [str(bin), "serve", "--listen", "127.0.0.1:0"], env=env, stdout=subprocess.PIPE,
            stderr=err, text=True, cwd=dir,
        )
    return proc, listening(proc, "abridge serve", log), env


@contextmanager
def killed_after(proc: subprocess.Popen) -> Iterator[None]:
    """Run the block, then end the process (whatever the block did)."""
    try:
        yield
    finally:
        proc.kill()
        proc.wait()
