//! The Python package (`python/`, PyPI `abridge-memory`): its pytest suite against this build's
//! `abridge` binary and the test model server started here. `.ci/run` installs it with its
//! pinned test dependencies into a virtualenv and names its python in ABRIDGE_PYTHON. Skipped
//! with a note where no such python exists, unless ABRIDGE_REQUIRE_PYTHON is set.

use std::path::{Path, PathBuf};

use abridge_test_llm::TestServer;

/// A Python with the package and pytest, or `None` (and a note, or a failure when required).
fn python() -> Option<PathBuf> {
    let candidates: Vec<PathBuf> = std::env::var_os("ABRIDGE_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain(
            std::env::var_os("HOME")
                .map(|h| Path::new(&h).join(".cache/abridge/py-venv/bin/python")),
        )
        .collect();
    for p in candidates {
        let ok = std::process::Command::new(&p)
            .args(["-c", "import abridge_memory, pytest"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Some(p);
        }
    }
    let how = "python3 -m venv ~/.cache/abridge/py-venv && ~/.cache/abridge/py-venv/bin/pip install -e 'python[test]', or set ABRIDGE_PYTHON";
    assert!(
        std::env::var_os("ABRIDGE_REQUIRE_PYTHON").is_none(),
        "ABRIDGE_REQUIRE_PYTHON is set but no python with abridge_memory and pytest was found ({how})"
    );
    eprintln!("SKIPPED: the Python package's tests need a virtualenv with it installed ({how})");
    None
}

#[test]
fn the_python_package_passes_its_suite_against_the_real_server() {
    let Some(py) = python() else { return };
    let model = TestServer::start();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python");
    let tmp = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(&py)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp"])
        .arg(tmp.path())
        .arg(&dir)
        .current_dir(&dir)
        .env("ABRIDGE_BIN", env!("CARGO_BIN_EXE_abridge"))
        .env("ABRIDGE_TEST_MODEL_URL", model.url())
        // Inside the suite, a missing piece fails instead of skipping.
        .env("ABRIDGE_REQUIRE_PYTHON", "1")
        .output()
        .expect("running pytest");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pytest failed:\n{stdout}\n{stderr}");
    assert!(
        !stdout.contains("skipped"),
        "the Python suite skipped tests:\n{stdout}"
    );
    eprintln!("{}", stdout.lines().last().unwrap_or(""));

    // The examples, as a user runs them: each starts its own server from this build.
    for (file, args, done) in [
        (
            "examples/langgraph_agent.py",
            &["--turns", "50", "--budget", "1500"][..],
            "50 turns, every prompt within the 1500-token budget",
        ),
        (
            "examples/langchain_chat.py",
            &["--turns", "30", "--budget", "1200"][..],
            "30 turns, the largest prompt",
        ),
        (
            "examples/agents_session.py",
            &["--turns", "40", "--budget", "1200"][..],
            "40 turns, every prompt within the 1200-token budget",
        ),
    ] {
        let example = dir.join(file);
        let out = std::process::Command::new(&py)
            .arg(&example)
            .args(args)
            .args(["--model-url", &model.url()])
            .args(["--binary", env!("CARGO_BIN_EXE_abridge")])
            .output()
            .expect("running an example");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(done),
            "{}: {stdout}\n{}",
            example.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The frameworks' own published test suites (LangGraph's store tests, the Agents SDK's
/// session tests, langchain-core's chat-history tests) against the adapters, each against a
/// fresh `abridge serve` of this build (`python/upstream/`). `.ci/run` fetches their sources
/// from PyPI (`run.py --fetch`); without them this says SKIPPED, or fails when required.
#[test]
fn the_frameworks_own_suites_pass_against_the_adapters() {
    let Some(py) = python() else { return };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/upstream");
    let fetched = std::process::Command::new(&py)
        .arg(dir.join("run.py"))
        .arg("--check")
        .output()
        .expect("running run.py --check");
    if !fetched.status.success() {
        let how = "python python/upstream/run.py --fetch";
        assert!(
            std::env::var_os("ABRIDGE_REQUIRE_PYTHON").is_none(),
            "ABRIDGE_REQUIRE_PYTHON is set but the frameworks' suites are not fetched ({how}):\n{}",
            String::from_utf8_lossy(&fetched.stderr)
        );
        eprintln!("SKIPPED: the frameworks' own suites are not fetched ({how})");
        return;
    }
    let model = TestServer::start();
    let out = std::process::Command::new(&py)
        .arg(dir.join("run.py"))
        .env("ABRIDGE_BIN", env!("CARGO_BIN_EXE_abridge"))
        .env("ABRIDGE_TEST_MODEL_URL", model.url())
        .output()
        .expect("running the frameworks' suites");
    let stdout = String::from_utf8_lossy(&out.stdout);
    const MARK: &str = "The frameworks' own suites against abridge's adapters:";
    let summary = stdout.split(MARK).nth(1).unwrap_or("");
    assert!(
        out.status.success(),
        "an applicable test of a framework's own suite failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The counts and the named not-applicable lists: in the test's output, and in
    // target/upstream-suites.txt, which .ci/run prints after the tests.
    let runs = stdout.split(MARK).next().unwrap_or("");
    let report: String = runs
        .lines()
        .filter(|l| l.contains("not applicable"))
        .chain(std::iter::once(MARK))
        .chain(summary.lines())
        .map(|l| format!("{l}\n"))
        .collect();
    eprintln!("{report}");
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/upstream-suites.txt");
    std::fs::write(&out, &report).expect("write target/upstream-suites.txt");
}
