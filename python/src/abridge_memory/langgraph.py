"""LangGraph adapters (``pip install 'abridge-memory[langgraph]'``).

- :class:`AbridgeStore`: a LangGraph ``BaseStore`` kept as abridge memories. A namespace
  ``(a, b, …)`` is the memory scope user ``a``, project ``b/…``; ``search(query=…)`` is recall;
  ``put``/``get``/``delete``/``list_namespaces`` work on the items. TTL is refused clearly
  (``supports_ttl`` is false), as LangGraph does for any store without it.
- :class:`ContextHook`: a pre-model hook that sends the model abridge's compact context of a
  thread (summary with its ledger, recent turns) within a token budget, with the current turn
  (the last user message and any tool calls after it) verbatim.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import threading
import weakref
from datetime import datetime, timezone
from typing import Any, Iterable, Iterator, Optional

try:
    from langchain_core.messages import BaseMessage, HumanMessage
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        Item,
        ListNamespacesOp,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
    )
    try:
        from langgraph.store.base import validate_op_namespace as _validate_op_namespace
    except ImportError:  # pragma: no cover - LangGraph releases before it checked ops
        _validate_op_namespace = None
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the LangGraph adapters need langgraph: pip install 'abridge-memory[langgraph]'"
    ) from e

from ._client import Client
from ._errors import NotFound
from .langchain import context_to_langchain, message_text, role_of

TYPE = "langgraph"
TYPE_UNINDEXED = "langgraph-unindexed"
PAGE = 1000


def item_id(namespace: tuple[str, ...], key: str) -> str:
    """The memory id of an item: the same for the same namespace and key, so a put replaces."""
    h = hashlib.sha256(json.dumps([list(namespace), key]).encode()).hexdigest()[:32]
    return f"lg-{h}"


def _label(s: str) -> str:
    """A namespace label or key as abridge's scope fields keep it: control characters (which
    the server refuses in a user, project or key) and `%` percent-encoded, so any label
    LangGraph accepts is stored; the item keeps its namespace and key as given."""
    return "".join(
        f"%{ord(c):02X}" if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or c == "%" else c for c in s
    )


def _scope(namespace: tuple[str, ...]) -> tuple[str, str]:
    if not namespace or not namespace[0]:
        raise ValueError("a namespace needs at least one non-empty label, e.g. ('memories', user_id)")
    return _label(namespace[0]), "/".join(_label(x) for x in namespace[1:])


def _time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def item_of(text: str) -> Optional[dict[str, Any]]:
    """The item a memory's text holds: the JSON envelope (``{"namespace", "key", "value"}``)
    the store writes and reads back exactly, or None for any other memory. (Recall shows it
    as its fields, ``key (namespace): field: value``, as the engine renders it for every
    client.)"""
    if not text.startswith("{"):
        return None
    try:
        e = json.loads(text)
    except ValueError:
        return None
    ok = isinstance(e, dict) and isinstance(e.get("namespace"), list) and "key" in e and "value" in e
    return e if ok else None


def _matches(ns: tuple[str, ...], cond: Any) -> bool:
    path = tuple(cond.path)
    seg = ns[: len(path)] if cond.match_type == "prefix" else ns[-len(path):] if path else ()
    if len(ns) < len(path):
        return False
    return all(p == "*" or p == s for p, s in zip(path, seg))



_COMPARISONS = {
    "$gt": lambda a, b: a > b,
    "$gte": lambda a, b: a >= b,
    "$lt": lambda a, b: a < b,
    "$lte": lambda a, b: a <= b,
}


def filter_matches(value: Any, wanted: Any) -> bool:
    """Whether an item's ``value`` meets a search filter's ``wanted``, with the semantics of
    LangGraph's own stores: a dict of ``$eq $ne $gt $gte $lt $lte`` operators (the ordered
    ones compare as numbers), a nested dict matched key by key, a list element by element,
    anything else by equality. An unknown operator is a ``ValueError``."""
    if isinstance(wanted, dict):
        if any(k.startswith("$") for k in wanted):
            return all(_apply(value, op, operand) for op, operand in wanted.items())
        return isinstance(value, dict) and all(
            filter_matches(value.get(k), v) for k, v in wanted.items()
        )
    if isinstance(wanted, (list, tuple)):
        return (
            isinstance(value, (list, tuple))
            and len(value) == len(wanted)
            and all(filter_matches(a, b) for a, b in zip(value, wanted))
        )
    return value == wanted


def _apply(value: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return value == operand
    if op == "$ne":
        return value != operand
    compare = _COMPARISONS.get(op)
    if compare is None:
        raise ValueError(f"Unsupported operator: {op}")
    try:
        return bool(compare(float(value), float(operand)))
    except (TypeError, ValueError):
        return False

def _validate(op: Op) -> None:
    """An operation's namespace labels checked as LangGraph checks them before a store runs it
    (``InvalidNamespaceError``), also for operations given to ``batch`` directly."""
    if _validate_op_namespace is not None:
        _validate_op_namespace(op)


def _op_key(op: Op) -> Any:
    """What makes two operations the same: equal reads are made once, writes of one item
    (a put or a delete) collapse to the last."""
    if isinstance(op, PutOp):
        return ("put", tuple(op.namespace), op.key)
    if isinstance(op, SearchOp):
        return ("search", tuple(op.namespace_prefix), json.dumps(op.filter, sort_keys=True, default=str),
                op.limit, op.offset, op.query)
    try:
        hash(op)
        return (type(op).__name__, op)
    except TypeError:
        # An operation holding a list (a match condition's path given as a list) is not
        # hashable: its text stands for it.
        return (type(op).__name__, repr(op))


def dedupe_ops(ops: list[Op]) -> tuple[list[int], list[Op]]:
    """The distinct operations, in order of first appearance (a put in place of its item's
    first write, with its last value), and for each given operation the index of its result."""
    index: dict[Any, int] = {}
    unique: list[Op] = []
    listen: list[int] = []
    for op in ops:
        k = _op_key(op)
        i = index.get(k)
        if i is None:
            i = index[k] = len(unique)
            unique.append(op)
        elif isinstance(op, PutOp):
            unique[i] = op
        listen.append(i)
    return listen, unique


async def _run_batches(queue: "asyncio.Queue[Any]", store_ref: "weakref.ref[AbridgeStore]") -> None:
    """The loop's batcher: whatever goes wrong with a batch (its operations, merging them,
    handing out the results) reaches every call waiting on it, and the next batch runs."""
    while True:
        first = await queue.get()
        calls = [first]
        while not queue.empty():
            calls.append(queue.get_nowait())
        calls = [(f, ops) for f, ops in calls if not f.done()]
        store = store_ref()
        if store is None:
            for f, _ in calls:
                f.set_exception(RuntimeError("the store was dropped"))
            return
        try:
            await _run_batch(store, calls)
        except BaseException as e:  # noqa: BLE001 - every waiting call hears of it
            for f, _ in calls:
                if not f.done():
                    f.set_exception(e)
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            del store


async def _run_batch(store: "AbridgeStore", calls: list[Any]) -> None:
    """One batch: the calls' operations merged, run off the loop, each call answered."""
    ops = [op for _, call_ops in calls for op in call_ops]
    listen, unique = dedupe_ops(ops)
    done = await asyncio.get_running_loop().run_in_executor(None, store._run_each, unique)
    at = 0
    for f, call_ops in calls:
        mine = [done[listen[at + j]] for j in range(len(call_ops))]
        at += len(call_ops)
        if f.done():
            continue
        error = next((v for ok, v in mine if not ok), None)
        if error is not None:
            f.set_exception(error)
        else:
            f.set_result([v for _, v in mine])


