"""LangChain adapters (``pip install 'abridge-memory[langchain]'``).

- :class:`AbridgeChatMessageHistory`: a ``BaseChatMessageHistory`` that stores a session's
  messages in abridge; :meth:`~AbridgeChatMessageHistory.context_messages` gives the compact
  context (summary with its ledger, pins, recent turns) instead of the whole history.
- :class:`AbridgeRetriever`: a ``BaseRetriever`` over recall (memories and cluster summaries,
  with the memories a summary stands for in ``metadata["sources"]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional, Union

try:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForRetrieverRun,
        CallbackManagerForRetrieverRun,
    )
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.documents import Document
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
    from langchain_core.retrievers import BaseRetriever
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the LangChain adapters need langchain-core: pip install 'abridge-memory[langchain]'"
    ) from e

from ._client import AsyncClient, Client
from ._models import Context, Hit

PAGE = 500


def role_of(message: BaseMessage) -> str:
    """abridge's role for a LangChain message (tool output is stored as a tool message)."""
    return {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}.get(
        message.type, "user"
    )


def to_langchain(role: str, content: str) -> BaseMessage:
    if role == "assistant":
        return AIMessage(content=content)
    if role == "system":
        return SystemMessage(content=content)
    return HumanMessage(content=content)


def context_to_langchain(ctx: Context, cache_control: bool = False) -> list[BaseMessage]:
    """A context's messages as LangChain messages (the summary is a system message).

    With ``cache_control`` the system message and the message that ends the stable prefix
    (``ctx.stable.messages``: what stays the same until the next fold) are text blocks with
    Anthropic's ``cache_control`` breakpoint (LangChain's Anthropic chat model sends them)."""
    out = [to_langchain(m.role, m.content) for m in ctx.messages]
    if cache_control:
        marks = {i for i, m in enumerate(ctx.messages) if m.role == "system" and i < ctx.stable.messages}
        if ctx.stable.messages > 0:
            marks.add(ctx.stable.messages - 1)
        for i in sorted(marks):
            text = ctx.messages[i].content
            out[i] = to_langchain(ctx.messages[i].role, "")
            out[i].content = [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]
    return out


def message_text(message: BaseMessage) -> str:
    """A message's text (the text parts of a multi-part message, joined)."""
    c = message.content
    if isinstance(c, str):
        return c
    parts = [p if isinstance(p, str) else str(p.get("text", "")) for p in c]
    return "\n".join(p for p in parts if p)


class AbridgeChatMessageHistory(BaseChatMessageHistory):
    """A session's messages, stored in abridge.

    ``messages`` reads the whole history back (for code that expects it); a model call should
    use :meth:`context_messages`, which stays within ``budget`` tokens however long the
    conversation grows.
    """

    def __init__(
        self,
        session_id: str,
        client: Optional[Client] = None,
        *,
        async_client: Optional[AsyncClient] = None,
        url: Optional[str] = None,
        token: Optional[str] = None,
    ) -> None:
        self.session_id = session_id
        self.client = client or Client(url, token=token)
        self.async_client = async_client
        # The context :meth:`context_messages` read last (its ``stable`` prefix, its note).
        self.last_context: Optional[Context] = None

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        from ._errors import NotFound

        out: list[BaseMessage] = []
        after = 0
        while True:
            try:
                page = self.client.messages(self.session_id, after=after, limit=PAGE)
            except NotFound:
                return out
            out.extend(to_langchain(e.role, e.content) for e in page)
            if len(page) < PAGE:
                return out
            after = page[-1].id

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        if messages:
            self.client.add_messages(
                self.session_id, [(role_of(m), message_text(m)) for m in messages]
            )

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        if not messages:
            return
        if self.async_client is None:
            # No blocking call on the event loop: the sync client runs in a worker thread.
            import asyncio

            await asyncio.to_thread(self.add_messages, messages)
            return
        await self.async_client.add_messages(
            self.session_id, [(role_of(m), message_text(m)) for m in messages]
        )

    async def aget_messages(self) -> list[BaseMessage]:
        import asyncio

        return await asyncio.to_thread(lambda: self.messages)

    async def aclear(self) -> None:
        import asyncio

        if self.async_client is not None:
            from ._errors import NotFound

            try:
                await self.async_client.reset(self.session_id)
            except NotFound:
                pass
            return
        await asyncio.to_thread(self.clear)

    def clear(self) -> None:
        from ._errors import NotFound

        try:
            self.client.reset(self.session_id)
        except NotFound:
            pass

    def context_messages(
        self, budget: int = 2000, *, pairs: Optional[int] = None, query: Union[str, bool] = True,
        cache_control: bool = False,
    ) -> list[BaseMessage]:
        """The compact context as LangChain messages, within ``budget`` tokens.

        ``query`` is what the next call is about: the earlier turns that best match it are
        included verbatim beside the summary. By default (``True``) it is the newest user
        message stored; pass the user's new message as a string when it is not stored yet, or
        ``False`` to turn it off. The first ``last_context.stable.messages`` messages stay the
        same until the next fold (a prompt cache keeps them); ``cache_control`` marks their end
        with Anthropic's breakpoint (see :func:`context_to_langchain`)."""
        from ._errors import NotFound

        try:
            q = self.client.newest_user_message(self.session_id) if query is True else query or None
            ctx = self.client.context(self.session_id, budget=budget, pairs=pairs, query=q)
            self.last_context = ctx
            return context_to_langchain(ctx, cache_control)
        except NotFound:
            return []


def hit_to_document(h: Hit) -> Document:
    return Document(
        page_content=h.text,
        metadata={"id": h.id, "kind": h.kind, "score": h.score, "importance": h.importance,
                  "sources": list(h.sources)},
    )


class AbridgeRetriever(BaseRetriever):
    """Recall as a LangChain retriever: the ``k`` best memories and cluster summaries for a
    query, within a scope (``user``, ``project``, ``environment``, ``type``)."""

    client: Any = None
    async_client: Any = None
    url: Optional[str] = None
    token: Optional[str] = None
    k: int = 4
    user: Optional[str] = None
    project: Optional[str] = None
    environment: Optional[str] = None
    type: Optional[str] = None

    def _sync(self) -> Client:
        if self.client is None:
            self.client = Client(self.url, token=self.token)
        return self.client

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kw: Any
    ) -> list[Document]:
        k = int(kw.get("k", self.k))
        hits = self._sync().recall(
            query, user=self.user, project=self.project, environment=self.environment,
            type=self.type, k=k,
        )
        return [hit_to_document(h) for h in hits[:k]]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **kw: Any
    ) -> list[Document]:
        k = int(kw.get("k", self.k))
        if self.async_client is None:
            self.async_client = AsyncClient(self.url, token=self.token)
        hits = await self.async_client.recall(
            query, user=self.user, project=self.project, environment=self.environment,
            type=self.type, k=k,
        )
        return [hit_to_document(h) for h in hits[:k]]
