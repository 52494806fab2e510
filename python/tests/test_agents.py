"""The OpenAI Agents SDK session against the real server: the ``Session`` protocol's documented
contract, step for step beside the SDK's own ``SQLiteSession``; items of every kind kept as
text; and a ``Runner`` whose prompts stay bounded while its session grows."""

from __future__ import annotations

from typing import Any

import httpx
from agents import Agent, OpenAIChatCompletionsModel, Runner, SQLiteSession, set_tracing_disabled
from agents.memory import Session, SessionSettings
from openai import AsyncOpenAI

import abridge_memory as ab
from abridge_memory.agents import AbridgeSession, item_message
from conftest import Server

set_tracing_disabled(True)


def turns(n: int, start: int = 0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(start, start + n):
        out.append({"role": "user", "content": f"Turn {i}: is the lease of worker{i} long enough?"})
        out.append({"role": "assistant", "content": f"Turn {i}: raise it to {30 + i} seconds."})
    return out


async def test_the_contract_step_for_step_beside_the_sdks_own_session(server: Server) -> None:
    async with ab.AsyncClient(server.url) as c:
        mine = AbridgeSession("contract", c, budget=4000)
        theirs = SQLiteSession("contract")
        assert isinstance(mine, Session)
        for s in (mine, theirs):
            assert await s.get_items() == []
            assert await s.pop_item() is None
        steps: list[tuple[str, Any]] = [
            ("add", turns(2)), ("get", None), ("get", 3), ("get", 0), ("pop", None),
            ("get", None), ("add", turns(1, 5)), ("get", None), ("pop", None), ("pop", None),
            ("get", 2), ("clear", None), ("get", None), ("pop", None), ("add", turns(1, 9)),
            ("get", None),
        ]
        for op, arg in steps:
            got = []
            for s in (mine, theirs):
                if op == "add":
                    got.append(await s.add_items(arg))
                elif op == "get":
                    got.append(await (s.get_items() if arg is None else s.get_items(limit=arg)))
                elif op == "pop":
                    got.append(await s.pop_item())
                else:
                    got.append(await s.clear_session())
            assert got[0] == got[1], f"{op}({arg}): abridge {got[0]} vs SQLiteSession {got[1]}"
        theirs.close()


async def test_items_are_summarized_as_text_and_come_back_as_they_were_added(server: Server) -> None:
    items: list[Any] = [
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "input_text", "text": "What is in"},
                                     {"type": "input_image", "image_url": "data:,"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"job": 7}'},
        {"type": "function_call_output", "call_id": "c1", "output": "job 7: 3 retries"},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Job 7 retried 3 times.", "annotations": []}]},
        {"type": "web_search_call", "id": "ws_1", "status": "completed",
         "action": {"type": "search", "query": "lease"}},
    ]
    assert item_message(items[2]) is None
    async with ab.AsyncClient(server.url) as c:
        s = AbridgeSession("kinds", c)
        await s.add_items(items)
        stored = [(m.role, m.content) for m in await c.messages("kinds")]
        assert stored == [
            ("system", "Answer briefly."),
            ("user", "What is in\n[image]"),
            ("assistant", '[called lookup({"job": 7})]'),
            ("tool", "job 7: 3 retries"),
            ("assistant", "Job 7 retried 3 times."),
            ("tool", '{"action": {"query": "lease", "type": "search"}, "type": "web_search_call"}'),
        ]
        # What comes back are the items that were added, as the SDK's own sessions give them
        # (the reasoning item, opaque, is not kept).
        kept = [i for i in items if item_message(i) is not None]
        assert await s.get_items() == kept
        assert await s.get_items(limit=2) == kept[-2:]
        assert await s.pop_item() == kept[-1]
        assert await s.pop_item() == kept[-2]
        # A message posted without an item (by another client) comes back as role and text.
        await c.add_messages("kinds", [("user", "and the lease?")])
        assert (await s.get_items())[-1] == {"role": "user", "content": "and the lease?"}


