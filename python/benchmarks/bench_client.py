"""The Python client's own cost, and what the LangGraph hook saves, measured in one run.

    python benchmarks/bench_client.py --binary ../target/release/abridge [--model-url URL]

1. Messages per second posted one request at a time to one local server by the sync client,
   by raw httpx, and by the async client and raw async httpx (16 in flight): the ratio is the
   client's overhead (ids, typed results, the retry loop).
2. The LangGraph hook at 50 and 500 turns: the prompt sent per turn (abridge's context, in
   abridge's token estimate) against sending the whole history, and the ratio of the two.

The server is started here from the binary, on a loopback port, with a fresh database (the
model: `--model-url`, an Ollama-compatible server, default the extractive summarizer).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import httpx
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph

import abridge_memory as ab
from abridge_memory.langgraph import ContextHook


def msg(i: int) -> dict:
    return {"role": "user" if i % 2 == 0 else "assistant",
            "content": f"message {i}: the worker lease for job {i * 13} is {30 + i % 60} seconds."}


def rate(n: int, seconds: float) -> float:
    return n / seconds


def sync_rates(url: str, n: int) -> tuple[float, float]:
    with ab.Client(url) as c:
        c.add_messages("warm", [msg(0)])
        t = time.perf_counter()
        for i in range(n):
            c.add_messages("sync-client", [msg(i)])
        client = rate(n, time.perf_counter() - t)
    with httpx.Client(base_url=url) as h:
        t = time.perf_counter()
        for i in range(n):
            body = {"messages": [{**msg(i), "id": uuid.uuid4().hex}]}
            r = h.post("/v1/sessions/sync-raw/messages", json=body)
            r.raise_for_status()
            r.json()
        raw = rate(n, time.perf_counter() - t)
    return client, raw


async def async_rates(url: str, n: int, inflight: int = 16) -> tuple[float, float]:
    sem = asyncio.Semaphore(inflight)

    async with ab.AsyncClient(url) as c:
        async def one(i: int) -> None:
            async with sem:
                await c.add_messages(f"async-client-{i % inflight}", [msg(i)])

        t = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        client = rate(n, time.perf_counter() - t)
    async with httpx.AsyncClient(base_url=url) as h:
        async def raw_one(i: int) -> None:
            async with sem:
                body = {"messages": [{**msg(i), "id": uuid.uuid4().hex}]}
                r = await h.post(f"/v1/sessions/async-raw-{i % inflight}/messages", json=body)
                r.raise_for_status()
                r.json()

        t = time.perf_counter()
        await asyncio.gather(*(raw_one(i) for i in range(n)))
        raw = rate(n, time.perf_counter() - t)
    return client, raw


def hook_tokens(client: ab.Client, turns: int, budget: int) -> tuple[float, float]:
    """Mean prompt tokens per turn with the hook, and with the whole history."""
    hook = ContextHook(client, budget=budget)
    thread = f"bench-{turns}"
    prompts: list[int] = []
    whole: list[int] = []

    def model(state: MessagesState, config: RunnableConfig) -> dict:
        hook(state, config)
        n = len(state["messages"])
        if n > 1:
            ctx = client.context(thread, budget=budget)
            prompts.append(ctx.tokens)
            whole.append(ctx.full_tokens)
        q = state["messages"][-1].content
        return {"messages": [AIMessage(f"About {q[:40]}: raise the lease and retry after the release.")]}

    g = StateGraph(MessagesState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    app = g.compile(checkpointer=InMemorySaver())
    cfg = {"configurable": {"thread_id": thread}}
    for i in range(turns):
        app.invoke({"messages": [HumanMessage(f"Turn {i}: why does job {i * 13} in services/worker{i % 9}/queue.rs retry before release v3.{i % 17}.0?")]}, cfg)
    return statistics.mean(prompts), statistics.mean(whole)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--binary", help="abridge binary (default $ABRIDGE_BIN, then PATH)")
    p.add_argument("--model-url", help="Ollama-compatible model server (default: extractive)")
    p.add_argument("--messages", type=int, default=2000)
    p.add_argument("--budget", type=int, default=1500)
    a = p.parse_args()
    env = {"EXTRACTION_URL": a.model_url} if a.model_url else {"ABRIDGE_BACKEND": "extractive"}
    with ab.local(a.binary, env=env) as c:
        s_client, s_raw = sync_rates(c.url, a.messages)
        a_client, a_raw = asyncio.run(async_rates(c.url, a.messages))
        print(f"posting one message a request, {a.messages} requests, one local server:")
        print(f"  sync:  client {s_client:8.0f}/s, raw httpx {s_raw:8.0f}/s, ratio {s_client / s_raw:.2f}")
        print(f"  async: client {a_client:8.0f}/s, raw httpx {a_raw:8.0f}/s, ratio {a_client / a_raw:.2f} (16 in flight)")
        print(f"LangGraph hook, {a.budget}-token budget, mean prompt tokens per turn:")
        for turns in (50, 500):
            hooked, whole = hook_tokens(c, turns, a.budget)
            print(f"  {turns:4} turns: hook {hooked:7.0f}, whole history {whole:8.0f}, ratio {hooked / whole:.3f}")


if __name__ == "__main__":
    main()
