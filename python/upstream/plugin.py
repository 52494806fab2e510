"""A pytest plugin that runs a framework's own tests against abridge's adapters.

Loaded by ``run.py`` (``-p plugin``) in the folder of one suite (``ABRIDGE_UPSTREAM_SUITE``):

- every test gets a fresh ``abridge serve`` (its own database, open on loopback) summarizing
  with the project's Ollama-compatible test model server;
- the suite's modules are imported unchanged, then the one name that builds the store or
  session (``Suite.swap``) is pointed at the abridge adapter;
- the tests that cannot apply by design (``Suite.not_applicable``) are deselected, by name,
  and listed with their reasons at the end; a name in that list that the suite no longer has
  is an error, so the list cannot go stale;
- no blocking call runs on an event loop inside ``abridge_memory`` (blockbuster, as
  langchain-core's own suite guards itself).
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from blocking_guard import no_blocking_calls_on_the_loop  # noqa: E402
from processes import binary, killed_after, start_model, start_serve  # noqa: E402
from suites import SUITES, Suite  # noqa: E402

SUITE: Suite = next(s for s in SUITES if s.name == os.environ["ABRIDGE_UPSTREAM_SUITE"])
URL: Optional[str] = None
DESELECTED: dict[str, str] = {}
KNOWN: dict[str, str] = {}


def _binary(env: str, name: str) -> Path:
    p = binary(env, name)
    if p is None:
        raise RuntimeError(f"{name} not found: build it (cargo build -p {name}) or set {env}")
    return p


@pytest.fixture(scope="session")
def _abridge_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    given = os.environ.get("ABRIDGE_TEST_MODEL_URL")
    if given:
        yield given
        return
    proc, url = start_model(_binary("ABRIDGE_TEST_LLM_BIN", "abridge-test-llm"),
                            tmp_path_factory.mktemp("llm"))
    with killed_after(proc):
        yield url


@pytest.fixture(autouse=True)
def _abridge_server(_abridge_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh `abridge serve` for each test: the state one in-memory store or SQLite file
    would start with."""
    global URL
    proc, URL, _ = start_serve(_binary("ABRIDGE_BIN", "abridge"), _abridge_model,
                               tmp_path_factory.mktemp("abridge"))
    with killed_after(proc):
        yield URL
    URL = None


@pytest.fixture(autouse=True)
def _no_blocking_calls_on_the_loop() -> Iterator[None]:
    """abridge_memory never blocks an event loop (python/tests/blocking_guard.py)."""
    with no_blocking_calls_on_the_loop():
        yield


# --- what replaces the framework's own store or session ---

def _url() -> str:
    if URL is None:
        raise RuntimeError("no abridge server: the store was built outside a test")
    return URL


def langgraph_store_class() -> type:
    from abridge_memory.langgraph import AbridgeStore

    class Store(AbridgeStore):
        """``InMemoryStore(...)`` for the suite: an AbridgeStore on this test's server."""

        def __init__(self, *, index: Any = None, ttl: Any = None) -> None:
            if index is not None or ttl is not None:
                raise NotImplementedError("index= and ttl= are not applicable (see suites.py)")
            super().__init__(url=_url())

    return Store


def langgraph_store_fixture() -> Any:
    from abridge_memory.langgraph import AbridgeStore

    @pytest.fixture
    async def store() -> Any:
        yield AbridgeStore(url=_url())

    return store


def agents_session_factory() -> Any:
    from abridge_memory.agents import AbridgeSession

    def make(session_id: str, db_path: Any = ":memory:", *, session_settings: Any = None,
             **_: Any) -> AbridgeSession:
        # A db_path names a separate database for SQLiteSession; sessions of one test share
        # this test's server, as sessions of one file share that file.
        return AbridgeSession(session_id, url=_url(), session_settings=session_settings)

    return make


def langchain_history_factory() -> Any:
    from abridge_memory.langchain import AbridgeChatMessageHistory

    def make(messages: Any = None, **_: Any) -> AbridgeChatMessageHistory:
        h = AbridgeChatMessageHistory(f"history-{uuid.uuid4().hex}", url=_url())
        if messages:
            h.add_messages(messages)
        return h

    return make


REPLACEMENT = {
    "InMemoryStore": langgraph_store_class,
    "store": langgraph_store_fixture,
    "SQLiteSession": agents_session_factory,
    "InMemoryChatMessageHistory": langchain_history_factory,
}


def _rel(path: Path) -> str:
    return path.resolve().relative_to(Path.cwd().resolve()).as_posix()


class _Swapped(pytest.Module):
    """The suite's module as it is, with the one name swapped after import."""

    def _getobj(self) -> Any:
        mod = super()._getobj()
        for file, name in SUITE.swap:
            if file == _rel(self.path):
                if not hasattr(mod, name):
                    raise RuntimeError(f"{file} has no {name}: the suite changed, update suites.py")
                setattr(mod, name, REPLACEMENT[name]())
        return mod


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: Any) -> Any:
    if _rel(module_path) in {f for f, _ in SUITE.swap}:
        return _Swapped.from_parent(parent, path=module_path)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        name = getattr(item, "originalname", item.name)
        if name in SUITE.known_failures:
            KNOWN[item.nodeid] = SUITE.known_failures[name]
            item.add_marker(pytest.mark.xfail(strict=True, reason=SUITE.known_failures[name]))
        if name in SUITE.not_applicable:
            DESELECTED[item.nodeid] = SUITE.not_applicable[name]
            drop.append(item)
        else:
            keep.append(item)
    seen = {getattr(i, "originalname", i.name) for i in items}
    stale = sorted((set(SUITE.not_applicable) | set(SUITE.known_failures)) - seen)
    whole = not any("::" in a for a in config.args)
    if stale and whole and not (items and items[0].session.testsfailed):
        raise pytest.UsageError(f"suites.py lists tests {SUITE.name} does not have: {stale}")
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_terminal_summary(terminalreporter: Any) -> None:
    stats = terminalreporter.stats
    passed = len([r for r in stats.get("passed", []) if r.when == "call"])
    failed = len(stats.get("failed", [])) + len(stats.get("error", []))
    w = terminalreporter.write_line
    known = len(stats.get("xfailed", []))
    w(f"{SUITE.name} ({SUITE.sdist}): {passed} passed, {failed} failed, "
      f"{len(DESELECTED)} not applicable, {known} known failures")
    by_reason: dict[str, list[str]] = {}
    for nodeid, reason in DESELECTED.items():
        by_reason.setdefault(reason, []).append(nodeid.split("::")[-1])
    for reason, names in by_reason.items():
        w(f"  not applicable ({reason}): {', '.join(sorted(names))}")
    known_by_reason: dict[str, list[str]] = {}
    for nodeid, reason in KNOWN.items():
        known_by_reason.setdefault(reason, []).append(nodeid.split("::")[-1])
    for reason, names in known_by_reason.items():
        w(f"  known failure ({reason}): {', '.join(sorted(names))}")
    out = os.environ.get("ABRIDGE_UPSTREAM_REPORT")
    if out:
        Path(out).write_text(json.dumps({"suite": SUITE.name, "sdist": SUITE.sdist,
                                         "passed": passed, "failed": failed, "known_failures": KNOWN,
                                         "not_applicable": DESELECTED}))
