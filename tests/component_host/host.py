"""abridge's engine component in a host abridge does not ship: the Python ``wasmtime`` package.

Every ``abridge:engine`` import is written here from the WIT (``wit/abridge.wit``): the model
(``llm``) over real HTTP to an Ollama-compatible server, the storage (``store``) in Python
dicts, the ``clock`` and the ``log``. The WASI 0.2.6 interfaces the component also imports
(``world component``: the environment, exit and stdio Rust's standard library links in) come
from wasmtime's own WASI. The memories' storage (``memory-store``) is not needed for a
conversation, so it is left to trap: calling it says so.

    python host.py --component abridge_guest.wasm --model-url http://127.0.0.1:11434

runs append → summarize → context → expand on a short conversation and prints what each
returned (exit 0 when each did what the WIT says). ``abridge component --out DIR`` writes the
component. See docs/component.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from typing import Any, Callable

import wasmtime
import wasmtime.component as wc

PKG = "abridge:engine"
VERSION = "0.5.0"


def iface(name: str) -> str:
    return f"{PKG}/{name}@{VERSION}"


def rec(**fields: Any) -> wc.Record:
    """A WIT record: field names as the WIT spells them (``first-episode``)."""
    r = wc.Record()
    for k, v in fields.items():
        setattr(r, k.replace("_", "-"), v)
    return r


def get(r: Any, field: str) -> Any:
    return getattr(r, field.replace("_", "-"))


class StoreError(Exception):
    """A store refusal, returned to the guest as the WIT ``error`` variant."""

    def __init__(self, tag: str, message: str) -> None:
        super().__init__(message)
        self.tag = tag


# --- store: the conversation's episodes and summary rows, in memory ---

class MemoryStore:
    def __init__(self) -> None:
        self.episodes: dict[str, list[wc.Record]] = {}
        self.keys: dict[str, set[str]] = {}
        self.rows: dict[str, list[wc.Record]] = {}
        self.next_row = 1
        self.failures: dict[str, wc.Record] = {}
        self.calibrations: dict[str, tuple[int, int]] = {}
        self.items: dict[tuple[str, int], str] = {}

    def append_episodes(self, session: str, eps: list[Any]) -> int:
        have = self.episodes.setdefault(session, [])
        keys = self.keys.setdefault(session, set())
        added = 0
        for e in eps:
            key = get(e, "source_key")
            if key in keys:
                continue
            keys.add(key)
            through = (get(have[-1], "tokens_through") if have else 0) + e.tokens
            have.append(rec(id=len(have) + 1, role=e.role, content=e.content,
                            timestamp_ms=get(e, "timestamp_ms"), tokens=e.tokens,
                            speaker=e.speaker, tokens_through=through))
            if e.item is not None:
                # The client's own record of the message, kept beside it (never read here).
                self.items[(session, len(have))] = e.item
            added += 1
        return added

    def stats(self, session: str) -> wc.Record:
        eps = self.episodes.get(session, [])
        return rec(episodes=len(eps), total_tokens=get(eps[-1], "tokens_through") if eps else 0,
                   last_episode=len(eps))

    def episodes_after(self, session: str, after: int, limit: int) -> list[wc.Record]:
        return [e for e in self.episodes.get(session, []) if e.id > after][:limit]

    def episodes_by_id(self, session: str, ids: list[int]) -> list[wc.Record]:
        want = set(ids)
        return [e for e in self.episodes.get(session, []) if e.id in want]

    def active(self, session: str) -> list[wc.Record]:
        rows = [r for r in self.rows.get(session, []) if get(r, "compacted_into") is None]
        return sorted(rows, key=lambda r: get(r, "first_episode"))

    def latest_summary(self, session: str) -> Any:
        rows = self.active(session)
        return max(rows, key=lambda r: (get(r, "last_episode"), r.id)) if rows else None

    def summary_history(self, session: str) -> list[wc.Record]:
        return sorted(self.rows.get(session, []),
                      key=lambda r: (get(r, "first_episode"), -r.level, r.id))

    def write_summary(self, session: str, w: Any) -> wc.Record:
        """A new row after the latest, or a rewrite of an active row (the chain rule of the
        WIT's ``write-summary``)."""
        episodes = len(self.episodes.get(session, []))
        first, last = get(w, "first_episode"), get(w, "last_episode")
        if first == 0 or last < first or last > episodes:
            raise StoreError("conflict", f"coverage {first}-{last} is outside episodes 1-{episodes}")
        prev = self.latest_summary(session)
        fields = dict(first_episode=first, last_episode=last, content=w.content, tokens=w.tokens,
                      prompt_tokens=get(w, "prompt_tokens"), output_tokens=get(w, "output_tokens"),
                      model=w.model, updated_ms=get(w, "now_ms"), skipped=w.skipped,
                      ledger=w.ledger, ledger_dropped=get(w, "ledger_dropped"))
        if w.replaces is None:
            expect = get(prev, "last_episode") + 1 if prev else 1
            if first != expect:
                raise StoreError("conflict", f"a new row must start at episode {expect}, not {first}")
            row = rec(id=self.next_row, created_ms=get(w, "now_ms"), level=0, compacted_into=None,
                      **fields)
            self.next_row += 1
            self.rows.setdefault(session, []).append(row)
            return row
        for row in self.active(session):
            if row.id == w.replaces:
                for k, v in fields.items():
                    setattr(row, k.replace("_", "-"), v)
                return row
        raise StoreError("conflict", f"row {w.replaces} is not in the session's active chain")

    def compact_summaries(self, session: str, c: Any) -> wc.Record:
        active = self.active(session)
        folded = active[: len(c.rows)]
        if len(c.rows) < 2 or [r.id for r in folded] != list(c.rows):
            raise StoreError("conflict", "a compaction folds the oldest two or more active rows")
        row = rec(id=self.next_row, first_episode=get(folded[0], "first_episode"),
                  last_episode=get(folded[-1], "last_episode"), content=c.content, tokens=c.tokens,
                  prompt_tokens=get(c, "prompt_tokens"), output_tokens=get(c, "output_tokens"),
                  model=c.model, created_ms=get(c, "now_ms"), updated_ms=get(c, "now_ms"),
                  skipped=c.skipped, level=max(r.level for r in folded) + 1, compacted_into=None,
                  ledger=c.ledger, ledger_dropped=get(c, "ledger_dropped"))
        self.next_row += 1
        for r in folded:
            setattr(r, "compacted-into", row.id)
        self.rows.setdefault(session, []).append(row)
        return row

    def reset_session(self, session: str) -> None:
        for table in (self.episodes, self.keys, self.rows, self.failures):
            table.pop(session, None)
        self.items = {k: v for k, v in self.items.items() if k[0] != session}

    def search_episodes(self, session: Any, terms: list[str], limit: int) -> wc.Record:
        # This host keeps no full-text index: nothing matches (the context then has no found
        # turns, as for a store without one).
        return rec(docs=0, length=0, df=[0 for _ in terms], matches=[])


def store_functions(s: MemoryStore) -> dict[str, Callable[..., Any]]:
    return {
        "calibration": lambda m: (rec(estimated=s.calibrations[m][0], reported=s.calibrations[m][1])
                                  if m in s.calibrations else None),
        "record-calibration": lambda m, e, r: s.calibrations.__setitem__(
            m, (s.calibrations.get(m, (0, 0))[0] + e, s.calibrations.get(m, (0, 0))[1] + r)),
        "failure": lambda sess: s.failures.get(sess),
        "set-failure": lambda sess, marker: (s.failures.__setitem__(sess, marker) if marker
                                             else s.failures.pop(sess, None)) and None,
        "reset-session": s.reset_session,
        "partial": lambda key: None,
        "append-episodes": s.append_episodes,
        "stats": s.stats,
        "episodes-after": s.episodes_after,
        "episodes": s.episodes_by_id,
        "latest-summary": s.latest_summary,
        "summaries": s.active,
        "summary-history": s.summary_history,
        "write-summary": s.write_summary,
        "compact-summaries": s.compact_summaries,
        "search-episodes": s.search_episodes,
    }


# --- llm: an Ollama-compatible server over HTTP ---

def generate(url: str, req: Any) -> wc.Record:
    options = {"temperature": req.temperature, "num_predict": get(req, "max_output_tokens"),
               "num_ctx": get(req, "context_length"), "stop": list(req.stop)}
    if req.seed is not None:
        options["seed"] = req.seed
    # The `prompt` variant: wasmtime gives its payload bare (a list is `chat`, a string `raw`).
    prompt = req.prompt
    prompt = prompt.payload if isinstance(prompt, wc.Variant) else prompt
    chat = isinstance(prompt, list)
    if chat:
        path = "/api/chat"
        body = {"model": req.model, "stream": False, "options": options,
                "messages": [{"role": m.role, "content": m.content} for m in prompt]}
    else:
        path = "/api/generate"
        body = {"model": req.model, "stream": False, "raw": True, "options": options,
                "prompt": prompt}
    r = urllib.request.Request(url.rstrip("/") + path, data=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(r, timeout=120) as resp:
            out = json.load(resp)
    except OSError as e:
        raise StoreError("unreachable", f"{url}: {e}") from e
    text = out["message"]["content"] if chat else out["response"]
    reason = {"stop": "stop", "length": "length"}.get(out.get("done_reason", "stop"), "other")
    return rec(text=text, finish_reason=reason, prompt_tokens=out.get("prompt_eval_count"),
               output_tokens=out.get("eval_count"),
               server_ms=int((time.monotonic() - started) * 1000))


# --- wiring the functions to the component's imports ---

def results_as_the_wit_says(fn: Callable[..., Any], result_ty: Any) -> Callable[..., Any]:
    """A function whose WIT result is ``result<T, error>`` returns ``T`` or raises
    StoreError; wasmtime's value for a result is the bare value when the two sides cannot be
    confused, else a ``Variant('ok'|'err', …)``."""
    is_result = isinstance(result_ty, wc.ResultType)

    def wrap(value: Any, ok: bool) -> Any:
        if not is_result:
            return value
        if result_ty._tagged():
            return wc.Variant("ok" if ok else "err", value)
        return value

    def call(_store: Any, *args: Any) -> Any:
        try:
            return wrap(fn(*args), True)
        except StoreError as e:
            if not is_result:
                raise
            return wrap(wc.Variant(e.tag, str(e)), False)

    return call


def link(engine: wasmtime.Engine, component: wc.Component, model_url: str,
         store: MemoryStore, logs: list[str]) -> wc.Linker:
    implemented: dict[str, dict[str, Callable[..., Any]]] = {
        iface("llm"): {
            "generate": lambda req: generate(model_url, req),
            "generate-batch": lambda reqs: [batch_one(model_url, r) for r in reqs],
        },
        iface("store"): store_functions(store),
        iface("clock"): {"now-ms": lambda: int(time.time() * 1000)},
        iface("log"): {
            "write": lambda level, message: logs.append(f"{level}: {message}"),
            "progress": lambda level, done, total: None,
            "planned": lambda report: None,
        },
    }
    linker = wc.Linker(engine)
    linker.add_wasip2()
    imports = dict(component.type.imports(engine))
    with linker.root() as root:
        for name, funcs in implemented.items():
            exports = {k: v.ty for k, v in dict(imports[name].ty.exports(engine)).items()}
            with root.add_instance(name) as inst:
                for fname, fn in funcs.items():
                    inst.add_func(fname, results_as_the_wit_says(fn, exports[fname].result))
    # memory-store (and `types`, which has no functions) are not used by a conversation.
    linker.define_unknown_imports_as_traps(component)
    return linker


def batch_one(url: str, req: Any) -> Any:
    try:
        return wc.Variant("ok", generate(url, req))
    except StoreError as e:
        return wc.Variant("err", wc.Variant(e.tag, str(e)))


class Engine:
    """The component's exports, called as plain Python functions."""

    def __init__(self, wasm: str, model_url: str) -> None:
        self.engine = wasmtime.Engine()
        self.component = wc.Component.from_file(self.engine, wasm)
        self.store = wasmtime.Store(self.engine)
        self.store.set_wasi(wasmtime.WasiConfig())
        self.data = MemoryStore()
        self.logs: list[str] = []
        linker = link(self.engine, self.component, model_url, self.data, self.logs)
        self.instance = linker.instantiate(self.store, self.component)

    def call(self, interface: str, name: str, *args: Any) -> Any:
        i = self.instance.get_export_index(self.store, iface(interface))
        f = self.instance.get_func(self.store, self.instance.get_export_index(self.store, name, i))
        out = f(self.store, *args)
        f.post_return(self.store)
        return out


def unwrap(v: Any, what: str) -> Any:
    if isinstance(v, wc.Variant) and v.tag in ("ok", "err"):
        if v.tag == "err":
            raise SystemExit(f"{what} failed: {v.payload}")
        return v.payload
    return v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--component", required=True, help="abridge_guest.wasm (abridge component --out DIR)")
    ap.add_argument("--model-url", required=True, help="an Ollama-compatible server")
    a = ap.parse_args()
    e = Engine(a.component, a.model_url)
    cfg, request = e.call("summarizer", "default-config")
    session = "python-host"
    turns = [
        ("user", "Our deploy of the billing service to eu-west-1 failed with error E4012."),
        ("assistant", "E4012 means the migration lock is held; run `billing migrate --unlock`."),
        ("user", "Unlocked it. Now the health check at /healthz times out after 30 seconds."),
        ("assistant", "Raise the timeout in deploy/billing.yaml to 90 seconds and redeploy."),
        ("user", "That worked. Next week we move the ledger database to Postgres 16."),
        ("assistant", "Noted: ledger to Postgres 16 next week; keep the E4012 runbook at hand."),
    ]
    episodes = [rec(role=role, content=text, timestamp_ms=None, source_key=f"turn-{i}",
                    tokens=0, speaker=None, terms="", item=None)
                for i, (role, text) in enumerate(turns)]
    appended = unwrap(e.call("summarizer", "append", session, episodes), "append")
    outcome = unwrap(e.call("summarizer", "summarize-now", session, cfg), "summarize-now")
    written = list(outcome.written)
    request.budget = 120
    request.pairs = 1
    window = unwrap(e.call("summarizer", "context", session, request, cfg), "context")
    row = written[0].id if written else 0
    expansion = unwrap(e.call("summarizer", "expand", session, row, None, 0, 50), "expand")
    report = {
        "appended": appended,
        "summaries_written": len(written),
        "summary": written[0].content if written else None,
        "covered": [get(written[0], "first_episode"), get(written[0], "last_episode")] if written else None,
        "context_messages": [(m.role, m.content) for m in window.messages],
        "context_tokens": window.tokens,
        "context_covered": window.covered,
        "expanded_episodes": [ep.id for ep in expansion.episodes],
        "expanded_row": expansion.row.id,
    }
    print(json.dumps(report, indent=2))
    ok = (appended == len(turns) and written and window.covered >= 1
          and window.tokens <= request.budget
          and report["expanded_episodes"] == list(range(get(written[0], "first_episode"),
                                                        get(written[0], "last_episode") + 1)))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
