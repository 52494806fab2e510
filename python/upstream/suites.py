"""The frameworks' own published test suites that abridge's adapters must pass, pinned to the
releases the package supports, and the tests that cannot apply by design, each with its reason.

The test files come from the frameworks' source distributions on PyPI (downloaded by
``run.py`` at test time, never committed). Each suite runs its files unchanged; the only
difference is the line that builds the store or session, which ``plugin.py`` swaps for the
abridge adapter against a real ``abridge serve`` on loopback.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Suite:
    name: str
    # The source distribution the tests come from (``pip download --no-binary``).
    sdist: str
    # Files and folders taken from it, relative to its top folder.
    take: tuple[str, ...]
    # The test files run, relative to the suite's folder.
    run: tuple[str, ...]
    # What the adapter replaces: test file → the name in it that builds the store or session.
    swap: tuple[tuple[str, str], ...]
    # Extra packages the suite's files import (installed by run.py).
    needs: tuple[str, ...] = ()
    # A conftest of ours that replaces the suite's own (which starts a database).
    own_conftest: bool = False
    not_applicable: dict[str, str] = field(default_factory=dict)
    # Applicable tests that still fail, with what is missing: run as strict expected failures,
    # so each is reported, and one that starts to pass must leave this list.
    known_failures: dict[str, str] = field(default_factory=dict)


# What plugin.py itself needs: the blocking-call guard, and the mocker fixture the suites use.
COMMON_NEEDS = ("blockbuster==1.5.26", "pytest-mock==3.15.1")

TTL = "TTL is refused by design (AbridgeStore.supports_ttl is false: a memory lasts until deleted)"
EMBED = "builds the store with its own embedding function (index={'embed': ...}); abridge embeds with its own model"
SPY_INTERNAL = "spies on the in-memory store class's internals"
SQLITE_INTERNAL = "checks SQLiteSession's own SQLite file, connections or locks"
CORRUPT_ROWS = "writes corrupt rows straight into SQLiteSession's SQLite file"
POOL = "checks the PostgreSQL store's connection pool"
SYNC_IN_LOOP = "expects the PostgreSQL store's sync methods to refuse the event loop thread (AbridgeStore's sync methods work anywhere)"
SYNC_IN_LOOP_SQLITE = "expects the SQLite store's sync methods to refuse the event loop thread (AbridgeStore's sync methods work anywhere)"
OWN_VECTOR_STORE = "builds SQLite's own vector store with its embedding function (create_vector_store) and never uses the store under test"

SUITES = [
    Suite(
        name="langgraph-store",
        sdist="langgraph-checkpoint==4.3.2",
        take=("tests/__init__.py", "tests/embed_test_utils.py", "tests/test_store.py"),
        run=("tests/test_store.py",),
        swap=(("tests/test_store.py", "InMemoryStore"),),
        not_applicable={
            "test_vector_store_initialization": EMBED,
            "test_vector_insert_with_auto_embedding": EMBED,
            "test_async_vector_insert_with_auto_embedding": EMBED,
            "test_vector_update_with_embedding": EMBED,
            "test_async_vector_update_with_embedding": EMBED,
            "test_vector_search_with_filters": EMBED,
            "test_async_vector_search_with_filters": EMBED,
            "test_async_batched_vector_search_concurrent": EMBED,
            "test_vector_search_pagination": EMBED,
            "test_async_vector_search_pagination": EMBED,
            "test_vector_search_scores_every_item": EMBED,
            "test_embed_with_path": EMBED,
            "test_non_ascii": EMBED,
        },
    ),
    Suite(
        name="langgraph-sql-store",
        sdist="langgraph-checkpoint-postgres==3.2.0",
        take=("tests/__init__.py", "tests/embed_test_utils.py", "tests/test_async_store.py"),
        run=("tests/test_async_store.py",),
        swap=(("tests/test_async_store.py", "store"),),
        needs=("psycopg[binary]==3.2.13", "psycopg-pool==3.2.6", "langgraph-checkpoint-postgres==3.2.0"),
        own_conftest=True,
        not_applicable={
            "test_store_ttl": TTL,
            "test_omit_expired_filters_read_paths": TTL,
            "test_omit_expired_disabled_preserves_expired_rows": TTL,
            "test_omit_expired_refresh_ttl_only_refreshes_live_rows": TTL,
            "test_omit_expired_search_pagination": TTL,
            "test_abatch_uses_single_pool_checkout": POOL,
            "test_no_running_loop": SYNC_IN_LOOP,
            "test_sync_methods_reject_invalid_namespace_labels": SYNC_IN_LOOP,
            "test_vector_store_initialization": EMBED,
            "test_vector_insert_with_auto_embedding": EMBED,
            "test_vector_update_with_embedding": EMBED,
            "test_vector_search_with_filters": EMBED,
            "test_vector_search_pagination": EMBED,
            "test_vector_search_edge_cases": EMBED,
            "test_embed_with_path": EMBED,
            "test_search_sorting": EMBED,
        },
    ),
    Suite(
        name="langgraph-sqlite-store",
        sdist="langgraph-checkpoint-sqlite==3.1.2",
        take=("tests/__init__.py", "tests/test_store.py", "tests/test_async_store.py"),
        run=("tests/test_async_store.py",),
        swap=(("tests/test_async_store.py", "store"),),
        needs=("langgraph-checkpoint-sqlite==3.1.2", "aiosqlite==0.22.1"),
        not_applicable={
            "test_no_running_loop": SYNC_IN_LOOP_SQLITE,
            "test_basic_store_ops": OWN_VECTOR_STORE,
            "test_list_namespaces": OWN_VECTOR_STORE,
            "test_search_items": OWN_VECTOR_STORE,
            "test_vector_store_initialization": EMBED,
            "test_vector_insert_with_auto_embedding": EMBED,
            "test_vector_update_with_embedding": EMBED,
            "test_vector_search_with_filters": EMBED,
            "test_vector_search_pagination": EMBED,
            "test_vector_search_edge_cases": EMBED,
            "test_embed_with_path": EMBED,
        },
    ),
    Suite(
        name="agents-session",
        sdist="openai-agents==0.24.0",
        take=("tests",),
        run=("tests/memory/test_session.py", "tests/memory/test_session_limit.py"),
        swap=(("tests/memory/test_session.py", "SQLiteSession"),
              ("tests/memory/test_session_limit.py", "SQLiteSession")),
        not_applicable={
            **{t: SQLITE_INTERNAL for t in (
                "test_sqlite_session_close_closes_worker_thread_connections",
                "test_sqlite_session_reaps_connections_from_exited_worker_threads",
                "test_sqlite_session_closes_retired_connections_before_the_next_allocation",
                "test_sqlite_session_keeps_connections_of_live_worker_threads",
                "test_sqlite_session_file_lock_is_shared_across_instances",
                "test_sqlite_session_failed_add_items_releases_write_lock",
                "test_sqlite_session_failed_clear_session_rolls_back",
                "test_sqlite_session_failed_pop_item_releases_write_lock",
                "test_sqlite_session_rollback_failure_evicts_connection",
                "test_sqlite_session_close_retries_quarantined_connection",
                "test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome",
            )},
            **{t: CORRUPT_ROWS for t in (
                "test_sqlite_session_pop_item_skips_corrupt_most_recent",
                "test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows",
                "test_sqlite_session_get_items_limit_skips_corrupt_newest_rows",
                "test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows",
            )},
            "test_sqlite_session_closed_rejects_empty_add_items":
                "matches the error text 'SQLiteSession is closed' (AbridgeSession says 'AbridgeSession is closed')",
        },

    ),
    Suite(
        name="langchain-chat-history",
        sdist="langchain-core==1.8.3",
        take=("tests/__init__.py", "tests/unit_tests/__init__.py", "tests/unit_tests/conftest.py",
              "tests/unit_tests/chat_history"),
        run=("tests/unit_tests/chat_history/test_chat_history.py",),
        swap=(("tests/unit_tests/chat_history/test_chat_history.py", "InMemoryChatMessageHistory"),),
        not_applicable={},
    ),
]