async def test_a_runner_keeps_its_history_in_abridge_and_its_prompts_stay_bounded(
    server: Server, model_url: str
) -> None:
    budget, allowance = 500, 100
    model = OpenAIChatCompletionsModel(
        model="qwen2.5:3b", openai_client=AsyncOpenAI(base_url=f"{model_url}/v1", api_key="local")
    )
    agent = Agent(name="helper", instructions="Answer in one sentence.", model=model)
    async with ab.AsyncClient(server.url) as c:
        session = AbridgeSession("runner", c, budget=budget)
        first = await Runner.run(agent, "Turn 0: the billing cluster moves on Friday.", session=session)
        got = await session.get_items()
        assert [i["role"] for i in got] == ["user", "assistant"]
        # The runner's own items: its output message with its content parts.
        assert got[1]["type"] == "message"
        assert got[1]["content"][0]["text"] == first.final_output
        prompts = []
        for i in range(1, 30):
            r = await Runner.run(
                agent,
                f"Turn {i}: why does job {i * 13} in services/worker{i % 9}/queue.rs retry "
                f"{3 + i % 4} times before release v3.{i % 17}.0?",
                session=session,
            )
            prompts.append(sum(x.usage.input_tokens for x in r.raw_responses))
        sess = await c.session("runner")
        assert sess.episodes == 60 and sess.history_tokens > 3 * budget, sess
        assert max(prompts) <= (budget + allowance) * 1.15, prompts
        items = await session.get_items()
        assert items[0]["role"] == "system" and "Summary" in items[0]["content"], items[0]
        # A limit from the session's settings keeps the newest items of the context.
        limited = AbridgeSession("runner", c, budget=budget, session_settings=SessionSettings(limit=4))
        r = await Runner.run(agent, "Turn 30: and the lease?", session=limited)
        assert (await c.session("runner")).episodes == 62
        # Undo the last turn: its answer, then its question, come back as items.
        answer = await session.pop_item()
        asked = await session.pop_item()
        assert answer["role"] == "assistant" and answer["content"][0]["text"] == r.final_output
        assert asked == {"role": "user", "content": "Turn 30: and the lease?"}
        assert (await c.session("runner")).episodes == 60


async def test_the_model_sees_the_sessions_context_not_the_whole_history(
    server: Server, model_url: str
) -> None:
    model = OpenAIChatCompletionsModel(
        model="qwen2.5:3b", openai_client=AsyncOpenAI(base_url=f"{model_url}/v1", api_key="local")
    )
    agent = Agent(name="helper", instructions="Answer in one sentence.", model=model)
    async with ab.AsyncClient(server.url) as c, httpx.AsyncClient(base_url=model_url) as llm:
        session = AbridgeSession("seen", c, budget=300)
        await session.add_items(turns(40))
        await llm.post("/_control/reset")
        await Runner.run(agent, "What was decided about worker39?", session=session)
        sent = [r for r in (await llm.get("/_control/requests")).json()
                if r.get("path") == "/v1/chat/completions"]
        assert sent, "the runner called the model"
        body = sent[-1]["body"]
        contents = [m.get("content") for m in body["messages"]]
        text = "\n".join(str(x) for x in contents)
        assert "What was decided about worker39?" in text
        assert "worker39" in text.split("What was decided")[0], "the newest turns are there"
        oldest = turns(1)
        assert not any(m.get("content") in (o["content"] for o in oldest) for m in body["messages"]), (
            "the oldest turns are summarized, not sent as turns"
        )
        assert len(body["messages"]) < 80, "the history is not sent whole"


async def test_the_context_carries_the_turns_that_answer_the_newest_user_message(server: Server) -> None:
    async with ab.AsyncClient(server.url) as c:
        items: list[Any] = [{"role": "user", "content": "The launch code for the Zephyr project is 7741."},
                            {"role": "assistant", "content": "Noted."}]
        items += turns(20)
        items.append({"role": "user", "content": "What was the Zephyr launch code?"})
        await AbridgeSession("agents-query", c).add_items(items)
        on = await AbridgeSession("agents-query", c, budget=300).get_items()
        # The per-call note is its own system item, just before the newest (added as it was).
        note = on[-2]
        assert note["role"] == "system", on
        assert "Earlier turns that match the question" in note["content"] and "7741" in note["content"]
        assert on[-1] == items[-1]
        off = await AbridgeSession("agents-query", c, budget=300, query=False).get_items()
        assert not any("Earlier turns that match" in i["content"] for i in off)


def test_one_session_from_two_threads_and_their_event_loops(server: Server) -> None:
    # Runner.run_sync from worker threads: each thread runs its own event loop; one session
    # (and its client) serves them all, as the SDK's SQLiteSession does.
    import asyncio
    import threading

    session = AbridgeSession("threads", url=server.url, budget=4000)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            asyncio.run(session.add_items(turns(1, i)))
            asyncio.run(session.get_items())
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(asyncio.run(session.get_items())) == 4


async def test_the_session_settings_limit_applies(server: Server) -> None:
    s = AbridgeSession("limited", url=server.url, budget=4000, session_settings=SessionSettings(limit=3))
    await s.add_items(turns(3))
    assert len(await s.get_items()) == 3
    assert len(await s.get_items(limit=1)) == 1
