"""What a call sends and how its answer is read, written once for both clients."""

from __future__ import annotations

import dataclasses
import os
import random
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, Mapping, Optional, TypeVar, Union
from urllib.parse import quote

from . import _models as m
from ._errors import (
    AbridgeError,
    RateLimited,
    ServerUnreachable,
    Unavailable,
    VersionMismatch,
    error_from_response,
)

T = TypeVar("T")

# The address `abridge serve` listens on by default (host/server/src/lib.rs).
DEFAULT_URL = "http://127.0.0.1:8787"

MessageLike = Union[Mapping[str, Any], tuple[str, str]]


@dataclass
class Call(Generic[T]):
    """One request and the reader of its JSON answer."""

    method: str
    path: str
    read: Callable[[Any], T]
    params: Optional[dict[str, Any]] = None
    json: Any = None
    content: Optional[bytes] = None
    headers: Optional[dict[str, str]] = None
    # Safe to send again after a dropped connection (reads, and writes keyed by ids).
    idempotent: bool = False
    # Never sent twice unless the server refused it before doing anything (429): a 503 may
    # come after the work was done.
    at_most_once: bool = False


def seg(s: Union[str, int]) -> str:
    """One path segment, percent-encoded (session ids may hold any character)."""
    return quote(str(s), safe="")


