"""Typed results. Each dataclass mirrors one schema of the server's OpenAPI document
(``SCHEMA``); ``tests/test_openapi.py`` compares their fields so they cannot drift."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Optional, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")


def _convert(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = get_origin(tp)
    if origin is Union:
        inner = [a for a in get_args(tp) if a is not type(None)]
        return _convert(inner[0], value) if len(inner) == 1 else value
    if origin is list:
        (item,) = get_args(tp)
        return [_convert(item, v) for v in value]
    if dataclasses.is_dataclass(tp) and isinstance(value, dict):
        return from_dict(tp, value)  # type: ignore[type-var]
    return value


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """``cls`` from a JSON object; keys the class does not know (a newer server) are ignored."""
    hints = get_type_hints(cls)
    kw = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            kw[f.name] = _convert(hints[f.name], data[f.name])
    return cls(**kw)


@dataclass
class Message:
    """One message of a context, ready to send to a model."""

    SCHEMA: ClassVar[str] = "ContextMessage"
    role: str
    content: str
    # The stored message this is (None for the summary's system message), and the item its
    # client stored with it, as given.
    episode: Optional[int] = None
    item: Optional[Any] = None


# The states a job ends in.
FINISHED = ("succeeded", "failed", "cancelled")


@dataclass
class Progress:
    SCHEMA: ClassVar[str] = "ProgressView"
    stage: str
    level: int
    done: int
    total: int


@dataclass
class Lease:
    """Who holds a running job."""

    SCHEMA: ClassVar[str] = "LeaseView"
    worker: str
    until_ms: Optional[int] = None


@dataclass
class Job:
    """A durable summarization job."""

    SCHEMA: ClassVar[str] = "JobView"
    id: int
    session: str
    target: int
    state: str
    progress: Progress
    calls_planned: int
    answers: int
    attempts: int
    cancel_requested: bool
    created_ms: int
    updated_ms: int
    model: str
    context_length: int
    error: Optional[str] = None
    started_ms: Optional[int] = None
    finished_ms: Optional[int] = None
    lease: Optional[Lease] = None

    @property
    def finished(self) -> bool:
        """Whether the job has ended (succeeded, failed or cancelled)."""
        return self.state in FINISHED


@dataclass
class Appended:
    """What a post of messages stored."""

    SCHEMA: ClassVar[str] = "Appended"
    session: str
    ids: list[str]
    received: int
    stored: int
    duplicates: int
    episodes: int
    job: Optional[Job] = None


@dataclass
class ContextParts:
    """The estimated tokens of each part of a context; they add up to its ``tokens``."""

    SCHEMA: ClassVar[str] = "ContextParts"
    summary: int
    ledger: int
    digest: int
    pinned: int
    recent: int
    days: int
    found: int


@dataclass
class StablePrefix:
    """The leading messages of a context that every later context begins with, byte for byte,
    until the next fold: a prompt cache's breakpoint goes at the end of them."""

    SCHEMA: ClassVar[str] = "StableView"
    messages: int
    chars: int


@dataclass
class SearchHit:
    """One message a search found: its session, number, time, and the matching words marked
    between ``**`` in ``excerpt``; ``expand`` is the path that reads it with its neighbours."""

    SCHEMA: ClassVar[str] = "SearchHitView"
    session: str
    episode: int
    role: str
    score: float
    excerpt: str
    expand: str
    speaker: Optional[str] = None
    timestamp_ms: Optional[int] = None


@dataclass
class SearchResults:
    """A page of search hits, best first; ``next_offset`` pages on (``None``: the last page);
    ``complete`` is false while older messages are still being indexed."""

    SCHEMA: ClassVar[str] = "SearchView"
    query: str
    hits: list[SearchHit]
    complete: bool
    session: Optional[str] = None
    next_offset: Optional[int] = None


