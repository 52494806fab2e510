"""``require_model_server()``: say how to get a model before an example or a script calls one."""

from __future__ import annotations

import httpx

from ._errors import ServerUnreachable


def require_model_server(url: str, *, timeout: float = 3.0) -> None:
    """Check that an Ollama- or OpenAI-compatible model server answers at ``url``
    (``GET /api/tags``, then ``GET /v1/models``); raise :class:`ServerUnreachable` with how to
    get one when none does. abridge itself needs no model (its extractive summarizer runs
    without one); a script that chats with a model does."""
    base = url.rstrip("/")
    for path in ("/api/tags", "/v1/models"):
        try:
            r = httpx.get(base + path, timeout=timeout)
        except httpx.HTTPError:
            continue
        if r.status_code < 500:
            return
    raise ServerUnreachable(
        f"no model server answers at {url}",
        hint="start Ollama there (`ollama serve`, then `ollama pull qwen2.5:3b`), or pass "
        "--model-url with the address of an Ollama- or OpenAI-compatible server; without a "
        "model, abridge's own deterministic test server answers in its place: in a clone, "
        "`cargo run -p abridge-test-llm -- --port 11435` and --model-url http://127.0.0.1:11435",
    )
