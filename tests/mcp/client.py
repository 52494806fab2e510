"""Drive abridge's MCP server with the official MCP Python SDK (PyPI `mcp`, pinned in
tests/mcp/requirements.txt), for tests/e2e/mcp.rs.

    python client.py stdio  PLAN.json  -- ABRIDGE_EXE [ARGS...]
    python client.py http   PLAN.json  URL TOKEN

PLAN.json is a list of tool calls [{"name": ..., "arguments": {...}}]. Prints one JSON object:
{"protocol": ..., "server": ..., "instructions": ..., "tools": [{"name", "description",
"schema"}], "calls": [{"is_error", "text"}]}. Any exception is printed as {"exception": ...}
with exit status 1.
"""

import asyncio
import json
import os
import sys

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client


async def run(client_target, plan):
    out = {"calls": []}
    async with Client(client_target, read_timeout_seconds=60) as c:
        tools = (await c.list_tools()).tools
        out["tools"] = [
            {"name": t.name, "description": t.description, "schema": t.input_schema}
            for t in tools
        ]
        for step in plan:
            r = await c.call_tool(step["name"], step.get("arguments") or {})
            text = "\n".join(b.text for b in r.content if getattr(b, "type", "") == "text")
            out["calls"].append({"is_error": bool(r.is_error), "text": text})
    return out


async def main():
    mode, plan_path = sys.argv[1], sys.argv[2]
    with open(plan_path) as f:
        plan = json.load(f)
    if mode == "stdio":
        rest = sys.argv[sys.argv.index("--") + 1 :]
        env = {k: v for k, v in os.environ.items() if k.startswith("ABRIDGE_") or k in ("HOME", "EXTRACTION_URL")}
        target = StdioServerParameters(command=rest[0], args=rest[1:], env=env)
        return await run(target, plan)
    url, token = sys.argv[3], sys.argv[4]
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as h:
        return await run(streamable_http_client(url, http_client=h), plan)


if __name__ == "__main__":
    try:
        print(json.dumps(asyncio.run(main())))
    except BaseException as e:  # noqa: BLE001 - the test reads what went wrong
        print(json.dumps({"exception": f"{type(e).__name__}: {e}"}))
        sys.exit(1)
