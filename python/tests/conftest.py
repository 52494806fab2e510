"""Fixtures: the real `abridge serve` binary on a free loopback port, summarizing with the
project's own Ollama-compatible test model server (`abridge-test-llm`), each in a fresh
directory. The binaries come from the workspace's `target/debug` (built by `cargo test
--workspace` and `cargo build -p abridge-test-llm`), or from $ABRIDGE_BIN and
$ABRIDGE_TEST_LLM_BIN. Without them the tests are skipped, and say so; with
ABRIDGE_REQUIRE_PYTHON=1 (CI) they fail instead."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _binary(env: str, name: str) -> Optional[Path]:
    given = os.environ.get(env)
    if given:
        return Path(given)
    p = ROOT / "target" / "debug" / name
    return p if p.exists() else None


def _require(env: str, name: str, build: str) -> Path:
    p = _binary(env, name)
    if p is None or not p.exists():
        msg = f"{name} not found; build it with `{build}` or set {env}"
        if os.environ.get("ABRIDGE_REQUIRE_PYTHON") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return p


def _listening(proc: subprocess.Popen, what: str, log: Path) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    prefix = "listening on "
    if not line.startswith(prefix):
        proc.kill()
        raise RuntimeError(f"{what} did not start: {line!r}\n{log.read_text() if log.exists() else ''}")
    return line[len(prefix):]


@dataclass
class Server:
    url: str
    dir: Path
    bin: Path
    env: dict[str, str]

    def cli(self, *args: str) -> str:
        """Run the `abridge` CLI against the same database (tokens, keys)."""
        out = subprocess.run([str(self.bin), *args], env=self.env, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"abridge {' '.join(args)}: {out.stderr}")
        return out.stdout.strip()


@pytest.fixture(scope="session")
def model_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The test model server: the one the Rust suite started ($ABRIDGE_TEST_MODEL_URL), or
    the `abridge-test-llm` binary."""
    given = os.environ.get("ABRIDGE_TEST_MODEL_URL")
    if given:
        yield given
        return
    llm = _require("ABRIDGE_TEST_LLM_BIN", "abridge-test-llm", "cargo build -p abridge-test-llm")
    log = tmp_path_factory.mktemp("llm") / "llm.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([str(llm)], stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        yield _listening(proc, "abridge-test-llm", log)
    finally:
        proc.kill()
        proc.wait()


def start_server(model_url: str, dir: Path, extra_env: Optional[dict[str, str]] = None) -> tuple[subprocess.Popen, Server]:
    bin = _require("ABRIDGE_BIN", "abridge", "cargo build -p abridge")
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
    return proc, Server(url=_listening(proc, "abridge serve", log), dir=dir, bin=bin, env=env)


@pytest.fixture()
def server(model_url: str, tmp_path: Path) -> Iterator[Server]:
    """A fresh `abridge serve` with its own database (open on loopback: no tokens)."""
    proc, srv = start_server(model_url, tmp_path)
    try:
        yield srv
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(autouse=True)
def no_blocking_calls_on_the_loop() -> Iterator[None]:
    """No async path of the package blocks an event loop (blocking_guard.py)."""
    from blocking_guard import no_blocking_calls_on_the_loop as guard

    with guard():
        yield


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"abridge binaries from {ROOT / 'target' / 'debug'} (python {sys.version.split()[0]})"]
