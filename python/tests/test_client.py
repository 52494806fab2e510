"""The clients against the real server."""

from __future__ import annotations

import http.server
import json
import threading
import time
from typing import Any

import pytest

import abridge_memory as ab
import abridge_memory._core
from conftest import Server


def chat(n: int, start: int = 0) -> list[tuple[str, str]]:
    out = []
    for i in range(start, start + n):
        out.append(("user", f"Turn {i}: can you check why job {i * 13} in services/worker{i % 9}/queue.rs retries before release v3.{i % 17}.0?"))
        out.append(("assistant", f"Turn {i}: the worker retries because the lease expires; I raised the lease to {30 + i} seconds and noted it for the release."))
    return out


def test_messages_context_and_ready_to_send_lists(server: Server) -> None:
    with ab.Client(server.url) as c:
        r = c.add_messages("chat-1", chat(3))
        assert (r.received, r.stored, r.duplicates, r.episodes) == (6, 6, 0, 6)
        ctx = c.context("chat-1", budget=2000)
        assert isinstance(ctx, ab.Context) and ctx.session == "chat-1"
        assert [m.role for m in ctx.messages][-2:] == ["user", "assistant"]
        assert ctx.to_openai()[-1] == {"role": "assistant", "content": ctx.messages[-1].content}
        system, turns = ctx.to_anthropic()
        assert turns[0]["role"] == "user"
        assert all(a["role"] != b["role"] for a, b in zip(turns, turns[1:]))
        assert isinstance(system, str)


def test_a_retried_post_stores_nothing_twice(server: Server) -> None:
    with ab.Client(server.url) as c:
        msgs = [{"role": "user", "content": "hello", "id": "m-1"}, {"role": "assistant", "content": "hi", "id": "m-2"}]
        assert c.add_messages("s", msgs).stored == 2
        again = c.add_messages("s", msgs)
        assert (again.stored, again.duplicates, again.episodes) == (0, 2, 2)


def test_a_refresh_is_a_job_whose_events_end_with_its_state(server: Server) -> None:
    with ab.Client(server.url) as c:
        posted = c.add_messages("long", chat(30))
        c.set_mode("long", "eager")
        # The refresh's job, or the one the post queued and the refresh found active.
        job = c.refresh("long") or posted.job
        assert job is not None
        events = list(c.job_events(job.id))
        assert events and events[-1].data["state"] == "succeeded", events
        assert c.job(job.id).finished
        if c.refresh("long") is not None:
            pytest.fail("a second refresh found work left")
        rows = c.summaries("long", coverage=True)
        assert rows and rows[-1].last_episode == 60
        assert rows[0].first_episode == 1 and rows[0].coverage is not None
        x = c.expand("long", rows[0].id)
        assert x.row.id == rows[0].id and x.episodes[0].id == rows[0].first_episode
        ctx = c.context("long", budget=800)
        assert ctx.covered == 60 and ctx.tokens <= 800 and ctx.omitted == 0
        assert c.session("long").episodes == 60
        assert "long" in [s.id for s in c.sessions()]


def test_focus_pins_mode_and_reset(server: Server) -> None:
    with ab.Client(server.url) as c:
        c.add_messages("p", chat(2))
        c.pin("p", 1)
        assert c.pins("p") == [1]
        c.unpin("p", 1)
        assert c.pins("p") == []
        c.set_focus("p", "keep file paths")
        c.set_mode("p", "idle", quiet_secs=60)
        assert c.session("p").mode == "idle"
        c.reset("p")
        with pytest.raises(ab.NotFound):
            c.session("p")


def settled_summary(c: ab.Client, user: str, ids: list[str]) -> tuple[list, Any]:
    """The user's summarized clusters and the first one's summary, once it covers ``ids``
    (summaries are made after the write is answered; at most a minute)."""
    deadline = time.monotonic() + 60
    while True:
        cl = [x for x in c.clusters(user=user) if x.summary is not None]
        s = c.cluster_summary(cl[0].summary) if cl else None
        if (s is not None and set(s.sources) == set(ids)) or time.monotonic() > deadline:
            return cl, s
        time.sleep(0.2)


