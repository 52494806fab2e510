"""LangChain with abridge: a chat history kept in abridge, the compact context for each model
call, and recall of a user's memories as a retriever.

    python examples/langchain_chat.py [--url URL | --binary PATH] [--model-url URL]

It chats 30 turns with an Ollama-compatible model (`--model-url`, default $EXTRACTION_URL, then
http://127.0.0.1:11434), each call sent the context within `--budget` tokens plus the
retriever's best memories, and prints what each prompt cost against the whole history.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import httpx
from langchain_core.messages import HumanMessage, SystemMessage

import abridge_memory as ab
from abridge_memory.langchain import AbridgeChatMessageHistory, AbridgeRetriever


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--budget", type=int, default=1200)
    p.add_argument("--url")
    p.add_argument("--binary")
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
        client.remember("Dana's team deploys the billing service on Thursdays.", user="dana")
        client.remember("Dana prefers answers with the exact file path.", user="dana")
        history = AbridgeChatMessageHistory("langchain-example", client)
        retriever = AbridgeRetriever(client=client, user="dana", k=2)
        worst = 0
        for i in range(a.turns):
            question = f"Turn {i}: when can the fix for job {i * 7} in billing/worker{i % 5}.py ship?"
            memories = retriever.invoke(question)
            prompt = [SystemMessage("Known about the user:\n" + "\n".join(d.page_content for d in memories))]
            prompt += history.context_messages(budget=a.budget) + [HumanMessage(question)]
            r = llm.post("/api/chat", json={
                "model": a.model, "stream": False,
                "messages": [{"role": {"human": "user", "ai": "assistant"}.get(m.type, "system"),
                              "content": str(m.content)} for m in prompt],
            })
            r.raise_for_status()
            answer = r.json()["message"]["content"]
            history.add_user_message(question)
            history.add_ai_message(answer)
            counted = int(r.json().get("prompt_eval_count", 0))
            worst = max(worst, counted)
            print(f"turn {i + 1:3}: prompt {counted:5} tokens; {len(history.messages):3} messages stored")
        allowed = a.budget + 200  # the memories and the new question come on top of the context
        print(f"{a.turns} turns, the largest prompt {worst} tokens (context budget {a.budget})")
        return 0 if worst <= allowed * 1.15 else 1


if __name__ == "__main__":
    sys.exit(main())
