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

from processes import binary, killed_after, start_model, start_serve  # noqa: E402


def _require(env: str, name: str, build: str) -> Path:
    p = binary(env, name)
    if p is None:
        msg = f"{name} not found; build it with `{build}` or set {env}"
        if os.environ.get("ABRIDGE_REQUIRE_PYTHON") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return p


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
    proc, url = start_model(llm, tmp_path_factory.mktemp("llm"))
    with killed_after(proc):
        yield url


def start_server(model_url: str, dir: Path, extra_env: Optional[dict[str, str]] = None) -> tuple[subprocess.Popen, Server]:
    bin = _require("ABRIDGE_BIN", "abridge", "cargo build -p abridge")
    proc, url, env = start_serve(bin, model_url, dir, extra_env)
    return proc, Server(url=url, dir=dir, bin=bin, env=env)


@pytest.fixture()
def server(model_url: str, tmp_path: Path) -> Iterator[Server]:
    """A fresh `abridge serve` with its own database (open on loopback: no tokens)."""
    proc, srv = start_server(model_url, tmp_path)
    with killed_after(proc):
        yield srv


@pytest.fixture(autouse=True)
def no_blocking_calls_on_the_loop() -> Iterator[None]:
    """No async path of the package blocks an event loop (blocking_guard.py)."""
    from blocking_guard import no_blocking_calls_on_the_loop as guard

    with guard():
        yield


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"abridge binaries from {ROOT / 'target' / 'debug'} (python {sys.version.split()[0]})"]
