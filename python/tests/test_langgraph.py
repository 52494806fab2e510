"""The LangGraph adapters against the real server: the store's documented contract
(``BaseStore``: put replaces, get, delete, search with and without a query, filters,
list_namespaces with prefixes and depth, TTL refused) and the pre-model hook in a graph."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph

import abridge_memory as ab
from abridge_memory.langgraph import AbridgeStore, ContextHook
from conftest import Server


def test_put_get_replace_and_delete(server: Server) -> None:
    s = AbridgeStore(url=server.url)
    ns = ("memories", "alice")
    assert s.get(ns, "theme") is None
    s.put(ns, "theme", {"text": "Alice prefers the dark theme", "since": 2024})
    item = s.get(ns, "theme")
    assert item is not None and item.value == {"text": "Alice prefers the dark theme", "since": 2024}
    assert item.namespace == ns and item.key == "theme" and item.created_at.year >= 2026
    s.put(ns, "theme", {"text": "Alice switched to the light theme"})
    assert s.get(ns, "theme").value == {"text": "Alice switched to the light theme"}
    assert len(s.search(ns)) == 1, "a put replaces the item"
    s.delete(ns, "theme")
    assert s.get(ns, "theme") is None and s.search(ns) == []


def test_search_by_query_filter_prefix_and_page(server: Server) -> None:
    s = AbridgeStore(url=server.url)
    s.put(("memories", "alice"), "deploy", {"text": "Alice deploys billing on Thursdays", "team": "billing"})
    s.put(("memories", "alice"), "editor", {"text": "Alice uses the dark editor theme", "team": "billing"})
    s.put(("memories", "alice", "work"), "laptop", {"text": "Alice's laptop runs Debian", "team": "infra"})
    s.put(("memories", "bob"), "editor", {"text": "Bob uses the light editor theme", "team": "infra"})
    hits = s.search(("memories", "alice"), query="which editor theme")
    assert hits and hits[0].key == "editor" and hits[0].score is not None
    assert all(h.namespace[:2] == ("memories", "alice") for h in hits)
    assert {h.key for h in s.search(("memories",), filter={"team": "infra"})} == {"laptop", "editor"}
    assert [h.key for h in s.search(("memories", "alice", "work"))] == ["laptop"]
    assert len(s.search(("memories",), limit=2)) == 2
    assert len(s.search(("memories",), limit=10, offset=3)) == 1
    # Not indexed: listed, never found by a query.
    s.put(("memories", "alice"), "secret", {"text": "Alice's dark editor theme is solarized"}, index=False)
    assert s.get(("memories", "alice"), "secret") is not None
    assert "secret" not in {h.key for h in s.search(("memories", "alice"), query="dark editor theme")}
    assert "secret" in {h.key for h in s.search(("memories", "alice"))}


def test_search_filters_compare_as_langgraphs_own_store_does(server: Server) -> None:
    from langgraph.store.memory import InMemoryStore

    items = [("a", {"score": 4.5, "tags": ["x", "y"], "meta": {"lang": "en"}}),
             ("b", {"score": 3.0, "tags": ["x"], "meta": {"lang": "fr"}}),
             ("c", {"score": 2.0, "tags": [], "meta": {"lang": "en"}})]
    ns = ("filters",)
    mine, theirs = AbridgeStore(url=server.url), InMemoryStore()
    for s in (mine, theirs):
        for k, v in items:
            s.put(ns, k, v)
    for f in [{"score": {"$gt": 3.2}}, {"score": {"$gte": 3.0}}, {"score": {"$lt": 3.0}},
              {"score": {"$lte": 3.0, "$ne": 2.0}}, {"score": {"$eq": 4.5}},
              {"meta": {"lang": "en"}}, {"tags": ["x"]}, {"score": 3.0}]:
        got = sorted(h.key for h in mine.search(ns, filter=f))
        want = sorted(h.key for h in theirs.search(ns, filter=f))
        assert got == want, f"{f}: abridge {got}, InMemoryStore {want}"
    with pytest.raises(ValueError, match="Unsupported operator"):
        mine.search(ns, filter={"score": {"$near": 1}})


def test_labels_with_control_characters_are_stored_as_langgraph_allows(server: Server) -> None:
    s = AbridgeStore(url=server.url)
    ns = ("mem\tories", "al\x01ice", "50%")
    s.put(ns, "k\ney", {"text": "a value"})
    item = s.get(ns, "k\ney")
    assert item is not None and item.namespace == ns and item.key == "k\ney"
    assert [h.key for h in s.search(ns[:2])] == ["k\ney"]
    assert ns in s.list_namespaces(prefix=ns[:1])


def test_list_namespaces_with_prefix_suffix_and_depth(server: Server) -> None:
    s = AbridgeStore(url=server.url)
    for ns in [("a", "x", "1"), ("a", "y"), ("b", "x")]:
        s.put(ns, "k", {"v": 1})
    assert s.list_namespaces() == [("a", "x", "1"), ("a", "y"), ("b", "x")]
    assert s.list_namespaces(prefix=("a",)) == [("a", "x", "1"), ("a", "y")]
    assert s.list_namespaces(suffix=("x",)) == [("b", "x")]
    assert s.list_namespaces(max_depth=1) == [("a",), ("b",)]
    assert s.list_namespaces(limit=1, offset=1) == [("a", "y")]


def test_ttl_is_refused_clearly(server: Server) -> None:
    s = AbridgeStore(url=server.url)
    with pytest.raises(NotImplementedError, match="TTL"):
        s.put(("m", "u"), "k", {"v": 1}, ttl=5)


async def test_an_async_operation_carrying_a_list_is_answered(server: Server) -> None:
    """A namespace condition given as a list made the batch task die (its key was not
    hashable) and left every waiting caller hanging: it is answered, and so are the calls
    batched with it."""
    import asyncio

    s = AbridgeStore(url=server.url)
    await s.aput(("uid", "users", "alice"), "k", {"v": 1})
    await s.aput(("uid", "users", "malice"), "k", {"v": 1})
    found, item = await asyncio.wait_for(
        asyncio.gather(
            s.alist_namespaces(suffix=["alice"], limit=100),
            s.aget(("uid", "users", "alice"), "k"),
        ),
        timeout=30,
    )
    assert found == [("uid", "users", "alice")]
    assert item is not None and item.value == {"v": 1}


async def test_a_batch_that_fails_answers_every_waiting_call(server: Server) -> None:
    """Whatever stops a batch — here the merge of its operations — reaches each call in it
    as an error, and the next batch runs."""
    import asyncio

    import abridge_memory.langgraph as lg

    s = AbridgeStore(url=server.url)
    real = lg.dedupe_ops

    def broken(ops):  # type: ignore[no-untyped-def]
        raise TypeError("unhashable type: 'list'")

    lg.dedupe_ops = broken
    try:
        results = await asyncio.wait_for(
            asyncio.gather(s.aget(("m",), "a"), s.aget(("m",), "b"), return_exceptions=True),
            timeout=30,
        )
    finally:
        lg.dedupe_ops = real
    assert all(isinstance(r, TypeError) for r in results), results
    await asyncio.wait_for(s.aput(("m",), "a", {"v": 3}), timeout=30)
    assert (await asyncio.wait_for(s.aget(("m",), "a"), timeout=30)).value == {"v": 3}


async def test_the_async_operations(server: Server) -> None:
    s = AbridgeStore(url=server.url)
    await s.aput(("m", "u"), "k", {"v": 2})
    assert (await s.aget(("m", "u"), "k")).value == {"v": 2}
    assert [i.key for i in await s.asearch(("m",))] == ["k"]
    await s.adelete(("m", "u"), "k")
    assert await s.aget(("m", "u"), "k") is None


def test_the_hook_keeps_each_model_call_within_budget_as_the_thread_grows(server: Server) -> None:
    client = ab.Client(server.url)
    hook = ContextHook(client, budget=1200)
    seen: list[list] = []

    def model(state: MessagesState, config) -> dict:
        msgs = hook(state, config)["llm_input_messages"]
        seen.append(msgs)
        last = state["messages"][-1].content
        return {"messages": [AIMessage(f"Answer to {last}: the worker's lease is raised to {len(seen) + 30} s.")]}

    g = StateGraph(MessagesState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    app = g.compile(checkpointer=InMemorySaver())
    cfg = {"configurable": {"thread_id": "lg-thread"}}
    for i in range(40):
        app.invoke({"messages": [HumanMessage(f"Turn {i}: why does job {i * 13} in services/worker{i % 9}/queue.rs retry before release v3.{i % 17}.0?")]}, cfg)
    # Every finished turn was stored once; each model call saw the context and the new turn.
    assert client.session("lg-thread").episodes == 78
    last = seen[-1]
    # The new turn, with the turns its query found before it (the per-call note).
    assert isinstance(last[-1], HumanMessage) and last[-1].content.split("follows:\n")[-1].startswith("Turn 39")
    assert isinstance(last[0], SystemMessage), "the summary leads the context"
    sizes = [sum(len(m.content) for m in s) for s in seen]
    assert max(sizes[20:]) < 1200 * 4, sizes
    assert sizes[-1] < sum(len(m.content) for m in app.get_state(cfg).values["messages"]) / 3


def test_the_hook_keeps_the_current_turns_tool_calls_verbatim(server: Server) -> None:
    hook = ContextHook(ab.Client(server.url), budget=800)
    cfg = {"configurable": {"thread_id": "tools"}}
    earlier = [HumanMessage("hello", id="h1"), AIMessage("hi", id="a1")]
    call = AIMessage("", id="a2", tool_calls=[{"name": "lookup", "args": {"q": "lease"}, "id": "c1"}])
    turn = [HumanMessage("check the lease", id="h2"), call, ToolMessage("30 s", tool_call_id="c1", id="t1")]
    out = hook({"messages": earlier + turn}, cfg)["llm_input_messages"]
    assert out[-3:] == turn
    with pytest.raises(ValueError, match="thread_id"):
        hook({"messages": earlier + turn}, {})


def test_the_hook_asks_the_context_for_the_turns_that_answer_the_new_message(server: Server) -> None:
    client = ab.Client(server.url)
    seen: dict[bool, list] = {}
    for query in (True, False):
        hook = ContextHook(client, budget=400, prefix=f"q{query}-", query=query)
        cfg = {"configurable": {"thread_id": "recall"}}
        history: list = [HumanMessage("The launch code for the Zephyr project is 7741.", id="z1"),
                         AIMessage("Noted.", id="z2")]
        for i in range(30):
            history += [HumanMessage(f"Turn {i}: the weather and the garden.", id=f"h{i}"),
                        AIMessage(f"Turn {i}: nothing more to say.", id=f"a{i}")]
        out = hook({"messages": history + [HumanMessage("What was the Zephyr launch code?")]}, cfg)
        seen[query] = out["llm_input_messages"]
    # The turns found ride on the user's new turn, after the stable prefix of the context.
    turn = seen[True][-1]
    assert isinstance(turn, HumanMessage) and turn.content.endswith("What was the Zephyr launch code?")
    assert "Earlier turns that match the question" in turn.content and "7741" in turn.content
    assert not any("Earlier turns that match" in m.content for m in seen[True][:-1])
    assert not any("Earlier turns that match" in m.content for m in seen[False])


def test_a_recalled_item_reads_as_its_fields_not_its_json(server: Server) -> None:
    """A LangGraph item recalled through the retriever (or any client of recall) is readable
    text; the store still reads it back exactly."""
    from abridge_memory.langchain import AbridgeRetriever

    s = AbridgeStore(url=server.url)
    s.put(("users", "alice"), "food", {"likes": "pizza with olives", "allergies": ["peanuts"]})
    assert s.get(("users", "alice"), "food").value == {"likes": "pizza with olives", "allergies": ["peanuts"]}
    docs = AbridgeRetriever(url=server.url, type="langgraph", k=3).invoke("pizza olives")
    assert docs, "the item was not recalled"
    text = docs[0].page_content
    # (The envelope keeps its fields in sorted order.)
    assert text == "food (users/alice): allergies: peanuts; likes: pizza with olives", text
