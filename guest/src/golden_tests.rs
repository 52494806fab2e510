//! Golden files in `tests/golden/`: prompts in both renderings and stripping cases. Set
//! `ABRIDGE_BLESS=1` to rewrite the expected files instead of comparing.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::types::{Message, Role};
use crate::{prompt, strip};

fn golden_dir(kind: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/golden")
        .join(kind)
}

fn cases(kind: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(golden_dir(kind))
        .expect("tests/golden exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no golden cases in {kind}");
    v
}

/// Compare `got` with the file, or write it when blessing. Returns a failure description.
fn check(path: &Path, got: &str) -> Option<String> {
    if std::env::var_os("ABRIDGE_BLESS").is_some() {
        std::fs::write(path, got).unwrap();
        return None;
    }
    let want = std::fs::read_to_string(path).unwrap_or_else(|_| {
        panic!(
            "{} is missing; run ABRIDGE_BLESS=1 cargo test -p abridge-guest golden",
            path.display()
        )
    });
    (want != got).then(|| format!("{}\n--- expected\n{want}\n--- got\n{got}", path.display()))
}

fn role(s: &str) -> Role {
    match s {
        "system" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn golden_prompts() {
    let mut failures = Vec::new();
    for dir in cases("prompts") {
        let input: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("input.json")).unwrap())
                .unwrap();
        if let Some(parts) = input["partials"].as_array() {
            let partials: Vec<prompt::Partial> = parts
                .iter()
                .map(|p| prompt::Partial {
                    first: p["first"].as_u64().unwrap(),
                    last: p["last"].as_u64().unwrap(),
                    text: p["text"].as_str().unwrap().to_string(),
                })
                .collect();
            let built = prompt::build_reduce(&partials);
            let messages: Vec<Value> = built
                .messages
                .iter()
                .map(|m| json!({"role": m.role.wire(), "content": m.content}))
                .collect();
            failures.extend(check(
                &dir.join("messages.json"),
                &(serde_json::to_string_pretty(&messages).unwrap() + "\n"),
            ));
            failures.extend(check(&dir.join("chatml.txt"), &built.chatml));
            continue;
        }
        let conv: Vec<Message> = input["conversation"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                Message::new(
                    role(m["role"].as_str().unwrap()),
                    m["content"].as_str().unwrap(),
                )
            })
            .collect();
        let built = prompt::build(&conv, input["previous_summary"].as_str());
        let messages: Vec<Value> = built
            .messages
            .iter()
            .map(|m| json!({"role": m.role.wire(), "content": m.content}))
            .collect();
        let messages = serde_json::to_string_pretty(&messages).unwrap() + "\n";
        failures.extend(check(&dir.join("messages.json"), &messages));
        failures.extend(check(&dir.join("chatml.txt"), &built.chatml));
    }
    assert!(
        failures.is_empty(),
        "golden prompt mismatches:\n{}",
        failures.join("\n\n")
    );
}

#[test]
fn golden_strip() {
    let mut failures = Vec::new();
    for dir in cases("strip") {
        let input = std::fs::read_to_string(dir.join("input.txt")).unwrap();
        failures.extend(check(
            &dir.join("expected.txt"),
            &strip::strip_template_tokens(&input),
        ));
    }
    assert!(
        failures.is_empty(),
        "golden strip mismatches:\n{}",
        failures.join("\n\n")
    );
}

#[test]
fn golden_plans() {
    let mut failures = Vec::new();
    for dir in cases("plans") {
        let input: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("input.json")).unwrap())
                .unwrap();
        let u = |k: &str| input[k].as_u64().unwrap() as u32;
        let contents = input["contents"].as_object().unwrap();
        // An episode given as text takes its tokens from the estimator, as stored ones do.
        let episodes: Vec<(u64, u32)> = input["episodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let id = e[0].as_u64().unwrap();
                let tokens = contents
                    .get(&id.to_string())
                    .and_then(Value::as_str)
                    .map_or(
                        e[1].as_u64().unwrap() as u32,
                        crate::tokens::estimate_tokens,
                    );
                (id, tokens)
            })
            .collect();
        let chunks = crate::plan::plan_chunks(episodes, u("budget"), |id| {
            contents[&id.to_string()].as_str().unwrap().to_string()
        });
        let levels =
            crate::plan::plan_levels(chunks.len(), u("partial_tokens"), u("reduce_budget"))
                .unwrap();
        let got = json!({
            "chunks": chunks.iter().map(|c| json!({"first": c.first, "last": c.last, "part": c.part.map(|(i, n)| [i, n]), "tokens": c.tokens})).collect::<Vec<_>>(),
            "levels": levels.iter().map(|l| l.iter().map(|g| [g.start, g.end]).collect::<Vec<_>>()).collect::<Vec<_>>(),
        });
        failures.extend(check(
            &dir.join("expected.json"),
            &(serde_json::to_string_pretty(&got).unwrap() + "\n"),
        ));
    }
    assert!(
        failures.is_empty(),
        "golden plan mismatches:\n{}",
        failures.join("\n\n")
    );
}

/// The facts ledger's extraction rules on fixed texts; the JS host checks the same file
/// through the component (`js/test/golden.test.js`).
#[test]
fn golden_ledger() {
    let dir = golden_dir("ledger");
    let input: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("input.json")).unwrap()).unwrap();
    let got: Vec<Value> = input
        .iter()
        .map(|t| {
            let ids: Vec<Value> = crate::ledger::extract(t)
                .into_iter()
                .map(|(k, x)| json!({"text": x, "kind": k.as_str()}))
                .collect();
            json!({"text": t, "identifiers": ids})
        })
        .collect();
    let text = serde_json::to_string_pretty(&got).unwrap() + "\n";
    if let Some(f) = check(&dir.join("expected.json"), &text) {
        panic!("golden ledger mismatch:\n{f}");
    }
}
