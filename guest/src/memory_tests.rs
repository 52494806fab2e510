//! The memory decisions against an in-memory host whose model restates the facts it is given.

use std::collections::BTreeMap;

use super::*;
use crate::types::Prompt;

struct Row {
    m: Memory,
    vector: Vec<f32>,
    model: String,
    fact_key: String,
}

#[derive(Default)]
struct Fake {
    rows: Vec<Row>,
    next_cluster: u64,
    clusters: BTreeMap<u64, Scope>,
    summaries: BTreeMap<u64, (ClusterSummary, Vec<f32>)>,
    notes: BTreeMap<u64, String>,
    next_summary: u64,
    prompts: Vec<String>,
    /// Text the model answers with instead of restating (an off-topic model).
    canned: Option<String>,
    /// Answer with the option numbers the prompt names (a model that condenses).
    condense: bool,
    /// A rival writer's summary slipped in before the next write.
    rival: bool,
    now: u64,
    /// The last `seq` given.
    seq: u64,
    /// Membership versions by cluster.
    versions: BTreeMap<u64, u64>,
    /// Member rows the store handed out (what a summarize run read).
    read: usize,
    /// The cluster's membership changes just before the next summary write.
    sneak: bool,
}

impl Fake {
    fn of(&self, cluster: u64) -> impl Iterator<Item = &Row> {
        self.rows.iter().filter(move |r| r.m.cluster == cluster)
    }
    fn bump(&mut self, cluster: u64) {
        *self.versions.entry(cluster).or_default() += 1;
    }
}

fn prompt_text(r: &Request) -> String {
    match &r.prompt {
        Prompt::Chat(ms) => ms
            .iter()
            .map(|m| m.content.clone())
            .collect::<Vec<_>>()
            .join("\n"),
        Prompt::Raw(s) => s.clone(),
    }
}

/// A model that restates: the current summary (if any), then every fact or partial.
fn restate(p: &str) -> String {
    let mut out = Vec::new();
    let mut in_summary = false;
    for line in p.lines() {
        if line.starts_with("Current summary:") {
            in_summary = true;
            continue;
        }
        if line.is_empty() {
            in_summary = false;
        }
        if in_summary {
            out.push(line.trim().to_string());
        } else if let Some(f) = line.strip_prefix("- ") {
            out.push(f.trim_end_matches('.').to_string() + ".");
        }
    }
    if p.contains("Partial summaries:") {
        for block in p.split("Part ").skip(1) {
            if let Some((_, t)) = block.split_once(":\n") {
                out.push(t.split("\n\n").next().unwrap_or("").trim().to_string());
            }
        }
    }
    out.join(" ")
}

