"""The package as users get it: a wheel built by its declared backend, typed (PEP 561), with
its extras and every module inside."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_is_typed_and_carries_every_module_and_extra(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True,
    )
    assert out.returncode == 0, out.stderr
    (wheel,) = tmp_path.glob("abridge_memory-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = z.read(meta_name).decode()
    for module in ("__init__", "_client", "_core", "_errors", "_local", "_models", "langchain",
                   "langgraph", "agents"):
        assert f"abridge_memory/{module}.py" in names, names
    assert "abridge_memory/py.typed" in names
    assert not any(n.startswith(("tests/", "examples/", "benchmarks/")) for n in names), names
    assert "Name: abridge-memory" in meta
    assert "Requires-Python: >=3.10" in meta
    for extra in ("langchain", "langgraph", "agents"):
        assert f"Provides-Extra: {extra}" in meta, meta