def test_facts_without_a_key_cluster_and_get_one_summary(server: Server) -> None:
    # The mem0-style call, no key: related facts still cluster (by meaning, under the default
    # key) and the cluster gets a summary with its sources.
    with ab.Client(server.url) as c:
        facts = ["Alice prefers the dark theme in her editor",
                 "Alice uses a dark theme with large fonts in the editor",
                 "Alice wants the editor theme dark at night"]
        ids = [c.remember(f, user="alice2").id for f in facts]
        assert len({c.memory(i).cluster for i in ids}) == 1
        assert c.memory(ids[0]).key == "general" and c.memory(ids[0]).type == "fact"
        _, s = settled_summary(c, "alice2", ids)
        assert s is not None and set(s.sources) == set(ids), c.clusters(user="alice2")


def test_memories_remember_recall_and_forget(server: Server) -> None:
    with ab.Client(server.url) as c:
        w = c.remember("Alice prefers dark mode in every editor.", user="alice")
        assert w.created and w.id
        c.remember("Alice's team deploys on Thursdays.", user="alice")
        hits = c.recall("dark mode", user="alice")
        assert hits and hits[0].id == w.id and "dark mode" in hits[0].text
        assert c.recall("dark mode", user="bob") == []
        assert c.memory(w.id).user == "alice"
        c.forget(w.id)
        with pytest.raises(ab.NotFound) as e:
            c.memory(w.id)
        assert e.value.status == 404 and e.value.hint
        assert c.usage().month


def test_a_changed_fact_replaces_the_earlier_memory_and_recall_marks_it(server: Server) -> None:
    with ab.Client(server.url) as c:
        porto = c.remember("I live in Porto, by the river Douro.", user="carol")
        lyon = c.remember("Carol moved to Lyon.", user="carol")
        assert porto.supersedes is None and lyon.supersedes == porto.id
        old = c.memory(porto.id)
        assert old.superseded_by == lyon.id and old.superseded_ms
        assert c.memory(lyon.id).supersedes == porto.id
        hits = c.recall("Porto river Douro", user="carol")
        ids = [h.id for h in hits if h.kind == "memory"]
        assert ids.index(lyon.id) < ids.index(porto.id), hits
        assert next(h for h in hits if h.id == porto.id).superseded_by == lyon.id
        tea = c.remember("Carol drinks tea.", user="carol", replaces=lyon.id)
        assert tea.supersedes == lyon.id
        with pytest.raises(ab.AbridgeError, match="does not exist"):
            c.remember("x", user="carol", replaces="no-such-memory")


def test_errors_are_typed_and_keep_the_servers_hint(server: Server) -> None:
    with ab.Client(server.url) as c:
        with pytest.raises(ab.NotFound) as e:
            c.context("no-such-session")
        assert e.value.code == "not_found" and e.value.hint
        with pytest.raises(ValueError, match="role and content"):
            c.add_messages("s", [{"content": "no role"}])
        with pytest.raises(ValueError, match="user="):
            c.remember("no user")


def test_an_unreachable_server_says_how_to_start_one() -> None:
    with ab.Client("http://127.0.0.1:9", max_retries=0) as c:
        with pytest.raises(ab.ServerUnreachable) as e:
            c.usage()
    # It names the URL it tried and the one `abridge serve` uses by default.
    assert "http://127.0.0.1:9" in str(e.value)
    assert "abridge serve` listens on http://127.0.0.1:8787 by default" in str(e.value)


def test_the_default_url_is_where_serve_listens(monkeypatch) -> None:
    monkeypatch.delenv("ABRIDGE_URL", raising=False)
    with ab.Client() as c:
        assert c.url == "http://127.0.0.1:8787"


def test_a_bad_token_is_unauthenticated(model_url: str, tmp_path) -> None:
    from conftest import start_server

    proc, srv = start_server(model_url, tmp_path)
    proc.kill()
    proc.wait()
    token = srv.cli("tokens", "create", "--tenant", "acme")
    proc, srv = start_server(model_url, tmp_path)
    try:
        with ab.Client(srv.url, token="not-a-token") as c:
            with pytest.raises(ab.Unauthenticated) as e:
                c.usage()
            assert e.value.status == 401
        with ab.Client(srv.url, token=token) as c:
            c.add_messages("t", [("user", "hi")])
            assert c.session("t").episodes == 1
        # Another tenant's session is not found, not forbidden: ids do not leak.
        other = srv.cli("tokens", "create", "--tenant", "globex")
        with ab.Client(srv.url, token=other) as c, pytest.raises(ab.NotFound):
            c.session("t")
    finally:
        proc.kill()
        proc.wait()