/// "Alice set editor options 1, 2, 3 for the dark theme.": the numbers after "number " or
/// after "options " in the prompt.
fn condensed(p: &str) -> String {
    let mut nums: Vec<u32> = Vec::new();
    for (i, _) in p.match_indices("number ") {
        let n: String = p[i + 7..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        nums.extend(n.parse::<u32>().ok());
    }
    for (i, _) in p.match_indices("options ") {
        let rest = &p[i + 8..];
        let list = rest.split(" for").next().unwrap_or("");
        nums.extend(list.split(", ").filter_map(|n| n.parse::<u32>().ok()));
    }
    nums.sort_unstable();
    nums.dedup();
    let list: Vec<String> = nums.iter().map(u32::to_string).collect();
    format!(
        "Alice set editor options {} for the dark theme.",
        list.join(", ")
    )
}

impl MemoryHost for Fake {
    fn embed(&mut self, texts: &[String]) -> Result<Embedding, Error> {
        Ok(Embedding {
            model: "other".into(),
            dim: 8,
            vectors: texts.iter().map(|t| embed::lexical(t, 8)).collect(),
            tokens: 0,
        })
    }
    fn centroids(&mut self, scope: &Scope) -> Result<Vec<Centroid>, Error> {
        let mut out = Vec::new();
        for (&id, s) in &self.clusters {
            if s != scope {
                continue;
            }
            let rows: Vec<&Row> = self.rows.iter().filter(|r| r.m.cluster == id).collect();
            if rows.is_empty() {
                continue;
            }
            let dim = rows[0].vector.len();
            let mut v = vec![0f32; dim];
            for r in &rows {
                for (x, y) in v.iter_mut().zip(&r.vector) {
                    *x += y;
                }
            }
            for x in &mut v {
                *x /= rows.len() as f32;
            }
            out.push(Centroid {
                cluster: id,
                model: rows[0].model.clone(),
                vector: v,
                members: rows.len() as u32,
            });
        }
        Ok(out)
    }
    fn put_memory(&mut self, m: NewMemory) -> Result<Stored, Error> {
        if let Some(r) = self.rows.iter().find(|r| r.m.id == m.id) {
            let c = r.m.cluster;
            let n = self.rows.iter().filter(|r| r.m.cluster == c).count() as u32;
            return Ok(Stored {
                cluster: c,
                created: false,
                members: n,
                superseded: None,
            });
        }
        let cluster = m.cluster.unwrap_or_else(|| {
            self.next_cluster += 1;
            self.clusters.insert(self.next_cluster, m.scope.clone());
            self.next_cluster
        });
        let (fk, named) = (m.fact_key.as_str(), m.replaces.as_deref());
        let superseded = match (fk, named) {
            ("", None) => None,
            _ => self
                .rows
                .iter_mut()
                .rev()
                .find(|r| {
                    r.m.scope == m.scope
                        && r.m.superseded_by.is_none()
                        && named.map_or(r.fact_key == fk, |n| r.m.id == n)
                })
                .map(|r| {
                    r.m.superseded_by = Some(m.id.clone());
                    r.m.superseded_ms = m.created_ms;
                    r.m.id.clone()
                }),
        };
        self.rows.push(Row {
            m: Memory {
                id: m.id,
                scope: m.scope,
                text: m.text,
                importance: m.importance,
                tokens: m.tokens,
                created_ms: m.created_ms,
                cluster,
                seq: {
                    self.seq += 1;
                    self.seq
                },
                supersedes: superseded.clone(),
                superseded_by: None,
                superseded_ms: 0,
            },
            vector: m.vector,
            model: m.model,
            fact_key: m.fact_key,
        });
        self.bump(cluster);
        let n = self.rows.iter().filter(|r| r.m.cluster == cluster).count() as u32;
        Ok(Stored {
            cluster,
            created: true,
            members: n,
            superseded,
        })
    }
    fn current_memory(&mut self, scope: &Scope, fact_key: &str) -> Result<Option<Memory>, Error> {
        Ok(self
            .rows
            .iter()
            .rev()
            .find(|r| &r.m.scope == scope && r.fact_key == fact_key && r.m.superseded_by.is_none())
            .map(|r| r.m.clone()))
    }
    fn get_memory(&mut self, id: &str) -> Result<Option<Memory>, Error> {
        Ok(self.rows.iter().find(|r| r.m.id == id).map(|r| r.m.clone()))
    }
    fn members_after(&mut self, cluster: u64, after_seq: u64) -> Result<MemberSet, Error> {
        let members: Vec<Memory> = self
            .of(cluster)
            .filter(|r| r.m.seq > after_seq)
            .map(|r| r.m.clone())
            .collect();
        self.read += members.len();
        Ok(MemberSet {
            version: self.versions.get(&cluster).copied().unwrap_or(0),
            count: self.of(cluster).count() as u32,
            members,
        })
    }
    fn top_members(&mut self, cluster: u64, offset: u32, limit: u32) -> Result<Vec<Memory>, Error> {
        let mut all: Vec<Memory> = self.of(cluster).map(|r| r.m.clone()).collect();
        rank_order(&mut all);
        let page: Vec<Memory> = all
            .into_iter()
            .skip(offset as usize)
            .take(limit as usize)
            .collect();
        self.read += page.len();
        Ok(page)
    }
    fn member_ids(&mut self, cluster: u64, upto_seq: u64) -> Result<Vec<String>, Error> {
        Ok(self
            .of(cluster)
            .filter(|r| r.m.seq <= upto_seq)
            .map(|r| r.m.id.clone())
            .collect())
    }
    fn delete_memory(&mut self, id: &str) -> Result<Option<Memory>, Error> {
        let i = self.rows.iter().position(|r| r.m.id == id);
        let gone = i.map(|i| self.rows.remove(i).m);
        if let Some(m) = &gone {
            self.bump(m.cluster);
            for r in &mut self.rows {
                if r.m.superseded_by.as_deref() == Some(id) {
                    r.m.superseded_by = None;
                    r.m.superseded_ms = 0;
                }
            }
        }
        Ok(gone)
    }
    fn set_vectors(
        &mut self,
        cluster: u64,
        model: &str,
        vectors: Vec<(String, Vec<f32>)>,
    ) -> Result<(), Error> {
        for (id, v) in vectors {
            let r = self.rows.iter_mut().find(|r| r.m.id == id).unwrap();
            r.vector = v;
            r.model = model.into();
        }
        self.bump(cluster);
        Ok(())
    }
    fn summary(&mut self, cluster: u64) -> Result<Option<ClusterSummary>, Error> {
        Ok(self.summaries.get(&cluster).map(|s| s.0.clone()))
    }
    fn write_summary(&mut self, w: SummaryWrite) -> Result<bool, Error> {
        if std::mem::take(&mut self.sneak) {
            self.bump(w.cluster);
        }
        if self.rival {
            self.rival = false;
            self.next_summary += 1;
            let mut s = self
                .summaries
                .get(&w.cluster)
                .map(|s| s.0.clone())
                .unwrap_or(ClusterSummary {
                    id: self.next_summary,
                    cluster: w.cluster,
                    text: "rival".into(),
                    member_hash: String::new(),
                    covered_seq: 0,
                    covered: 0,
                    importance: 0.0,
                    tokens: 1,
                    model: "m".into(),
                    calls: 1,
                    prompt_tokens: 0,
                    output_tokens: 0,
                    created_ms: 0,
                    updated_ms: 0,
                });
            s.member_hash = w.member_hash.clone();
            s.covered_seq = w.covered_seq;
            s.covered = w.covered;
            self.summaries.insert(w.cluster, (s, Vec::new()));
        }
        let cur = self
            .summaries
            .get(&w.cluster)
            .map(|s| s.0.member_hash.clone());
        if cur != w.expect || self.versions.get(&w.cluster).copied().unwrap_or(0) != w.version {
            return Ok(false);
        }
        let id = match self.summaries.get(&w.cluster) {
            Some(s) => s.0.id,
            None => {
                self.next_summary += 1;
                self.next_summary
            }
        };
        self.summaries.insert(
            w.cluster,
            (
                ClusterSummary {
                    id,
                    cluster: w.cluster,
                    text: w.text,
                    member_hash: w.member_hash,
                    covered_seq: w.covered_seq,
                    covered: w.covered,
                    importance: w.importance,
                    tokens: w.tokens,
                    model: w.model,
                    calls: w.calls,
                    prompt_tokens: w.prompt_tokens,
                    output_tokens: w.output_tokens,
                    created_ms: w.now_ms,
                    updated_ms: w.now_ms,
                },
                w.vector,
            ),
        );
        Ok(true)
    }
    fn delete_summary(&mut self, cluster: u64) -> Result<(), Error> {
        self.summaries.remove(&cluster);
        Ok(())
    }
    fn set_cluster_note(&mut self, cluster: u64, note: Option<String>) -> Result<(), Error> {
        match note {
            Some(n) => self.notes.insert(cluster, n),
            None => self.notes.remove(&cluster),
        };
        Ok(())
    }
    fn search(
        &mut self,
        query: &[f32],
        _model: &str,
        filter: &Filter,
        limit: u32,
    ) -> Result<Vec<Hit>, Error> {
        let ok = |s: &Scope| filter.user.as_ref().is_none_or(|u| *u == s.user);
        let mut hits: Vec<Hit> = self
            .rows
            .iter()
            .filter(|r| ok(&r.m.scope))
            .map(|r| Hit {
                kind: HitKind::Memory,
                id: r.m.id.clone(),
                text: r.m.text.clone(),
                similarity: cosine(query, &r.vector),
                importance: r.m.importance,
                cluster: r.m.cluster,
                covered_seq: 0,
                covered: 0,
                superseded_by: r.m.superseded_by.clone(),
                superseded_ms: r.m.superseded_ms,
            })
            .collect();
        for (s, v) in self.summaries.values() {
            if ok(&self.clusters[&s.cluster]) {
                hits.push(Hit {
                    kind: HitKind::Summary,
                    id: s.id.to_string(),
                    text: s.text.clone(),
                    similarity: cosine(query, v),
                    importance: s.importance,
                    cluster: s.cluster,
                    covered_seq: s.covered_seq,
                    covered: s.covered,
                    superseded_by: None,
                    superseded_ms: 0,
                });
            }
        }
        hits.sort_by(|a, b| b.similarity.total_cmp(&a.similarity));
        hits.truncate(limit as usize * 2);
        Ok(hits)
    }
    fn generate_batch(&mut self, reqs: Vec<Request>) -> Vec<Result<Response, Error>> {
        reqs.iter()
            .map(|r| {
                let p = prompt_text(r);
                self.prompts.push(p.clone());
                if self.condense {
                    return Ok(answer(&condensed(&p)));
                }
                Ok(answer(self.canned.as_deref().unwrap_or(&restate(&p))))
            })
            .collect()
    }
    fn now_ms(&mut self) -> u64 {
        self.now += 1;
        self.now
    }
    fn log(&mut self, _: Level, _: &str) {}
}

fn scope(key: &str) -> Scope {
    Scope {
        user: "alice".into(),
        project: "web".into(),
        environment: "prod".into(),
        kind: "preference".into(),
        key: key.into(),
    }
}

fn mem(id: &str, key: &str, text: &str) -> MemoryIn {
    MemoryIn {
        id: id.into(),
        scope: scope(key),
        text: text.into(),
        importance: 0.5,
        replaces: None,
    }
}

fn llm() -> Config {
    Config {
        model: "m".into(),
        ..Config::default()
    }
}

const EDITOR: [&str; 5] = [
    "Alice prefers the dark theme in her editor",
    "Alice uses a dark theme with large fonts in the editor",
    "Alice wants the editor theme dark at night",
    "Alice likes a dark editor theme with high contrast",
    "Alice switched the editor theme to dark",
];

fn three(h: &mut Fake, cfg: &MemoryConfig) -> Vec<Remembered> {
    let items: Vec<MemoryIn> = EDITOR[..3]
        .iter()
        .enumerate()
        .map(|(i, t)| mem(&format!("m{}", i + 1), "editor", t))
        .collect();
    remember(h, &items, cfg).unwrap()
}

/// The order `top-members` returns a cluster's members in: importance (highest first), then
/// oldest, then id.
fn rank_order(members: &mut [Memory]) {
    members.sort_by(|a, b| {
        b.importance
            .total_cmp(&a.importance)
            .then(a.created_ms.cmp(&b.created_ms))
            .then(a.id.cmp(&b.id))
    });
}

/// A summary's sources as a host reads them.
fn sources(h: &mut Fake, s: &ClusterSummary) -> Vec<String> {
    h.member_ids(s.cluster, s.covered_seq).unwrap()
}

#[test]
fn three_related_facts_make_one_due_cluster() {
    let (mut h, cfg) = (Fake::default(), MemoryConfig::default());
    let r = three(&mut h, &cfg);
    assert!(r.iter().all(|x| x.cluster == r[0].cluster), "{r:?}");
    assert_eq!(
        r.iter().map(|x| x.due).collect::<Vec<_>>(),
        [false, false, true]
    );
    // The same write again stores nothing and is not due.
    let again = three(&mut h, &cfg);
    assert!(again.iter().all(|x| !x.created && !x.due));
}

#[test]
fn summary_names_its_sources_refreshes_in_place_and_skips_a_known_set() {
    let (mut h, cfg) = (Fake::default(), MemoryConfig::default());
    let c = three(&mut h, &cfg)[0].cluster;
    let o = summarize_cluster(&mut h, c, &llm(), &cfg).unwrap();
    assert_eq!((o.action, o.calls), (Action::Created, 1));
    let s = o.summary.unwrap();
    assert_eq!(sources(&mut h, &s), ["m1", "m2", "m3"]);
    assert_eq!(s.covered, 3);
    for t in &EDITOR[..3] {
        assert!(s.text.contains(t), "{}", s.text);
    }
    // A fourth member: one call that folds only it into the summary, same row.
    let r = remember(&mut h, &[mem("m4", "editor", EDITOR[3])], &cfg).unwrap();
    assert!(r[0].due && r[0].cluster == c);
    let o = summarize_cluster(&mut h, c, &llm(), &cfg).unwrap();
    assert_eq!((o.action, o.calls), (Action::Refreshed, 1));
    let last = h.prompts.last().unwrap();
    assert!(last.contains("Current summary:") && last.contains(EDITOR[3]));
    assert!(!last.contains(&format!("- {}", EDITOR[0])), "{last}");
    let s2 = o.summary.unwrap();
    assert_eq!(s2.id, s.id);
    assert_eq!(sources(&mut h, &s2).len(), 4);
    assert_eq!(s2.covered, 4);
    assert_eq!(s2.member_hash, member_hash(&["m4", "m3", "m2", "m1"]));
    // The same member set: no call.
    let o = summarize_cluster(&mut h, c, &llm(), &cfg).unwrap();
    assert_eq!((o.action, o.calls), (Action::Unchanged, 0));
    assert_eq!(h.prompts.len(), 2);
}

#[test]
fn deletes_never_resurface_and_under_the_minimum_the_summary_goes() {
    let (mut h, cfg) = (Fake::default(), MemoryConfig::default());
    let c = three(&mut h, &cfg)[0].cluster;
    remember(&mut h, &[mem("m4", "editor", EDITOR[3])], &cfg).unwrap();
    summarize_cluster(&mut h, c, &llm(), &cfg).unwrap();
    let f = forget(&mut h, "m2", &cfg).unwrap().unwrap();
    assert_eq!(
        f,
        Forgotten {
            cluster: c,
            summary_deleted: true,
            due: true
        }
    );
    assert!(h.summaries.is_empty(), "the covering summary goes at once");
    let o = summarize_cluster(&mut h, c, &llm(), &cfg).unwrap();
    assert_eq!(o.action, Action::Created);
    let s = o.summary.unwrap();
    assert!(!s.text.contains(EDITOR[1]), "{}", s.text);
    assert!(!h.prompts.last().unwrap().contains(EDITOR[1]));
    assert_eq!(sources(&mut h, &s), ["m1", "m3", "m4"]);
    // Two deletes: under three members, no summary, and recall returns raw memories only.
    forget(&mut h, "m1", &cfg).unwrap();
    let f = forget(&mut h, "m3", &cfg).unwrap().unwrap();
    assert!(!f.due);
    assert_eq!(
        summarize_cluster(&mut h, c, &llm(), &cfg).unwrap().action,
        Action::TooFew
    );
    let r = recall(
        &mut h,
        "dark editor theme",
        &Filter::default(),
        5,
        true,
        &cfg,
    )
    .unwrap();
    assert!(r.iter().all(|x| x.kind == HitKind::Memory));
    assert_eq!(forget(&mut h, "m3", &cfg).unwrap(), None);
}

#[test]
fn a_summary_left_with_too_few_members_is_deleted_by_the_next_run() {
    let (mut h, cfg) = (Fake::default(), MemoryConfig::default());
    let c = three(&mut h, &cfg)[0].cluster;
    remember(&mut h, &[mem("m4", "editor", EDITOR[3])], &cfg).unwrap();
    summarize_cluster(&mut h, c, &llm(), &cfg).unwrap();
    // Rows removed behind the guest's back (another host's delete path).
    h.rows.retain(|r| r.m.id == "m1");
    let o = summarize_cluster(&mut h, c, &llm(), &cfg).unwrap();
    assert_eq!(o.action, Action::Deleted);
    assert!(h.summaries.is_empty());
}

#[test]
fn unrelated_facts_and_other_scopes_open_their_own_clusters() {
    let (mut h, cfg) = (Fake::default(), MemoryConfig::default());
    let r = remember(
        &mut h,
        &[
            mem("a", "editor", EDITOR[0]),
            mem("b", "editor", "The deploy pipeline runs on Fridays at noon"),
            mem("c", "deploy", EDITOR[1]),
            mem("d", "editor", EDITOR[1]),
        ],
        &cfg,
    )
    .unwrap();
    assert_ne!(r[0].cluster, r[1].cluster, "unrelated text, same scope");
    assert_ne!(r[0].cluster, r[2].cluster, "related text, other key");
    assert_eq!(r[0].cluster, r[3].cluster);
}

#[test]
fn nearest_prefers_the_closest_then_the_oldest() {
    let c = |cluster, v: Vec<f32>| Centroid {
        cluster,
        model: "x".into(),
        vector: v,
        members: 1,
    };
    let cs = [
        c(2, vec![1.0, 0.0]),
        c(1, vec![1.0, 0.0]),
        c(3, vec![0.0, 1.0]),
    ];
    assert_eq!(nearest(&cs, "x", &[1.0, 0.1], 0.5), Some(1));
    assert_eq!(nearest(&cs, "x", &[0.1, 1.0], 0.5), Some(3));
    assert_eq!(nearest(&cs, "x", &[-1.0, -1.0], 0.5), None);
    assert_eq!(
        nearest(&cs, "y", &[1.0, 0.0], 0.5),
        None,
        "another model's space"
    );
}

#[test]
fn a_racing_writer_wins_and_nothing_is_written_twice() {
    let (mut h, cfg) = (Fake::default(), MemoryConfig::default());
    let c = three(&mut h, &cfg)[0].cluster;
    h.rival = true;
    let o = summarize_cluster(&mut h, c, &llm(), &cfg).unwrap();
    assert_eq!(o.action, Action::LostRace);
    assert_eq!(o.summary.unwrap().text, "rival");
    // The rival's row covers this member set: nothing to do now.
    let o = summarize_cluster(&mut h, c, &llm(), &cfg).unwrap();
    assert_eq!((o.action, o.calls), (Action::Unchanged, 0));
}

#[test]
fn an_off_topic_summary_is_discarded_with_its_reason() {
    let (mut h, cfg) = (Fake::default(), MemoryConfig::default());
    let c = three(&mut h, &cfg)[0].cluster;
    h.canned = Some("Quarterly revenue grew in the northern sales region last spring.".into());
    let e = summarize_cluster(&mut h, c, &llm(), &cfg).unwrap_err();
    assert!(
        matches!(e, Error::RejectedOutput(ref m) if m.contains("similarity")),
        "{e:?}"
    );
    assert!(h.summaries.is_empty());
    assert!(h.notes[&c].contains("not about its memories"));
    // A model that repeats itself fails the quality gate, also recorded.
    h.canned = Some("dark dark dark dark dark dark dark dark dark dark dark dark".into());
    let e = summarize_cluster(&mut h, c, &llm(), &cfg).unwrap_err();
    assert!(matches!(e, Error::RejectedOutput(_)));
    assert!(h.notes[&c].contains("repeats"), "{}", h.notes[&c]);
    // A good answer clears the note.
    h.canned = None;
    summarize_cluster(&mut h, c, &llm(), &cfg).unwrap();
    assert!(h.notes.is_empty());
}

#[test]
fn a_cluster_over_the_budget_is_summarized_in_parts_and_merged() {
    let mut h = Fake {
        condense: true,
        ..Fake::default()
    };
    let cfg = MemoryConfig {
        min_similarity: 0.0,
        prompt_budget: 400,
        ..MemoryConfig::default()
    };
    let items: Vec<MemoryIn> = (0..30)
        .map(|i| {
            mem(
                &format!("f{i:02}"),
                "editor",
                &format!(
                    "Alice set editor option number {i} to value {} for the dark theme",
                    i * 7
                ),
            )
        })
        .collect();
    let r = remember(&mut h, &items, &cfg).unwrap();
    let c = r[0].cluster;
    assert!(r.iter().all(|x| x.cluster == c));
    let small = Config {
        max_output_tokens: 64,
        ..llm()
    };
    let o = summarize_cluster(&mut h, c, &small, &cfg).unwrap();
    assert!(o.calls >= 3, "{o:?}");
    // Every fact went into some prompt, and no prompt exceeded the budget.
    for i in 0..30 {
        let needle = format!("option number {i} to");
        assert!(h.prompts.iter().any(|p| p.contains(&needle)), "{needle}");
    }
    assert!(h.prompts.iter().any(|p| p.contains("Partial summaries:")));
    // A budget that cannot hold two partial answers is refused up front, not truncated.
    let tight = MemoryConfig {
        prompt_budget: 260,
        ..cfg.clone()
    };
    h.summaries.clear();
    let e = summarize_cluster(&mut h, c, &small, &tight).unwrap_err();
    assert!(
        matches!(e, Error::InvalidInput(ref m) if m.contains("raise")),
        "{e:?}"
    );
    for p in &h.prompts {
        assert!(estimate_tokens(p) <= 400, "{}", estimate_tokens(p));
    }
    let text = o.summary.unwrap().text;
    let all: Vec<String> = (0..30).map(|i| i.to_string()).collect();
    assert_eq!(
        text,
        format!(
            "Alice set editor options {} for the dark theme.",
            all.join(", ")
        )
    );
}

#[test]
fn recall_weighs_importance_and_adds_summaries_beside_their_sources() {
    let (mut h, cfg) = (Fake::default(), MemoryConfig::default());
    let c = three(&mut h, &cfg)[0].cluster;
    let mut deploy = mem("d1", "deploy", "The deploy runs on Fridays");
    deploy.importance = 1.0;
    remember(&mut h, &[deploy], &cfg).unwrap();
    summarize_cluster(&mut h, c, &llm(), &cfg).unwrap();
    let r = recall(
        &mut h,
        "dark editor theme",
        &Filter::default(),
        10,
        true,
        &cfg,
    )
    .unwrap();
    let kinds: Vec<HitKind> = r.iter().map(|x| x.kind).collect();
    assert!(kinds.contains(&HitKind::Summary));
    // The deploy fact shares nothing with the query: however important, it is no hit.
    assert_eq!(kinds.iter().filter(|k| **k == HitKind::Memory).count(), 3);
    assert!(!r.iter().any(|x| x.id == "d1"));
    let s = r.iter().find(|x| x.kind == HitKind::Summary).unwrap();
    assert_eq!(s.sources, ["m1", "m2", "m3"]);
    assert!((s.importance - 0.5).abs() < 1e-6);
    for w in r.windows(2) {
        assert!(w[0].score >= w[1].score);
    }
    for x in &r {
        assert!((x.score - score(x.similarity, x.importance)).abs() < 1e-6);
    }
    let no_summaries = recall(
        &mut h,
        "dark editor theme",
        &Filter::default(),
        10,
        false,
        &cfg,
    )
    .unwrap();
    assert!(no_summaries.iter().all(|x| x.kind == HitKind::Memory));
    assert_eq!(
        recall(&mut h, "dark", &Filter::default(), 2, true, &cfg)
            .unwrap()
            .len(),
        2
    );
    assert!(matches!(
        recall(&mut h, "  ", &Filter::default(), 2, true, &cfg),
        Err(Error::InvalidInput(_))
    ));
}

#[test]
fn the_extractive_engine_states_the_facts_without_a_model() {
    let (mut h, cfg) = (Fake::default(), MemoryConfig::default());
    let c = three(&mut h, &cfg)[0].cluster;
    let ex = Config {
        engine: Engine::Extractive,
        ..Config::default()
    };
    let o = summarize_cluster(&mut h, c, &ex, &cfg).unwrap();
    assert_eq!((o.action, o.calls), (Action::Created, 0));
    let s = o.summary.unwrap();
    assert_eq!(s.model, "extractive");
    for t in &EDITOR[..3] {
        assert!(s.text.contains(t));
    }
    assert!(h.prompts.is_empty());
    // Over its output limit it says how many facts it left out.
    let mut members = h.members_after(c, 0).unwrap().members;
    rank_order(&mut members);
    let short = extractive_summary(&members, 3, 12);
    assert!(
        short.ends_with("(2 more related facts not shown.)"),
        "{short}"
    );
}

#[test]
fn bad_memories_are_refused_with_what_to_fix() {
    let (mut h, cfg) = (Fake::default(), MemoryConfig::default());
    let cases = [
        (mem("x", "editor", "  "), "no text"),
        (mem("", "editor", "t"), "id is empty"),
        (mem("x", "", "t"), "key is empty"),
        (mem("x", "e\u{7}", "t"), "control characters"),
        (
            mem("x", "editor", &"a".repeat(MAX_MEMORY_BYTES + 1)),
            "split it",
        ),
        (
            MemoryIn {
                importance: 1.5,
                ..mem("x", "editor", "t")
            },
            "from 0 to 1",
        ),
        (
            MemoryIn {
                importance: f32::NAN,
                ..mem("x", "editor", "t")
            },
            "from 0 to 1",
        ),
    ];
    for (m, want) in cases {
        match remember(&mut h, &[m], &cfg) {
            Err(Error::InvalidInput(msg)) => assert!(msg.contains(want), "{msg}"),
            other => panic!("{other:?}"),
        }
    }
    assert!(h.rows.is_empty(), "a refused batch stores nothing");
    let bad = MemoryConfig {
        min_cluster_items: 1,
        ..MemoryConfig::default()
    };
    assert!(remember(&mut h, &[mem("x", "e", "t")], &bad).is_err());
}

#[test]
fn a_changed_embedding_model_re_embeds_the_cluster() {
    let mut h = Fake::default();
    let lexical = MemoryConfig::default();
    let c = three(&mut h, &lexical)[0].cluster;
    assert!(h.rows.iter().all(|r| r.model == embed::LEXICAL_MODEL));
    let other = MemoryConfig {
        embedder: "other".into(),
        min_similarity: 0.0,
        ..MemoryConfig::default()
    };
    let r = remember(&mut h, &[mem("m4", "editor", EDITOR[3])], &other).unwrap();
    assert_eq!(r[0].cluster, c);
    assert!(
        h.rows
            .iter()
            .all(|r| r.model == "other" && r.vector.len() == 8)
    );
}

#[test]
fn member_hash_ignores_order_and_takes_members_in_one_at_a_time() {
    let a = member_hash(&["b", "a"]);
    assert_eq!(a, member_hash(&["a", "b"]));
    assert_ne!(a, member_hash(&["a", "b", "c"]));
    assert_ne!(member_hash(&["ab"]), member_hash(&["a", "b"]));
    assert_eq!(a.len(), 32);
    assert_eq!(member_hash_with(&a, &["c"]), member_hash(&["c", "a", "b"]));
    assert_eq!(
        member_hash_with(&member_hash::<&str>(&[]), &["x"]),
        member_hash(&["x"])
    );
    // An older hash (another format) is not folded into: the set gets a fresh identity.
    assert_eq!(member_hash_with("0f3a", &["a", "b"]), a);
}

/// Grow cluster `c` to `n` members.
fn grow(h: &mut Fake, cfg: &MemoryConfig, c: u64, n: usize) {
    let have = h.of(c).count();
    let items: Vec<MemoryIn> = (have..n)
        .map(|i| {
            // Words of their own, so no two facts (nor a summary of them) repeat phrases.
            let word = |k: usize| -> String {
                let s = [
                    "ka", "mo", "ri", "te", "su", "no", "ba", "le", "fi", "go", "pu",
                ];
                (0..3).map(|j| s[(k / 11usize.pow(j)) % 11]).collect()
            };
            let text = format!(
                "Alice {} {} {} the dark editor theme {}.",
                word(i * 3),
                word(i * 3 + 1),
                word(i * 3 + 2),
                word(i + 1000)
            );
            mem(&format!("g{i}"), "editor", &text)
        })
        .collect();
    for r in remember(h, &items, cfg).unwrap() {
        assert_eq!(r.cluster, c);
    }
}

#[test]
fn a_hot_cluster_reads_only_what_changed_whatever_its_size() {
    for engine in [Engine::Llm, Engine::Extractive] {
        let cfg = MemoryConfig {
            min_similarity: 0.0,
            ..MemoryConfig::default()
        };
        let run = Config { engine, ..llm() };
        let mut reads = Vec::new();
        for n in [400, 4000] {
            let mut h = Fake::default();
            let c = three(&mut h, &cfg)[0].cluster;
            grow(&mut h, &cfg, c, n);
            let first = Config {
                engine: Engine::Extractive,
                ..llm()
            };
            summarize_cluster(&mut h, c, &first, &cfg).unwrap();
            // One more member, then the refresh: it reads the new one (and, extractive, a
            // bounded page of the best ranked), never the cluster.
            grow(&mut h, &cfg, c, n + 1);
            h.read = 0;
            let o = summarize_cluster(&mut h, c, &run, &cfg).unwrap();
            assert_eq!(o.action, Action::Refreshed, "{engine:?}");
            let s = o.summary.unwrap();
            assert_eq!(s.covered as usize, n + 1);
            let all: Vec<String> = h.of(c).map(|r| r.m.id.clone()).collect();
            assert_eq!(s.member_hash, member_hash(&all), "the hash kept up");
            assert_eq!(sources(&mut h, &s), all);
            reads.push(h.read);
        }
        assert_eq!(
            reads[0], reads[1],
            "{engine:?}: rows read at 400 and 4,000 members"
        );
        if engine == Engine::Llm {
            assert_eq!(reads[0], 1);
        }
    }
}

#[test]
fn a_summary_of_a_set_that_changed_meanwhile_is_not_written() {
    let (mut h, cfg) = (Fake::default(), MemoryConfig::default());
    let c = three(&mut h, &cfg)[0].cluster;
    // Another writer adds a member between the read and the write: the version moved.
    h.sneak = true;
    let o = summarize_cluster(&mut h, c, &llm(), &cfg).unwrap();
    assert_eq!(o.action, Action::LostRace);
    assert!(h.summaries.is_empty());
    let o = summarize_cluster(&mut h, c, &llm(), &cfg).unwrap();
    assert_eq!(o.action, Action::Created);
}

/// 14 Apr 2025, 09:00 UTC.
const APR_14: u64 = 1_744_621_200_000;
const DAY: u64 = 86_400_000;

fn fact(id: &str, text: &str) -> MemoryIn {
    mem(id, "alice", text)
}

#[test]
fn a_changed_fact_supersedes_the_earlier_memory_and_joins_its_cluster() {
    let (mut h, cfg) = (Fake::default(), MemoryConfig::default());
    h.now = APR_14;
    let a = remember(&mut h, &[fact("porto", "I live in Porto")], &cfg).unwrap();
    let b = remember(&mut h, &[fact("tea", "Alice likes green tea")], &cfg).unwrap();
    h.now = APR_14 + 30 * DAY;
    // Third person, another cluster by its words: still the same fact, and its cluster.
    let c = remember(
        &mut h,
        &[fact("lyon", "Alice moved to Lyon last week")],
        &cfg,
    )
    .unwrap();
    assert_eq!(a[0].supersedes, None);
    assert_eq!(
        b[0].supersedes, None,
        "a preference is no fact of those kinds"
    );
    assert_eq!(c[0].supersedes.as_deref(), Some("porto"));
    assert_eq!(c[0].cluster, a[0].cluster);
    let porto = h.get_memory("porto").unwrap().unwrap();
    assert_eq!(porto.superseded_by.as_deref(), Some("lyon"));
    let lyon = h.get_memory("lyon").unwrap().unwrap();
    assert_eq!(porto.superseded_ms, lyon.created_ms);
    assert_eq!(
        h.get_memory("lyon").unwrap().unwrap().supersedes.as_deref(),
        Some("porto")
    );
    // Kept, never deleted.
    assert_eq!(h.rows.len(), 3);
    // A third value supersedes the second, and only it.
    let d = remember(&mut h, &[fact("oslo", "The user relocated to Oslo")], &cfg).unwrap();
    assert_eq!(d[0].supersedes.as_deref(), Some("lyon"));
    assert_eq!(
        h.get_memory("porto")
            .unwrap()
            .unwrap()
            .superseded_by
            .as_deref(),
        Some("lyon")
    );
    // An unrelated fact supersedes nothing.
    let e = remember(&mut h, &[fact("job", "Alice works at Globex")], &cfg).unwrap();
    assert_eq!(e[0].supersedes, None);
}

#[test]
fn endings_supersede_the_fact_they_end_even_by_its_value_alone() {
    let (mut h, cfg) = (Fake::default(), MemoryConfig::default());
    h.now = APR_14;
    remember(
        &mut h,
        &[
            fact("car", "I drive a blue Skoda"),
            fact("dog", "We have a dog named Biscuit"),
        ],
        &cfg,
    )
    .unwrap();
    h.now += DAY;
    let r = remember(
        &mut h,
        &[
            fact("sold", "Alice sold her car"),
            fact("rip", "Sad news: Biscuit passed away"),
        ],
        &cfg,
    )
    .unwrap();
    assert_eq!(r[0].supersedes.as_deref(), Some("car"));
    assert_eq!(r[1].supersedes.as_deref(), Some("dog"));
}

#[test]
fn a_client_names_what_a_memory_replaces_and_bad_names_are_refused() {
    let (mut h, cfg) = (Fake::default(), MemoryConfig::default());
    remember(&mut h, &[mem("m1", "editor", EDITOR[0])], &cfg).unwrap();
    let named = |id: &str, text: &str, replaces: &str| MemoryIn {
        replaces: Some(replaces.into()),
        ..mem(id, "editor", text)
    };
    let r = remember(&mut h, &[named("m2", EDITOR[4], "m1")], &cfg).unwrap();
    assert_eq!(r[0].supersedes.as_deref(), Some("m1"));
    // Naming the replaced one again replaces what is current in its place.
    let r = remember(&mut h, &[named("m3", EDITOR[3], "m1")], &cfg).unwrap();
    assert_eq!(r[0].supersedes.as_deref(), Some("m2"));
    for (m, want) in [
        (named("m4", "x", "nope"), "does not exist"),
        (named("m4", "x", "m4"), "cannot replace itself"),
        (
            MemoryIn {
                replaces: Some("m3".into()),
                ..mem("m4", "billing", "x")
            },
            "another scope",
        ),
    ] {
        let e = remember(&mut h, &[m], &cfg).unwrap_err();
        assert!(format!("{e:?}").contains(want), "{e:?}");
    }
}

#[test]
fn recall_puts_the_current_memory_before_a_superseded_one_and_marks_it() {
    let (mut h, cfg) = (Fake::default(), MemoryConfig::default());
    h.now = APR_14;
    remember(
        &mut h,
        &[fact("porto", "I live in Porto, by the river Douro")],
        &cfg,
    )
    .unwrap();
    h.now += 30 * DAY;
    remember(&mut h, &[fact("lyon", "I moved to Lyon")], &cfg).unwrap();
    let f = Filter {
        user: Some("alice".into()),
        ..Filter::default()
    };
    // The query's words are the old memory's: it ranks first by similarity, yet the current
    // one comes before it.
    let r = recall(&mut h, "Porto river Douro", &f, 5, true, &cfg).unwrap();
    let ids: Vec<&str> = r.iter().map(|x| x.id.as_str()).collect();
    assert_eq!(ids[..2], ["lyon", "porto"], "{r:?}");
    assert_eq!(r[1].superseded_by.as_deref(), Some("lyon"));
    let lyon = h.get_memory("lyon").unwrap().unwrap();
    assert_eq!(r[1].superseded_ms, lyon.created_ms);
    assert_eq!(r[0].superseded_by, None);
    // With room for one, the current one is what is returned.
    let r = recall(&mut h, "Porto river Douro", &f, 1, true, &cfg).unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].id, "lyon");
    // Deleting the successor makes the earlier memory current again.
    forget(&mut h, "lyon", &cfg).unwrap();
    let r = recall(&mut h, "Porto river Douro", &f, 5, true, &cfg).unwrap();
    assert_eq!(
        (r[0].id.as_str(), r[0].superseded_by.as_deref()),
        ("porto", None)
    );
}

