//! Engine tests against an in-memory host that enforces the store's chain rules.

use super::*;
use crate::tokens::estimate_tokens;
use crate::types::{Finish, Role};

#[derive(Default)]
struct Fake {
    episodes: Vec<Episode>,
    rows: Vec<SummaryRow>,
    /// Scripted replies; when empty, a reply naming the episode ids it saw.
    replies: Vec<Result<Response, Error>>,
    requests: Vec<Request>,
    now: u64,
    batches: u32,
    calibration: Option<(u64, u64)>,
    /// Simulate a model that counts this many times our estimate and refuses prompts over
    /// the context, as Ollama does with `truncate: false`.
    count_ratio: Option<f64>,
    refused: u32,
    partials: std::collections::BTreeMap<String, Cached>,
    progress: Vec<(u32, u32, u32)>,
    /// Each plan the call reported, with the model requests made before it.
    plans: Vec<(PlanReport, usize)>,
    marker: Option<FailureMarker>,
    /// Writes that another process wins: it stores the same coverage first, and this write
    /// is refused as a conflict.
    races: u32,
    /// A store that refuses every write as a conflict without anyone writing.
    stuck: bool,
    /// Episodes a chat app appends while each model call runs.
    grow_per_call: usize,
    /// Rows compacted into "earlier" rows (out of the active chain, never deleted).
    compacted: Vec<SummaryRow>,
    /// The longest chain a `summaries` read handed back.
    widest_read: usize,
    /// A model that keeps only the last exchange: its answer restates the prompt's last
    /// conversation line and drops everything else (earlier facts included).
    forgetful: bool,
}

impl Fake {
    /// A host whose model keeps only the last exchange (see `forgetful`).
    fn forgetful() -> Self {
        Fake {
            forgetful: true,
            ..Fake::default()
        }
    }

    fn with_episodes(n: usize, words: usize) -> Self {
        Self::alternating(n, |i| format!("ep{} {}", i + 1, "word ".repeat(words)))
    }

    /// `n` episodes, the user's and the assistant's in turn, episode `i + 1` saying `text(i)`.
    fn alternating(n: usize, text: impl Fn(usize) -> String) -> Self {
        let mut f = Fake::default();
        for i in 0..n {
            let role = if i % 2 == 0 {
                Role::User
            } else {
                Role::Assistant
            };
            f.push(role, &text(i));
        }
        f
    }

    fn push(&mut self, role: Role, content: &str) {
        let id = self.episodes.len() as u64 + 1;
        let tokens = estimate_tokens(content);
        let before = self.episodes.last().map_or(0, |e| e.tokens_through);
        self.episodes.push(Episode {
            id,
            role,
            content: content.into(),
            tokens,
            timestamp_ms: Some(self.now as i64),
            speaker: None,
            tokens_through: before + u64::from(tokens),
        });
    }

    /// Append an episode said at `ms`.
    fn push_at(&mut self, role: Role, content: &str, ms: u64) {
        self.push(role, content);
        self.episodes.last_mut().unwrap().timestamp_ms = Some(ms as i64);
    }

    /// Date every episode at `ms` and set the clock there.
    fn stamp_all(&mut self, ms: u64) {
        self.now = ms;
        for e in &mut self.episodes {
            e.timestamp_ms = Some(ms as i64);
        }
    }