class _Flaky(http.server.BaseHTTPRequestHandler):
    """Answers 429 (Retry-After: 0), then 503, then 200: what the retry policy must ride out."""

    answers: list[tuple[int, dict]] = []
    seen: list[float] = []
    version: str = ab.__version__

    def do_GET(self) -> None:  # noqa: N802
        _Flaky.seen.append(time.monotonic())
        status, body = _Flaky.answers.pop(0)
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        if status == 429:
            self.send_header("retry-after", "0")
        if _Flaky.version:
            self.send_header("abridge-version", _Flaky.version)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a: object) -> None:
        pass


def _flaky(answers: list[tuple[int, dict]], version: str = ab.__version__) -> http.server.HTTPServer:
    _Flaky.answers, _Flaky.seen, _Flaky.version = list(answers), [], version
    srv = http.server.HTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


USAGE = {"month": "2026-11", "calls": 1, "prompt_tokens": 2, "output_tokens": 3, "cost": 0.0,
         "exhausted": False, "resets_at_ms": 0, "days": []}


def test_rate_limits_and_unavailability_are_retried_with_backoff() -> None:
    limited = {"error": {"code": "rate_limited", "message": "slow down"}}
    down = {"error": {"code": "unavailable", "message": "shutting down"}}
    srv = _flaky([(429, limited), (503, down), (200, USAGE)])
    try:
        with ab.Client(f"http://127.0.0.1:{srv.server_port}") as c:
            assert c.usage().calls == 1
        assert len(_Flaky.seen) == 3
    finally:
        srv.shutdown()


def test_a_spent_quota_is_not_retried_and_says_when_it_resets() -> None:
    body = {"error": {"code": "quota_exhausted", "message": "the monthly budget is spent",
                      "hint": "raise it with abridge tenants", "quota": {"spent": 1000, "limit": 1000, "resets_at_ms": 1796083200000}}}
    srv = _flaky([(429, body), (200, USAGE)])
    try:
        with ab.Client(f"http://127.0.0.1:{srv.server_port}") as c, pytest.raises(ab.QuotaExhausted) as e:
            c.usage()
        assert (e.value.spent, e.value.limit, e.value.resets_at) == (1000, 1000, 1796083200000)
        assert len(_Flaky.seen) == 1
    finally:
        srv.shutdown()


async def test_the_async_client_does_the_same(server: Server) -> None:
    async with ab.AsyncClient(server.url) as c:
        r = await c.add_messages("a", chat(10))
        assert r.stored == 20
        await c.set_mode("a", "eager")
        job = await c.refresh("a") or r.job
        assert job is not None
        states = [e.data.get("state") async for e in c.job_events(job.id)]
        assert states[-1] == "succeeded"
        ctx = await c.context("a", budget=300)
        assert ctx.covered == 20 and ctx.parts.summary > 0 and ctx.to_openai()
        whole = await c.context("a", budget=4000)
        assert whole.covered == 0 and len(whole.messages) == 20, "a history that fits is sent verbatim"
        w = await c.remember("Bob likes green tea.", user="bob")
        assert [h.id for h in await c.recall("green tea", user="bob")][:1] == [w.id]


def test_a_server_of_another_version_is_named_with_the_fix() -> None:
    for version, fix in [("0.9.0", "pip install 'abridge-memory==0.9.0'"), ("", "upgrade the server")]:
        srv = _flaky([(200, USAGE)], version=version)
        try:
            with ab.Client(f"http://127.0.0.1:{srv.server_port}") as c, pytest.raises(ab.VersionMismatch) as e:
                c.usage()
            assert fix in str(e.value)
        finally:
            srv.shutdown()
    assert ab._core.compatible("0.1.0", "0.1.7") and not ab._core.compatible("0.1.0", "0.2.0")
    assert ab._core.compatible("1.2.0", "1.9.1") and not ab._core.compatible("1.2.0", "2.0.0")


def test_local_starts_a_private_server_and_stops_it(model_url: str) -> None:
    from conftest import _require

    exe = _require("ABRIDGE_BIN", "abridge", "cargo build -p abridge")
    with ab.local(exe, env={"EXTRACTION_URL": model_url}) as c:
        c.add_messages("nb", [("user", "hello from a notebook")])
        assert c.session("nb").episodes == 1
        url = c.url
    with ab.Client(url, max_retries=0) as c, pytest.raises(ab.ServerUnreachable):
        c.usage()
    with pytest.raises(ab.ServerUnreachable, match="ABRIDGE_BIN"):
        with ab.local("/nonexistent/abridge"):
            pass