#[test]
fn a_cluster_summary_states_current_values_and_what_they_replaced() {
    let (mut h, cfg) = (Fake::default(), MemoryConfig::default());
    h.now = APR_14;
    let items = [
        fact("porto", "Alice lives in Porto"),
        fact("job", "Alice works at Globex in Porto"),
    ];
    remember(&mut h, &items, &cfg).unwrap();
    h.now += 30 * DAY;
    let r = remember(&mut h, &[fact("lyon", "Alice moved to Lyon")], &cfg).unwrap();
    let c = r[0].cluster;
    let ex = Config {
        engine: Engine::Extractive,
        ..Config::default()
    };
    let o = summarize_cluster(&mut h, c, &ex, &cfg).unwrap();
    let text = o.summary.unwrap().text;
    assert!(
        text.contains("Alice moved to Lyon. (It replaced, on 14 May 2025: Alice lives in Porto.)"),
        "{text}"
    );
    assert_eq!(text.matches("Alice lives in Porto").count(), 1, "{text}");
    // A model is told which fact is no longer true, and writes the whole cluster again when a
    // change arrives after its summary.
    let mut h2 = Fake {
        now: APR_14,
        ..Fake::default()
    };
    remember(&mut h2, &items, &cfg).unwrap();
    remember(
        &mut h2,
        &[fact("tz", "Alice lives in Porto and likes it there")],
        &cfg,
    )
    .unwrap();
    let c = h2.rows[0].m.cluster;
    summarize_cluster(&mut h2, c, &llm(), &cfg).unwrap();
    h2.now += 30 * DAY;
    remember(&mut h2, &[fact("lyon", "Alice moved to Lyon")], &cfg).unwrap();
    let o = summarize_cluster(&mut h2, c, &llm(), &cfg).unwrap();
    assert_eq!(o.action, Action::Refreshed);
    let last = h2.prompts.last().unwrap();
    assert!(!last.contains("Current summary:"), "{last}");
    assert!(
        last.contains("- (no longer true since 14 May 2025; a later fact replaced it) Alice lives in Porto and likes it there"),
        "{last}"
    );
}