def params(**kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in kw.items():
        if v is None:
            continue
        out[k] = ("true" if v else "false") if isinstance(v, bool) else v
    return out


def message_body(messages: Iterable[MessageLike]) -> list[dict[str, Any]]:
    """Messages for a post, each with an id (a retried post then stores nothing twice)."""
    out = []
    for msg in messages:
        if isinstance(msg, tuple):
            role, content = msg
            d: dict[str, Any] = {"role": role, "content": content}
        else:
            d = {k: v for k, v in msg.items() if v is not None}
            if "role" not in d or "content" not in d:
                raise ValueError(
                    "each message needs a role and content, e.g. {'role': 'user', 'content': 'hi'}"
                )
        d.setdefault("id", f"py-{uuid.uuid4().hex}")
        out.append(d)
    return out


def base_url(url: Optional[str]) -> str:
    return (url or os.environ.get("ABRIDGE_URL") or DEFAULT_URL).rstrip("/")


def auth_headers(token: Optional[str]) -> dict[str, str]:
    from . import __version__

    h = {"user-agent": f"abridge-memory-python/{__version__}"}
    token = token if token is not None else os.environ.get("ABRIDGE_TOKEN")
    if token:
        h["authorization"] = f"Bearer {token}"
    return h


def retry_after(headers: Mapping[str, str]) -> Optional[float]:
    v = headers.get("retry-after")
    try:
        return max(0.0, float(v)) if v is not None else None
    except ValueError:
        return None


def body_of(text: str) -> Any:
    import json

    try:
        return json.loads(text) if text else None
    except ValueError:
        return text


def check(status: int, text: str, headers: Mapping[str, str]) -> Any:
    """The answer's JSON, or the typed error it stands for."""
    body = body_of(text)
    if status >= 400:
        raise error_from_response(status, body, retry_after(headers))
    return body


def compatible(client: str, server: str) -> bool:
    """Whether a client speaks to a server: the same major version (and, before 1.0, the
    same minor version, as semantic versioning allows breaking changes there)."""
    a, b = client.split(".")[:2], server.split(".")[:2]
    return a == b if a[0] == "0" else a[0] == b[0]


def check_version(headers: Mapping[str, str], url: str) -> None:
    """Refuse a server this client does not speak to, saying what to do."""
    from . import __version__

    server = headers.get("abridge-version")
    if server is None:
        raise VersionMismatch(
            f"the server at {url} did not say which abridge version it runs; it is older than "
            f"this client ({__version__}) or not abridge",
            hint="upgrade the server (`abridge serve` reports its version in every answer), "
            "or check the url",
        )
    if not compatible(__version__, server):
        raise VersionMismatch(
            f"the server at {url} runs abridge {server}; this client ({__version__}) speaks to "
            f"{'.'.join(__version__.split('.')[:2])}.x",
            server_version=server,
            hint=f"install the matching client: pip install 'abridge-memory=={server}'",
        )


def should_retry(e: AbridgeError, call: Call[Any], attempt: int, max_retries: int) -> bool:
    if attempt >= max_retries:
        return False
    if isinstance(e, RateLimited):
        return True
    if isinstance(e, Unavailable):
        return not call.at_most_once
    return isinstance(e, ServerUnreachable) and call.idempotent


def backoff(e: AbridgeError, attempt: int) -> float:
    """Seconds before the next attempt: the server's Retry-After, else jittered doubling."""
    if isinstance(e, RateLimited) and e.retry_after is not None:
        return min(e.retry_after, 60.0)
    return min(8.0, 0.25 * 2**attempt) * (0.5 + random.random() / 2)


def unreachable(url: str, err: Exception) -> ServerUnreachable:
    return ServerUnreachable(
        f"cannot reach abridge at {url}: {err}",
        hint=f"`abridge serve` listens on {DEFAULT_URL} by default: start it, "
        "or use abridge_memory.local() from Python, or pass the right url= / set ABRIDGE_URL",
    )


# ---- the calls -------------------------------------------------------------------------


def add_messages(session: str, messages: Iterable[MessageLike]) -> Call[m.Appended]:
    return Call(
        "POST",
        f"/v1/sessions/{seg(session)}/messages",
        lambda b: m.from_dict(m.Appended, b),
        json={"messages": message_body(messages)},
        idempotent=True,
    )


def context(
    session: str,
    budget: Optional[int],
    pairs: Optional[int],
    refresh_after: Optional[int],
    wait_ms: Optional[int],
    query: Optional[str] = None,
) -> Call[m.Context]:
    return Call(
        "GET",
        f"/v1/sessions/{seg(session)}/context",
        lambda b: m.from_dict(m.Context, b),
        params=params(
            budget=budget, pairs=pairs, refresh_after=refresh_after, wait=wait_ms,
            query=query or None,
        ),
        idempotent=True,
    )


def search(
    q: str, session: Optional[str], offset: Optional[int], limit: Optional[int]
) -> Call[m.SearchResults]:
    return Call(
        "GET",
        "/v1/search",
        lambda b: m.from_dict(m.SearchResults, b),
        params=params(q=q, session=session, offset=offset, limit=limit),
        idempotent=True,
    )


def summaries(session: str, all: bool, coverage: bool) -> Call[list[m.Summary]]:
    return Call(
        "GET",
        f"/v1/sessions/{seg(session)}/summaries",
        lambda b: [m.from_dict(m.Summary, r) for r in b["summaries"]],
        params=params(all=all or None, coverage=coverage or None),
        idempotent=True,
    )


def expand(
    session: str, row: int, identifier: Optional[str], after: Optional[int], limit: Optional[int]
) -> Call[m.Expansion]:
    return Call(
        "GET",
        f"/v1/sessions/{seg(session)}/summaries/{int(row)}/expand",
        lambda b: m.from_dict(m.Expansion, b),
        params=params(identifier=identifier, after=after, limit=limit),
        idempotent=True,
    )


def session(session: str) -> Call[m.Session]:
    return Call(
        "GET", f"/v1/sessions/{seg(session)}", lambda b: m.from_dict(m.Session, b), idempotent=True
    )


def sessions(q: Optional[str], offset: Optional[int], limit: Optional[int]) -> Call[list[m.Session]]:
    return Call(
        "GET",
        "/v1/sessions",
        lambda b: [m.from_dict(m.Session, s) for s in b["sessions"]],
        params=params(q=q, offset=offset, limit=limit),
        idempotent=True,
    )


def messages(session: str, after: int, limit: Optional[int]) -> Call[list[m.StoredMessage]]:
    return Call(
        "GET",
        f"/v1/sessions/{seg(session)}/messages",
        lambda b: [m.from_dict(m.StoredMessage, e) for e in b["messages"]],
        params=params(after=after, limit=limit),
        idempotent=True,
    )


def pop_message(session: str) -> Call[m.Removed]:
    # Sent twice, it removes two messages.
    return Call(
        "DELETE",
        f"/v1/sessions/{seg(session)}/messages/last",
        lambda b: m.from_dict(m.Removed, b),
        at_most_once=True,
    )


def set_focus(session: str, focus: Optional[str]) -> Call[None]:
    return Call(
        "PUT", f"/v1/sessions/{seg(session)}/focus", lambda b: None, json={"focus": focus},
        idempotent=True,
    )


def set_mode(session: str, mode: str, quiet_secs: Optional[int]) -> Call[None]:
    return Call(
        "PUT",
        f"/v1/sessions/{seg(session)}/mode",
        lambda b: None,
        json={k: v for k, v in {"mode": mode, "quiet_secs": quiet_secs}.items() if v is not None},
        idempotent=True,
    )


def pins(session: str) -> Call[list[int]]:
    return Call(
        "GET", f"/v1/sessions/{seg(session)}/pins", lambda b: list(b["pins"]), idempotent=True
    )


def pin(session: str, episode: int, on: bool) -> Call[None]:
    return Call(
        "PUT" if on else "DELETE",
        f"/v1/sessions/{seg(session)}/pins/{int(episode)}",
        lambda b: None,
        idempotent=True,
    )


def refresh(session: str) -> Call[Optional[m.Job]]:
    def read(b: Any) -> Optional[m.Job]:
        return m.from_dict(m.Job, b) if isinstance(b, dict) and "state" in b else None

    return Call("POST", f"/v1/sessions/{seg(session)}/refresh", read)


def reset(session: str) -> Call[None]:
    return Call("DELETE", f"/v1/sessions/{seg(session)}", lambda b: None, idempotent=True)


def import_transcript(
    data: bytes, format: Optional[str], session: Optional[str], name: Optional[str],
    include_tools: bool,
) -> Call[list[m.Imported]]:
    return Call(
        "POST",
        "/v1/transcripts",
        lambda b: [m.from_dict(m.Imported, c) for c in b["conversations"]],
        params=params(format=format, session=session, name=name, include_tools=include_tools or None),
        content=data,
        # The server detects the format (or takes `format`) from the bytes themselves.
        headers={"content-type": "application/octet-stream"},
    )


def remember(body: dict[str, Any]) -> Call[m.Written]:
    body = {k: v for k, v in body.items() if v is not None}
    body.setdefault("id", f"py-{uuid.uuid4().hex}")
    return Call(
        "POST",
        "/v1/memories",
        lambda b: m.from_dict(m.Written, b["memories"][0]),
        json=body,
        idempotent=True,
    )


def recall(body: dict[str, Any]) -> Call[list[m.Hit]]:
    return Call(
        "POST",
        "/v1/recall",
        lambda b: [m.from_dict(m.Hit, h) for h in b["results"]],
        json={k: v for k, v in body.items() if v is not None},
        idempotent=True,
    )


def memory(id: str) -> Call[m.Memory]:
    return Call("GET", f"/v1/memories/{seg(id)}", lambda b: m.from_dict(m.Memory, b), idempotent=True)


def _scope_page(
    path: str, key_of_list: str, cls: type[T], user: Optional[str], project: Optional[str],
    environment: Optional[str], type: Optional[str], key: Optional[str], offset: int, limit: int,
) -> Call[list[T]]:
    """A page of a scope's memories or clusters (every field given must match)."""
    return Call(
        "GET",
        path,
        lambda b: [m.from_dict(cls, x) for x in b[key_of_list]],
        params=params(user=user, project=project, environment=environment, type=type, key=key,
                      offset=offset, limit=limit),
        idempotent=True,
    )


def memories(
    user: Optional[str], project: Optional[str], environment: Optional[str], type: Optional[str],
    key: Optional[str], offset: int, limit: int,
) -> Call[list[m.Memory]]:
    return _scope_page("/v1/memories", "memories", m.Memory, user, project, environment, type,
                       key, offset, limit)


def clusters(
    user: Optional[str], project: Optional[str], environment: Optional[str], type: Optional[str],
    key: Optional[str], offset: int, limit: int,
) -> Call[list[m.Cluster]]:
    return _scope_page("/v1/clusters", "clusters", m.Cluster, user, project, environment, type,
                       key, offset, limit)


def cluster_summary(id: int) -> Call[m.ClusterSummary]:
    return Call("GET", f"/v1/summaries/{int(id)}", lambda b: m.from_dict(m.ClusterSummary, b),
                idempotent=True)


def summary_sources(id: int) -> Call[list[m.Memory]]:
    return Call("GET", f"/v1/summaries/{int(id)}/sources",
                lambda b: [m.from_dict(m.Memory, x) for x in b["sources"]], idempotent=True)


def forget(id: str) -> Call[None]:
    return Call("DELETE", f"/v1/memories/{seg(id)}", lambda b: None, idempotent=True)


def job(id: int) -> Call[m.Job]:
    return Call("GET", f"/v1/jobs/{int(id)}", lambda b: m.from_dict(m.Job, b), idempotent=True)


def cancel_job(id: int) -> Call[m.Job]:
    return Call("POST", f"/v1/jobs/{int(id)}/cancel", lambda b: m.from_dict(m.Job, b), idempotent=True)


def tokens() -> Call[list[m.Token]]:
    return Call("GET", "/v1/tokens", lambda b: [m.from_dict(m.Token, t) for t in b["tokens"]],
                idempotent=True)


def create_token(read_only: bool, label: Optional[str]) -> Call[m.CreatedToken]:
    body: dict[str, Any] = {"read_only": read_only}
    if label is not None:
        body["label"] = label
    return Call("POST", "/v1/tokens", lambda b: m.from_dict(m.CreatedToken, b), json=body)


def revoke_token(id: int) -> Call[m.Token]:
    return Call("DELETE", f"/v1/tokens/{int(id)}", lambda b: m.from_dict(m.Token, b))


def usage() -> Call[m.Usage]:
    return Call("GET", "/v1/usage", lambda b: m.from_dict(m.Usage, b), idempotent=True)


def memory_body(
    text: str,
    user: Optional[str],
    type: str,
    key: Optional[str],
    project: Optional[str],
    environment: Optional[str],
    importance: Optional[float],
    id: Optional[str],
    replaces: Optional[str] = None,
) -> dict[str, Any]:
    if not user:
        raise ValueError("remember needs the user the memory belongs to, e.g. user='alice'")
    body: dict[str, Any] = {"user": user, "text": text, "type": type}
    # Without a key the server's default (`general`) keys it: the user's related facts then
    # cluster by meaning, and their clusters get summaries.
    for name, value in (("key", key), ("project", project), ("environment", environment),
                        ("importance", importance), ("id", id), ("replaces", replaces)):
        if value is not None:
            body[name] = value
    return body


# ---- server-sent events ----------------------------------------------------------------


class SseParser:
    """Incremental `text/event-stream` parsing: feed lines, take whole events."""

    def __init__(self) -> None:
        self.id: Optional[int] = None
        self.event = "message"
        self.data: list[str] = []

    def line(self, line: str) -> Optional[m.Event]:
        line = line.rstrip("\r\n")
        if not line:
            if not self.data:
                self.event = "message"
                return None
            ev = m.Event(id=self.id, event=self.event, data=body_of("\n".join(self.data)))
            self.event, self.data = "message", []
            return ev
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self.data.append(value)
        elif name == "event":
            self.event = value
        elif name == "id":
            try:
                self.id = int(value)
            except ValueError:
                pass
        return None


def terminal(ev: m.Event) -> bool:
    """Whether a job event ends its stream (the job has finished)."""
    return isinstance(ev.data, dict) and ev.data.get("state") in m.FINISHED


class JobStream:
    """A job's event stream across reconnections: where to resume (``Last-Event-ID``), when
    to give up, and when the stream is over. Both clients drive it."""

    def __init__(self, id: int, last_event_id: Optional[int], max_retries: int) -> None:
        self.path = f"/v1/jobs/{int(id)}/events"
        self.last = last_event_id
        self.max_retries = max_retries
        self.failures = 0
        self.done = False
        self.parser = SseParser()

    def headers(self) -> dict[str, str]:
        """Headers for the next connection (a new parser starts with it)."""
        self.parser = SseParser()
        h = {"accept": "text/event-stream"}
        if self.last is not None:
            h["last-event-id"] = str(self.last)
        return h

    def feed(self, line: str) -> Optional[m.Event]:
        ev = self.parser.line(line)
        if ev is not None:
            self.failures = 0
            if ev.id is not None:
                self.last = ev.id
            self.done = terminal(ev)
        return ev

    def dropped(self, url: str, err: Exception) -> float:
        """A broken connection: seconds to wait before resuming, or the error when it keeps
        breaking."""
        self.failures += 1
        e = unreachable(url, err)
        if self.failures > self.max_retries:
            raise e from err
        return backoff(e, self.failures)

    def ended(self, job: m.Job) -> Optional[m.Event]:
        """The stream closed without a final event: the job's state if it has finished (the
        stream is then over), else None (resume after :meth:`pause`)."""
        if job.finished:
            self.done = True
            return m.Event(id=self.last, event="job.state", data=dataclasses.asdict(job))
        self.failures += 1
        return None

    def pause(self) -> float:
        return min(8.0, 0.25 * 2 ** min(self.failures, 5))
