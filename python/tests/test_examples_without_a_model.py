"""The examples, started with no model server, say how to get one (exit 2), not a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("example", ["langchain_chat.py", "langgraph_agent.py", "agents_session.py"])
def test_an_example_without_a_model_server_says_what_to_do(example: str) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    r = subprocess.run(
        [sys.executable, str(EXAMPLES / example), "--model-url", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert f"no model server answers at {url}" in r.stderr
    assert "ollama serve" in r.stderr and "abridge-test-llm" in r.stderr