#[test]
fn a_change_that_names_the_value_it_replaces_supersedes_that_memory() {
    let (mut h, cfg) = (Fake::default(), MemoryConfig::default());
    remember(&mut h, &[fact("job", "My company is Blue Harbor")], &cfg).unwrap();
    let r = remember(
        &mut h,
        &[fact(
            "moved",
            "I moved from Blue Harbor to Wayne Health, new team and all",
        )],
        &cfg,
    )
    .unwrap();
    assert_eq!(r[0].supersedes.as_deref(), Some("job"));
    // And the change after it, named by the value the first change gave.
    let r = remember(
        &mut h,
        &[fact(
            "again",
            "Finally left Wayne Health, I'm at Initech now",
        )],
        &cfg,
    )
    .unwrap();
    assert_eq!(r[0].supersedes.as_deref(), Some("moved"));
}

#[test]
fn a_langgraph_item_is_recalled_as_its_fields() {
    let (mut h, cfg) = (Fake::default(), MemoryConfig::default());
    let text = r#"{"key": "food", "namespace": ["users", "alice"], "value": {"allergies": ["peanuts"], "likes": "pizza with olives"}}"#;
    remember(&mut h, &[mem("lg-1", "food", text)], &cfg).unwrap();
    let r = recall(
        &mut h,
        "pizza with olives",
        &Filter::default(),
        3,
        false,
        &cfg,
    )
    .unwrap();
    let hit = r.iter().find(|x| x.id == "lg-1").expect("recalled");
    assert_eq!(
        hit.text,
        "food (users/alice): allergies: peanuts; likes: pizza with olives"
    );
    // Other text is as it was stored, JSON that is no item included.
    assert_eq!(crate::memory::readable_item(r#"{"a": 1}"#), None);
    assert_eq!(crate::memory::readable_item("Alice likes tea"), None);
}
