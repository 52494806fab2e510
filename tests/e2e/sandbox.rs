//! The sandbox, with tests that fail if it leaks: imports, the granted WASI context, the CPU
//! bound, the memory cap, and isolation between calls.

use std::sync::Arc;

use abridge_engine::sandbox::{ALLOWED_IMPORTS, empty_ctx};
use abridge_engine::types::{Config, Engine, NewEpisode, Role};
use abridge_engine::{Abridge, CallError, ComponentSource, Runtime, Store};
use abridge_store::SqliteStore;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::WasiCliCtxView;
use wasmtime_wasi::p2::bindings::cli::environment::Host as _;

fn runtime() -> Arc<Runtime> {
    Arc::new(Runtime::load(&ComponentSource::Embedded, None).unwrap())
}

fn episodes(n: usize) -> Vec<NewEpisode> {
    (0..n)
        .map(|i| NewEpisode {
            role: if i % 2 == 0 {
                Role::User
            } else {
                Role::Assistant
            },
            content: format!("Message {i} about the quarterly budget review and the hiring plan."),
            source_key: i.to_string(),
            tokens: 0,
            ..Default::default()
        })
        .collect()
}

#[test]
fn the_guest_imports_nothing_but_its_contract_and_std_wasi_plumbing() {
    let names = runtime().import_names();
    assert!(
        names.iter().any(|n| n.starts_with("abridge:engine/llm@")),
        "{names:?}"
    );
    for n in &names {
        assert!(
            ALLOWED_IMPORTS.iter().any(|p| n.starts_with(p)),
            "forbidden import {n} (all: {names:?})"
        );
    }
    for forbidden in [
        "wasi:clocks",
        "wasi:random",
        "wasi:filesystem",
        "wasi:sockets",
        "wasi:http",
    ] {
        assert!(
            !names.iter().any(|n| n.starts_with(forbidden)),
            "{forbidden} imported"
        );
    }
}

#[test]
fn the_granted_context_holds_no_environment_arguments_or_directory() {
    // SAFETY-free check of what the guest would see through wasi:cli/environment.
    unsafe { std::env::set_var("ABRIDGE_SANDBOX_CANARY", "leaked") };
    let mut ctx = empty_ctx();
    let mut table = ResourceTable::new();
    let mut view = WasiCliCtxView {
        ctx: ctx.cli(),
        table: &mut table,
    };
    assert_eq!(
        view.get_environment().unwrap(),
        Vec::<(String, String)>::new()
    );
    assert_eq!(view.get_arguments().unwrap(), Vec::<String>::new());
    assert_eq!(view.initial_cwd().unwrap(), None);
}

#[tokio::test]
async fn a_runaway_call_ends_with_a_clear_error_and_the_engine_keeps_working() {
    let rt = runtime();
    let store = Arc::new(SqliteStore::in_memory().unwrap());
    let cfg = Config {
        engine: Engine::Extractive,
        ..Config::default()
    };
    let tight = Abridge::builder()
        .runtime(rt.clone())
        .store(store.clone())
        .fuel(50_000)
        .build()
        .unwrap();
    let normal = Abridge::builder()
        .runtime(rt)
        .store(store.clone())
        .build()
        .unwrap();
    normal.append("s", &episodes(40)).await.unwrap();
    let err = tight.summarize_now("s", &cfg).await.unwrap_err();
    assert!(matches!(err, CallError::Host(_)), "{err}");
    // The budget named is the call's: 50,000, and a little more for the session's tokens.
    let said = err.to_string();
    assert!(
        said.contains("CPU budget of 500") && said.contains("raise it with AbridgeBuilder::fuel"),
        "{err}"
    );
    assert!(
        store.summaries("s").await.unwrap().is_empty(),
        "nothing written by the stopped call"
    );
    let out = normal.summarize_now("s", &cfg).await.unwrap();
    assert_eq!(out.written.last().unwrap().last_episode, 40);
}

#[tokio::test]
async fn the_memory_cap_is_an_error_not_an_abort() {
    let store = Arc::new(SqliteStore::in_memory().unwrap());
    let engine = Abridge::builder()
        .runtime(runtime())
        .store(store.clone())
        .memory_limit(4 << 20)
        .build()
        .unwrap();
    let big = "word ".repeat(2 << 20); // 10 MiB into a 4 MiB guest
    let err = engine.estimate_tokens(&big).await.unwrap_err();
    assert!(err.to_string().contains("4 MiB memory limit"), "{err}");
    // The next call gets a fresh instance and works; other sessions are untouched.
    assert_eq!(engine.estimate_tokens("still fine").await.unwrap(), 3);
    engine.append("other", &episodes(6)).await.unwrap();
    let cfg = Config {
        engine: Engine::Extractive,
        ..Config::default()
    };
    assert_eq!(engine.summarize_now("other", &cfg).await.unwrap().passes, 1);
}
