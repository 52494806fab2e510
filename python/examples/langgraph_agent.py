"""A LangGraph agent loop whose prompts stay within a budget while the conversation grows.

Each turn, `ContextHook` stores the finished turns in abridge and hands the model abridge's
compact context (summary with its ledger, recent turns) plus the new message, within
`--budget` tokens. The model is any Ollama-compatible server (`--model-url`, default
$EXTRACTION_URL, then http://127.0.0.1:11434); abridge is a server you run (`--url`) or a
private one started here from the `abridge` binary (`--binary`).

    python examples/langgraph_agent.py --turns 50 --budget 1500

It prints, per turn, the prompt the model was sent (tokens the model counted, and abridge's
estimate of the whole history), and fails if a prompt went over the budget.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import httpx
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph

import abridge_memory as ab
from abridge_memory.langgraph import ContextHook


def ollama_role(m: BaseMessage) -> str:
    return {"human": "user", "ai": "assistant", "system": "system"}.get(m.type, "user")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=50)
    p.add_argument("--budget", type=int, default=1500)
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
            client = stack.enter_context(ab.Client(a.url))
        else:
            client = stack.enter_context(ab.local(a.binary, env={"EXTRACTION_URL": a.model_url}))
        llm = stack.enter_context(httpx.Client(base_url=a.model_url, timeout=120))
        hook = ContextHook(client, budget=a.budget)
        counted: list[int] = []

        def model(state: MessagesState, config: RunnableConfig) -> dict:
            prompt = hook(state, config)["llm_input_messages"]
            r = llm.post("/api/chat", json={
                "model": a.model, "stream": False,
                "messages": [{"role": ollama_role(m), "content": str(m.content)} for m in prompt],
                "options": {"num_ctx": 4096},
            })
            r.raise_for_status()
            body = r.json()
            counted.append(int(body.get("prompt_eval_count", 0)))
            return {"messages": [AIMessage(body["message"]["content"])]}

        g = StateGraph(MessagesState)
        g.add_node("model", model)
        g.add_edge(START, "model")
        app = g.compile(checkpointer=InMemorySaver())
        cfg = {"configurable": {"thread_id": "example-agent"}}
        over = 0
        for i in range(a.turns):
            question = (f"Turn {i}: why does job {i * 13} in services/worker{i % 9}/queue.rs retry "
                        f"{3 + i % 4} times before release v3.{i % 17}.0, and what should the lease be?")
            app.invoke({"messages": [HumanMessage(question)]}, cfg)
            history = client.context("example-agent", budget=a.budget).full_tokens if i else 0
            print(f"turn {i + 1:3}: prompt {counted[-1]:5} tokens (model's count); history {history:6} tokens")
            # The model counts with its own tokenizer; abridge budgets in its estimate, which
            # the test model matches within a few percent: allow that, no more.
            if counted[-1] > a.budget * 1.15:
                over += 1
        if over:
            print(f"{over} prompts went over the {a.budget}-token budget", file=sys.stderr)
            return 1
        print(f"{a.turns} turns, every prompt within the {a.budget}-token budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())
