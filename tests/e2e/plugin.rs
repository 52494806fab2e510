//! The component as a plugin any host can load: the published WIT (`wit/`, as `abridge
//! component` writes it) describes every import the component has, and a host abridge does
//! not ship — the Python `wasmtime` package, its imports written from the WIT
//! (`tests/component_host/host.py`, the example of docs/component.md) — runs append →
//! summarize → context → expand.

use std::path::Path;
use std::process::Command;

use abridge_test_llm::TestServer;

/// `abridge component --out DIR`: the component and its WIT, as a host author gets them.
fn written() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let out = Command::new(env!("CARGO_BIN_EXE_abridge"))
        .args(["component", "--out"])
        .arg(dir.path())
        .output()
        .expect("run abridge component");
    assert!(out.status.success(), "{out:?}");
    let wasm = dir.path().join("abridge_guest.wasm");
    let wit = dir.path().join("wit");
    (dir, wasm, wit)
}

#[test]
fn the_published_wit_describes_every_import_of_the_component() {
    let (_dir, wasm, wit) = written();
    let bytes = std::fs::read(&wasm).expect("the component");
    let mut resolve = wit_parser::Resolve::default();
    let (pkg, _) = resolve
        .push_dir(&wit)
        .expect("the written WIT parses, deps included");
    // `wasm-tools component targets wit --world component abridge_guest.wasm`.
    let world = resolve
        .select_world(&[pkg], Some("component"))
        .expect("a `component` world");
    wit_component::targets(&resolve, world, &bytes, false)
        .expect("the component targets the published `component` world");
    // The `engine` world alone lacks the WASI interfaces the standard library links in:
    // that is why `component` exists.
    let engine = resolve
        .select_world(&[pkg], Some("engine"))
        .expect("an `engine` world");
    let err = wit_component::targets(&resolve, engine, &bytes, false)
        .expect_err("the engine world lacks the WASI imports");
    assert!(format!("{err:#}").contains("wasi:"), "{err:#}");
}

#[test]
fn a_python_wasmtime_host_written_from_the_wit_runs_the_component() {
    let py = std::env::var_os("ABRIDGE_PYTHON")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| Path::new(&h).join(".cache/abridge/py-venv/bin/python"))
        })
        .filter(|p| {
            Command::new(p)
                .args(["-c", "import wasmtime.component"])
                .output()
                .is_ok_and(|o| o.status.success())
        });
    let Some(py) = py else {
        let how =
            "pip install 'wasmtime==50.0.1' into ~/.cache/abridge/py-venv (or ABRIDGE_PYTHON)";
        assert!(
            std::env::var_os("ABRIDGE_REQUIRE_PYTHON").is_none(),
            "ABRIDGE_REQUIRE_PYTHON is set but no python has the wasmtime package ({how})"
        );
        eprintln!("SKIPPED: the Python wasmtime host needs the wasmtime package ({how})");
        return;
    };
    let (_dir, wasm, _) = written();
    let model = TestServer::start();
    let host = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/component_host/host.py");
    let out = Command::new(&py)
        .arg(&host)
        .arg("--component")
        .arg(&wasm)
        .args(["--model-url", &model.url()])
        .output()
        .expect("run the Python host");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("the host's JSON report");
    assert_eq!(v["appended"], 6, "{v}");
    assert_eq!(v["covered"], serde_json::json!([1, 6]), "{v}");
    assert!(v["context_tokens"].as_u64().unwrap() <= 120, "{v}");
    let first = &v["context_messages"][0];
    assert_eq!(first[0], "system", "the summary leads the context: {v}");
    assert!(
        first[1]
            .as_str()
            .unwrap()
            .contains("Summary of the earlier conversation"),
        "{v}"
    );
    assert_eq!(
        v["expanded_episodes"],
        serde_json::json!([1, 2, 3, 4, 5, 6]),
        "{v}"
    );
}
