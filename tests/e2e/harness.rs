//! Running the binary in isolation: a clean environment, its own HOME and database, and the
//! compiled-component cache shared by every test of this run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub use abridge_test_llm::{Fault, TestServer};
use serde_json::Value;

/// A small model setup that makes a few dozen messages a map-reduce: a 1,024-token context,
/// 120 output tokens, two requests in flight.
pub const SMALL: &[&str] = &[
    "--context-length",
    "1024",
    "--max-output-tokens",
    "120",
    "--concurrency",
    "2",
];

/// One isolated working area.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub vars: Vec<(String, String)>,
    /// Leave `ABRIDGE_MODE` unset: the product's default mode.
    pub default_mode: bool,
}

impl Env {
    pub fn new() -> Env {
        Env {
            dir: tempfile::tempdir().expect("temp dir"),
            vars: Vec::new(),
            default_mode: false,
        }
    }

    pub fn db(&self) -> PathBuf {
        self.dir.path().join("abridge.db")
    }

    pub fn with(mut self, k: &str, v: &str) -> Env {
        self.vars.push((k.into(), v.into()));
        self
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_abridge"));
        c.env_clear()
            .env("HOME", self.dir.path())
            .env("ABRIDGE_CACHE_DIR", cache_dir())
            .env("ABRIDGE_DB", self.db())
            // Keep retry backoff short in tests; the policy itself is unit-tested.
            .env("ABRIDGE_RETRY_BASE_MS", "5")
            // Most suites are written against the eager trigger (a fold every 5 messages);
            // the default, window mode, has its own tests (`Env::with_default_mode`).
            .env("ABRIDGE_MODE", "eager")
            .current_dir(self.dir.path())
            .args(args)
            .stdin(Stdio::null());
        if self.default_mode {
            c.env_remove("ABRIDGE_MODE");
        }
        for (k, v) in &self.vars {
            c.env(k, v);
        }
        c
    }

    /// This environment with the product's default mode (no `ABRIDGE_MODE`).
    pub fn with_default_mode(mut self) -> Env {
        self.default_mode = true;
        self
    }

    pub fn run(&self, args: &[&str]) -> Run {
        Run::from(self.command(args).output().expect("running abridge"))
    }

    pub fn run_stdin(&self, args: &[&str], input: &[u8]) -> Run {
        use std::io::Write;
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        child.stdin.take().unwrap().write_all(input).unwrap();
        Run::from(child.wait_with_output().unwrap())
    }