class _Sse(http.server.BaseHTTPRequestHandler):
    """A job stream that breaks after its first event, then resumes where Last-Event-ID says."""

    resumed_from: list = []

    def do_GET(self) -> None:  # noqa: N802
        last = self.headers.get("last-event-id")
        _Sse.resumed_from.append(last)
        if self.path.startswith("/v1/jobs/7/events"):
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("abridge-version", ab.__version__)
            self.end_headers()
            if last is None:
                self.wfile.write(b'id: 1\nevent: job.running\ndata: {"id": 7, "state": "running"}\n\n')
            else:
                self.wfile.write(b': keep-alive\n\nid: 2\nevent: job.succeeded\ndata: {"id": 7, "state": "succeeded"}\n\n')
            self.wfile.flush()
            self.close_connection = True
            return
        self.send_response(404)
        self.end_headers()

    def log_message(self, *a: object) -> None:
        pass


def test_a_dropped_event_stream_resumes_from_the_last_event() -> None:
    _Sse.resumed_from = []
    srv = http.server.HTTPServer(("127.0.0.1", 0), _Sse)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        c = ab.Client(f"http://127.0.0.1:{srv.server_port}")
        job = {"id": 7, "session": "s", "target": 1, "state": "running", "progress": {"stage": "map", "level": 0, "done": 0, "total": 0},
               "calls_planned": 0, "answers": 0, "attempts": 1, "cancel_requested": False, "created_ms": 0,
               "updated_ms": 0, "model": "m", "context_length": 8192}
        # The first stream closes without a final event: the client asks where the job stands
        # (still running), then resumes from event 1.
        c.job = lambda id: ab.Job(**{**job, "progress": ab._models.Progress(**job["progress"])})  # type: ignore[method-assign]
        events = list(c.job_events(7))
        assert [(e.id, e.event) for e in events] == [(1, "job.running"), (2, "job.succeeded")]
        assert _Sse.resumed_from == [None, "1"]
    finally:
        srv.shutdown()


def test_a_transcript_is_imported_as_a_session(server: Server) -> None:
    from conftest import ROOT

    data = (ROOT / "tests" / "fixtures" / "claude-code.jsonl").read_bytes()
    with ab.Client(server.url) as c:
        got = c.import_transcript(data, session="imported")
        assert len(got) == 1 and got[0].session == "imported" and got[0].episodes > 0
        assert c.session("imported").episodes == got[0].episodes
        again = c.import_transcript(data, session="imported")
        assert again[0].stored == 0, "an import of the same file stores nothing twice"
        with pytest.raises(ab.AbridgeError) as e:
            c.import_transcript(b"\x00not a transcript", session="bad")
        assert e.value.status == 400 and "format" in str(e.value)


def test_related_memories_are_summarized_and_the_summary_names_its_sources(model_url: str, tmp_path) -> None:
    from conftest import start_server

    # A write that lands while its cluster is being summarized leaves the cluster unsettled
    # for the sweeper (every 120 s by default; every second here).
    proc, server = start_server(model_url, tmp_path, {"ABRIDGE_SWEEP_SECS": "1"})
    try:
        with ab.Client(server.url) as c:
            facts = ["Alice prefers the dark theme in her editor",
                     "Alice uses a dark theme with large fonts in the editor",
                     "Alice wants the editor theme dark at night",
                     "Alice likes a dark editor theme with high contrast"]
            ids = [c.remember(f, user="alice", key="editor").id for f in facts]
            # Settled: one summary covering all four (a summary written while the last writes
            # landed covers fewer, until the sweeper refolds it).
            cl, s = settled_summary(c, "alice", ids)
            assert cl and s is not None, c.clusters(user="alice")
            assert s.cluster == cl[0].id and set(s.sources) == set(ids), s
            assert {m.id for m in c.summary_sources(s.id)} == set(s.sources)
            hits = c.recall("dark editor theme", user="alice")
            summary_hits = [h for h in hits if h.kind == "summary"]
            assert summary_hits and set(summary_hits[0].sources) == set(s.sources)
    finally:
        proc.kill()
        proc.wait()


