//! The README's code blocks hold: every block marked `sh` (in the README and in the docs that
//! mark theirs) runs with the real binary as `abridge`, from the repository root, in an
//! isolated HOME and database; the Rust block is the compiled example `host/examples/readme.rs`
//! word for word; and the README keeps its first screen short.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::{Env, cache_dir};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ sits in the repository root")
        .to_path_buf()
}

/// The fenced blocks of a Markdown text whose info string is `lang`, in order.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match (&mut current, line.trim_end()) {
            (None, l) if l.strip_prefix("```") == Some(lang) => current = Some(String::new()),
            (Some(_), "```") => out.push(current.take().expect("inside a block")),
            (Some(b), l) => {
                b.push_str(l);
                b.push('\n');
            }
            (None, _) => {}
        }
    }
    assert!(current.is_none(), "a ```{lang} block is not closed");
    out
}

#[test]
fn every_sh_block_in_the_readme_and_docs_runs() {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_abridge"))
        .parent()
        .expect("the binary has a folder")
        .to_path_buf();
    let mut ran = 0;
    for doc in ["README.md", "docs/component.md"] {
        let text = std::fs::read_to_string(root().join(doc)).expect("read the doc");
        for (i, block) in blocks(&text, "sh").iter().enumerate() {
            // The README's two commands build and test the whole project: they are what CI
            // itself runs (.ci/run), so they are not run again here.
            if block.contains("cargo run --release") || block.contains("bash .ci/run") {
                continue;
            }
            let env = Env::new();
            let out = Command::new("bash")
                .args(["-euo", "pipefail", "-c", block])
                .env_clear()
                .env("PATH", format!("{}:/usr/bin:/bin", bin_dir.display()))
                .env("HOME", env.dir.path())
                .env("ABRIDGE_CACHE_DIR", cache_dir())
                .env("ABRIDGE_DB", env.db())
                .env("ABRIDGE_BACKEND", "extractive")
                .current_dir(root())
                .output()
                .expect("running bash");
            assert!(
                out.status.success(),
                "{doc}, sh block {}:\n{block}\nexit {:?}\nstdout:\n{}\nstderr:\n{}",
                i + 1,
                out.status.code(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                !out.stdout.is_empty(),
                "{doc}, sh block {} printed nothing",
                i + 1
            );
            ran += 1;
        }
    }
    assert!(ran >= 2, "only {ran} sh blocks ran");
}

#[test]
fn the_readme_rust_block_is_the_compiled_example() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let rust = blocks(&readme, "rust");
    assert_eq!(rust.len(), 1, "the README has one Rust block");
    let example = std::fs::read_to_string(root().join("host/examples/readme.rs")).unwrap();
    assert_eq!(
        rust[0], example,
        "the README's Rust block must be host/examples/readme.rs word for word"
    );
}

#[test]
fn the_readme_starts_with_the_user_and_stays_short() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines < 300,
        "README.md has {lines} lines; reference belongs in docs/"
    );
    let first_screen: String = readme.lines().take(15).collect::<Vec<_>>().join("\n");
    assert!(first_screen.contains("**For**") && first_screen.contains("**It saves**"));
    assert_eq!(
        blocks(&readme, "sh")[0].lines().count(),
        2,
        "the first block is the two commands"
    );
    // Every relative link points at a file that exists.
    for doc in std::iter::once(PathBuf::from("README.md")).chain(
        std::fs::read_dir(root().join("docs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "md"))
            .map(|p| p.strip_prefix(root()).unwrap().to_path_buf()),
    ) {
        let text = std::fs::read_to_string(root().join(&doc)).unwrap();
        let base = root().join(&doc).parent().unwrap().to_path_buf();
        for link in text.split("](").skip(1) {
            let target = link.split(')').next().unwrap_or("");
            if target.starts_with("http") || target.starts_with('#') || target.is_empty() {
                continue;
            }
            let path = target.split('#').next().unwrap();
            assert!(
                base.join(path).exists(),
                "{}: the link {target} points nowhere",
                doc.display()
            );
        }
    }
}

/// One default address: the Python client's default URL is where `abridge serve` listens
/// when no `--listen` is given.
#[test]
fn the_python_client_defaults_to_where_serve_listens() {
    let core = std::fs::read_to_string(root().join("python/src/abridge_memory/_core.py"))
        .expect("read the Python client");
    let url = core
        .lines()
        .find_map(|l| l.strip_prefix("DEFAULT_URL = \""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("the Python client has a DEFAULT_URL");
    let listen = abridge_server::ServeOptions::default().listen;
    assert_eq!(url, format!("http://{listen}"));
}

/// `abridge --version` names the component the binary embeds, as `abridge component` writes
/// it.
#[test]
fn the_version_names_the_embedded_component() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_abridge"))
            .args(args)
            .output()
            .expect("run abridge");
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let dir = tempfile::tempdir().expect("a temporary folder");
    let out = dir.path().join("c");
    let written: serde_json::Value = serde_json::from_str(&run(&[
        "component",
        "--out",
        out.to_str().expect("utf-8 path"),
        "--json",
    ]))
    .expect("JSON");
    let sha = written["sha256"].as_str().expect("a sha256");
    let version = run(&["--version"]);
    assert_eq!(
        version.trim(),
        format!(
            "abridge {} (component sha256 {sha})",
            env!("CARGO_PKG_VERSION")
        )
    );
}