    fn prompt_text(req: &Request) -> String {
        match &req.prompt {
            Prompt::Chat(ms) => ms
                .iter()
                .map(|m| m.content.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            Prompt::Raw(s) => s.clone(),
        }
    }

    /// Every episode covered exactly once, in order, by contiguous rows.
    fn assert_chain(&self) {
        let mut next = 1;
        for r in &self.rows {
            assert_eq!(r.first_episode, next, "rows {:?}", self.rows);
            assert!(r.last_episode >= r.first_episode);
            next = r.last_episode + 1;
        }
    }
}

impl Host for Fake {
    fn stats(&mut self, _: &str) -> Result<Stats, Error> {
        Ok(Stats {
            episodes: self.episodes.len() as u64,
            total_tokens: self.episodes.iter().map(|e| u64::from(e.tokens)).sum(),
            last_episode: self.episodes.len() as u64,
        })
    }
    fn episodes_after(&mut self, _: &str, after: u64, limit: u32) -> Result<Vec<Episode>, Error> {
        Ok(self
            .episodes
            .iter()
            .filter(|e| e.id > after)
            .take(limit as usize)
            .cloned()
            .collect())
    }
    fn latest_summary(&mut self, _: &str) -> Result<Option<SummaryRow>, Error> {
        Ok(self.rows.last().cloned())
    }
    fn write_summary(&mut self, session: &str, w: SummaryWrite) -> Result<SummaryRow, Error> {
        if self.stuck {
            return Err(Error::Conflict("always".into()));
        }
        if self.races > 0 {
            self.races -= 1;
            let theirs = SummaryWrite {
                content: "Another process summarized these episodes first.".into(),
                ..w.clone()
            };
            self.write_summary(session, theirs)?;
            let _ = session;
            return Err(Error::Conflict(
                "a new row must start at a later episode".into(),
            ));
        }
        let prev_last = self.rows.last().map_or(0, |r| r.last_episode);
        let row = SummaryRow {
            id: 0,
            first_episode: w.first_episode,
            last_episode: w.last_episode,
            content: w.content,
            tokens: w.tokens,
            prompt_tokens: w.prompt_tokens,
            output_tokens: w.output_tokens,
            model: w.model,
            created_ms: w.now_ms,
            updated_ms: w.now_ms,
            skipped: w.skipped,
            level: 0,
            compacted_into: None,
            ledger: w.ledger,
        };
        match w.replaces {
            None => {
                assert_eq!(
                    w.first_episode,
                    prev_last + 1,
                    "new row must follow the chain"
                );
                let row = SummaryRow {
                    id: (self.rows.len() + self.compacted.len()) as u64 + 1,
                    ..row
                };
                self.rows.push(row.clone());
                Ok(row)
            }
            Some(id) => {
                let latest = self.rows.last().expect("update needs a row").id;
                let r = self
                    .rows
                    .iter_mut()
                    .find(|r| r.id == id)
                    .expect("a write replaces an active row");
                assert_eq!(r.first_episode, w.first_episode);
                if id == latest {
                    assert!(w.last_episode >= r.last_episode, "an update never shrinks");
                } else {
                    assert_eq!(r.last_episode, w.last_episode, "a rewrite keeps its range");
                }
                *r = SummaryRow {
                    id,
                    created_ms: r.created_ms,
                    level: r.level,
                    ..row
                };
                Ok(r.clone())
            }
        }
    }
    fn summary_history(&mut self, _: &str) -> Result<Vec<SummaryRow>, Error> {
        let mut all: Vec<SummaryRow> = self.rows.iter().chain(&self.compacted).cloned().collect();
        all.sort_by(|a, b| {
            a.first_episode
                .cmp(&b.first_episode)
                .then(b.level.cmp(&a.level))
        });
        Ok(all)
    }
    fn compact_summaries(&mut self, _: &str, c: Compaction) -> Result<SummaryRow, Error> {
        let k = c.rows.len();
        assert!(k >= 2, "a compaction folds at least two rows");
        let ids: Vec<u64> = self.rows.iter().take(k).map(|r| r.id).collect();
        if ids != c.rows {
            return Err(Error::Conflict("not the oldest active rows".into()));
        }
        let id = (self.rows.len() + self.compacted.len()) as u64 + 1;
        let folded: Vec<SummaryRow> = self.rows.drain(..k).collect();
        let row = SummaryRow {
            id,
            first_episode: folded[0].first_episode,
            last_episode: folded[k - 1].last_episode,
            content: c.content,
            tokens: c.tokens,
            prompt_tokens: c.prompt_tokens,
            output_tokens: c.output_tokens,
            model: c.model,
            created_ms: c.now_ms,
            updated_ms: c.now_ms,
            skipped: c.skipped,
            level: folded.iter().map(|r| r.level).max().unwrap_or(0) + 1,
            compacted_into: None,
            ledger: c.ledger,
        };
        for mut r in folded {
            r.compacted_into = Some(id);
            self.compacted.push(r);
        }
        self.rows.insert(0, row.clone());
        Ok(row)
    }
    fn generate(&mut self, req: Request) -> Result<Response, Error> {
        for _ in 0..self.grow_per_call {
            let n = self.episodes.len();
            self.push(
                Role::User,
                &format!("a message posted during the call, number {n}"),
            );
        }
        let text = Self::prompt_text(&req);
        if self.count_ratio.is_some() && !self.replies.is_empty() {
            self.requests.push(req);
            return self.replies.remove(0);
        }
        if let Some(ratio) = self.count_ratio {
            let counted = (f64::from(estimate_tokens(&text)) * ratio) as u32;
            if counted > req.context_length {
                self.refused += 1;
                return Err(Error::ContextOverflow(format!(
                    "the prompt is longer than the context length ({counted})"
                )));
            }
            self.requests.push(req);
            return Ok(Response {
                text: "The user and the assistant covered part of the plan: the replica, the \
                       maintenance window and the rollback."
                    .into(),
                finish: Finish::Stop,
                prompt_tokens: Some(counted),
                output_tokens: Some(10),
            });
        }
        self.requests.push(req);
        if !self.replies.is_empty() {
            return self.replies.remove(0);
        }
        if self.forgetful {
            let last = text
                .lines()
                .rfind(|l| l.starts_with("User: ") || l.starts_with("Assistant: "))
                .unwrap_or("nothing");
            return Ok(Response {
                text: format!("The conversation so far ended with this exchange. {last}"),
                finish: Finish::Stop,
                prompt_tokens: Some(estimate_tokens(&text)),
                output_tokens: Some(20),
            });
        }
        let ids: Vec<&str> = text
            .split_whitespace()
            .filter(|w| w.starts_with("ep"))
            .collect();
        Ok(Response {
            text: format!(
                "The user and the assistant covered {}.<|im_end|>",
                ids.join(" ")
            ),
            finish: Finish::Stop,
            prompt_tokens: Some(estimate_tokens(&text)),
            output_tokens: Some(12),
        })
    }
    fn generate_batch(&mut self, reqs: Vec<Request>) -> Vec<Result<Response, Error>> {
        self.batches += 1;
        reqs.into_iter()
            .map(|r| {
                let key = r.cache_key.clone();
                let resp = self.generate(r);
                // As a host does: a complete answer is cached the moment it arrives.
                if let (Some(k), Ok(a)) = (key, &resp)
                    && a.finish == Finish::Stop
                {
                    self.partials.insert(
                        k,
                        Cached {
                            text: a.text.clone(),
                            prompt_tokens: a.prompt_tokens.unwrap_or(0),
                            output_tokens: a.output_tokens.unwrap_or(0),
                        },
                    );
                }
                resp
            })
            .collect()
    }
    fn calibration(&mut self, _model: &str) -> Result<Option<(u64, u64)>, Error> {
        Ok(self.calibration)
    }
    fn record_calibration(
        &mut self,
        _model: &str,
        estimated: u32,
        reported: u32,
    ) -> Result<(), Error> {
        let (e, r) = self.calibration.unwrap_or((0, 0));
        self.calibration = Some((e + u64::from(estimated), r + u64::from(reported)));
        Ok(())
    }
    fn partial(&mut self, key: &str) -> Result<Option<Cached>, Error> {
        Ok(self.partials.get(key).cloned())
    }
    fn progress(&mut self, level: u32, done: u32, total: u32) {
        assert!(done <= total, "progress {done}/{total}");
        self.progress.push((level, done, total));
    }
    fn planned(&mut self, report: &PlanReport) {
        self.plans.push((report.clone(), self.requests.len()));
    }
    fn summaries(&mut self, _session: &str) -> Result<Vec<SummaryRow>, Error> {
        self.widest_read = self.widest_read.max(self.rows.len());
        Ok(self.rows.clone())
    }
    fn failure(&mut self, _session: &str) -> Result<Option<FailureMarker>, Error> {
        Ok(self.marker.clone())
    }
    fn set_failure(&mut self, _session: &str, marker: Option<FailureMarker>) -> Result<(), Error> {
        self.marker = marker;
        Ok(())
    }
    fn reset_session(&mut self, _session: &str) -> Result<(), Error> {
        self.episodes.clear();
        self.rows.clear();
        self.marker = None;
        Ok(())
    }
    fn search_episodes(
        &mut self,
        _session: Option<&str>,
        terms: &[String],
        limit: u32,
    ) -> Result<crate::search::Matches, Error> {
        // The index as a store keeps it: each episode's terms, counted (one session here).
        let docs: Vec<(u64, Vec<String>)> = self
            .episodes
            .iter()
            .map(|e| {
                let d = crate::search::doc(e.speaker.as_deref(), &e.content);
                (e.id, d.split_whitespace().map(String::from).collect())
            })
            .collect();
        let df = terms
            .iter()
            .map(|t| docs.iter().filter(|(_, d)| d.contains(t)).count() as u64)
            .collect();
        let matches = docs
            .iter()
            .rev()
            .filter(|(_, d)| terms.iter().any(|t| d.contains(t)))
            .take(limit as usize)
            .map(|(id, d)| crate::search::Match {
                session: "s".into(),
                episode: *id,
                length: d.len() as u32,
                counts: terms
                    .iter()
                    .map(|t| d.iter().filter(|x| *x == t).count() as u32)
                    .collect(),
            })
            .collect();
        Ok(crate::search::Matches {
            docs: docs.len() as u64,
            length: docs.iter().map(|(_, d)| d.len() as u64).sum(),
            df,
            matches,
        })
    }
    fn now_ms(&mut self) -> u64 {
        self.now += 1;
        self.now
    }
    fn log(&mut self, l: Level, m: &str) {
        if std::env::var("FAKE_LOG").is_ok() {
            eprintln!("{l:?} {m}");
        }
    }
}

/// The eager trigger these tests are written against (the default is window mode, tested
/// on its own below).
fn cfg() -> Config {
    Config {
        mode: crate::policy::Mode::Eager,
        ..Config::default()
    }
}

#[test]
fn below_threshold_nothing_happens() {
    let mut f = Fake::with_episodes(4, 100);
    let out = after_episode_written(&mut f, "s", &cfg()).unwrap();
    assert!(!out.triggered);
    assert_eq!(out.unsummarized, 4);
    assert!(f.requests.is_empty() && f.rows.is_empty());
}

#[test]
fn fresh_then_update_then_new_row() {
    let mut f = Fake::with_episodes(5, 60);
    let out = after_episode_written(&mut f, "s", &cfg()).unwrap();
    assert!(out.triggered);
    assert_eq!(
        (
            f.rows.len(),
            f.rows[0].first_episode,
            f.rows[0].last_episode
        ),
        (1, 1, 5)
    );
    assert_eq!(
        f.rows[0].content,
        "The user and the assistant covered ep1 ep2 ep3 ep4 ep5."
    );
    assert!(Fake::prompt_text(&f.requests[0]).starts_with("You write summaries"));

    // Four more: below min-episodes-since, no call.
    for _ in 0..4 {
        f.push(Role::User, "ep-more more text");
    }
    assert!(
        !after_episode_written(&mut f, "s", &cfg())
            .unwrap()
            .triggered
    );
    assert_eq!(f.requests.len(), 1);

    // The fifth triggers an update of row 1, carrying the previous summary.
    f.push(Role::Assistant, "ep10 done");
    let out = after_episode_written(&mut f, "s", &cfg()).unwrap();
    assert_eq!(out.passes, 1);
    assert_eq!((f.rows.len(), f.rows[0].last_episode), (1, 10));
    let p = Fake::prompt_text(&f.requests[1]);
    assert!(
        p.starts_with("Update a conversation's running summary") && p.contains("covered ep1 ep2"),
        "{p}"
    );
    assert!(!p.contains("ep1 word"), "old episodes are not re-sent");

    // A summary at max-summary-tokens starts a new row.
    let small = Config {
        max_summary_tokens: 5,
        ..cfg()
    };
    for i in 0..5 {
        f.push(Role::User, &format!("ep{} later", 11 + i));
    }
    after_episode_written(&mut f, "s", &small).unwrap();
    assert_eq!(f.rows.len(), 2);
    assert_eq!((f.rows[1].first_episode, f.rows[1].last_episode), (11, 15));
    assert!(Fake::prompt_text(&f.requests[2]).starts_with("You write summaries"));
    f.assert_chain();
}

#[test]
fn a_long_session_is_map_reduced_into_one_row() {
    // 60 episodes of ~100 tokens against a 1024-token context: chunks, then reduce levels.
    let mut f = Fake::with_episodes(60, 100);
    let c = Config {
        context_length: 1024,
        max_output_tokens: 200,
        ..cfg()
    };
    let out = summarize_now(&mut f, "s", &c).unwrap();
    assert_eq!((out.passes, out.unsummarized), (1, 0));
    f.assert_chain();
    assert_eq!(
        (
            f.rows.len(),
            f.rows[0].first_episode,
            f.rows[0].last_episode
        ),
        (1, 1, 60)
    );
    assert!(f.batches >= 2, "map and reduce go through the batch import");
    for r in &f.requests {
        let tokens = estimate_tokens(&Fake::prompt_text(r)) + 8;
        assert!(
            tokens + c.max_output_tokens <= c.context_length,
            "prompt {tokens} too big"
        );
    }
    let maps: Vec<String> = f
        .requests
        .iter()
        .map(Fake::prompt_text)
        .filter(|p| p.starts_with("You write summaries"))
        .collect();
    let reduces: Vec<String> = f
        .requests
        .iter()
        .map(Fake::prompt_text)
        .filter(|p| p.starts_with("You merge partial summaries"))
        .collect();
    assert!(
        maps.len() >= 6 && !reduces.is_empty(),
        "{} maps, {} reduces",
        maps.len(),
        reduces.len()
    );
    // Every episode went into exactly one map prompt; reduce prompts carry episode labels.
    let all: String = maps.concat();
    for i in 1..=60 {
        assert_eq!(
            all.matches(&format!("ep{i} word")).count(),
            1,
            "episode {i}"
        );
    }
    assert!(reduces[0].contains("Episodes 1-"), "{}", reduces[0]);
    assert_eq!(
        f.rows[0].prompt_tokens,
        f.requests
            .iter()
            .map(|r| estimate_tokens(&Fake::prompt_text(r)))
            .sum::<u32>()
    );
}

#[test]
fn a_large_backlog_behind_a_summary_is_map_reduced_into_a_new_row_and_a_small_one_rolls() {
    let mut f = Fake::with_episodes(5, 60);
    summarize_now(&mut f, "s", &cfg()).unwrap();
    let first = f.rows[0].clone();
    let c = Config {
        context_length: 1024,
        max_output_tokens: 200,
        ..cfg()
    };
    // A modest backlog (two passes' worth at most) is folded by rolling passes.
    for i in 6..=10 {
        f.push(Role::User, &format!("ep{i} {}", "word ".repeat(100)));
    }
    let out = summarize_now(&mut f, "s", &c).unwrap();
    assert!(out.passes >= 1 && f.batches == 0, "passes {}", out.passes);
    f.assert_chain();
    let covered = f.rows.last().unwrap().last_episode;
    assert_eq!(covered, 10);
    let rows_before = f.rows.clone();
    // A large one: only the new part is map-reduced, into a new row; old rows stay as they are.
    for i in 11..=60 {
        f.push(Role::User, &format!("ep{i} {}", "word ".repeat(100)));
    }
    let asked = f.requests.len();
    let out = summarize_now(&mut f, "s", &c).unwrap();
    assert_eq!(out.passes, 1);
    assert!(f.batches >= 1);
    f.assert_chain();
    assert_eq!(&f.rows[..rows_before.len()], &rows_before[..]);
    let new = f.rows.last().unwrap();
    assert_eq!((new.first_episode, new.last_episode), (11, 60));
    // No map prompt carried an episode the summary already covered.
    for r in &f.requests[asked..] {
        let p = Fake::prompt_text(r);
        assert!(!p.contains("ep10 ") && !p.contains("ep5 "), "{p}");
    }
    assert_eq!(f.rows[0].id, first.id);
}

#[test]
fn a_failed_map_chunk_is_skipped_and_recorded() {
    let mut f = Fake::with_episodes(60, 100);
    let c = Config {
        context_length: 1024,
        max_output_tokens: 200,
        ..cfg()
    };
    f.replies = vec![Err(Error::Server("HTTP 503 (after 3 attempts)".into()))];
    summarize_now(&mut f, "s", &c).unwrap();
    f.assert_chain();
    let row = &f.rows[0];
    assert_eq!((row.first_episode, row.last_episode), (1, 60));
    assert_eq!(row.skipped.len(), 1);
    assert_eq!(
        row.skipped[0].0, 1,
        "the first chunk failed: {:?}",
        row.skipped
    );
    let reduce = f
        .requests
        .iter()
        .map(Fake::prompt_text)
        .find(|p| p.starts_with("You merge"))
        .unwrap();
    assert!(
        !reduce.contains("Episodes 1-"),
        "the skipped chunk has no partial: {reduce}"
    );
}

#[test]
fn too_many_failed_chunks_fail_the_call_and_write_nothing() {
    let mut f = Fake::with_episodes(60, 100);
    let c = Config {
        context_length: 1024,
        max_output_tokens: 200,
        ..cfg()
    };
    f.replies = (0..100)
        .map(|_| Err(Error::Server("HTTP 503 (after 3 attempts)".into())))
        .collect();
    let err = summarize_now(&mut f, "s", &c).unwrap_err();
    assert!(
        matches!(&err, Error::Server(m) if m.contains("over the 50% limit") && m.contains("HTTP 503")),
        "{err:?}"
    );
    assert!(f.rows.is_empty());
    let strict = Config {
        max_skipped_percent: 0,
        ..c
    };
    let mut f = Fake::with_episodes(60, 100);
    f.replies = vec![Err(Error::Server("HTTP 503".into()))];
    assert!(
        summarize_now(&mut f, "s", &strict).is_err(),
        "0% tolerates no failure"
    );
}

#[test]
fn an_oversized_episode_is_folded_in_parts() {
    let mut f = Fake::default();
    f.push(Role::User, "short opener here");
    let big = (0..400)
        .map(|i| format!("Sentence number {i} talks about the rollout plan."))
        .collect::<Vec<_>>()
        .join(" ");
    f.push(Role::Assistant, &big);
    f.push(Role::User, "ep3 thanks");
    let c = Config {
        context_length: 1024,
        max_output_tokens: 200,
        ..cfg()
    };
    summarize_now(&mut f, "s", &c).unwrap();
    f.assert_chain();
    assert_eq!(f.rows.last().unwrap().last_episode, 3);
    let parts: Vec<String> = f
        .requests
        .iter()
        .map(Fake::prompt_text)
        .filter(|p| p.contains("of one long message"))
        .collect();
    assert!(parts.len() >= 3, "{} parts", parts.len());
    for i in [0, 199, 399] {
        assert!(
            parts
                .iter()
                .any(|p| p.contains(&format!("Sentence number {i} talks"))),
            "sentence {i} lost"
        );
    }
}

#[test]
fn rejected_output_writes_nothing_and_keeps_the_summary() {
    let mut f = Fake::with_episodes(5, 60);
    summarize_now(&mut f, "s", &cfg()).unwrap();
    let before = f.rows.clone();
    for _ in 0..5 {
        f.push(Role::User, "more words to fold in");
    }
    for (text, finish) in [
        ("<|im_end|>", Finish::Stop),
        ("The user asked about", Finish::Length),
    ] {
        f.replies.push(Ok(Response {
            text: text.into(),
            finish,
            prompt_tokens: None,
            output_tokens: None,
        }));
        let err = summarize_now(&mut f, "s", &cfg()).unwrap_err();
        assert!(matches!(err, Error::RejectedOutput(_)), "{err:?}");
        assert_eq!(f.rows, before);
    }
    f.replies
        .push(Err(Error::Unreachable("http://127.0.0.1:1".into())));
    assert!(matches!(
        summarize_now(&mut f, "s", &cfg()),
        Err(Error::Unreachable(_))
    ));
    assert_eq!(f.rows, before);
}

#[test]
fn chatml_rendering_sends_a_raw_prompt_with_stops() {
    let mut f = Fake::with_episodes(5, 60);
    let c = Config {
        rendering: Rendering::Chatml,
        ..cfg()
    };
    summarize_now(&mut f, "s", &c).unwrap();
    match &f.requests[0].prompt {
        Prompt::Raw(p) => {
            assert!(p.starts_with("<|im_start|>system\n") && p.ends_with("<|im_start|>assistant\n"))
        }
        other => panic!("expected a raw prompt, got {other:?}"),
    }
    assert_eq!(f.requests[0].stop, vec!["<|im_end|>", "<|im_start|>"]);
    assert_eq!(
        (
            f.requests[0].context_length,
            f.requests[0].max_output_tokens
        ),
        (4096, 500)
    );
}

#[test]
fn extractive_engine_needs_no_model() {
    let mut f = Fake::default();
    f.push(
        Role::User,
        "Our nightly backup job to the S3 bucket failed three nights in a row.",
    );
    f.push(Role::Assistant, "The credentials on the backup host expired last Monday. Rotate the access key and rerun the job.");
    let c = Config {
        engine: Engine::Extractive,
        ..cfg()
    };
    let out = summarize_now(&mut f, "s", &c).unwrap();
    assert!(f.requests.is_empty());
    assert_eq!(out.written[0].model, "extractive");
    assert!(
        out.written[0]
            .content
            .starts_with("- User: Our nightly backup job"),
        "{}",
        out.written[0].content
    );
}

#[test]
fn a_long_catch_up_compacts_as_it_goes_and_never_reads_a_long_chain() {
    // Each episode says something of its own, so the offline summary keeps growing rows.
    let mut f = Fake::alternating(12_000, |i| {
        format!(
            "Item {i} ships to depot{i} with code{i} on route{} today.",
            i * 7
        )
    });
    let c = Config {
        engine: Engine::Extractive,
        ..cfg()
    };
    let out = summarize_now(&mut f, "s", &c).unwrap();
    assert!(out.passes > 4 * COMPACT_EVERY_ROWS, "{} passes", out.passes);
    assert!(
        f.compacted.len() > 2 * COMPACT_EVERY_ROWS as usize,
        "{} rows written and folded",
        f.compacted.len()
    );
    // The chain is compacted every few new rows: no read holds the whole history's rows.
    assert!(
        f.widest_read <= 2 * COMPACT_EVERY_ROWS as usize + 2,
        "a read of {} rows",
        f.widest_read
    );
    // And it ends within its budget, covering episode 1 to the last.
    assert!(chain_tokens(&f.rows) <= c.summary_budget_tokens);
    assert_eq!(f.rows[0].first_episode, 1);
    assert_eq!(f.rows.last().unwrap().last_episode, 12_000);
}

#[test]
fn invalid_config_is_an_actionable_error() {
    let mut f = Fake::with_episodes(5, 60);
    let err = summarize_now(&mut f, "", &cfg()).unwrap_err();
    assert!(matches!(err, Error::InvalidInput(m) if m.contains("session")));
    let tiny = Config {
        context_length: 300,
        ..cfg()
    };
    let err = summarize_now(&mut f, "s", &tiny).unwrap_err();
    assert!(matches!(err, Error::InvalidInput(m) if m.contains("raise the context length")));
}

#[test]
fn plans_match_what_execution_does() {
    let c = Config {
        context_length: 1024,
        max_output_tokens: 200,
        ..cfg()
    };
    let mut f = Fake::with_episodes(60, 100);
    let plan = plan_report(&mut f, "s", &c).unwrap();
    assert!(
        f.requests.is_empty() && f.rows.is_empty(),
        "planning calls nothing and writes nothing"
    );
    assert_eq!(plan.path, PlanPath::MapReduce);
    summarize_now(&mut f, "s", &c).unwrap();
    let reduces = f
        .requests
        .iter()
        .filter(|r| Fake::prompt_text(r).starts_with("You merge"))
        .count();
    // Map chunks are exact; reduce levels assume 160-token partials (these are shorter), so
    // they bound the real reduce calls from above here.
    assert_eq!(plan.chunks as usize, f.requests.len() - reduces, "{plan:?}");
    assert!(plan.levels.iter().sum::<u32>() as usize >= reduces && reduces >= 1);
    assert!(plan.calls as usize >= f.requests.len());
    assert_eq!(
        plan_report(&mut f, "s", &c).unwrap().path,
        PlanPath::Nothing
    );
    // The call planned once, before its first model call, and told the host the same plan.
    assert_eq!(f.plans, vec![(plan.clone(), 0)]);

    let mut small = Fake::with_episodes(5, 20);
    let p = plan_report(&mut small, "s", &cfg()).unwrap();
    assert_eq!((p.path, p.calls, p.episodes), (PlanPath::Single, 1, 5));
    assert!(p.input_tokens > p.backlog_tokens);
}

#[test]
fn a_model_that_counts_more_than_we_estimate_is_calibrated_and_never_overflowed() {
    // The model counts 2x our estimate: uncalibrated chunks overflow its context; the
    // refusal recalibrates, the session is re-planned, and every accepted prompt fits.
    let mut f = Fake::with_episodes(60, 100);
    f.count_ratio = Some(2.0);
    let c = Config {
        context_length: 2048,
        max_output_tokens: 200,
        ..cfg()
    };
    let out = summarize_now(&mut f, "s", &c).unwrap();
    assert_eq!(out.passes, 1);
    f.assert_chain();
    assert!(f.refused >= 1, "the first plan overflowed");
    for r in &f.requests {
        assert!(
            f64::from(estimate_tokens(&Fake::prompt_text(r))) * 2.0 <= f64::from(c.context_length)
        );
    }
    let (e, r) = f.calibration.unwrap();
    assert!(
        policy::factor(Some((e, r))) > 1.5,
        "calibrated: {e} estimated, {r} reported"
    );
    // Each refusal re-planned the call, and the host was told each plan; the last one is
    // what ran (its map chunks are the prompts after it).
    // (one wave's refusals recalibrate once: several refused prompts, one re-plan).
    let plans = f.plans.len() as u32;
    assert!(
        (2..=1 + MAX_OVERFLOW_REPLANS).contains(&plans),
        "{plans} plans"
    );
    assert!(f.plans[0].0.chunks < f.plans[1].0.chunks, "{:?}", f.plans);
    let (last, before) = f.plans.last().unwrap().clone();
    let maps = f.requests[before..]
        .iter()
        .filter(|r| !Fake::prompt_text(r).starts_with("You merge"))
        .count();
    assert_eq!(last.chunks as usize, maps, "{last:?}");
    // A second session planned with the stored calibration is not refused at all.
    let refused = f.refused;
    let mut g = Fake::with_episodes(60, 100);
    g.count_ratio = Some(2.0);
    g.calibration = f.calibration;
    summarize_now(&mut g, "t", &c).unwrap();
    assert_eq!(
        g.refused, 0,
        "no refusal once calibrated (the first session had {refused})"
    );
}

#[test]
fn a_failed_map_reduce_resumes_with_only_the_missing_chunks() {
    let c = Config {
        context_length: 1024,
        max_output_tokens: 200,
        ..cfg()
    };
    let mut f = Fake::with_episodes(60, 100);
    // Most chunks fail: the call fails and writes nothing, but the good partials are cached.
    f.replies = (0..8)
        .map(|_| Err(Error::Server("HTTP 503 (after 3 attempts)".into())))
        .collect();
    assert!(summarize_now(&mut f, "s", &c).is_err());
    assert!(f.rows.is_empty());
    let first_maps = f.requests.len();
    let cached = f.partials.len();
    assert!(cached >= 1, "successful chunks were cached");
    // The rerun asks only for the chunks that failed (then reduces).
    let before = f.requests.len();
    summarize_now(&mut f, "s", &c).unwrap();
    let maps_again = f.requests[before..]
        .iter()
        .filter(|r| Fake::prompt_text(r).starts_with("You write summaries"))
        .count();
    assert_eq!(
        maps_again, 8,
        "only the 8 failed chunks are asked again ({first_maps} maps first, {cached} cached)"
    );
    f.assert_chain();
    assert_eq!(f.rows[0].last_episode, 60);
}

#[test]
fn a_map_stage_longer_than_one_wave_reads_its_text_wave_by_wave_and_misses_nothing() {
    // ~600 chunks: more than two waves of 240 chunks (BATCH), each wave's text read when its
    // prompts are built.
    let n = 3_000;
    let mut f = Fake::with_episodes(n, 100);
    // Short fixed answers (a model that counts as we estimate), so the reduce levels fit.
    f.count_ratio = Some(1.0);
    let c = Config {
        context_length: 1024,
        max_output_tokens: 200,
        ..cfg()
    };
    let out = summarize_now(&mut f, "s", &c).unwrap();
    assert_eq!((out.passes, out.unsummarized), (1, 0));
    f.assert_chain();
    assert_eq!(
        (
            f.rows.len(),
            f.rows[0].first_episode,
            f.rows[0].last_episode
        ),
        (1, 1, n as u64)
    );
    let maps: Vec<String> = f
        .requests
        .iter()
        .map(Fake::prompt_text)
        .filter(|p| p.starts_with("You write summaries"))
        .collect();
    assert!(maps.len() > 2 * 240, "{} map chunks", maps.len());
    let mut seen = std::collections::BTreeMap::<u64, u32>::new();
    for w in maps.iter().flat_map(|m| m.split_whitespace()) {
        if let Some(i) = w.strip_prefix("ep").and_then(|d| d.parse::<u64>().ok()) {
            *seen.entry(i).or_default() += 1;
        }
    }
    assert_eq!(seen.len(), n, "every episode is in a map prompt");
    assert!(seen.values().all(|&k| k == 1), "each in exactly one");
    // The map stage's progress counts over every wave: monotonic, out of all chunks, and
    // complete at the end.
    let stage: Vec<_> = f.progress.iter().filter(|p| p.0 == 0).collect();
    assert!(
        stage.iter().all(|p| p.2 as usize == maps.len()),
        "{stage:?}"
    );
    assert!(stage.windows(2).all(|w| w[0].1 <= w[1].1), "{stage:?}");
    assert_eq!(stage.last().unwrap().1 as usize, maps.len());
}

#[test]
fn map_reduce_reports_progress_per_stage_and_caches_each_answer_with_its_key() {
    let c = Config {
        context_length: 1024,
        max_output_tokens: 200,
        ..cfg()
    };
    let mut f = Fake::with_episodes(60, 100);
    summarize_now(&mut f, "s", &c).unwrap();
    // Every map and reduce request carried its key, and every answer was cached under it.
    assert!(f.requests.iter().all(|r| r.cache_key.is_some()));
    assert_eq!(f.partials.len(), f.requests.len());
    // Each stage starts at 0 done and ends with everything done; levels go 0, 1, ...
    let levels: Vec<u32> = f.progress.iter().map(|p| p.0).collect();
    assert!(levels.windows(2).all(|w| w[0] <= w[1]), "{levels:?}");
    assert_eq!(f.progress[0].1, 0);
    let max_level = *levels.last().unwrap();
    assert!(max_level >= 1, "{:?}", f.progress);
    for l in 0..=max_level {
        let stage: Vec<_> = f.progress.iter().filter(|p| p.0 == l).collect();
        let last = stage.last().unwrap();
        assert_eq!(last.1, last.2, "stage {l} ends complete: {stage:?}");
    }
}

#[test]
fn a_cached_answer_that_fails_the_quality_gate_is_asked_again() {
    let c = Config {
        context_length: 1024,
        max_output_tokens: 200,
        ..cfg()
    };
    let mut f = Fake::with_episodes(60, 100);
    summarize_now(&mut f, "s", &c).unwrap();
    let asked = f.requests.len();
    // Poison one cached map answer and summarize the same session again from scratch.
    let key = f.requests[0].cache_key.clone().unwrap();
    f.partials.insert(
        key,
        Cached {
            text: String::new(),
            prompt_tokens: 0,
            output_tokens: 0,
        },
    );
    f.rows.clear();
    f.progress.clear();
    // The same plan as the first run (whose success taught the estimator).
    f.calibration = None;
    summarize_now(&mut f, "s", &c).unwrap();
    let again = &f.requests[asked..];
    assert_eq!(again.len(), 1, "only the poisoned chunk is asked again");
    assert_eq!(again[0].cache_key, f.requests[0].cache_key);
    // The map stage started with all but one answer in hand.
    let start = f.progress[0];
    assert_eq!((start.0, start.1 + 1), (0, start.2));
    f.assert_chain();
}

#[test]
fn summarizing_a_grown_session_from_scratch_reuses_the_unchanged_chunks() {
    let c = Config {
        context_length: 1024,
        max_output_tokens: 200,
        ..cfg()
    };
    let mut f = Fake::with_episodes(60, 100);
    summarize_now(&mut f, "s", &c).unwrap();
    let maps = |reqs: &[Request]| {
        reqs.iter()
            .filter(|r| Fake::prompt_text(r).starts_with("You write summaries"))
            .count()
    };
    let first = maps(&f.requests);
    // The summary is dropped (as a reset would) and the session grows by ten episodes.
    f.rows.clear();
    for i in 60..70 {
        let role = if i % 2 == 0 {
            Role::User
        } else {
            Role::Assistant
        };
        f.push(role, &format!("ep{} {}", i + 1, "word ".repeat(100)));
    }
    let before = f.requests.len();
    summarize_now(&mut f, "s", &c).unwrap();
    let again = maps(&f.requests[before..]);
    // Chunks break at the same places; only the chunks holding new episodes are asked.
    assert!(
        again <= 4 && first > 10,
        "{again} maps asked again of {first}"
    );
    f.assert_chain();
    assert_eq!(f.rows[0].last_episode, 70);
}

const HOUR: u64 = 3_600_000;

fn idle_cfg() -> Config {
    Config {
        mode: policy::Mode::Idle,
        ..cfg()
    }
}

#[test]
fn growth_is_folded_into_the_summary_and_nothing_changed_means_no_call() {
    let mut f = Fake::with_episodes(10, 30);
    summarize_now(&mut f, "s", &cfg()).unwrap();
    let calls = f.requests.len();
    // Nothing new: no call, fresh.
    let out = refresh(&mut f, "s", &cfg()).unwrap();
    assert!(!out.triggered && f.requests.len() == calls);
    assert_eq!(
        freshness(&mut f, "s", &cfg()).unwrap().state,
        FreshState::Fresh
    );
    // Six new episodes: one update prompt carrying the old summary and only the new turns.
    for i in 11..=16 {
        f.push(Role::User, &format!("ep{i} {}", "word ".repeat(30)));
    }
    let out = refresh(&mut f, "s", &cfg()).unwrap();
    assert_eq!(out.passes, 1);
    let p = Fake::prompt_text(&f.requests[calls]);
    assert!(p.contains("The user and the assistant covered"), "{p}");
    assert!(
        p.contains("ep11") && p.contains("ep16") && !p.contains("ep10 "),
        "{p}"
    );
    assert_eq!(f.rows.len(), 1);
    assert_eq!(f.rows[0].last_episode, 16);
}

#[test]
fn idle_mode_waits_for_quiet_by_the_clock_and_refreshes_once_idle_again() {
    let c = idle_cfg();
    let mut f = Fake::with_episodes(10, 30);
    f.stamp_all(10 * HOUR);
    // Active: nothing happens; the verdict says when it becomes due.
    let v = freshness(&mut f, "s", &c).unwrap();
    assert_eq!(v.state, FreshState::Waiting, "{}", v.reason);
    assert_eq!(v.due_at_ms, Some(11 * HOUR));
    assert!(!after_episode_written(&mut f, "s", &c).unwrap().triggered);
    assert!(f.requests.is_empty());
    // An hour of quiet later: summarized.
    f.now = 11 * HOUR;
    assert_eq!(refresh(&mut f, "s", &c).unwrap().passes, 1);
    // The conversation grows later: waiting while active, refreshed once idle again.
    f.now = 20 * HOUR;
    f.push_at(
        Role::User,
        &format!("ep11 {}", "word ".repeat(30)),
        20 * HOUR,
    );
    f.now = 20 * HOUR + HOUR / 2;
    assert!(!refresh(&mut f, "s", &c).unwrap().triggered);
    f.now = 21 * HOUR;
    assert!(refresh(&mut f, "s", &c).unwrap().triggered);
    assert_eq!(f.rows.last().unwrap().last_episode, 11);
}

#[test]
fn idle_mode_gives_a_large_active_conversation_a_provisional_summary() {
    let c = Config {
        provisional_tokens: 300,
        ..idle_cfg()
    };
    let mut f = Fake::with_episodes(10, 50);
    f.stamp_all(5 * HOUR);
    let v = freshness(&mut f, "s", &c).unwrap();
    assert_eq!(v.state, FreshState::Due, "{}", v.reason);
    assert!(v.reason.contains("provisional"));
    refresh(&mut f, "s", &c).unwrap();
    // Two more turns: under the limit, so it waits for quiet, then folds them.
    for i in 11..=12 {
        f.push_at(
            Role::User,
            &format!("ep{i} {}", "word ".repeat(20)),
            5 * HOUR,
        );
    }
    f.now = 5 * HOUR + 60_000;
    assert_eq!(
        freshness(&mut f, "s", &c).unwrap().state,
        FreshState::Waiting
    );
    f.now = 6 * HOUR + 60_000;
    refresh(&mut f, "s", &c).unwrap();
    assert_eq!(f.rows.last().unwrap().last_episode, 12);
}

#[test]
fn a_failed_refresh_keeps_the_summary_marks_the_session_backs_off_and_gives_up() {
    let c = Config {
        max_attempts: 3,
        ..cfg()
    };
    let mut f = Fake::with_episodes(10, 30);
    summarize_now(&mut f, "s", &c).unwrap();
    let good = f.rows.clone();
    for i in 11..=16 {
        f.push(Role::User, &format!("ep{i} {}", "word ".repeat(30)));
    }
    let fail = || Err(Error::Server("HTTP 503 (after 3 attempts)".into()));
    f.replies = vec![fail()];
    assert!(refresh(&mut f, "s", &c).is_err());
    assert_eq!(f.rows, good, "the good summary is untouched");
    let m = f.marker.clone().unwrap();
    assert_eq!(m.failures, 1);
    assert!(m.last_error.contains("503"));
    // Backing off: no call until the retry time.
    let calls = f.requests.len();
    let v = freshness(&mut f, "s", &c).unwrap();
    assert_eq!(v.state, FreshState::BackingOff, "{}", v.reason);
    assert!(!refresh(&mut f, "s", &c).unwrap().triggered);
    assert_eq!(f.requests.len(), calls);
    // Two more failures, each after its backoff (60 s, then 120 s): then it gives up.
    for _ in 0..2 {
        f.now = f.marker.as_ref().unwrap().retry_after_ms;
        f.replies = vec![fail()];
        assert!(refresh(&mut f, "s", &c).is_err());
    }
    assert_eq!(f.marker.as_ref().unwrap().failures, 3);
    f.now += 100 * HOUR;
    assert_eq!(
        freshness(&mut f, "s", &c).unwrap().state,
        FreshState::GaveUp
    );
    let calls = f.requests.len();
    assert!(!refresh(&mut f, "s", &c).unwrap().triggered);
    assert_eq!(f.requests.len(), calls, "no storm");
    assert_eq!(f.rows, good);
    // An explicit summarize tries, succeeds and clears the marker.
    summarize_now(&mut f, "s", &c).unwrap();
    assert!(f.marker.is_none());
    assert_eq!(f.rows.last().unwrap().last_episode, 16);
    assert!(f.rows.iter().all(|r| !r.content.contains("503")));
}

#[test]
fn context_fits_the_budget_refreshes_when_far_behind_and_reset_clears() {
    let mut f = Fake::with_episodes(30, 20);
    summarize_now(&mut f, "s", &cfg()).unwrap();
    for i in 31..=40 {
        f.push(
            if i % 2 == 1 {
                Role::User
            } else {
                Role::Assistant
            },
            &format!("ep{i} {}", "word ".repeat(20)),
        );
    }
    let req = ContextRequest {
        query: None,
        budget: 400,
        pairs: 4,
        refresh_after: 8,
        pins: vec![],
    };
    // Ten messages beyond the summary (over 8): eager refreshes first.
    let w = context(&mut f, "s", req.clone(), &cfg()).unwrap();
    assert!(w.refreshed && !w.refresh_due);
    assert_eq!(w.window.covered, 40);
    assert!(w.window.tokens <= 400);
    assert_eq!(w.window.messages[0].role, Role::System);
    assert!(w.full_tokens > u64::from(w.window.tokens) * 2);
    // Idle mode leaves the refresh to the caller.
    for i in 41..=50 {
        f.push(Role::User, &format!("ep{i} {}", "word ".repeat(20)));
    }
    let calls = f.requests.len();
    let w = context(&mut f, "s", req.clone(), &idle_cfg()).unwrap();
    assert!(w.refresh_due && !w.refreshed);
    assert_eq!(f.requests.len(), calls);
    // The budget has room for the ten messages no summary covers: they are shown verbatim
    // (the pairs are a minimum), so nothing is left out.
    assert!(w.window.tokens <= 400);
    assert!(w.window.recent >= 10, "{:?}", w.window);
    assert_eq!(w.window.omitted, 0);
    // Reset clears history and summaries.
    reset(&mut f, "s").unwrap();
    assert!(f.rows.is_empty() && f.episodes.is_empty());
    let w = context(&mut f, "s", req.clone(), &cfg()).unwrap();
    assert!(w.window.messages.is_empty());
}

#[test]
fn a_count_that_shows_truncation_never_calibrates() {
    // A server that cut the prompt to its own small window (Ollama's /v1 without num_ctx)
    // reports a count far below our estimate: it is logged, not learned from.
    let mut f = Fake::with_episodes(12, 120);
    f.count_ratio = Some(0.3);
    let c = Config {
        context_length: 8192,
        ..cfg()
    };
    summarize_now(&mut f, "s", &c).unwrap();
    assert_eq!(f.calibration, None, "a truncated count was recorded");
    // An honest count close to the estimate is recorded as before.
    let mut g = Fake::with_episodes(12, 120);
    g.count_ratio = Some(0.9);
    summarize_now(&mut g, "s", &c).unwrap();
    assert!(g.calibration.is_some());
}

#[test]
fn a_concurrent_writer_is_a_retry_not_a_failure() {
    // Two ingests of one session: the other process writes first, twice; this call goes on
    // from the row it finds, and the chain stays whole.
    let mut f = Fake::with_episodes(12, 30);
    f.races = 2;
    let out = summarize_now(&mut f, "s", &cfg()).unwrap();
    f.assert_chain();
    assert_eq!(f.rows.last().unwrap().last_episode, 12);
    assert!(out.unsummarized == 0, "{out:?}");
    // Endless conflicts end in the error, not a loop.
    let mut g = Fake::with_episodes(12, 30);
    g.stuck = true;
    assert!(matches!(
        summarize_now(&mut g, "s", &cfg()),
        Err(Error::Conflict(_))
    ));
}

#[test]
fn a_rejected_map_answer_is_asked_again_with_another_seed_and_every_call_is_counted() {
    let c = Config {
        context_length: 1024,
        max_output_tokens: 200,
        ..cfg()
    };
    let mut f = Fake::with_episodes(60, 100);
    // The first map answer copies the transcript (rejected); the rest are normal.
    f.replies = vec![Ok(Response {
        text: "User: ep1 word word\nAssistant: ep2 word word\nUser: ep3 word".into(),
        finish: Finish::Stop,
        prompt_tokens: Some(700),
        output_tokens: Some(40),
    })];
    summarize_now(&mut f, "s", &c).unwrap();
    f.assert_chain();
    let row = f.rows.last().unwrap();
    assert!(
        row.skipped.is_empty(),
        "the re-asked chunk was not skipped: {:?}",
        row.skipped
    );
    let reasked: Vec<&Request> = f.requests.iter().filter(|r| r.seed.is_some()).collect();
    assert_eq!(reasked.len(), 1, "one re-ask");
    assert_eq!(
        Fake::prompt_text(reasked[0]),
        Fake::prompt_text(&f.requests[0]),
        "the same prompt, another seed"
    );
    // Usage counts the rejected call's tokens too.
    let counted: u32 = f
        .requests
        .iter()
        .map(|r| estimate_tokens(&Fake::prompt_text(r)))
        .sum::<u32>()
        - estimate_tokens(&Fake::prompt_text(&f.requests[0]))
        + 700;
    assert_eq!(row.prompt_tokens, counted);
}

#[test]
fn a_rerun_after_a_failure_keeps_the_chunk_boundaries_and_reuses_every_cached_answer() {
    // Each answer reports a prompt count unlike our estimate: a measurement that would move
    // the calibration and so the chunk boundaries. The first run fails (most
    // chunks fail); the rerun must plan the same chunks and ask only for the failed ones.
    let c = Config {
        context_length: 2048,
        max_output_tokens: 200,
        max_skipped_percent: 10,
        ..cfg()
    };
    let mut f = Fake::with_episodes(200, 60);
    f.count_ratio = Some(1.05);
    let fail = || Err(Error::Server("HTTP 503 (after 3 attempts)".into()));
    // The first two chunks answer, then three fail: over the 10 % limit, nothing written.
    f.replies = vec![];
    let first = plan_report(&mut f, "s", &c).unwrap();
    assert!(first.chunks >= 6, "{first:?}");
    f.replies = (0..first.chunks)
        .map(|i| if i < 2 { ok_reply() } else { fail() })
        .collect();
    assert!(summarize_now(&mut f, "s", &c).is_err());
    assert!(f.rows.is_empty());
    assert_eq!(f.calibration, None, "a failed run taught the estimator");
    let cached = f.partials.len();
    assert_eq!(cached, 2);
    let before = f.requests.len();
    summarize_now(&mut f, "s", &c).unwrap();
    f.assert_chain();
    let map_prompts: Vec<String> = f.requests[before..]
        .iter()
        .map(Fake::prompt_text)
        .filter(|p| !p.contains("Partial summaries"))
        .collect();
    assert_eq!(
        map_prompts.len(),
        first.chunks as usize - cached,
        "the rerun re-asked cached chunks"
    );
    // The successful run recorded its measurements.
    assert!(f.calibration.is_some());
    // Usage counts every call: the two answers of the failed run (900 prompt tokens each),
    // reused from the cache, and every call of the rerun.
    let rerun: u32 = f.requests[before..]
        .iter()
        .map(|r| (f64::from(estimate_tokens(&Fake::prompt_text(r))) * 1.05) as u32)
        .sum();
    assert_eq!(f.rows[0].prompt_tokens, 2 * 900 + rerun);
}

fn ok_reply() -> Result<Response, Error> {
    Ok(Response {
        text: "The user and the assistant covered the replica, the window and the rollback plan."
            .into(),
        finish: Finish::Stop,
        prompt_tokens: Some(900),
        output_tokens: Some(20),
    })
}

#[test]
fn a_session_that_grows_during_the_call_is_covered_as_it_stood_and_the_call_ends() {
    // A chat app posts three messages during every model call: the call covers what the
    // session held when it started and leaves the rest to the next one, instead of chasing
    // the end for ever (or tripping the store-misbehaviour guard).
    let mut h = Fake::with_episodes(12, 30);
    h.grow_per_call = 3;
    let out = summarize_now(&mut h, "s", &cfg()).unwrap();
    let covered = h.rows.last().unwrap().last_episode;
    assert!(covered >= 12, "covered {covered}");
    assert!(out.passes <= 2, "{} passes", out.passes);
    assert!(out.unsummarized > 0);
}

// ---- Summaries that do not drift (#12) ----

/// A conversation whose user turns each plant identifiers: a path, a ticket, a version and a
/// number with a unit.
fn planted(f: &mut Fake, from: usize, to: usize) {
    for i in from..=to {
        f.push(
            Role::User,
            &format!(
                "Turn {i}: please look at src/mod{i}.rs for ticket #{} before release v2.{i}.0; it took {} ms.",
                1000 + i,
                10 * i
            ),
        );
        f.push(
            Role::Assistant,
            &format!("Noted for turn {i}; I will check the module and report back."),
        );
    }
}

/// The window's parts add up to its tokens.
fn assert_parts_add_up(w: &ContextWindow) {
    let p = w.window.parts;
    assert_eq!(
        p.summary + p.ledger + p.digest + p.pinned + p.recent + p.days,
        w.window.tokens,
        "{p:?}"
    );
}

fn context_text(w: &ContextWindow) -> String {
    w.window
        .messages
        .iter()
        .map(|m| m.content.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn identifiers_survive_fifty_folds_of_a_model_that_keeps_only_the_last_exchange() {
    let mut f = Fake::forgetful();
    let c = Config {
        min_episodes_since: 2,
        threshold_tokens: 0,
        ledger_tokens: 4000,
        ..cfg()
    };
    let mut folds = 0;
    for i in 1..=50 {
        planted(&mut f, i, i);
        folds += after_episode_written(&mut f, "s", &c).unwrap().passes;
    }
    assert!(folds >= 49, "{folds} folds");
    let texts: Vec<String> = f.episodes.iter().map(|e| e.content.clone()).collect();
    let req = ContextRequest {
        query: None,
        budget: 20_000,
        pairs: 1,
        refresh_after: 8,
        pins: vec![],
    };
    let w = context(&mut f, "s", req, &c).unwrap();
    let (all, kept) = ledger::retention(texts.iter().map(String::as_str), &context_text(&w));
    assert_eq!(all, 200, "4 identifiers in each of 50 turns");
    assert_eq!(kept, all, "every identifier is in the context");
    // The prose alone keeps only what the last exchange said.
    let prose = f
        .rows
        .iter()
        .map(|r| r.content.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let (_, in_prose) = ledger::retention(texts.iter().map(String::as_str), &prose);
    assert!(in_prose <= 8, "prose kept {in_prose}");
    // Each entry knows the episode it was last seen in.
    let row = f.rows.last().unwrap();
    let e = row
        .ledger
        .entries
        .iter()
        .find(|e| e.text == "src/mod7.rs")
        .unwrap();
    assert_eq!(e.episode, 13);
    assert_eq!(row.ledger.dropped, 0);
}

#[test]
fn a_small_ledger_slice_bounds_the_prompt_and_the_context_but_the_row_keeps_every_identifier() {
    let mut f = Fake::forgetful();
    let c = Config {
        min_episodes_since: 2,
        threshold_tokens: 0,
        ledger_tokens: 120,
        ..cfg()
    };
    for i in 1..=30 {
        planted(&mut f, i, i);
        after_episode_written(&mut f, "s", &c).unwrap();
    }
    // The row keeps all 120 identifiers: storage is cheap, budgets apply when reading.
    let row = f.rows.last().unwrap();
    assert_eq!(row.ledger.entries.len(), 120);
    assert_eq!(row.ledger.dropped, 0);
    // A fold prompt carries no ledger (its fixed part follows the summary, not the
    // conversation): the instructions say to copy identifiers exactly, and the guest merges
    // the row's ledger; the rest stays in the row.
    let prompt = Fake::prompt_text(f.requests.last().unwrap());
    assert!(prompt.contains("Current summary:"), "{prompt}");
    assert!(prompt.contains("identifiers exactly"), "{prompt}");
    assert!(!prompt.contains(ledger::HEADING), "{prompt}");
    assert!(!prompt.contains("src/mod1.rs "), "{prompt}");
    // A small context shows the slice and says how many it left out ...
    let texts: Vec<String> = f.episodes.iter().map(|e| e.content.clone()).collect();
    let small = ContextRequest {
        query: None,
        budget: 400,
        pairs: 1,
        refresh_after: 8,
        pins: vec![],
    };
    let w = context(&mut f, "s", small, &c).unwrap();
    assert!(w.window.tokens <= 400);
    let (all, kept) = ledger::retention(texts.iter().map(String::as_str), &context_text(&w));
    assert!(kept < all, "{kept} of {all}");
    let small_kept = kept;
    assert!(context_text(&w).contains("older identifiers left out for the budget"));
    // ... and one with room (not quite the whole history's 1,965 tokens) fills its stable
    // head's share with more of them.
    let roomy = ContextRequest {
        query: None,
        budget: 1900,
        pairs: 1,
        refresh_after: 8,
        pins: vec![],
    };
    let w = context(&mut f, "s", roomy, &c).unwrap();
    assert!(w.window.tokens <= 1900);
    let (all, kept) = ledger::retention(texts.iter().map(String::as_str), &context_text(&w));
    assert!(
        kept > small_kept,
        "{kept} of {all} identifiers, in {} tokens",
        w.window.tokens
    );
    // The ledger widens into the stable head's share (the rest is the turns since the fold).
    let head = w.window.parts.summary + w.window.parts.ledger;
    assert!(
        head * 4 >= crate::context::share_of(1900, crate::context::head_share(c.engine)) * 3,
        "{} identifiers in {head} tokens: {:?}",
        w.window.identifiers,
        w.window.parts
    );
    assert_parts_add_up(&w);
    assert!(w.window.parts.ledger > 0 && w.window.parts.summary > 0);
}

#[test]
fn two_huge_messages_are_folded_and_a_context_that_leaves_anything_out_says_so() {
    let mut f = Fake::forgetful();
    f.push(Role::User, &format!("ep1 {}", "alpha ".repeat(3500)));
    f.push(Role::Assistant, &format!("ep2 {}", "beta ".repeat(3500)));
    // What a caller that runs refreshes itself sees first: nothing summarized, and the
    // context says which episodes it left out.
    let hot = ContextRequest {
        query: None,
        budget: 2000,
        pairs: 4,
        refresh_after: u32::MAX,
        pins: vec![],
    };
    let w = context(&mut f, "s", hot.clone(), &cfg()).unwrap();
    assert!(w.window.omitted > 0);
    assert_eq!(w.window.omitted_ranges, vec![(1, 2)], "{:?}", w.window);
    assert!(w.window.covered_from > 1);
    // Two episodes never reach min-episodes (5), but 3,500 tokens over the backlog limit do.
    assert_eq!(
        freshness(&mut f, "s", &cfg()).unwrap().state,
        FreshState::Due
    );
    let out = refresh(&mut f, "s", &cfg()).unwrap();
    assert!(out.triggered && out.passes > 0);
    let w = context(&mut f, "s", hot, &cfg()).unwrap();
    assert_eq!(w.window.covered, 2);
    assert!(w.window.tokens <= 2000);
}

#[test]
fn the_second_level_keeps_episode_one_in_a_small_context_over_a_thousand_turns() {
    let mut f = Fake::default();
    let c = Config {
        engine: Engine::Extractive,
        max_summary_tokens: 20,
        summary_budget_tokens: 300,
        ledger_tokens: 100,
        ..cfg()
    };
    let req = ContextRequest {
        query: None,
        budget: 700,
        pairs: 2,
        refresh_after: 8,
        pins: vec![],
    };
    for i in 1..=1000usize {
        let role = if i % 2 == 1 {
            Role::User
        } else {
            Role::Assistant
        };
        f.push(
            role,
            &format!(
                "Message {i} talks about the {} deployment and the {} budget review for item {}.",
                ["billing", "search", "ingest", "alerting"][i % 4],
                ["quarterly", "monthly", "yearly"][i % 3],
                i * 7
            ),
        );
        after_episode_written(&mut f, "s", &c).unwrap();
        if i % 50 == 0 {
            let w = context(&mut f, "s", req.clone(), &c).unwrap();
            assert!(
                w.window.tokens <= 700,
                "turn {i}: {} tokens",
                w.window.tokens
            );
            assert_eq!(
                w.window.covered_from, 1,
                "turn {i}: {:?}",
                w.window.omitted_ranges
            );
            assert!(
                w.window.omitted_ranges.is_empty(),
                "turn {i}: {:?}",
                w.window.omitted_ranges
            );
        }
    }
    let w = context(&mut f, "s", req, &c).unwrap();
    let stored = f.rows.iter().map(|r| r.level).max().unwrap_or(0);
    assert!(stored >= 2, "a fold of folds by now: level {stored}");
    // The context reads an offline chain at its finest level and picks its lines within the
    // budget, so more room shows more detail rather than the compacted text.
    assert_eq!(w.window.level, 0);
    assert!(
        w.window.tokens * 100 >= 700 * crate::context::head_share(c.engine),
        "{} of 700",
        w.window.tokens
    );
    assert!(chain_tokens(&f.rows) <= 300 + 200);
    // Nothing was deleted: the history still holds every row, each range covered once per
    // level, and the active chain covers 1..n exactly once.
    f.assert_chain();
    assert!(!f.compacted.is_empty());
    let history = f.summary_history("s").unwrap();
    assert_eq!(history.len(), f.rows.len() + f.compacted.len());
}

#[test]
fn expand_returns_exactly_the_covered_episodes_and_a_ledger_entry_its_episode() {
    let mut f = Fake::default();
    planted(&mut f, 1, 20);
    let c = Config {
        engine: Engine::Extractive,
        max_summary_tokens: 40,
        summary_budget_tokens: 200,
        ..cfg()
    };
    for _ in 0..4 {
        summarize_now(&mut f, "s", &c).unwrap();
        let n = f.episodes.len() / 2;
        planted(&mut f, n + 1, n + 10);
    }
    summarize_now(&mut f, "s", &c).unwrap();
    let history = f.summary_history("s").unwrap();
    for r in &history {
        let x = expand(&mut f, "s", r.id, None, 0, 10_000).unwrap();
        let ids: Vec<u64> = x.episodes.iter().map(|e| e.id).collect();
        assert_eq!(ids, (r.first_episode..=r.last_episode).collect::<Vec<_>>());
        assert_eq!(x.next_after, None);
        if r.level > 0 {
            assert!(x.compacted.len() >= 2);
            assert_eq!(x.compacted[0].first_episode, r.first_episode);
        }
    }
    // Paged.
    let r = &history[0];
    let x = expand(&mut f, "s", r.id, None, 0, 2).unwrap();
    assert_eq!(x.episodes.len(), 2);
    assert_eq!(x.next_after, Some(r.first_episode + 1));
    // A ledger entry leads to the episode it came from.
    let r = f.rows.last().unwrap().clone();
    let entry = r.ledger.entries.last().unwrap().clone();
    let x = expand(&mut f, "s", r.id, Some(&entry.text), 0, 10).unwrap();
    assert_eq!(x.episodes.len(), 1);
    assert_eq!(x.episodes[0].id, entry.episode);
    assert!(x.episodes[0].content.contains(&entry.text));
    // Unknown rows and identifiers are the caller's mistake.
    assert!(matches!(
        expand(&mut f, "s", 999, None, 0, 10),
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        expand(&mut f, "s", r.id, Some("nope.rs"), 0, 10),
        Err(Error::InvalidInput(_))
    ));
}

#[test]
fn an_invented_quote_is_rejected_and_the_previous_summary_stays() {
    let mut f = Fake::default();
    planted(&mut f, 1, 5);
    summarize_now(&mut f, "s", &cfg()).unwrap();
    let before = f.rows.clone();
    planted(&mut f, 6, 10);
    let said = |t: &str| {
        Ok(Response {
            text: t.into(),
            finish: Finish::Stop,
            prompt_tokens: Some(900),
            output_tokens: Some(40),
        })
    };
    f.replies = vec![said(
        "The user reviewed ten modules and their tickets, then said \"delete the production database tonight\" before the release.",
    )];
    let e = summarize_now(&mut f, "s", &cfg()).unwrap_err();
    assert!(
        matches!(&e, Error::RejectedOutput(m) if m.contains("delete the production database tonight")),
        "{e:?}"
    );
    assert_eq!(f.rows, before, "the previous summary stays");
    assert!(f.marker.is_some(), "the failure is recorded");
    // A quote of words that were said passes.
    f.replies = vec![said(
        "The user listed modules and tickets for the release; the assistant answered \"I will check the module and report back\" each time.",
    )];
    summarize_now(&mut f, "s", &cfg()).unwrap();
    assert_eq!(f.rows.last().unwrap().last_episode, 20);
}

#[test]
fn what_the_gate_cannot_catch_an_unquoted_invented_instruction() {
    // Documented limit: the gate checks quotations, not paraphrase. An instruction the user
    // never gave, written without quotes, passes it (the prompts forbid it; only a reader of
    // the expanded episodes can tell).
    let mut f = Fake::default();
    planted(&mut f, 1, 5);
    f.replies = vec![Ok(Response {
        text: "The user instructed the assistant to delete the staging cluster after reviewing the five modules and their tickets.".into(),
        finish: Finish::Stop,
        prompt_tokens: Some(900),
        output_tokens: Some(40),
    })];
    summarize_now(&mut f, "s", &cfg()).unwrap();
    assert!(f.rows[0].content.contains("instructed"));
}

#[test]
fn pinned_messages_stay_in_the_context_whatever_their_age() {
    let mut f = Fake::default();
    f.push(
        Role::User,
        "ep1 PINNED: the deploy key lives in vault path secret/deploy/prod.",
    );
    planted(&mut f, 2, 60);
    let c = Config {
        engine: Engine::Extractive,
        ..cfg()
    };
    summarize_now(&mut f, "s", &c).unwrap();
    let req = ContextRequest {
        query: None,
        budget: 400,
        pairs: 2,
        refresh_after: 8,
        pins: vec![1, 999],
    };
    let w = context(&mut f, "s", req, &c).unwrap();
    assert_eq!(w.window.pinned, 1);
    assert!(w.window.tokens <= 400);
    let verbatim: Vec<&Message> = w
        .window
        .messages
        .iter()
        .filter(|m| m.role != Role::System)
        .collect();
    assert!(
        verbatim[0].content.starts_with("ep1 PINNED"),
        "{verbatim:?}"
    );
}

#[test]
fn focus_instructions_reach_every_fold_prompt() {
    let mut f = Fake::default();
    planted(&mut f, 1, 5);
    let c = Config {
        focus: "keep decisions and file paths".into(),
        ..cfg()
    };
    summarize_now(&mut f, "s", &c).unwrap();
    planted(&mut f, 6, 10);
    summarize_now(&mut f, "s", &c).unwrap();
    assert!(f.requests.len() >= 2);
    for r in &f.requests {
        assert!(Fake::prompt_text(r).contains("keep decisions and file paths"));
    }
}

#[test]
fn window_mode_folds_what_left_the_window_and_never_misses_a_message() {
    let mut f = Fake::forgetful();
    let c = Config {
        mode: policy::Mode::Window,
        threshold_tokens: 0,
        ..cfg()
    };
    let req = ContextRequest {
        query: None,
        budget: 6000,
        pairs: 4,
        refresh_after: 8,
        pins: vec![],
    };
    for i in 1..=400usize {
        planted(&mut f, i, i);
        after_episode_written(&mut f, "s", &c).unwrap();
        let w = context(&mut f, "s", req.clone(), &c).unwrap();
        assert!(
            w.window.omitted_ranges.is_empty(),
            "turn {i}: {:?}",
            w.window.omitted_ranges
        );
        assert_eq!(w.window.covered_from, 1);
        // The recent window is never folded.
        let covered = f.rows.last().map_or(0, |r| r.last_episode);
        assert!(covered + u64::from(c.window_messages) <= f.episodes.len() as u64 || covered == 0);
    }
    // Each fold (after a write, or when the turns since the last one reach the context's
    // high-water mark) takes a batch of many messages in one call: far fewer calls than
    // eager's one per five messages.
    let folds = f.requests.len();
    assert!(folds >= 2, "{folds}");
    assert!(folds < 40, "{folds} folds for 400 messages");
}

#[test]
fn a_window_fold_goes_in_whole_prompts_and_leaves_less_than_a_batch_waiting() {
    let mut f = Fake::forgetful();
    let c = Config {
        mode: policy::Mode::Window,
        threshold_tokens: 0,
        context_length: 2048,
        ..cfg()
    };
    let mut smallest = u32::MAX;
    let mut batch = 0;
    for i in 1..=300usize {
        planted(&mut f, i, i);
        let before = f.requests.len();
        let latest = f.rows.last().cloned();
        let b = window_batch(&mut f, &c, latest.as_ref()).unwrap();
        after_episode_written(&mut f, "s", &c).unwrap();
        for r in &f.requests[before..] {
            let text = Fake::prompt_text(r);
            if let Some(conversation) = text.split("New exchanges:").nth(1) {
                smallest = smallest.min(estimate_tokens(conversation));
                batch = b;
            }
        }
    }
    assert!(batch > 0, "no fold into a summary");
    // Every fold carried a batch: none spent a call with the whole fixed part on the few
    // messages one prompt left over (they waited for the next batch).
    assert!(
        smallest >= batch * 9 / 10,
        "a fold of {smallest} tokens, a batch is {batch}"
    );
    // What waits beyond the window is less than a batch and one message.
    let covered = f.rows.last().unwrap().last_episode;
    let edge = f.episodes.len() as u64 - u64::from(c.window_messages);
    let through = |id: u64| f.episodes[id as usize - 1].tokens_through;
    let rest = through(edge) - through(covered) + u64::from(plan::MESSAGE_COST) * (edge - covered);
    assert!(
        rest < u64::from(batch) + 60,
        "{rest} tokens wait, a batch is {batch}"
    );
}

#[test]
fn a_job_host_folds_what_a_small_context_cannot_carry_in_window_and_eager_modes() {
    // A host that runs refreshes as jobs asks `context_freshness` with the context's budget,
    // runs `catch_up` to its `fold_upto`, then reads the context without refreshing inline.
    for mode in [policy::Mode::Window, policy::Mode::Eager] {
        let mut f = Fake::default();
        let c = Config {
            mode,
            // Far above this chat: only the budget can make a fold due.
            threshold_tokens: 1_000_000,
            ..cfg()
        };
        let req = ContextRequest {
            query: None,
            budget: 600,
            pairs: 4,
            refresh_after: u32::MAX,
            pins: vec![],
        };
        let mut folds = 0;
        for i in 1..=40usize {
            // Tool output now and then, which a context never shows: window mode folds it.
            let role = match i % 7 {
                0 => Role::Tool,
                r if r % 2 == 1 => Role::User,
                _ => Role::Assistant,
            };
            f.push(
                role,
                &format!("message {i}: {}", "words and more words ".repeat(12)),
            );
            let fr = context_freshness(&mut f, "s", &c, u32::MAX, req.budget).unwrap();
            if fr.state == FreshState::Due {
                folds += 1;
                catch_up(&mut f, "s", &c, Reach::to(fr.fold_upto)).unwrap();
            }
            let w = context(&mut f, "s", req.clone(), &c).unwrap();
            assert!(
                w.window.omitted_ranges.is_empty(),
                "{mode:?} turn {i}: {:?} (fold_upto {})",
                w.window.omitted_ranges,
                fr.fold_upto
            );
            assert!(w.window.tokens <= req.budget, "{mode:?} turn {i}");
            // The newest message is always verbatim (when the context shows its kind).
            if role != Role::Tool {
                assert!(
                    context_text(&w).contains(&format!("message {i}:")),
                    "{mode:?} turn {i}"
                );
            }
        }
        assert!(folds >= 2, "{mode:?}: {folds}");
        if mode == policy::Mode::Window {
            // Each fold takes a batch (from the tail's high-water mark down to its low-water
            // mark), more than one message on average, even of a context this small.
            assert!(folds * 3 <= 40 * 2, "{folds} folds for 40 messages");
        }
        // Without a budget nothing is due below the threshold.
        let fr = context_freshness(&mut f, "s", &c, u32::MAX, 0).unwrap();
        assert_ne!(fr.state, FreshState::Due, "{mode:?}");
    }
}

#[test]
fn a_newest_message_larger_than_the_context_is_folded_into_the_summary() {
    let mut f = Fake::default();
    let c = Config {
        mode: policy::Mode::Window,
        threshold_tokens: 1_000_000,
        ..cfg()
    };
    f.push(Role::User, "please review the attached log");
    let big = (0..200)
        .map(|i| format!("Sentence number {i} talks about the rollout plan."))
        .collect::<Vec<_>>()
        .join(" ");
    f.push(Role::Assistant, &big);
    let fr = context_freshness(&mut f, "s", &c, u32::MAX, 600).unwrap();
    assert_eq!(fr.state, FreshState::Due, "{}", fr.reason);
    assert_eq!(fr.fold_upto, 2);
    catch_up(&mut f, "s", &c, Reach::to(fr.fold_upto)).unwrap();
    let req = ContextRequest {
        query: None,
        budget: 600,
        pairs: 4,
        refresh_after: u32::MAX,
        pins: vec![],
    };
    let w = context(&mut f, "s", req, &c).unwrap();
    assert_eq!(w.window.covered_from, 1);
    assert!(
        w.window.omitted_ranges.is_empty(),
        "{:?}",
        w.window.omitted_ranges
    );
    assert!(w.window.covered >= 2);
}

#[test]
fn rows_the_offline_summarizer_wrote_are_rewritten_by_the_model_keeping_their_ranges() {
    let mut f = Fake::default();
    let offline = Config {
        engine: Engine::Extractive,
        max_summary_tokens: 5,
        ..cfg()
    };
    // Three rounds offline: each row is full at once, so each round starts a new row.
    for round in 0..3 {
        for i in 0..10 {
            let id = round * 10 + i + 1;
            let role = if i % 2 == 0 {
                Role::User
            } else {
                Role::Assistant
            };
            f.push(role, &format!("ep{id} {}", "word ".repeat(40)));
        }
        summarize_now(&mut f, "s", &offline).unwrap();
    }
    let before: Vec<(u64, u64, u64)> = f
        .rows
        .iter()
        .map(|r| (r.id, r.first_episode, r.last_episode))
        .collect();
    assert!(before.len() >= 2, "{before:?}");
    assert!(f.rows.iter().all(|r| r.model == FALLBACK_MODEL));
    assert!(f.requests.is_empty());
    // Without a model nothing is due; with one, the offline rows make the session due.
    let fr = freshness(&mut f, "s", &offline).unwrap();
    assert_eq!((fr.state, fr.fallback_rows), (FreshState::Fresh, 0));
    let model = cfg();
    let fr = freshness(&mut f, "s", &model).unwrap();
    assert_eq!(fr.state, FreshState::Due, "{}", fr.reason);
    assert_eq!(fr.fallback_rows as usize, before.len());
    assert!(fr.reason.contains("offline summarizer"), "{}", fr.reason);
    // The next refresh rewrites each row in place: same ids, same ranges, the model's text.
    let out = refresh(&mut f, "s", &model).unwrap();
    assert!(out.triggered);
    let after: Vec<(u64, u64, u64)> = f
        .rows
        .iter()
        .map(|r| (r.id, r.first_episode, r.last_episode))
        .collect();
    assert_eq!(after, before);
    assert!(
        f.rows.iter().all(|r| r.model == model.model),
        "{:?}",
        f.rows
    );
    assert_eq!(f.requests.len(), before.len(), "one fresh summary per row");
    // Each request saw exactly its row's episodes.
    for (req, (_, a, b)) in f.requests.iter().zip(&before) {
        let p = Fake::prompt_text(req);
        assert!(
            p.contains(&format!("ep{a} ")) || p.contains(&format!("ep{a}\n")),
            "{p}"
        );
        assert!(!p.contains(&format!("ep{} ", b + 1)), "{p}");
    }
    // And then it is fresh; new episodes fold into the model's rows as usual.
    let fr = freshness(&mut f, "s", &model).unwrap();
    assert_eq!((fr.state, fr.fallback_rows), (FreshState::Fresh, 0));
}

#[test]
fn a_coding_session_keeps_its_digest_through_folds_and_shows_it_in_the_context() {
    use crate::digest::{action_line, failure_line};
    let mut f = Fake::forgetful();
    let c = Config {
        min_episodes_since: 2,
        threshold_tokens: 0,
        ..cfg()
    };
    f.push(
        Role::User,
        "Rule: never push to main. Fix the flaky checkout test.",
    );
    f.push(Role::Assistant, "Looking at it.");
    for i in 1..=30 {
        f.push(
            Role::Tool,
            &action_line("Read", Some(&format!("src/mod{i}.rs"))),
        );
        f.push(
            Role::Tool,
            &action_line("Edit", Some(&format!("src/mod{i}.rs"))),
        );
        f.push(Role::Assistant, &format!("Changed module {i}."));
        after_episode_written(&mut f, "s", &c).unwrap();
    }
    f.push(Role::Tool, &action_line("Bash", Some("cargo test")));
    f.push(
        Role::Tool,
        &failure_line(
            &action_line("Bash", Some("cargo test")),
            "error: test checkout_retries failed",
        ),
    );
    f.push(
        Role::User,
        "Now make the retry count configurable, default 3.",
    );
    // The rows carry the digest; the model's prose (which keeps only the last exchange) does not.
    assert!(
        f.rows
            .iter()
            .any(|r| crate::digest::is_coding(&r.ledger.entries))
    );
    let req = ContextRequest {
        query: None,
        budget: 1000,
        pairs: 1,
        refresh_after: u32::MAX,
        pins: vec![],
    };
    let w = context(&mut f, "s", req, &c).unwrap();
    let text = context_text(&w);
    assert_parts_add_up(&w);
    assert!(w.window.parts.digest > 0, "{:?}", w.window.parts);
    // The history does not fit, so the digest stands for what the context leaves out.
    assert!(
        w.window.tokens <= 1000 && u64::from(w.window.tokens) < w.full_tokens,
        "{} of {}",
        w.window.tokens,
        w.full_tokens
    );
    assert!(
        text.contains("Latest request (#")
            && text.contains("Now make the retry count configurable, default 3."),
        "{text}"
    );
    assert!(
        text.contains("First request (#1): Rule: never push to main. Fix the flaky checkout test."),
        "{text}"
    );
    for i in 1..=30 {
        assert!(
            text.contains(&format!("src/mod{i}.rs (#")),
            "src/mod{i}.rs missing: {text}"
        );
    }
    assert!(
        text.contains("Unresolved error (#")
            && text.contains("error: test checkout_retries failed"),
        "{text}"
    );
}

#[test]
fn the_offline_summary_of_a_coding_session_is_its_digest() {
    use crate::digest::action_line;
    let mut f = Fake::default();
    let c = Config {
        engine: Engine::Extractive,
        ..cfg()
    };
    f.push(Role::User, "Add a --json flag to the status command.");
    f.push(Role::Assistant, "Pros: easy. Cons: none.");
    f.push(Role::Tool, &action_line("Edit", Some("src/cli/status.rs")));
    f.push(Role::Tool, &action_line("Bash", Some("cargo test status")));
    f.push(
        Role::Assistant,
        "Done: status --json prints one object per session.",
    );
    summarize_now(&mut f, "s", &c).unwrap();
    let row = &f.rows[0];
    assert!(
        row.content.starts_with(crate::digest::HEADING),
        "{}",
        row.content
    );
    assert!(
        row.content
            .contains("Latest request (#1): Add a --json flag to the status command.")
    );
    assert!(row.content.contains("Files edited: src/cli/status.rs (#3)"));
    assert!(
        row.content
            .contains("Commands (newest first): Bash: cargo test status (#4)")
    );
}

/// A context never costs more than the raw history: when the whole history fits the budget
/// and is cheaper than the summary with the recent turns, the history is returned as it is;
/// otherwise the summary serves.
#[test]
fn a_context_never_costs_more_than_the_history_it_stands_for() {
    let mut f = Fake::with_episodes(10, 3);
    let long = "the planning covered many details at great length ".repeat(30);
    f.rows
        .push(SummaryRow::plain(1, 1, 6, &long, estimate_tokens(&long)));
    let req = ContextRequest {
        query: None,
        budget: 2000,
        pairs: 2,
        refresh_after: u32::MAX,
        pins: vec![],
    };
    let w = context(&mut f, "s", req.clone(), &cfg()).unwrap();
    assert_eq!(w.window.messages.len(), 10, "{:?}", w.window.messages);
    assert!(w.window.messages.iter().all(|m| m.role != Role::System));
    assert_eq!(u64::from(w.window.tokens), w.full_tokens);
    assert_eq!((w.window.omitted, w.window.covered_from), (0, 1));
    // A budget the history does not fit: the summary and the recent turns, as before.
    let small = ContextRequest {
        budget: 60,
        ..req.clone()
    };
    let w = context(&mut f, "s", small, &cfg()).unwrap();
    assert!(u64::from(w.window.tokens) <= 60);
    assert!(w.window.messages.len() < 10);
    // Even beside a short summary, a history that fits is the context, verbatim: the budget
    // is there to be spent, and nothing said is lost to a summary.
    f.rows[0] = SummaryRow::plain(1, 1, 6, "Planned the deploy.", 5);
    let w = context(&mut f, "s", req, &cfg()).unwrap();
    assert!(w.window.messages.iter().all(|m| m.role != Role::System));
    assert_eq!(u64::from(w.window.tokens), w.full_tokens);
}

/// A long chat over many dated sessions, facts planted among small talk: a context of a
/// small budget must hold the facts (and the day each was said, with relative dates
/// resolved), spend most of its budget, and never cost more than it.
#[test]
fn a_long_dated_chat_keeps_its_planted_facts_in_a_small_context() {
    const DAY: u64 = 86_400_000;
    let start = 1_683_554_160_000u64; // 8 May 2023, 13:56 UTC
    let small_talk = [
        "Wow, that sounds amazing!",
        "Thanks so much, that means a lot to me.",
        "Haha, totally agree with you.",
        "Good to see you again!",
        "That's so cool, I love that.",
        "Awesome, glad to hear it.",
    ];
    let facts = [
        "I adopted a beagle called Pepper from the Riverside shelter yesterday.",
        "My sister Mara moved to Lisbon for a job at the aquarium.",
        "I finished the Ashford half marathon in 2 hours 14 minutes last Saturday.",
        "We booked a cabin at Lake Tahoe for the second week of August.",
        "I started pottery classes at the Clayhouse studio on Pine Street.",
        "My grandmother turned 90 and we threw a party at the Harbor Inn.",
        "I signed up for a Spanish course at the community college downtown.",
        "Our band Static Tides plays at the Blue Lantern next month.",
    ];
    let mut f = Fake::default();
    for (session, fact) in facts.iter().enumerate() {
        let at = start + session as u64 * 9 * DAY;
        for turn in 0..24u64 {
            let role = if turn % 2 == 0 {
                Role::User
            } else {
                Role::Assistant
            };
            let text = if turn == 11 {
                (*fact).to_string()
            } else {
                small_talk[(turn as usize + session) % small_talk.len()].to_string()
            };
            f.push_at(role, &text, at + turn * 60_000);
        }
    }
    let c = Config {
        engine: Engine::Extractive,
        ..cfg()
    };
    summarize_now(&mut f, "s", &c).unwrap();
    // The stable head's share of 550 tokens holds every planted fact (its lines and its
    // ledger); the turns since the fold take the rest.
    let budget = 700;
    let req = ContextRequest {
        query: None,
        budget,
        pairs: 2,
        refresh_after: u32::MAX,
        pins: vec![],
    };
    let w = context(&mut f, "s", req, &c).unwrap();
    let text: String = w
        .window
        .messages
        .iter()
        .map(|m| m.content.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(w.window.tokens <= budget, "{} > {budget}", w.window.tokens);
    // At least the low-water mark: the stable head's share.
    assert!(
        w.window.tokens * 100 >= budget * crate::context::head_share(c.engine),
        "{} of {budget} used:\n{text}",
        w.window.tokens
    );
    for planted in [
        "Pepper",
        "Lisbon",
        "Ashford",
        "Tahoe",
        "Clayhouse",
        "Harbor Inn",
        "Spanish",
        "Static Tides",
    ] {
        assert!(text.contains(planted), "{planted} left out:\n{text}");
    }
    // The day each fact was said, and its relative dates resolved against it.
    assert!(text.contains("yesterday (= 7 May 2023)"), "{text}");
    assert!(text.contains("last Saturday (= 20 May 2023)"), "{text}");
    assert_parts_add_up(&w);
    assert!(w.window.parts.summary > 0 && w.window.parts.recent > 0 && w.window.parts.days > 0);
    for praise in ["Wow, that sounds amazing", "Thanks so much"] {
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("- ") && l.contains(praise)),
            "small talk chosen:\n{text}"
        );
    }
}

/// Posted messages no fold has covered yet (a service's hot path runs no fold inline): a
/// context that cannot show them verbatim still carries their identifiers and sentences, and
/// the verdict it is read with makes the fold due.
#[test]
fn a_context_before_any_fold_keeps_the_identifiers_of_what_it_cannot_show() {
    let mut f = Fake::forgetful();
    let c = Config {
        mode: policy::Mode::Window,
        ..Config::default()
    };
    for i in 1..=60 {
        let text = if i == 8 {
            "The outage is tracked as INC-4471; the on-call lead is Priya Raman in Toronto."
                .to_string()
        } else {
            format!(
                "Message {i}: we went over the release checklist again and it still looks fine to everyone here."
            )
        };
        f.push(
            if i % 2 == 1 {
                Role::User
            } else {
                Role::Assistant
            },
            &text,
        );
    }
    let req = ContextRequest {
        query: None,
        budget: 1500,
        pairs: 4,
        refresh_after: u32::MAX,
        pins: vec![],
    };
    let w = context(&mut f, "s", req, &c).unwrap();
    let text = context_text(&w);
    assert!(
        w.window.tokens <= 1500 && w.window.omitted > 0,
        "{:?}",
        w.window
    );
    assert!(f.requests.is_empty(), "no model call on the hot path");
    for planted in ["INC-4471", "Priya Raman", "Toronto"] {
        assert!(text.contains(planted), "{planted} left out:\n{text}");
    }
    assert!(w.window.identifiers >= 3, "{:?}", w.window);
    assert_parts_add_up(&w);
    // The verdict a context of this budget is read with: the fold is due.
    let v = context_freshness(&mut f, "s", &c, u32::MAX, 1500).unwrap();
    assert_eq!(v.state, FreshState::Due, "{v:?}");
    assert!(v.fold_upto >= 8, "{v:?}");
}

#[test]
fn a_models_chain_is_read_at_the_finest_level_that_fits() {
    let row = |id, first, last, tokens, level, into: Option<u64>| {
        let mut r = SummaryRow::plain(id, first, last, &format!("rows {first}-{last}"), tokens);
        r.level = level;
        r.compacted_into = into;
        r
    };
    let history = vec![
        row(1, 1, 10, 100, 0, Some(5)),
        row(2, 11, 20, 100, 0, Some(5)),
        row(3, 21, 30, 100, 0, Some(6)),
        row(4, 31, 40, 100, 0, Some(6)),
        row(5, 1, 20, 60, 1, Some(7)),
        row(6, 21, 40, 60, 1, Some(7)),
        row(7, 1, 40, 40, 2, None),
    ];
    let active = vec![history[6].clone()];
    let ids = |rows: Vec<SummaryRow>| rows.iter().map(|r| r.id).collect::<Vec<_>>();
    let cost = |ids: &[u64]| {
        chain_tokens(
            &history
                .iter()
                .filter(|r| ids.contains(&r.id))
                .cloned()
                .collect::<Vec<_>>(),
        )
    };
    assert_eq!(
        ids(finer_rows_within(&active, &history, cost(&[5, 6]) - 1)),
        [7]
    );
    assert_eq!(
        ids(finer_rows_within(&active, &history, cost(&[5, 6]))),
        [5, 6]
    );
    // The newest part is read finer first.
    assert_eq!(
        ids(finer_rows_within(&active, &history, cost(&[5, 3, 4]))),
        [5, 3, 4]
    );
    assert_eq!(
        ids(finer_rows_within(&active, &history, cost(&[1, 2, 3, 4]))),
        [1, 2, 3, 4]
    );
    assert_eq!(ids(finest_rows(&active, &history)), [1, 2, 3, 4]);
}

/// Window mode with a model, a context read after every message of a chat that crosses
/// midnight: neither the day marks nor the ledger ever cost a message (every one is
/// summarized or shown).
#[test]
fn neither_day_marks_nor_the_ledger_cost_a_message() {
    let mut f = Fake::forgetful();
    let c = Config {
        mode: policy::Mode::Window,
        ..Config::default()
    };
    let start = 1_767_222_000_000u64; // 31 December 2025, 23:00 UTC
    let req = ContextRequest {
        query: None,
        budget: 6000,
        pairs: 4,
        refresh_after: u32::MAX,
        pins: vec![],
    };
    let mut missing = 0;
    let mut marked = false;
    for i in 0..200u64 {
        let text = if i % 2 == 0 {
            format!(
                "Can you check why job {} in services/worker{}/queue.rs retries {} times before it gives up? It started after release v3.{}.0.",
                i * 13,
                i % 9,
                3 + i % 4,
                i % 17
            )
        } else {
            format!(
                "The retry loop reads its limit from the environment, so the deploy on 2026-{:02}-{:02} changed it: the old value was {} and the new one is {}. I would set it back, add a test that pins the limit, and watch the p99 latency, which went from {} ms to {} ms after that release. Ticket OPS-{} tracks the follow-up.",
                1 + i % 12,
                1 + i % 28,
                3 + i % 4,
                5 + i % 4,
                120 + i,
                180 + i,
                400 + i
            )
        };
        f.push_at(
            if i % 2 == 0 {
                Role::User
            } else {
                Role::Assistant
            },
            &text,
            start + i * 60_000,
        );
        f.now = start + i * 60_000;
        after_episode_written(&mut f, "s", &c).unwrap();
        // As every front end does: the fold a context of this budget makes due runs first.
        let fr = context_freshness(&mut f, "s", &c, u32::MAX, req.budget).unwrap();
        if fr.state == FreshState::Due {
            catch_up(&mut f, "s", &c, Reach::to(fr.fold_upto)).unwrap();
        }
        let w = context(&mut f, "s", req.clone(), &c).unwrap();
        assert!(w.window.tokens <= 6000);
        missing += w.window.omitted;
        marked |= w.window.parts.days > 0;
    }
    assert!(
        marked,
        "the history crosses midnight: some context marks a day"
    );
    assert_eq!(missing, 0);
}

#[test]
fn a_call_up_to_a_target_plans_and_reports_that_target_only() {
    let c = Config {
        context_length: 1024,
        max_output_tokens: 200,
        ..cfg()
    };
    let mut f = Fake::with_episodes(60, 100);
    catch_up_to(&mut f, "s", &c, 40).unwrap();
    f.assert_chain();
    assert_eq!(f.rows.last().unwrap().last_episode, 40);
    let [(plan, 0)] = f.plans.as_slice() else {
        panic!("one plan before any model call: {:?}", f.plans);
    };
    assert_eq!((plan.path, plan.episodes), (PlanPath::MapReduce, 40));
    // The rest, planned from where the chain stands: a summarized session's new part.
    let before = f.requests.len();
    catch_up_to(&mut f, "s", &c, u64::MAX).unwrap();
    let (next, at) = f.plans.last().unwrap();
    assert_eq!((next.episodes, *at), (20, before));
    assert_ne!(next.path, PlanPath::Nothing);
    // Nothing left: the plan says so and no model is called.
    let before = f.requests.len();
    catch_up_to(&mut f, "s", &c, u64::MAX).unwrap();
    assert_eq!(f.plans.last().unwrap().0.path, PlanPath::Nothing);
    assert_eq!(f.requests.len(), before);
}

#[test]
fn a_coding_sessions_tool_calls_make_no_fold_due_and_its_turns_append_to_one_prefix() {
    use crate::digest::action_line;
    let mut f = Fake::default();
    let c = Config {
        mode: policy::Mode::Window,
        engine: Engine::Extractive,
        threshold_tokens: 1_000_000,
        ..cfg()
    };
    f.push(
        Role::User,
        "Rule: keep the public API stable. Add retries to fetch.",
    );
    for i in 1..=12 {
        f.push(
            Role::Tool,
            &action_line("Edit", Some(&format!("src/net{i}.rs"))),
        );
        f.push(
            Role::Assistant,
            &format!(
                "Changed src/net{i}.rs: the retry loop now backs off {i} times. {}",
                "The old loop gave up at once. ".repeat(30)
            ),
        );
    }
    summarize_now(&mut f, "s", &c).unwrap();
    assert!(crate::digest::is_coding(
        &f.rows.last().unwrap().ledger.entries
    ));
    let budget = 2000;
    let read = |f: &mut Fake| {
        let req = ContextRequest {
            query: None,
            budget,
            pairs: 4,
            refresh_after: u32::MAX,
            pins: vec![],
        };
        context(f, "s", req, &c).unwrap()
    };
    // Tool calls after the fold are in the digest the context carries: nothing is due for
    // them (a chat's tool output would be folded), and each context begins with the one
    // before until the turns since the fold pass the coding high-water mark.
    let mut before: Option<ContextWindow> = None;
    let mut n = 0;
    loop {
        n += 1;
        f.push(
            Role::Tool,
            &action_line("Bash", Some(&format!("cargo test net{n}"))),
        );
        f.push(
            Role::User,
            &format!("Step {n}: now handle timeouts in module {n} too."),
        );
        f.push(
            Role::Assistant,
            &format!(
                "Done with step {n}: timeouts in module {n} retry like the rest. {}",
                "ok ".repeat(20)
            ),
        );
        let fr = context_freshness(&mut f, "s", &c, u32::MAX, budget).unwrap();
        if fr.state == FreshState::Due {
            // The turns since the fold made it due, at the coding high-water mark.
            let high = crate::context::tail_high(c.engine, true);
            assert_eq!(
                high,
                100 - crate::context::HEAD_SHARE_CODING - crate::context::DIGEST_ROOM
            );
            assert!(fr.reason.contains(&format!("{high} %")), "{}", fr.reason);
            break;
        }
        let w = read(&mut f);
        assert!(w.window.tokens <= budget);
        assert!(w.window.parts.digest > 0, "{:?}", w.window.parts);
        let text = context_text(&w);
        assert!(
            text.contains(&format!(
                "Latest request (#{}): Step {n}:",
                f.episodes.len() - 1
            )),
            "{text}"
        );
        if let Some(b) = &before {
            let k = b.window.stable.messages as usize;
            assert!(k > 0);
            assert_eq!(
                w.window.messages[..k],
                b.window.messages[..k],
                "call {n} rewrote the prefix"
            );
        }
        before = Some(w);
        assert!(n < 100, "never due");
    }
    assert!(
        n > 5,
        "due after {n} calls: a coding session folds in batches"
    );
}
