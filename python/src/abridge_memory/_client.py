"""`Client` and `AsyncClient`: the same calls (``_core``), run over httpx."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Iterable, Iterator, Optional, TypeVar

import httpx

from . import _core as c
from . import _models as m
from ._errors import AbridgeError

T = TypeVar("T")


class _Base:
    def __init__(
        self,
        url: Optional[str] = None,
        *,
        token: Optional[str] = None,
        timeout: float = 30.0,
        max_retries: int = 3,
    ) -> None:
        self.url = c.base_url(url)
        self.max_retries = max_retries
        self._headers = c.auth_headers(token)
        self._timeout = timeout
        self._version_checked = False

    def _seen(self, r: "httpx.Response") -> None:
        if not self._version_checked:
            c.check_version(r.headers, self.url)
            self._version_checked = True


class Client(_Base):
    """A synchronous client of an abridge server (``abridge serve``).

    ``url`` defaults to ``$ABRIDGE_URL``, then ``http://127.0.0.1:8787`` (where ``abridge serve`` listens by default); ``token`` to
    ``$ABRIDGE_TOKEN``. Rate limits (429) and an unavailable server (503) are retried with
    backoff, honouring ``Retry-After``, up to ``max_retries`` times; so are dropped connections
    for requests that are safe to repeat.
    """

    def __init__(self, url: Optional[str] = None, **kw: Any) -> None:
        super().__init__(url, **kw)
        self._http = httpx.Client(base_url=self.url, headers=self._headers, timeout=self._timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, call: c.Call[T]) -> T:
        attempt = 0
        while True:
            try:
                r = self._http.request(
                    call.method, call.path, params=call.params, json=call.json, content=call.content,
                    headers=call.headers,
                )
                self._seen(r)
                return call.read(c.check(r.status_code, r.text, r.headers))
            except httpx.TransportError as e:
                err: AbridgeError = c.unreachable(self.url, e)
            except AbridgeError as e:
                err = e
            if not c.should_retry(err, call, attempt, self.max_retries):
                raise err
            time.sleep(c.backoff(err, attempt))
            attempt += 1

    # sessions
    def add_messages(self, session: str, messages: Iterable[c.MessageLike]) -> m.Appended:
        """Store messages (``{"role", "content"}`` dicts or ``(role, content)`` pairs). A dict
        may carry when it was said (``timestamp`` or ``created_at``: epoch ms or RFC 3339), so
        a context can resolve "yesterday" and mark each new day."""
        return self._run(c.add_messages(session, messages))

    def context(
        self,
        session: str,
        *,
        budget: Optional[int] = None,
        pairs: Optional[int] = None,
        refresh_after: Optional[int] = None,
        wait_ms: Optional[int] = None,
        query: Optional[str] = None,
    ) -> m.Context:
        """The compact context for the next model call, within ``budget`` tokens. With
        ``query`` (usually the user's newest message), the earlier turns that best match it are
        included verbatim beside the summary, numbered and dated."""
        return self._run(c.context(session, budget, pairs, refresh_after, wait_ms, query))

    def newest_user_message(self, session: str) -> Optional[str]:
        """The text of the session's newest stored user message (what the adapters pass as a
        context's query by default), or None."""
        n = self.session(session).episodes
        page = self.messages(session, after=max(0, n - 16), limit=16)
        return next((e.content for e in reversed(page) if e.role == "user"), None)

    def search(
        self, query: str, *, session: Optional[str] = None, offset: Optional[int] = None,
        limit: Optional[int] = None,
    ) -> m.SearchResults:
        """Full-text search of every stored message of the tenant (of one ``session``), best
        first. Quotes and operators are words, not a query language."""
        return self._run(c.search(query, session, offset, limit))

    def summaries(self, session: str, *, all: bool = False, coverage: bool = False) -> list[m.Summary]:
        return self._run(c.summaries(session, all, coverage))

    def expand(
        self, session: str, row: int, *, identifier: Optional[str] = None,
        after: Optional[int] = None, limit: Optional[int] = None,
    ) -> m.Expansion:
        return self._run(c.expand(session, row, identifier, after, limit))

    def session(self, session: str) -> m.Session:
        return self._run(c.session(session))

    def sessions(
        self, *, q: Optional[str] = None, offset: Optional[int] = None, limit: Optional[int] = None
    ) -> list[m.Session]:
        return self._run(c.sessions(q, offset, limit))

    def messages(
        self, session: str, *, after: int = 0, limit: Optional[int] = None
    ) -> list[m.StoredMessage]:
        """A page of the session's stored messages (ids after ``after``), oldest first."""
        return self._run(c.messages(session, after, limit))

    def pop_message(self, session: str) -> m.Removed:
        """Remove the session's newest message (an undo). The summary rows that covered it go
        with it and are folded again without it; its id is free again. Removing the only
        message removes the session."""
        return self._run(c.pop_message(session))

    def set_focus(self, session: str, focus: Optional[str]) -> None:
        return self._run(c.set_focus(session, focus))

    def set_mode(self, session: str, mode: str, *, quiet_secs: Optional[int] = None) -> None:
        return self._run(c.set_mode(session, mode, quiet_secs))

    def pins(self, session: str) -> list[int]:
        return self._run(c.pins(session))

    def pin(self, session: str, episode: int) -> None:
        return self._run(c.pin(session, episode, True))

    def unpin(self, session: str, episode: int) -> None:
        return self._run(c.pin(session, episode, False))

    def refresh(self, session: str) -> Optional[m.Job]:
        """Queue a refresh; the job, or None when every message is already covered."""
        return self._run(c.refresh(session))

    def reset(self, session: str) -> None:
        """Delete the session: its messages, summaries and pins."""
        return self._run(c.reset(session))

    def import_transcript(
        self, data: bytes, *, format: Optional[str] = None, session: Optional[str] = None,
        name: Optional[str] = None, include_tools: bool = False,
    ) -> list[m.Imported]:
        return self._run(c.import_transcript(data, format, session, name, include_tools))

    # memories
    def remember(
        self, text: str, *, user: Optional[str] = None, type: str = "fact", key: Optional[str] = None,
        project: Optional[str] = None, environment: Optional[str] = None,
        importance: Optional[float] = None, id: Optional[str] = None,
        replaces: Optional[str] = None,
    ) -> m.Written:
        """Store a memory for ``user`` (``remember("likes tea", user="alice")``). A fact that
        changes ("moved to Lyon" after "lives in Porto") replaces the earlier memory, which is
        kept and recalled marked; ``replaces`` names the memory it replaces explicitly."""
        body = c.memory_body(text, user, type, key, project, environment, importance, id, replaces)
        return self._run(c.remember(body))

    def recall(
        self, query: str, *, user: Optional[str] = None, project: Optional[str] = None,
        environment: Optional[str] = None, type: Optional[str] = None, key: Optional[str] = None,
        k: Optional[int] = None, exact: bool = False,
    ) -> list[m.Hit]:
        body = dict(query=query, user=user, project=project, environment=environment, type=type,
                    key=key, k=k, exact=exact)
        return self._run(c.recall(body))

    def memory(self, id: str) -> m.Memory:
        return self._run(c.memory(id))

    def memories(
        self, *, user: Optional[str] = None, project: Optional[str] = None,
        environment: Optional[str] = None, type: Optional[str] = None, key: Optional[str] = None,
        offset: int = 0, limit: int = 100,
    ) -> list[m.Memory]:
        """Memories in a scope, oldest first (a page: ``offset``, ``limit`` ≤ 1000)."""
        return self._run(c.memories(user, project, environment, type, key, offset, limit))

    def clusters(
        self, *, user: Optional[str] = None, project: Optional[str] = None,
        environment: Optional[str] = None, type: Optional[str] = None, key: Optional[str] = None,
        offset: int = 0, limit: int = 100,
    ) -> list[m.Cluster]:
        return self._run(c.clusters(user, project, environment, type, key, offset, limit))

    def cluster_summary(self, id: int) -> m.ClusterSummary:
        """A cluster summary (a recall hit of kind ``summary`` names it)."""
        return self._run(c.cluster_summary(id))

    def summary_sources(self, id: int) -> list[m.Memory]:
        """The memories a cluster summary covers."""
        return self._run(c.summary_sources(id))

    def forget(self, id: str) -> None:
        return self._run(c.forget(id))

    # jobs and usage
    def job(self, id: int) -> m.Job:
        return self._run(c.job(id))

    def cancel_job(self, id: int) -> m.Job:
        return self._run(c.cancel_job(id))

    def job_events(self, id: int, *, last_event_id: Optional[int] = None) -> Iterator[m.Event]:
        """The job's events as they happen, until it finishes. A dropped stream is resumed
        with ``Last-Event-ID``, so no event is missed while the server retains it."""
        s = c.JobStream(id, last_event_id, self.max_retries)
        timeout = httpx.Timeout(self._timeout, read=None)
        while not s.done:
            try:
                with self._http.stream("GET", s.path, headers=s.headers(), timeout=timeout) as r:
                    self._seen(r)
                    if r.status_code >= 400:
                        r.read()
                        c.check(r.status_code, r.text, r.headers)
                    for line in r.iter_lines():
                        ev = s.feed(line)
                        if ev is not None:
                            yield ev
                        if s.done:
                            return
            except httpx.TransportError as e:
                time.sleep(s.dropped(self.url, e))
                continue
            ev = s.ended(self.job(id))
            if ev is not None:
                yield ev
            else:
                time.sleep(s.pause())

    def wait_job(self, id: int, *, timeout: float = 600.0) -> m.Job:
        """Block until the job finishes (by its event stream); its final state."""
        deadline = time.monotonic() + timeout
        for _ in self.job_events(id):
            if time.monotonic() > deadline:
                break
        return self.job(id)

    def usage(self) -> m.Usage:
        return self._run(c.usage())

    def tokens(self) -> list[m.Token]:
        """The tenant's API tokens, live and revoked (never the tokens themselves)."""
        return self._run(c.tokens())

    def create_token(self, *, read_only: bool = False, label: Optional[str] = None) -> m.CreatedToken:
        """A new token for this tenant (not with a read-only token); ``.token`` is shown once."""
        return self._run(c.create_token(read_only, label))

    def revoke_token(self, id: int) -> m.Token:
        """Revoke one of the tenant's tokens; another tenant's is :class:`NotFound`."""
        return self._run(c.revoke_token(id))


class AsyncClient(_Base):
    """The asynchronous twin of :class:`Client` (same calls, awaited).

    One client may be used from any event loop and thread: each loop gets its own connection
    pool (an httpx pool belongs to the loop that opened it), made on first use there."""

    def __init__(self, url: Optional[str] = None, **kw: Any) -> None:
        import threading
        import weakref

        super().__init__(url, **kw)
        self._pools: "weakref.WeakKeyDictionary[Any, httpx.AsyncClient]" = weakref.WeakKeyDictionary()
        self._pools_lock = threading.Lock()

    @property
    def _http(self) -> httpx.AsyncClient:
        import asyncio

        loop = asyncio.get_running_loop()
        with self._pools_lock:
            pool = self._pools.get(loop)
            if pool is None:
                pool = httpx.AsyncClient(base_url=self.url, headers=self._headers, timeout=self._timeout)
                self._pools[loop] = pool
            return pool

    async def aclose(self) -> None:
        """Close this loop's connections (another loop's close with that loop)."""
        import asyncio

        with self._pools_lock:
            pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self, call: c.Call[T]) -> T:
        attempt = 0
        while True:
            try:
                r = await self._http.request(
                    call.method, call.path, params=call.params, json=call.json, content=call.content,
                    headers=call.headers,
                )
                self._seen(r)
                return call.read(c.check(r.status_code, r.text, r.headers))
            except httpx.TransportError as e:
                err: AbridgeError = c.unreachable(self.url, e)
            except AbridgeError as e:
                err = e
            if not c.should_retry(err, call, attempt, self.max_retries):
                raise err
            await asyncio.sleep(c.backoff(err, attempt))
            attempt += 1

    async def add_messages(self, session: str, messages: Iterable[c.MessageLike]) -> m.Appended:
        return await self._run(c.add_messages(session, messages))

    async def context(
        self, session: str, *, budget: Optional[int] = None, pairs: Optional[int] = None,
        refresh_after: Optional[int] = None, wait_ms: Optional[int] = None,
        query: Optional[str] = None,
    ) -> m.Context:
        return await self._run(c.context(session, budget, pairs, refresh_after, wait_ms, query))

    async def search(
        self, query: str, *, session: Optional[str] = None, offset: Optional[int] = None,
        limit: Optional[int] = None,
    ) -> m.SearchResults:
        return await self._run(c.search(query, session, offset, limit))

    async def newest_user_message(self, session: str) -> Optional[str]:
        """The text of the session's newest stored user message, or None."""
        n = (await self.session(session)).episodes
        page = await self.messages(session, after=max(0, n - 16), limit=16)
        return next((e.content for e in reversed(page) if e.role == "user"), None)

    async def summaries(
        self, session: str, *, all: bool = False, coverage: bool = False
    ) -> list[m.Summary]:
        return await self._run(c.summaries(session, all, coverage))

    async def expand(
        self, session: str, row: int, *, identifier: Optional[str] = None,
        after: Optional[int] = None, limit: Optional[int] = None,
    ) -> m.Expansion:
        return await self._run(c.expand(session, row, identifier, after, limit))

    async def session(self, session: str) -> m.Session:
        return await self._run(c.session(session))

    async def sessions(
        self, *, q: Optional[str] = None, offset: Optional[int] = None, limit: Optional[int] = None
    ) -> list[m.Session]:
        return await self._run(c.sessions(q, offset, limit))

    async def messages(
        self, session: str, *, after: int = 0, limit: Optional[int] = None
    ) -> list[m.StoredMessage]:
        return await self._run(c.messages(session, after, limit))

    async def pop_message(self, session: str) -> m.Removed:
        return await self._run(c.pop_message(session))

    async def set_focus(self, session: str, focus: Optional[str]) -> None:
        return await self._run(c.set_focus(session, focus))

    async def set_mode(self, session: str, mode: str, *, quiet_secs: Optional[int] = None) -> None:
        return await self._run(c.set_mode(session, mode, quiet_secs))

    async def pins(self, session: str) -> list[int]:
        return await self._run(c.pins(session))

    async def pin(self, session: str, episode: int) -> None:
        return await self._run(c.pin(session, episode, True))

    async def unpin(self, session: str, episode: int) -> None:
        return await self._run(c.pin(session, episode, False))

    async def refresh(self, session: str) -> Optional[m.Job]:
        return await self._run(c.refresh(session))

    async def reset(self, session: str) -> None:
        return await self._run(c.reset(session))

    async def import_transcript(
        self, data: bytes, *, format: Optional[str] = None, session: Optional[str] = None,
        name: Optional[str] = None, include_tools: bool = False,
    ) -> list[m.Imported]:
        return await self._run(c.import_transcript(data, format, session, name, include_tools))

    async def remember(
        self, text: str, *, user: Optional[str] = None, type: str = "fact", key: Optional[str] = None,
        project: Optional[str] = None, environment: Optional[str] = None,
        importance: Optional[float] = None, id: Optional[str] = None,
        replaces: Optional[str] = None,
    ) -> m.Written:
        body = c.memory_body(text, user, type, key, project, environment, importance, id, replaces)
        return await self._run(c.remember(body))

    async def recall(
        self, query: str, *, user: Optional[str] = None, project: Optional[str] = None,
        environment: Optional[str] = None, type: Optional[str] = None, key: Optional[str] = None,
        k: Optional[int] = None, exact: bool = False,
    ) -> list[m.Hit]:
        body = dict(query=query, user=user, project=project, environment=environment, type=type,
                    key=key, k=k, exact=exact)
        return await self._run(c.recall(body))

    async def memory(self, id: str) -> m.Memory:
        return await self._run(c.memory(id))

    async def memories(
        self, *, user: Optional[str] = None, project: Optional[str] = None,
        environment: Optional[str] = None, type: Optional[str] = None, key: Optional[str] = None,
        offset: int = 0, limit: int = 100,
    ) -> list[m.Memory]:
        return await self._run(c.memories(user, project, environment, type, key, offset, limit))

    async def clusters(
        self, *, user: Optional[str] = None, project: Optional[str] = None,
        environment: Optional[str] = None, type: Optional[str] = None, key: Optional[str] = None,
        offset: int = 0, limit: int = 100,
    ) -> list[m.Cluster]:
        return await self._run(c.clusters(user, project, environment, type, key, offset, limit))

    async def cluster_summary(self, id: int) -> m.ClusterSummary:
        return await self._run(c.cluster_summary(id))

    async def summary_sources(self, id: int) -> list[m.Memory]:
        return await self._run(c.summary_sources(id))

    async def forget(self, id: str) -> None:
        return await self._run(c.forget(id))

    async def job(self, id: int) -> m.Job:
        return await self._run(c.job(id))

    async def cancel_job(self, id: int) -> m.Job:
        return await self._run(c.cancel_job(id))

    async def job_events(
        self, id: int, *, last_event_id: Optional[int] = None
    ) -> AsyncIterator[m.Event]:
        s = c.JobStream(id, last_event_id, self.max_retries)
        timeout = httpx.Timeout(self._timeout, read=None)
        while not s.done:
            try:
                async with self._http.stream(
                    "GET", s.path, headers=s.headers(), timeout=timeout
                ) as r:
                    self._seen(r)
                    if r.status_code >= 400:
                        await r.aread()
                        c.check(r.status_code, r.text, r.headers)
                    async for line in r.aiter_lines():
                        ev = s.feed(line)
                        if ev is not None:
                            yield ev
                        if s.done:
                            return
            except httpx.TransportError as e:
                await asyncio.sleep(s.dropped(self.url, e))
                continue
            ev = s.ended(await self.job(id))
            if ev is not None:
                yield ev
            else:
                await asyncio.sleep(s.pause())

    async def wait_job(self, id: int, *, timeout: float = 600.0) -> m.Job:
        async def drain() -> None:
            async for _ in self.job_events(id):
                pass

        try:
            await asyncio.wait_for(drain(), timeout)
        except asyncio.TimeoutError:
            pass
        return await self.job(id)

    async def usage(self) -> m.Usage:
        return await self._run(c.usage())

    async def tokens(self) -> list[m.Token]:
        return await self._run(c.tokens())

    async def create_token(
        self, *, read_only: bool = False, label: Optional[str] = None
    ) -> m.CreatedToken:
        return await self._run(c.create_token(read_only, label))

    async def revoke_token(self, id: int) -> m.Token:
        return await self._run(c.revoke_token(id))
