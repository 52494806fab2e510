"""An OpenAI Agents SDK runner whose session is abridge: prompts stay within a budget while the
conversation grows, and the last turn can be taken back and asked again.

Each `Runner.run(agent, question, session=session)` reads the session's history through
`AbridgeSession.get_items`, which is abridge's compact context (summary with its ledger,
recent turns) within `--budget` tokens, and stores the turn's items after. The model is any
OpenAI-compatible server (`--model-url`, default $EXTRACTION_URL, then Ollama's
http://127.0.0.1:11434; the runner calls its `/v1/chat/completions`); abridge is a server you run
(`--url`) or a private one started here from the `abridge` binary (`--binary`). Tracing is
off: nothing is sent anywhere but these two servers.

    python examples/agents_session.py --turns 40 --budget 1200

It prints, per turn, the prompt the model counted, and fails if a prompt went over the budget
(plus the instructions and the new question, which the runner adds).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys

from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI

import abridge_memory as ab
from abridge_memory.agents import AbridgeSession

INSTRUCTIONS = "You are a release engineer. Answer in two sentences."
# What the runner sends besides the context: the instructions and one question (the test
# model counts about 60 tokens for them; a real tokenizer about as many).
ALLOWANCE = 100


def question(i: int) -> str:
    return (f"Turn {i}: why does job {i * 13} in services/worker{i % 9}/queue.rs retry "
            f"{3 + i % 4} times before release v3.{i % 17}.0, and what should the lease be?")


async def run(url: str, a: argparse.Namespace) -> int:
    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(
        model=a.model,
        openai_client=AsyncOpenAI(base_url=a.model_url.rstrip("/") + "/v1", api_key="local"),
    )
    agent = Agent(name="release-engineer", instructions=INSTRUCTIONS, model=model)
    async with ab.AsyncClient(url) as client:
        session = AbridgeSession("agents-example", client, budget=a.budget)
        await session.clear_session()
        over, largest = 0, 0
        for i in range(a.turns):
            result = await Runner.run(agent, question(i), session=session)
            counted = sum(r.usage.input_tokens for r in result.raw_responses)
            largest = max(largest, counted)
            history = (await client.session("agents-example")).history_tokens
            print(f"turn {i + 1:3}: prompt {counted:5} tokens (model's count); "
                  f"history {history:6} tokens")
            if counted > (a.budget + ALLOWANCE) * 1.15:
                over += 1
        # Take the last turn back (its answer, then its question) and ask again.
        answer = await session.pop_item()
        asked = await session.pop_item()
        assert answer is not None and asked is not None
        print(f"took back: {asked['content'][:60]!r} → {answer['content'][:60]!r}")
        again = await Runner.run(agent, asked["content"], session=session)
        print(f"asked again: {again.final_output[:80]!r}")
        items = await session.get_items()
        first = items[0]["content"] if items else ""
        print(f"the session's context: {len(items)} items, the first a summary: "
              f"{first[:100]!r}")
        if over:
            print(f"{over} prompts went over the {a.budget}-token budget", file=sys.stderr)
            return 1
        print(f"{a.turns} turns, every prompt within the {a.budget}-token budget "
              f"(largest {largest})")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=40)
    p.add_argument("--budget", type=int, default=1200)
    p.add_argument("--url", help="a running abridge serve (default: start one)")
    p.add_argument("--binary", help="the abridge binary to start (default: $ABRIDGE_BIN, PATH)")
    p.add_argument("--model-url", default=os.environ.get("EXTRACTION_URL", "http://127.0.0.1:11434"))
    p.add_argument("--model", default="qwen2.5:3b")
    a = p.parse_args()
    # No model server: say how to get one (or run without one) instead of a traceback.
    try:
        ab.require_model_server(a.model_url)
    except ab.ServerUnreachable as e:
        print(f"{p.prog}: {e}", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        if a.url:
            url = a.url
        else:
            url = stack.enter_context(ab.local(a.binary, env={"EXTRACTION_URL": a.model_url})).url
        return asyncio.run(run(url, a))


if __name__ == "__main__":
    sys.exit(main())
