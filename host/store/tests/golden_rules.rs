//! The store rules' golden script (`tests/golden/store-rules/steps.json`): every write in it,
//! with its exact outcome, on SQLite, in memory and in a file. The JS host runs the same
//! script on its own stores (`js/test/rules.test.js`), so where the JS host still keeps a
//! rule of its own, both hosts are proven to decide alike, message for message.

use std::collections::BTreeMap;
use std::sync::Arc;

use abridge_engine::types::{Error, MemoryFilter, NewEpisode, NewMemory, Scope, SummaryWrite};
use abridge_store::{AppStore, SqliteStore};

mod common;
use serde_json::Value;

const TENANT: &str = "t";

/// `n` user messages, "message 1" to "message n", 10 tokens each.
fn messages(n: u64) -> Vec<NewEpisode> {
    (1..=n)
        .map(|i| NewEpisode {
            content: format!("message {i}"),
            source_key: format!("k{i}"),
            tokens: 10,
            ..Default::default()
        })
        .collect()
}

fn steps() -> Vec<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/golden/store-rules/steps.json"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["steps"].as_array().unwrap().clone()
}

fn scope() -> Scope {
    common::scope("k")
}

/// What the script names: the summary rows written, in order, and the memories' clusters.
#[derive(Default)]
struct Names {
    rows: Vec<u64>,
    clusters: BTreeMap<String, u64>,
}

impl Names {
    fn fill(&self, text: &str) -> String {
        let mut t = text.to_string();
        for (i, id) in self.rows.iter().enumerate() {
            t = t.replace(&format!("{{row{i}}}"), &id.to_string());
        }
        for (m, c) in &self.clusters {
            t = t.replace(&format!("{{cluster:{m}}}"), &c.to_string());
        }
        t
    }
}

/// The expected refusal of a step, as (kind, message).
fn refusal(expect: &Value, names: &Names) -> Option<(String, String)> {
    let o = expect.as_object()?;
    for kind in ["conflict", "invalid-input"] {
        if let Some(m) = o.get(kind) {
            return Some((kind.to_string(), names.fill(m.as_str().unwrap())));
        }
    }
    None
}