def test_popping_the_newest_message_refolds_its_row_and_frees_its_id(server: Server) -> None:
    with ab.Client(server.url) as c:
        msgs = [{"role": r, "content": t, "id": f"m-{i}"} for i, (r, t) in enumerate(chat(8))]
        msgs[-1]["content"] = "zebracorn: a message sent by mistake"
        c.add_messages("undo", msgs)
        c.set_mode("undo", "eager")
        job = c.refresh("undo")
        assert job is not None and c.wait_job(job.id).state == "succeeded"
        row = c.summaries("undo")[-1]
        assert row.last_episode == 16 and "zebracorn" in row.content
        gone = c.pop_message("undo")
        assert isinstance(gone, ab.Removed) and isinstance(gone.message, ab.StoredMessage)
        assert (gone.message.id, gone.message.role, gone.episodes) == (16, "assistant", 15)
        assert gone.message.content.startswith("zebracorn") and gone.dropped_rows == [row.id]
        assert gone.job is not None and c.wait_job(gone.job.id).state == "succeeded"
        rows = c.summaries("undo", all=True)
        assert rows[-1].last_episode == 15
        assert not any("zebracorn" in r.content for r in rows)
        assert [m.id for m in c.messages("undo")][-1] == 15
        # The same client id posts again: the message comes back as 16.
        again = c.add_messages("undo", [msgs[-1]])
        assert (again.stored, again.episodes) == (1, 16)
        with pytest.raises(ab.NotFound):
            c.pop_message("no-such-session")


def test_a_tenant_lists_creates_and_revokes_its_own_tokens(model_url: str, tmp_path) -> None:
    from conftest import start_server

    proc, srv = start_server(model_url, tmp_path)
    proc.kill()
    proc.wait()
    acme = srv.cli("tokens", "create", "--tenant", "acme")
    srv.cli("tokens", "create", "--tenant", "globex")
    proc, srv = start_server(model_url, tmp_path)
    try:
        with ab.Client(srv.url, token=acme) as c:
            mine = c.tokens()
            assert len(mine) == 1 and acme.startswith(mine[0].prefix)
            made = c.create_token(read_only=True, label="dashboard")
            assert isinstance(made, ab.CreatedToken) and made.token.startswith("abr_")
            listed = c.tokens()
            assert [t.label for t in listed] == [None, "dashboard"]
            assert all(t.revoked_ms is None for t in listed)
            with ab.Client(srv.url, token=made.token) as ro:
                assert len(ro.tokens()) == 2
                with pytest.raises(ab.Forbidden) as e:
                    ro.create_token()
                assert e.value.status == 403
            with pytest.raises(ab.NotFound):
                c.revoke_token(made.id + 1000)
            assert c.revoke_token(made.id).revoked_ms is not None
            with ab.Client(srv.url, token=made.token) as ro, pytest.raises(ab.Unauthenticated):
                ro.tokens()
    finally:
        proc.kill()
        proc.wait()


def test_search_and_a_context_with_a_query(server: Server) -> None:
    with ab.Client(server.url) as c:
        said = [("user" if i % 2 == 0 else "assistant", f"Turn {i}: the weather and the garden, nothing more.")
                for i in range(30)]
        said[4] = ("user", "The launch code for the Zephyr project is 7741.")
        c.add_messages("search-1", said)
        r = c.search("zephyr launch code")
        assert isinstance(r, ab.SearchResults) and r.complete
        hit = r.hits[0]
        assert isinstance(hit, ab.SearchHit)
        assert (hit.session, hit.episode, hit.role) == ("search-1", 5, "user")
        assert "**launch**" in hit.excerpt and hit.timestamp_ms
        assert hit.expand.startswith("/v1/sessions/search-1/messages")
        # Quotes and operators are words; paging; one session.
        assert c.search('"zephyr" NEAR(launch*) -code content:x').hits[0].episode == 5
        page = c.search("garden", limit=2)
        assert len(page.hits) == 2 and page.next_offset == 2
        assert c.search("garden", session="search-1", offset=2, limit=2).hits[0].episode != page.hits[0].episode
        with pytest.raises(ab.NotFound):
            c.search("garden", session="nobody")
        with pytest.raises(ab.InvalidInput):
            c.search("garden", limit=0)
        # The context with the question carries the turn that answers it.
        ctx = c.context("search-1", budget=200, query="What is the Zephyr launch code?")
        assert ctx.found >= 1 and ctx.parts.found > 0
        # It changes every call, so it rides on the newest message (after the stable prefix).
        assert ctx.note and "7741" in ctx.note and ctx.messages[-1].content.startswith(ctx.note)
        assert c.context("search-1", budget=200).found == 0
        assert c.newest_user_message("search-1") == said[28][1]


async def test_the_blocking_call_guard_fails_a_sync_call_made_on_the_event_loop(server: Server) -> None:
    """The suite's guard (conftest.no_blocking_calls_on_the_loop) is live: the sync client
    used inside a coroutine is caught, so an async path of the package that did the same
    would fail its test."""
    from blockbuster import BlockingError

    with ab.Client(server.url) as c:
        with pytest.raises(BlockingError):
            c.sessions()