@dataclass
class Context:
    """A compact context: the summary with its ledger, pins and recent turns, within a budget."""

    SCHEMA: ClassVar[str] = "ContextView"
    session: str
    messages: list[Message]
    tokens: int
    full_tokens: int
    episodes: int
    saving_percent: float
    covered: int
    recent: int
    omitted: int
    omitted_ranges: list[list[int]]
    covered_from: int
    level: int
    identifiers: int
    pinned: int
    found: int
    budget: int
    budget_used_percent: float
    parts: ContextParts
    stable: StablePrefix
    refresh_pending: bool
    refresh_due: bool
    waited: bool
    note: Optional[str] = None
    job: Optional[Job] = None

    def split_note(self) -> tuple[list[Message], str]:
        """The messages with the per-call note taken off the newest one, and that note as the
        newest message carried it (the note, then the line that ends it): for a caller that
        puts the note on a message of its own (the user's new turn)."""
        msgs = list(self.messages)
        if not self.note or not msgs or not msgs[-1].content.startswith(self.note):
            return msgs, ""
        last = msgs[-1]
        rest = last.content[len(self.note):].lstrip("\n")
        _, _, bare = rest.partition("\n")
        block = last.content[: len(last.content) - len(bare)]
        msgs[-1] = dataclasses.replace(last, content=bare)
        return msgs, block

    def to_openai(self) -> list[dict[str, str]]:
        """Messages for the OpenAI chat API (``messages=``): the summary as a system message.
        The first ``stable.messages`` are the same on every call until the next fold, so the
        provider's automatic prefix cache keeps them (pass the session id as
        ``prompt_cache_key``)."""
        return [{"role": m.role, "content": m.content} for m in self.messages]

    def to_anthropic(self, cache: bool = False) -> tuple[Any, list[dict[str, Any]]]:
        """``(system, messages)`` for Anthropic's Messages API: system text apart, and turns
        that alternate and start with the user (adjacent same-role turns are joined).

        With ``cache=True`` the system text and the messages are content blocks, with a
        ``cache_control`` breakpoint on the system block and on the block that ends the
        stable prefix (``stable.messages``), so the part that stays the same until the next
        fold is read from Anthropic's prompt cache."""
        stable = self.stable.messages
        system_parts = [m.content for i, m in enumerate(self.messages) if m.role == "system"]
        system_text = "\n\n".join(system_parts)
        turns: list[dict[str, Any]] = []
        # (turn index, block index) of the last block of the stable prefix.
        mark: Optional[tuple[int, int]] = None
        for i, m in enumerate(self.messages):
            if m.role == "system":
                continue
            role = "assistant" if m.role == "assistant" else "user"
            if not turns or turns[-1]["role"] != role:
                turns.append({"role": role, "content": []})
            turns[-1]["content"].append({"type": "text", "text": m.content})
            if i < stable:
                mark = (len(turns) - 1, len(turns[-1]["content"]) - 1)
        if turns and turns[0]["role"] == "assistant":
            turns.insert(0, {"role": "user", "content": [
                {"type": "text", "text": "(earlier turns are summarized above)"}]})
            if mark is not None:
                mark = (mark[0] + 1, mark[1])
        if not cache:
            plain = [{"role": t["role"], "content": "\n\n".join(b["text"] for b in t["content"])}
                     for t in turns]
            return system_text, plain
        if mark is not None:
            turns[mark[0]]["content"][mark[1]]["cache_control"] = {"type": "ephemeral"}
        system: list[dict[str, Any]] = []
        if system_text:
            system.append({"type": "text", "text": system_text, "cache_control": {"type": "ephemeral"}})
        return system, turns


@dataclass
class LedgerEntry:
    SCHEMA: ClassVar[str] = "LedgerView"
    text: str
    kind: str
    episode: int
    count: int


@dataclass
class SourceMark:
    SCHEMA: ClassVar[str] = "SourceMarkView"
    path: str
    bytes: int


@dataclass
class Coverage:
    SCHEMA: ClassVar[str] = "CoverageView"
    transcript_bytes: int
    messages: int
    last_exchange_ms: Optional[int] = None
    source: Optional[SourceMark] = None


@dataclass
class Summary:
    """One row of a session's summary chain: what it says and exactly which episodes."""

    SCHEMA: ClassVar[str] = "SummaryView"
    id: int
    first_episode: int
    last_episode: int
    tokens: int
    content: str
    model: str
    prompt_tokens: int
    output_tokens: int
    skipped: list[Any]
    level: int
    ledger: list[LedgerEntry]
    ledger_dropped: int
    compacted_into: Optional[int] = None
    coverage: Optional[Coverage] = None


@dataclass
class Session:
    """A session's state: freshness, coverage and what its summary saves."""

    SCHEMA: ClassVar[str] = "SessionView"
    id: str
    state: str
    reason: str
    mode: str
    own_mode: bool
    episodes: int
    covered: int
    backlog_tokens: int
    failures: int
    history_tokens: int
    summary_tokens: int
    tokens_saved: int
    last_activity_ms: Optional[int] = None
    covered_until_ms: Optional[int] = None
    due_at_ms: Optional[int] = None
    last_error: Optional[str] = None
    active_job: Optional[int] = None
    title: Optional[str] = None
    project: Optional[str] = None


