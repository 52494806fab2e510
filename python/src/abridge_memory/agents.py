"""OpenAI Agents SDK adapter (``pip install 'abridge-memory[agents]'``).

:class:`AbridgeSession` is an Agents SDK ``Session`` kept in abridge. The runner reads the
history with ``get_items`` before each turn and gets abridge's compact context instead of every
item: the summary (with its facts ledger) as one system message, then the recent turns
verbatim, within ``budget`` tokens. ``add_items`` stores the turn's items as messages;
``pop_item`` removes the newest (the summary rows that covered it are folded again without it);
``clear_session`` deletes the session.

Each item is stored as a message abridge can summarize — a message's role and text (input and
output text parts; an image or a file as a short placeholder), a function call as the
assistant's ``[called NAME(ARGUMENTS)]``, its output as a tool message — and, beside it, the
item itself (as the JSON dict the SDK gave, or ``model_dump`` of a model object). So the items
``get_items`` returns for the recent turns, and ``pop_item``, are the dicts that were added;
the summary of the earlier turns comes first as a ``{"role": "system", "content"}`` message.
Reasoning items (opaque, and often encrypted) are not stored.
"""

from __future__ import annotations

import json
from typing import Any, Optional, Union

try:
    from agents.memory import SessionSettings
    from agents.memory.session_settings import coerce_session_settings
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the Agents SDK adapter needs openai-agents: pip install 'abridge-memory[agents]'"
    ) from e

from ._client import AsyncClient
from ._errors import NotFound

# Roles of the Responses API's input messages; abridge's own roles map onto them.
_ITEM_ROLE = {"system": "system", "user": "user", "assistant": "assistant", "tool": "user"}


def _as_dict(item: Any) -> dict[str, Any]:
    if isinstance(item, dict):
        return item
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        return dump(exclude_none=True)
    raise TypeError(f"not an input item: {type(item).__name__}")


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    p = _as_dict(part)
    kind = p.get("type", "")
    if kind in ("input_text", "output_text", "text"):
        return str(p.get("text", ""))
    if kind == "refusal":
        return str(p.get("refusal", ""))
    if kind == "input_image":
        return "[image]"
    if kind == "input_file":
        return f"[file {p.get('filename') or p.get('file_id') or ''}]".replace(" ]", "]")
    if kind == "input_audio":
        return "[audio]"
    return ""


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(t for t in (_part_text(p) for p in content) if t)


def item_message(item: Any) -> Optional[tuple[str, str]]:
    """The ``(role, text)`` abridge keeps for one input item, or None for an item with
    nothing to keep (reasoning, an empty message)."""
    d = _as_dict(item)
    kind = d.get("type")
    if kind in (None, "message") and "role" in d:
        role = {"developer": "system"}.get(d["role"], d["role"])
        text = _text(d.get("content"))
        return (role, text) if text.strip() else None
    if kind == "function_call":
        return ("assistant", f"[called {d.get('name', '?')}({d.get('arguments', '')})]")
    if kind in ("function_call_output", "custom_tool_call_output", "computer_call_output"):
        out = d.get("output")
        text = out if isinstance(out, str) else _text(out) if isinstance(out, list) else json.dumps(out)
        return ("tool", text) if text.strip() else None
    if kind == "reasoning" or kind == "compaction":
        return None
    # Any other tool call or result (web search, file search, shell, MCP…): its fields as
    # JSON, without ids, so a summary can say what was done.
    rest = {k: v for k, v in d.items() if k not in ("id", "status", "encrypted_content")}
    return ("tool", json.dumps(rest, default=str, sort_keys=True))