class AbridgeStore(BaseStore):
    """A LangGraph store whose items are abridge memories (see the module)."""

    supports_ttl = False

    def __init__(self, client: Optional[Client] = None, *, url: Optional[str] = None,
                 token: Optional[str] = None) -> None:
        self.client = client or Client(url, token=token)
        self._batchers: "weakref.WeakKeyDictionary[Any, asyncio.Queue[Any]]" = weakref.WeakKeyDictionary()
        self._batchers_lock = threading.Lock()

    # --- operations ---
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        for op in ops:
            _validate(op)
        return [self._one(op) for op in ops]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run the operations off the event loop. The operations of calls made in the same
        tick of a loop (``asyncio.gather`` of many ``aput``/``aget``/``asearch`` calls) run as
        one batch, with repeated reads made once and repeated writes of one item collapsed
        to the last, as LangGraph's own batched stores do; each call gets its own result or
        its own error."""
        ops = list(ops)
        for op in ops:
            _validate(op)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._batcher(loop).put_nowait((fut, ops))
        return await fut

    def _batcher(self, loop: asyncio.AbstractEventLoop) -> "asyncio.Queue[Any]":
        with self._batchers_lock:
            q = self._batchers.get(loop)
            if q is None:
                q = asyncio.Queue()
                self._batchers[loop] = q
                # The task holds the store weakly: a dropped store ends its batcher.
                loop.create_task(_run_batches(q, weakref.ref(self)))
            return q

    def _run_each(self, ops: list[Op]) -> list[tuple[bool, Any]]:
        out: list[tuple[bool, Any]] = []
        for op in ops:
            try:
                out.append((True, self._one(op)))
            except Exception as e:  # noqa: BLE001 - handed to the caller that asked for it
                out.append((False, e))
        return out

    def _one(self, op: Op) -> Result:
        if isinstance(op, GetOp):
            return self._get(op.namespace, op.key)
        if isinstance(op, PutOp):
            return self._put(op)
        if isinstance(op, SearchOp):
            return self._search(op)
        if isinstance(op, ListNamespacesOp):
            return self._list_namespaces(op)
        raise ValueError(f"unknown store operation {type(op).__name__}")

    def _item(self, mem: Any, score: Optional[float] = None) -> Optional[Any]:
        e = item_of(mem.text)
        if e is None:
            return None
        ns, key = tuple(e["namespace"]), str(e["key"])
        created = _time(mem.created_ms)
        if score is None:
            return Item(value=e["value"], key=key, namespace=ns, created_at=created,
                        updated_at=created)
        return SearchItem(namespace=ns, key=key, value=e["value"], created_at=created,
                          updated_at=created, score=score)

    def _get(self, namespace: tuple[str, ...], key: str) -> Optional[Item]:
        try:
            return self._item(self.client.memory(item_id(namespace, key)))
        except NotFound:
            return None

    def _put(self, op: PutOp) -> None:
        if op.ttl is not None:
            raise NotImplementedError(
                "TTL is not supported by AbridgeStore: abridge keeps a memory until it is "
                "deleted; pass ttl=None (or delete the item yourself)"
            )
        user, project = _scope(op.namespace)
        id = item_id(op.namespace, op.key)
        # A put replaces: the old item goes first (a memory id is written once).
        try:
            self.client.forget(id)
        except NotFound:
            pass
        if op.value is None:
            return None
        text = json.dumps({"namespace": list(op.namespace), "key": op.key, "value": op.value},
                          ensure_ascii=False, sort_keys=True)
        self.client.remember(
            text, user=user, project=project, type=TYPE if op.index is not False else TYPE_UNINDEXED,
            key=_label(op.key), id=id,
        )
        return None

    def _pages(self, user: Optional[str], project: Optional[str]) -> Iterator[Any]:
        """The items' memories, a page at a time (read only as far as the caller goes)."""
        for t in (TYPE, TYPE_UNINDEXED):
            offset = 0
            while True:
                page = self.client.memories(user=user, project=project, type=t, offset=offset,
                                            limit=PAGE)
                yield from page
                if len(page) < PAGE:
                    break
                offset += PAGE

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        user = _label(prefix[0]) if prefix else None

        def wanted(item: Any) -> bool:
            if item is None or tuple(item.namespace[: len(prefix)]) != prefix:
                return False
            return all(filter_matches(item.value.get(k), v) for k, v in (op.filter or {}).items())

        if op.query:
            k = min(100, (op.offset + op.limit) * 4 + 10)
            hits = self.client.recall(op.query, user=user, type=TYPE, k=k)
            items = []
            for h in hits:
                if h.kind != "memory" or not h.id.startswith("lg-"):
                    continue
                # The hit has no time; the item's comes from the memory.
                mem = self.client.memory(h.id)
                items.append(self._item(mem, score=h.score))
            found = [i for i in items if wanted(i)]
        else:
            # Read only as far as the page asked for needs.
            found = []
            for x in self._pages(user, None):
                i = self._item(x, score=None)
                if wanted(i):
                    found.append(i)
                    if len(found) >= op.offset + op.limit:
                        break
            found = [SearchItem(namespace=i.namespace, key=i.key, value=i.value,
                                created_at=i.created_at, updated_at=i.updated_at) for i in found]
        return found[op.offset: op.offset + op.limit]

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        # The items are read a page at a time; what is kept is one entry per namespace.
        seen: set[tuple[str, ...]] = set()
        for mem in self._pages(None, None):
            e = item_of(mem.text)
            if e is None:
                continue
            ns = tuple(e["namespace"])
            if op.match_conditions and not all(_matches(ns, c) for c in op.match_conditions):
                continue
            seen.add(ns[: op.max_depth] if op.max_depth is not None else ns)
        return sorted(seen)[op.offset: op.offset + op.limit]


