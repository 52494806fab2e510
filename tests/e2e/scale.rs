//! Scale: a 100,000-episode session summarized end to end against the test server.

use std::collections::BTreeSet;
use std::io::Write;

use crate::harness::*;

const N: usize = 100_000;

/// The episode ids named by `#<id>#` markers in a prompt.
fn markers(text: &str) -> Vec<usize> {
    text.split('#')
        .collect::<Vec<_>>()
        .windows(3)
        .filter(|w| w[0].ends_with("ep ") && w[2].starts_with(' '))
        .filter_map(|w| w[1].parse().ok())
        .collect()
}

#[test]
fn a_100k_episode_session_is_covered_exactly_once_or_listed_as_skipped() {
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    let path = env.dir.path().join("huge.jsonl");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        for i in 1..=N {
            let role = if i % 2 == 1 { "user" } else { "assistant" };
            writeln!(
                f,
                r#"{{"role":"{role}","content":"ep #{i}# we moved shard {} to the new cluster and checked replica lag"}}"#,
                i % 97
            )
            .unwrap();
        }
    }
    // The first three chunks to reach the model fail (one attempt each): they are skipped
    // and listed; everything else is summarized.
    server.push_faults((0..3).map(|_| Fault::Status {
        code: 500,
        message: "injected".into(),
    }));
    let r = env.run(&[
        "summarize",
        &path.display().to_string(),
        "--json",
        "--retries",
        "1",
        "--context-length",
        "8192",
    ]);
    r.assert_ok();
    let v = r.json();
    assert_eq!(v["episodes"], N as u64);
    assert_covers(&v, N as u64);
    let rows = v["summaries"].as_array().unwrap();
    assert_eq!(rows.len(), 1);

    // Every episode went to the model in exactly one map prompt.
    let gens = server.generations();
    let is_map = |g: &&abridge_test_llm::LoggedRequest| {
        g.body["messages"][0]["content"]
            .as_str()
            .is_some_and(|s| s.starts_with("You write summaries"))
    };
    let maps: Vec<_> = gens.iter().filter(is_map).collect();
    let mut seen = vec![0u8; N + 1];
    for g in &maps {
        for id in markers(g.body["messages"][1]["content"].as_str().unwrap()) {
            seen[id] += 1;
        }
    }
    let wrong: Vec<usize> = (1..=N).filter(|&i| seen[i] != 1).take(5).collect();
    assert!(
        wrong.is_empty(),
        "episodes not sent exactly once: {wrong:?}"
    );

    // The skipped ranges are exactly the episodes of the three failed prompts.
    let failed: BTreeSet<usize> = maps[..3]
        .iter()
        .flat_map(|g| markers(g.body["messages"][1]["content"].as_str().unwrap()))
        .collect();
    let skipped: BTreeSet<usize> = rows[0]["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r[0].as_u64().unwrap() as usize..=r[1].as_u64().unwrap() as usize)
        .collect();
    assert_eq!(skipped, failed);
    assert!(!skipped.is_empty() && skipped.len() < N / 10);

    // The merge was hierarchical and every prompt fitted (the server refuses what does not).
    let reduces = gens.len() - maps.len();
    assert!(
        maps.len() > 200 && reduces > 1,
        "{} maps, {reduces} reduces",
        maps.len()
    );
    let job = env.run(&["jobs", "--json"]).json();
    assert_eq!(job[0]["state"], "succeeded");
    assert!(
        job[0]["progress"]["level"].as_u64().unwrap() >= 2,
        "{job:#}"
    );
}