class AbridgeSession:
    """An Agents SDK ``Session`` whose history is abridge's compact context.

    ``budget`` bounds what ``get_items`` returns (abridge's token estimate of the summary and
    the recent turns); ``pairs`` is how many recent exchanges to show verbatim at most;
    ``refresh_after`` how many tokens may lie beyond the summary before a context read folds
    them; ``wait_ms`` how long a read may wait for a refresh under way (see
    ``GET /v1/sessions/{id}/context``). ``limit`` given to ``get_items`` (or through
    ``session_settings``) keeps only the newest items of that context.

    The context's query (the earlier turns that best match it are included beside the
    summary) is the newest user message stored: the SDK reads a session's history before it
    stores the new input, so that is the newest this session can see. ``query=False`` turns it
    off.
    """

    def __init__(
        self,
        session_id: str,
        client: Optional[AsyncClient] = None,
        *,
        url: Optional[str] = None,
        token: Optional[str] = None,
        budget: int = 2000,
        pairs: Optional[int] = None,
        refresh_after: Optional[int] = None,
        wait_ms: Optional[int] = None,
        session_settings: Union[SessionSettings, dict[str, Any], None] = None,
        query: bool = True,
    ) -> None:
        self.session_id = session_id
        # Usable from any event loop and thread (``Runner.run_sync`` from worker threads): the
        # client keeps a connection pool per loop.
        self._own_client = client is None
        self.client = client or AsyncClient(url, token=token)
        self._closed = False
        self.budget = budget
        self.pairs = pairs
        self.refresh_after = refresh_after
        self.wait_ms = wait_ms
        # As the SDK's own sessions: a dict is checked and turned into settings (unknown
        # fields are a TypeError), None is the defaults.
        self.session_settings = (
            coerce_session_settings(session_settings) if session_settings is not None
            else SessionSettings()
        )
        self.query = query
        # The context get_items read last (its ``stable`` prefix: what a prompt cache keeps).
        self.last_context: Optional[Any] = None

    def close(self) -> None:
        """End the session object (the stored session stays): later calls raise
        ``RuntimeError``. Connections the session opened itself close with their event loops."""
        self._closed = True

    def _open(self) -> None:
        if self._closed:
            raise RuntimeError("AbridgeSession is closed")

    async def get_items(self, limit: Optional[int] = None) -> list[Any]:
        """The compact context as input items, oldest first (``[]`` for a new session); at
        most ``limit`` (else the session settings' ``limit``) of the newest."""
        self._open()
        if limit is None:
            limit = self.session_settings.limit
        try:
            asked = await self.client.newest_user_message(self.session_id) if self.query else None
            ctx = await self.client.context(
                self.session_id, budget=self.budget, pairs=self.pairs,
                refresh_after=self.refresh_after, wait_ms=self.wait_ms, query=asked,
            )
        except NotFound:
            return []
        # The stored messages come back as the items that were added; the summary (and a
        # message posted without an item) as a plain input message.
        self.last_context = ctx
        # The per-call note (the turns the query found) is its own system item before the
        # newest one, whose item comes back as it was added.
        msgs, note = ctx.split_note()
        items: list[Any] = [
            m.item if m.item is not None
            else {"role": _ITEM_ROLE.get(m.role, "user"), "content": m.content}
            for m in msgs
        ]
        if note:
            items.insert(len(items) - 1, {"role": "system", "content": note.rstrip()})
        if limit is not None:
            items = items[-limit:] if limit > 0 else []
        return items

    async def add_items(self, items: list[Any]) -> None:
        """Store the items as messages, in order (an item with nothing to keep is skipped)."""
        self._open()
        messages = []
        for item in items:
            kept = item_message(item)
            if kept is not None:
                role, text = kept
                messages.append({"role": role, "content": text, "item": _as_dict(item)})
        if messages:
            await self.client.add_messages(self.session_id, messages)

    async def pop_item(self) -> Optional[Any]:
        """Remove the newest message and return it as an input item; None when the session is
        empty. The summary rows that covered it are folded again without it."""
        self._open()
        try:
            removed = await self.client.pop_message(self.session_id)
        except NotFound:
            return None
        m = removed.message
        if m.item is not None:
            return m.item
        return {"role": _ITEM_ROLE.get(m.role, "user"), "content": m.content}

    async def clear_session(self) -> None:
        """Delete the session: its messages, summaries and pins."""
        self._open()
        try:
            await self.client.reset(self.session_id)
        except NotFound:
            pass
