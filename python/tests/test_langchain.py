"""The LangChain adapters: langchain-tests' standard retriever suite, and the chat history's
documented contract (``BaseChatMessageHistory``), against the real server."""

from __future__ import annotations

import warnings

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_tests.integration_tests import RetrieversIntegrationTests

import abridge_memory as ab
from abridge_memory.langchain import AbridgeChatMessageHistory, AbridgeRetriever
from conftest import Server
from test_client import chat

warnings.filterwarnings("ignore", category=DeprecationWarning)

FACTS = [
    "Alice deploys the billing service on Thursdays.",
    "Alice prefers the dark theme in her editor.",
    "Alice's laptop runs Debian 12 with 32 GB of memory.",
    "Alice reviews pull requests every morning before standup.",
    "Alice keeps the on-call runbook in the ops repository.",
    "Alice rotates the staging database password monthly.",
]


@pytest.fixture()
def seeded(server: Server) -> Server:
    with ab.Client(server.url) as c:
        for i, f in enumerate(FACTS):
            # Distinct keys: six facts, six memories (no cluster summary stands in for them).
            c.remember(f, user="alice", key=f"fact-{i}")
    return server


class TestAbridgeRetrieverStandard(RetrieversIntegrationTests):
    """langchain-tests' own suite for retrievers."""

    @pytest.fixture(autouse=True)
    def _server(self, seeded: Server) -> None:
        type(self).url = seeded.url

    @property
    def retriever_constructor(self) -> type[AbridgeRetriever]:
        return AbridgeRetriever

    @property
    def retriever_constructor_params(self) -> dict:
        return {"url": type(self).url, "user": "alice"}

    @property
    def retriever_query_example(self) -> str:
        return "what does Alice do on Thursdays"


def test_the_retriever_finds_the_fact_with_its_metadata(seeded: Server) -> None:
    r = AbridgeRetriever(url=seeded.url, user="alice", k=2)
    docs = r.invoke("which editor theme does Alice like")
    assert len(docs) == 2 and "dark theme" in docs[0].page_content
    assert docs[0].metadata["kind"] == "memory" and docs[0].metadata["id"]
    assert AbridgeRetriever(url=seeded.url, user="bob").invoke("editor theme") == []


def test_the_history_stores_messages_reads_them_back_and_clears(server: Server) -> None:
    h = AbridgeChatMessageHistory("lc-1", url=server.url)
    assert h.messages == []
    h.add_user_message("We ship v2.3 on Friday.")
    h.add_ai_message("Noted: v2.3 ships Friday.")
    h.add_messages([HumanMessage("And the changelog?"), AIMessage("Drafted in docs/CHANGES.md.")])
    got = h.messages
    assert [type(m) for m in got] == [HumanMessage, AIMessage, HumanMessage, AIMessage]
    assert got[-1].content == "Drafted in docs/CHANGES.md."
    h.clear()
    assert h.messages == []
    h.clear()  # clearing an empty history is fine


async def test_the_history_async_methods(server: Server) -> None:
    async with ab.AsyncClient(server.url) as ac:
        h = AbridgeChatMessageHistory("lc-2", url=server.url, async_client=ac)
        await h.aadd_messages([HumanMessage("hi"), AIMessage("hello")])
        assert [m.content for m in await h.aget_messages()] == ["hi", "hello"]
        await h.aclear()
        assert await h.aget_messages() == []


def test_the_context_stays_within_budget_as_the_history_grows(server: Server) -> None:
    h = AbridgeChatMessageHistory("lc-3", url=server.url)
    with ab.Client(server.url) as c:
        c.add_messages("lc-3", chat(100))
        ctx = c.context("lc-3", budget=1500, wait_ms=60000)
    msgs = h.context_messages(budget=1500)
    assert len(h.messages) == 200
    assert ctx.tokens <= 1500 and ctx.omitted == 0, ctx
    assert isinstance(msgs[0], SystemMessage) and len(msgs) < 200
    assert sum(len(m.content) for m in msgs) < sum(len(m.content) for m in h.messages) / 3


def test_the_context_carries_the_turns_that_answer_the_newest_user_message(server: Server) -> None:
    h = AbridgeChatMessageHistory("lc-query", url=server.url)
    said = [("user", "The launch code for the Zephyr project is 7741."), ("assistant", "Noted.")]
    said += [("user" if i % 2 == 0 else "assistant", f"Turn {i}: the weather and the garden.") for i in range(40)]
    said.append(("user", "What was the Zephyr launch code again?"))
    with ab.Client(server.url) as c:
        c.add_messages("lc-query", said)
    by_default = "\n".join(m.content for m in h.context_messages(budget=300))
    assert "Earlier turns that match the question" in by_default and "7741" in by_default
    given = "\n".join(m.content for m in h.context_messages(budget=300, query="zephyr launch code"))
    assert "7741" in given
    off = "\n".join(m.content for m in h.context_messages(budget=300, query=False))
    assert "Earlier turns that match the question" not in off


async def test_the_async_methods_never_block_the_event_loop(server: Server) -> None:
    # Without an async client the sync client works in a worker thread, never on the loop
    # (LangChain's guard drops a turn whose history blocks it).
    import threading

    from langchain_core.messages import HumanMessage

    h = AbridgeChatMessageHistory("no-block", url=server.url)
    loop_thread = threading.current_thread()
    seen: list[threading.Thread] = []
    original = h.client.add_messages

    def add(*a, **k):  # type: ignore[no-untyped-def]
        seen.append(threading.current_thread())
        return original(*a, **k)

    h.client.add_messages = add  # type: ignore[method-assign]
    await h.aadd_messages([HumanMessage("We ship on Friday.")])
    assert seen and all(t is not loop_thread for t in seen)
    assert [m.content for m in await h.aget_messages()] == ["We ship on Friday."]
    await h.aclear()
    assert await h.aget_messages() == []
