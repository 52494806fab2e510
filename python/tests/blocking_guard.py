"""The blocking-call guard shared by the package's suite (conftest.py) and the frameworks'
suites (upstream/plugin.py): a blocking call (socket, file, sleep) made inside
``abridge_memory`` on a running event loop raises ``blockbuster.BlockingError``, as
langchain-core's own suite guards itself. Only the sync entry points below may block: they
block by contract, wherever their caller runs them."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

SYNC_ENTRY_POINTS = [
    ("abridge_memory/langgraph.py", {"batch", "__call__"}),
    ("abridge_memory/langchain.py", {"messages", "add_messages", "clear", "context_messages",
                                     "_get_relevant_documents"}),
]


@contextmanager
def no_blocking_calls_on_the_loop() -> Iterator[None]:
    from blockbuster import blockbuster_ctx

    with blockbuster_ctx("abridge_memory") as bb:
        for f in bb.functions.values():
            for file, names in SYNC_ENTRY_POINTS:
                f.can_block_in(file, names)
        yield