fn kind_of(e: &Error) -> (String, String) {
    match e {
        Error::Conflict(m) => ("conflict".into(), m.clone()),
        Error::InvalidInput(m) => ("invalid-input".into(), m.clone()),
        other => ("other".into(), format!("{other:?}")),
    }
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

async fn run(name: &str, s: Arc<dyn AppStore>) {
    let mut names = Names::default();
    for (n, step) in steps().iter().enumerate() {
        let at = format!("{name}, step {n} ({step})");
        let expect = &step["expect"];
        let session = step["session"].as_str().unwrap_or("");
        match step["op"].as_str().unwrap() {
            "append" => {
                s.append_episodes(session, messages(u(&step["episodes"])))
                    .await
                    .unwrap();
            }
            "write" => {
                let w = SummaryWrite {
                    replaces: step["replaces"].as_u64().map(|i| names.rows[i as usize]),
                    first_episode: u(&step["first"]),
                    last_episode: u(&step["last"]),
                    content: "summary".into(),
                    tokens: 5,
                    prompt_tokens: 1,
                    output_tokens: 1,
                    model: "m".into(),
                    now_ms: 1,
                    skipped: Vec::new(),
                    ledger: Vec::new(),
                    ledger_dropped: 0,
                };
                let got = s.write_summary(session, w).await;
                match refusal(expect, &names) {
                    Some(want) => assert_eq!(kind_of(&got.unwrap_err()), want, "{at}"),
                    None => {
                        let row = got.unwrap_or_else(|e| panic!("{at}: {e:?}"));
                        if step["replaces"].is_null() {
                            names.rows.push(row.id);
                        }
                    }
                }
            }
            "compact" => {
                let rows = step["rows"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| names.rows[u(i) as usize])
                    .collect();
                let c = common::compaction(rows, 2);
                let got = s.compact_summaries(session, c).await;
                match refusal(expect, &names) {
                    Some(want) => assert_eq!(kind_of(&got.unwrap_err()), want, "{at}"),
                    None => {
                        let r = got.unwrap_or_else(|e| panic!("{at}: {e:?}"));
                        let want = &expect["row"];
                        assert_eq!(
                            (r.first_episode, r.last_episode, u64::from(r.level)),
                            (u(&want["first"]), u(&want["last"]), u(&want["level"])),
                            "{at}"
                        );
                    }
                }
            }
            "items" => {
                let eps = step["items"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .enumerate()
                    .map(|(i, item)| NewEpisode {
                        content: format!("message {}", i + 1),
                        source_key: format!("k{}", i + 1),
                        tokens: 10,
                        item: item.as_str().map(str::to_string),
                        ..Default::default()
                    })
                    .collect();
                s.append_episodes(session, eps).await.unwrap();
                let ask: Vec<u64> = serde_json::from_value(step["ask"].clone()).unwrap();
                let got: BTreeMap<String, String> = s
                    .items(session, &ask)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|(id, item)| (id.to_string(), item))
                    .collect();
                let want: BTreeMap<String, String> =
                    serde_json::from_value(expect.clone()).unwrap();
                assert_eq!(got, want, "{at}");
            }
            "episodes" => {
                let n = step["count"].as_u64().unwrap();
                s.append_episodes(session, messages(n)).await.unwrap();
                let ask: Vec<u64> = serde_json::from_value(step["ask"].clone()).unwrap();
                let got: Vec<(u64, String)> = s
                    .episodes(session, &ask)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|e| (e.id, e.content))
                    .collect();
                let want: Vec<(u64, String)> = serde_json::from_value(expect.clone()).unwrap();
                assert_eq!(got, want, "{at}");
            }
            "chain" => {
                let got: Vec<[u64; 3]> = s
                    .summaries(session)
                    .await
                    .unwrap()
                    .iter()
                    .map(|r| [r.first_episode, r.last_episode, u64::from(r.level)])
                    .collect();
                let want: Vec<[u64; 3]> = serde_json::from_value(expect.clone()).unwrap();
                assert_eq!(got, want, "{at}");
            }
            "put" => {
                let id = step["id"].as_str().unwrap();
                let cluster = match (&step["cluster"], step["cluster_of"].as_str()) {
                    (Value::Number(c), _) => Some(c.as_u64().unwrap()),
                    (_, Some(of)) => Some(names.clusters[of]),
                    _ => None,
                };
                let m = NewMemory {
                    id: id.into(),
                    scope: scope(),
                    text: step["text"].as_str().unwrap().into(),
                    importance: 0.5,
                    tokens: 4,
                    created_ms: 10,
                    model: step["model"].as_str().unwrap_or("emb").into(),
                    vector: floats(&step["vector"]),
                    cluster,
                    fact_key: String::new(),
                    replaces: None,
                };
                let got = s.put_memory(TENANT, m).await;
                match refusal(expect, &names) {
                    Some(want) => assert_eq!(kind_of(&got.unwrap_err()), want, "{at}"),
                    None => {
                        let r = got.unwrap_or_else(|e| panic!("{at}: {e:?}"));
                        let want = &expect["stored"];
                        assert_eq!(
                            (r.created, u64::from(r.members)),
                            (want["created"].as_bool().unwrap(), u(&want["members"])),
                            "{at}"
                        );
                        names.clusters.insert(id.into(), r.cluster);
                    }
                }
            }
            "centroid" => {
                let cluster = names.clusters[step["of"].as_str().unwrap()];
                let c = s.centroids(TENANT, &scope()).await.unwrap();
                let got = &c
                    .iter()
                    .find(|c| c.cluster == cluster)
                    .unwrap_or_else(|| panic!("{at}: no centroid"))
                    .vector;
                let want = floats(expect);
                assert!(
                    got.len() == want.len()
                        && got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-6),
                    "{at}: {got:?}"
                );
            }
            "search" => {
                let hits = s
                    .search(
                        TENANT,
                        &floats(&step["vector"]),
                        "emb",
                        &MemoryFilter::default(),
                        u(&step["limit"]) as u32,
                    )
                    .await
                    .unwrap();
                let got: Vec<&str> = hits.iter().map(|h| h.id.as_str()).collect();
                let want: Vec<&str> = expect
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_str().unwrap())
                    .collect();
                assert_eq!(got, want, "{at}");
            }
            "delete" => {
                let got = s
                    .delete_memory(TENANT, step["id"].as_str().unwrap())
                    .await
                    .unwrap();
                assert_eq!(got.is_some(), expect == "ok", "{at}");
            }
            "reset" => s.reset_session(session).await.unwrap(),
            other => panic!("{at}: unknown op {other}"),
        }
    }
}

#[tokio::test]
async fn the_golden_store_rules_hold_on_sqlite_in_a_file_and_in_memory() {
    run(
        "sqlite in memory",
        Arc::new(SqliteStore::in_memory().unwrap()),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    run(
        "sqlite",
        Arc::new(SqliteStore::open(&dir.path().join("rules.db")).unwrap()),
    )
    .await;
}

/// The store's cosine is its own arithmetic: bit for bit the guest's on the golden cases
/// (`tests/golden/cosine/cases.json`, written by the guest's test).
#[test]
fn the_stores_cosine_equals_the_guests_on_the_golden_cases() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/golden/cosine/cases.json"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let vector = |x: &Value| -> Vec<f32> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_f64().unwrap() as f32)
            .collect()
    };
    let cases = v["cases"].as_array().unwrap();
    assert!(cases.len() >= 8);
    for c in cases {
        let got = abridge_store::rules::cosine(&vector(&c["a"]), &vector(&c["b"]));
        assert_eq!(got.to_bits() as u64, c["bits"].as_u64().unwrap(), "{c}");
    }
}
