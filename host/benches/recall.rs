//! `cargo bench --bench recall [-- --ollama URL --model NAME]`: the retrieval quality of the
//! embedders on the labelled set in tests/fixtures/recall: every memory ranked by cosine
//! similarity to each question; recall@5 (an answer among the five best) and MRR, for all
//! questions, those sharing words with their answer, and the paraphrases.
//!
//! The offline lexical embedder always runs (the guest's code, natively: it uses only exactly
//! rounded arithmetic, so the vectors are the component's). With `--ollama` an Ollama
//! embedding model is measured in the same run, next to it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use abridge_backend::embedding::{EmbedApi, Embedder, ServerEmbedder};
use abridge_guest::embed::{LEXICAL_DIM, LEXICAL_MODEL, cosine, lexical};
use serde_json::Value;

struct Query {
    text: String,
    relevant: Vec<String>,
    paraphrase: bool,
}

fn from_root(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the package lives in the repository")
        .join(p)
}

fn jsonl(name: &str) -> Vec<Value> {
    let path = from_root(&format!("tests/fixtures/recall/{name}"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect()
}

/// (recall@5, MRR) of `queries` against memories, given their vectors.
fn score(ids: &[String], mem: &[Vec<f32>], queries: &[(&Query, Vec<f32>)]) -> (f64, f64) {
    let (mut hits, mut rr) = (0usize, 0f64);
    for (q, qv) in queries {
        let mut ranked: Vec<(f32, &String)> = mem
            .iter()
            .zip(ids)
            .map(|(v, id)| (cosine(qv, v), id))
            .collect();
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
        let first = ranked.iter().position(|(_, id)| q.relevant.contains(id));
        if first.is_some_and(|r| r < 5) {
            hits += 1;
        }
        rr += first.map_or(0.0, |r| 1.0 / (r as f64 + 1.0));
    }
    let n = queries.len().max(1) as f64;
    (hits as f64 / n, rr / n)
}

fn report(name: &str, ids: &[String], mem: &[Vec<f32>], queries: &[(&Query, Vec<f32>)]) {
    let part = |p: Option<bool>| -> Vec<(&Query, Vec<f32>)> {
        queries
            .iter()
            .filter(|(q, _)| p.is_none_or(|p| q.paraphrase == p))
            .map(|(q, v)| (*q, v.clone()))
            .collect()
    };
    let (all, words, para) = (part(None), part(Some(false)), part(Some(true)));
    let (r, m) = score(ids, mem, &all);
    let (rw, mw) = score(ids, mem, &words);
    let (rp, mp) = score(ids, mem, &para);
    println!(
        "{name:<34} recall@5 {r:.3} MRR {m:.3} | shared words ({}) {rw:.3} / {mw:.3} | paraphrases ({}) {rp:.3} / {mp:.3}",
        words.len(),
        para.len()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let memories = jsonl("memories.jsonl");
    let ids: Vec<String> = memories
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    let texts: Vec<String> = memories
        .iter()
        .map(|m| m["text"].as_str().unwrap().to_string())
        .collect();
    let queries: Vec<Query> = jsonl("queries.jsonl")
        .iter()
        .map(|q| Query {
            text: q["query"].as_str().unwrap().to_string(),
            relevant: q["relevant"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_str().unwrap().to_string())
                .collect(),
            paraphrase: q["paraphrase"].as_bool().unwrap_or(false),
        })
        .collect();
    println!(
        "recall on tests/fixtures/recall: {} memories, {} questions (cosine ranking of all memories)",
        texts.len(),
        queries.len()
    );

    let mem: Vec<Vec<f32>> = texts.iter().map(|t| lexical(t, LEXICAL_DIM)).collect();
    let qs: Vec<(&Query, Vec<f32>)> = queries
        .iter()
        .map(|q| (q, lexical(&q.text, LEXICAL_DIM)))
        .collect();
    report(
        &format!("{LEXICAL_MODEL} ({LEXICAL_DIM} d, offline)"),
        &ids,
        &mem,
        &qs,
    );

    if let Some(url) = opt("--ollama") {
        let model = opt("--model").unwrap_or_else(|| "nomic-embed-text".into());
        let rt = tokio::runtime::Runtime::new().expect("a runtime");
        let e = ServerEmbedder::new(
            EmbedApi::Ollama,
            &url,
            None,
            &model,
            Duration::from_secs(120),
        )
        .expect("a valid URL");
        let q_texts: Vec<String> = queries.iter().map(|q| q.text.clone()).collect();
        match rt.block_on(async {
            Ok::<_, abridge_engine::types::Error>((
                e.embed(&texts).await?,
                e.embed(&q_texts).await?,
            ))
        }) {
            Ok((m, q)) => {
                let qs: Vec<(&Query, Vec<f32>)> = queries.iter().zip(q.vectors).collect();
                report(
                    &format!("{} ({} d)", e.model(), m.dim),
                    &ids,
                    &m.vectors,
                    &qs,
                );
            }
            Err(e) => println!("ollama:{model}: {}", abridge_engine::types::describe(&e)),
        }
    } else {
        println!(
            "(no Ollama model measured: pass -- --ollama http://localhost:11434 --model nomic-embed-text)"
        );
    }
}