    /// Run `args`, killing the process if it has not ended within `secs` (a hang guard for
    /// inputs that used to loop forever; the test fails then).
    #[track_caller]
    pub fn run_within(&self, secs: u64, args: &[&str]) -> Run {
        let mut child = self
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            if child.try_wait().unwrap().is_some() {
                return Run::from(child.wait_with_output().unwrap());
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                panic!(
                    "abridge {args:?} did not end within {secs} s (killed)\n--- stderr\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// The stored chain as JSON (`summaries SESSION --json`), or `None` for an unknown session.
    pub fn chain(&self, session: &str) -> Option<Value> {
        let r = self.run(&["summaries", session, "--json"]);
        r.ok().then(|| r.json())
    }

    pub fn write(&self, name: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }
}

/// The compiled component is cached once per test run, for every process.
pub fn cache_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("abridge-component-cache")
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Run {
        Run {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

/// Run `cmd` with `input` on its stdin (stdout and stderr captured).
pub fn with_stdin(mut cmd: Command, input: &[u8]) -> Run {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(input)
        .expect("write stdin");
    Run::from(child.wait_with_output().expect("wait"))
}

impl Run {
    pub fn ok(&self) -> bool {
        self.code == 0
    }

    #[track_caller]
    pub fn assert_ok(&self) -> &Run {
        assert_eq!(
            self.code, 0,
            "expected success\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout, self.stderr
        );
        self
    }

    #[track_caller]
    pub fn assert_fails(&self, code: i32, stderr_has: &[&str]) -> &Run {
        assert_eq!(
            self.code, code,
            "expected exit {code}\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout, self.stderr
        );
        for s in stderr_has {
            assert!(
                self.stderr.contains(s),
                "stderr lacks {s:?}\n--- stderr\n{}",
                self.stderr
            );
        }
        self
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }
}

/// The case folders of a golden-vector kind (`tests/golden/<kind>/*/`), sorted.
pub fn golden_cases(kind: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/golden")
        .join(kind);
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// A fixture shipped with the project.
pub fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

/// A real transcript from ../shared/data/transcripts, or `None` (and a note) when absent — a
/// failure instead when `ABRIDGE_REQUIRE_DATA` is set (CI sets it where ../shared is beside
/// the clone, so a real-data test cannot pass by skipping there).
pub fn shared(rel: &str) -> Option<String> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/data/transcripts")
        .join(rel);
    if p.exists() {
        Some(p.display().to_string())
    } else {
        assert!(
            std::env::var_os("ABRIDGE_REQUIRE_DATA").is_none(),
            "ABRIDGE_REQUIRE_DATA is set but {} is not there (put ../shared beside the clone)",
            p.display()
        );
        eprintln!(
            "SKIPPED: {} not found (real-data test; CI provides ../shared)",
            p.display()
        );
        None
    }
}

/// Each active summary row of `session`: (id, first episode, last episode, model).
pub fn row_spans(env: &Env, session: &str) -> Vec<(u64, u64, u64, String)> {
    env.chain(session).expect("a summary chain")["summaries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_u64().unwrap(),
                r["first_episode"].as_u64().unwrap(),
                r["last_episode"].as_u64().unwrap(),
                r["model"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A loopback port with nothing listening.
pub fn closed_port_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    format!("http://127.0.0.1:{port}")
}

/// Check the chain covers episodes 1..=n exactly once, in order.
#[track_caller]
pub fn assert_covers(chain: &Value, n: u64) {
    let mut next = 1;
    for r in chain["summaries"].as_array().expect("summaries array") {
        assert_eq!(r["first_episode"].as_u64(), Some(next), "chain {chain:#}");
        next = r["last_episode"].as_u64().unwrap() + 1;
        assert!(!r["content"].as_str().unwrap().is_empty());
    }
    assert_eq!(next, n + 1, "chain stops at {} of {n}: {chain:#}", next - 1);
}

/// The episode ids of an expansion (`abridge expand --json`, `GET …/expand`), in order.
pub fn expanded_ids(x: &Value) -> Vec<u64> {
    x["episodes"]
        .as_array()
        .unwrap_or_else(|| panic!("no episodes in {x}"))
        .iter()
        .map(|e| e["id"].as_u64().unwrap())
        .collect()
}

/// A tool a test needs from outside the build (a host, an SDK's Python): `$env_var`, else
/// `~/<cached>`, whichever `works`; or `None` with a SKIPPED note saying `how` to get it — a
/// failure instead when `$require_var` is set (CI sets it where the tool must be there).
pub fn locate(
    env_var: &str,
    cached: &str,
    require_var: &str,
    what: &str,
    how: &str,
    works: impl Fn(&Path) -> bool,
) -> Option<PathBuf> {
    let found = std::env::var_os(env_var)
        .map(PathBuf::from)
        .into_iter()
        .chain(std::env::var_os("HOME").map(|h| Path::new(&h).join(cached)))
        .find(|p| works(p));
    if found.is_none() {
        assert!(
            std::env::var_os(require_var).is_none(),
            "{require_var} is set but {what} was not found ({how}, or set {env_var})"
        );
        eprintln!("SKIPPED: {what} is not installed ({how}, or set {env_var})");
    }
    found
}

/// Whether `python` imports `modules` (a comma-separated list).
pub fn imports(python: &Path, modules: &str) -> bool {
    Command::new(python)
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// What a SessionStart hook hands the model: its stdout's
/// `hookSpecificOutput.additionalContext` (the hook event checked too).
pub fn start_context(r: &Run) -> String {
    let out: Value = serde_json::from_str(r.stdout.trim())
        .unwrap_or_else(|e| panic!("{e}: not the JSON a hook prints: {}", r.stdout));
    assert_eq!(
        out["hookSpecificOutput"]["hookEventName"], "SessionStart",
        "{out}"
    );
    out["hookSpecificOutput"]["additionalContext"]
        .as_str()
        .unwrap_or_else(|| panic!("no additionalContext in {out}"))
        .to_string()
}