@dataclass
class Episode:
    SCHEMA: ClassVar[str] = "EpisodeView"
    id: int
    role: str
    content: str
    timestamp_ms: Optional[int] = None


@dataclass
class StoredMessage:
    """A stored message of a session and the summary row that covers it, if any."""

    SCHEMA: ClassVar[str] = "MessageView"
    id: int
    role: str
    content: str
    tokens: int
    timestamp_ms: Optional[int] = None
    speaker: Optional[str] = None
    covered_by: Optional[int] = None
    # The item its client stored with it, as given (``add_messages`` with ``item``).
    item: Optional[Any] = None


@dataclass
class Removed:
    """What removing a session's newest message did (:meth:`Client.pop_message`)."""

    SCHEMA: ClassVar[str] = "RemovedView"
    session: str
    message: StoredMessage
    dropped_rows: list[int]
    reopened_rows: list[int]
    episodes: int
    job: Optional[Job] = None


@dataclass
class Token:
    """One of the tenant's API tokens (never the token itself: its first characters)."""

    SCHEMA: ClassVar[str] = "TokenView"
    id: int
    prefix: str
    read_only: bool
    created_ms: int
    label: Optional[str] = None
    revoked_ms: Optional[int] = None


@dataclass
class CreatedToken:
    """A token just created: ``token`` is shown this once (the server keeps its hash)."""

    SCHEMA: ClassVar[str] = "CreatedToken"
    token: str
    id: int
    prefix: str
    read_only: bool
    created_ms: int
    label: Optional[str] = None


@dataclass
class Expansion:
    """A summary row and exactly the episodes it covers."""

    SCHEMA: ClassVar[str] = "ExpansionView"
    row: Summary
    episodes: list[Episode]
    compacted: list[Summary]
    next_after: Optional[int] = None


@dataclass
class Imported:
    SCHEMA: ClassVar[str] = "Imported"
    session: str
    episodes: int
    stored: int
    title: Optional[str] = None
    job: Optional[Job] = None


@dataclass
class Memory:
    SCHEMA: ClassVar[str] = "MemoryView"
    id: str
    user: str
    project: str
    environment: str
    type: str
    key: str
    text: str
    importance: float
    created_ms: int
    cluster: int
    # Its place in its fact's history: the memory it replaced, and the one that replaced it
    # (it is then no longer current, kept as history) and when.
    supersedes: Optional[str] = None
    superseded_by: Optional[str] = None
    superseded_ms: Optional[int] = None


@dataclass
class Written:
    """A memory written: its id, its cluster and whether it was new."""

    SCHEMA: ClassVar[str] = "WrittenMemory"
    id: str
    cluster: int
    created: bool
    members: int
    summarizing: bool
    # The memory it replaced (named in ``replaces``, or the same fact found in its text).
    supersedes: Optional[str] = None


@dataclass
class Hit:
    """One recall result: a memory or a cluster summary, with the memories it stands for."""

    SCHEMA: ClassVar[str] = "RecallView"
    kind: str
    id: str
    text: str
    score: float
    importance: float
    sources: list[str]
    # Set when it is no longer current: the memory that replaced it comes before it.
    superseded_by: Optional[str] = None
    superseded_ms: Optional[int] = None


@dataclass
class Cluster:
    """Memories of one scope that lie near each other, and the summary that stands for them."""

    SCHEMA: ClassVar[str] = "ClusterView"
    id: int
    user: str
    project: str
    environment: str
    type: str
    key: str
    members: list[str]
    settled: bool
    summary: Optional[int] = None
    note: Optional[str] = None


@dataclass
class ClusterSummary:
    """A cluster's summary, with the ids of the memories it covers."""

    SCHEMA: ClassVar[str] = "ClusterSummaryView"
    id: int
    cluster: int
    text: str
    sources: list[str]
    importance: float
    model: str
    calls: int
    prompt_tokens: int
    output_tokens: int
    created_ms: int
    updated_ms: int


@dataclass
class UsageDay:
    SCHEMA: ClassVar[str] = "UsageDayView"
    day: str
    calls: int
    prompt_tokens: int
    output_tokens: int
    cost: float


@dataclass
class Usage:
    """The tenant's model usage this month and its ceiling."""

    SCHEMA: ClassVar[str] = "UsageView"
    month: str
    calls: int
    prompt_tokens: int
    output_tokens: int
    cost: float
    exhausted: bool
    resets_at_ms: int
    days: list[UsageDay]
    limit_tokens: Optional[int] = None
    limit_cost: Optional[float] = None


@dataclass
class Event:
    """One server-sent event of a job's stream."""

    id: Optional[int]
    event: str
    data: Any