def _text(m: BaseMessage) -> str:
    """A message's text with its tool calls written out (a call's arguments matter later)."""
    text = message_text(m)
    for call in getattr(m, "tool_calls", None) or []:
        text += f"\n[called {call.get('name')} with {json.dumps(call.get('args'), sort_keys=True)}]"
    return text.strip() or "(empty)"


class ContextHook:
    """A LangGraph pre-model hook: ``create_react_agent(..., pre_model_hook=ContextHook(client))``
    or a node of your own graph. Each call stores the thread's finished turns in abridge
    (session = the thread id, each message under its LangChain id, so nothing is stored twice)
    and returns ``{"llm_input_messages": …}``: the compact context within ``budget`` tokens,
    then the current turn verbatim (the last user message and the tool calls after it). The
    context's query is that user message, so the earlier turns that best answer it are in the
    context too; ``query=False`` turns it off. What the query finds changes every call, so it
    rides on that user message, after the part of the context that stays the same until the
    next fold (``last_context[session].stable``); ``cache_control=True`` marks the end of that
    part with Anthropic's breakpoint."""

    def __init__(
        self, client: Client, *, budget: int = 2000, prefix: str = "", query: bool = True,
        cache_control: bool = False,
    ) -> None:
        self.client = client
        self.budget = budget
        self.prefix = prefix
        self.query = query
        self.cache_control = cache_control
        # The context read last per session (its ``stable`` prefix: what a prompt cache keeps).
        self.last_context: dict[str, Any] = {}
        self._posted: dict[str, int] = {}

    def session(self, config: Optional[dict[str, Any]]) -> str:
        thread = ((config or {}).get("configurable") or {}).get("thread_id")
        if thread is None:
            raise ValueError("the graph runs without a thread id: invoke it with "
                             "config={'configurable': {'thread_id': ...}}")
        return f"{self.prefix}{thread}"

    def __call__(self, state: dict[str, Any], config: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        msgs: list[BaseMessage] = list(state["messages"])
        session = self.session(config)
        start = max((i for i, m in enumerate(msgs) if isinstance(m, HumanMessage)), default=0)
        history, turn = msgs[:start], msgs[start:]
        posted = self._posted.get(session, 0)
        new = history[posted:] if posted <= len(history) else history
        if new:
            self.client.add_messages(session, [
                {"role": role_of(m), "content": _text(m), "id": m.id} for m in new
            ])
            self._posted[session] = len(history)
        if not history:
            return {"llm_input_messages": turn}
        turn_cost = sum(len(_text(m)) // 3 + 4 for m in turn)
        asked = _text(turn[0]) if self.query and turn and isinstance(turn[0], HumanMessage) else None
        try:
            ctx = self.client.context(
                session, budget=max(64, self.budget - turn_cost), query=asked
            )
        except NotFound:
            return {"llm_input_messages": history + turn}
        self.last_context[session] = ctx
        # The per-call note (the turns the query found) rides on the user's new turn, after
        # the stable prefix; the context's own newest message goes back to what was said.
        msgs, note = ctx.split_note()
        if note and turn and isinstance(turn[0], HumanMessage):
            ctx = dataclasses.replace(ctx, messages=msgs)
            turn = [HumanMessage(content=note + _text(turn[0]), id=turn[0].id)] + turn[1:]
        return {"llm_input_messages": context_to_langchain(ctx, self.cache_control) + turn}
