//! Memories and cluster summaries: the decisions. The host stores memories, vectors and
//! summaries and searches them (the [`MemoryHost`] trait); this module decides which cluster a
//! memory joins, when a cluster's summary is missing or stale, what the summary prompt holds
//! (in parts when the members exceed the budget), whether a summary is good enough to keep,
//! and how recall ranks what the search found.
//!
//! The rules:
//! - A memory clusters only within its scope (user, project, environment, kind, key). It joins
//!   the cluster whose centroid is nearest by cosine, if that similarity is at least
//!   `min_similarity`; otherwise it opens a new cluster. Ties go to the older cluster.
//! - A cluster is summarized once it has `min_cluster_items` active members. The summary is
//!   keyed by a hash of its member set: the same set is never summarized twice, and a write
//!   whose expected hash is no longer current is refused by the store (a racing writer won).
//! - A refresh folds only the new members into the summary when every member it covered is
//!   still there; after a delete it is written from scratch from the survivors, so a deleted
//!   memory's text cannot survive in it. Deleting a covered memory deletes the summary at once.
//! - A summary's importance is the largest of its members' (a summary is as important as the
//!   most important fact it states); recall scores are `similarity × (0.5 + importance / 2)`.

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};

use crate::embed;
use crate::plan::plan_groups;
use crate::policy::{Config, Engine};
use crate::prompt::{self, Built};
use crate::quality;
use crate::strip;
use crate::tokens::{MESSAGE_OVERHEAD, estimate_tokens};
use crate::types::{Error, Level, Message, Request, Response, Role};

/// Longest memory text, in bytes.
pub const MAX_MEMORY_BYTES: usize = 8 * 1024;

/// Longest scope field or id, in characters.
pub const MAX_FIELD_CHARS: usize = 200;

/// Where a memory belongs.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Scope {
    /// Whose memory.
    pub user: String,
    /// Project.
    pub project: String,
    /// Environment.
    pub environment: String,
    /// Kind of fact.
    pub kind: String,
    /// Subject.
    pub key: String,
}

/// Which memories a search looks at.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Filter {
    /// User.
    pub user: Option<String>,
    /// Project.
    pub project: Option<String>,
    /// Environment.
    pub environment: Option<String>,
    /// Kind.
    pub kind: Option<String>,
    /// Key.
    pub key: Option<String>,
    /// The exact scan, never an approximate index (passed to the store as it is).
    pub exact: bool,
}

/// Vectors from the embedder.
#[derive(Clone, Debug, PartialEq)]
pub struct Embedding {
    /// Model.
    pub model: String,
    /// Dimension.
    pub dim: u32,
    /// One per text.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens counted by the server.
    pub tokens: u32,
}

/// A cluster's centre.
#[derive(Clone, Debug, PartialEq)]
pub struct Centroid {
    /// Cluster id.
    pub cluster: u64,
    /// Embedding model of its vectors.
    pub model: String,
    /// Mean vector.
    pub vector: Vec<f32>,
    /// Active members.
    pub members: u32,
}

/// A memory to store.
#[derive(Clone, Debug, PartialEq)]
pub struct NewMemory {
    /// Id.
    pub id: String,
    /// Scope.
    pub scope: Scope,
    /// Text.
    pub text: String,
    /// Importance, 0 to 1.
    pub importance: f32,
    /// Estimated tokens.
    pub tokens: u32,
    /// Written at.
    pub created_ms: u64,
    /// Embedding model.
    pub model: String,
    /// Vector.
    pub vector: Vec<f32>,
    /// Cluster to join, `None` for a new one.
    pub cluster: Option<u64>,
    /// The fact it states ([`fact_key`]), empty for none: the store supersedes the scope's
    /// current memory of it.
    pub fact_key: String,
    /// The memory it replaces, named by the client (then the fact key picks nothing).
    pub replaces: Option<String>,
}

/// What storing did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// Its cluster.
    pub cluster: u64,
    /// False for an id already stored.
    pub created: bool,
    /// Active members of the cluster.
    pub members: u32,
    /// The memory it superseded.
    pub superseded: Option<String>,
}

/// A stored memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Memory {
    /// Id.
    pub id: String,
    /// Scope.
    pub scope: Scope,
    /// Text.
    pub text: String,
    /// Importance.
    pub importance: f32,
    /// Estimated tokens.
    pub tokens: u32,
    /// Written at.
    pub created_ms: u64,
    /// Cluster.
    pub cluster: u64,
    /// Place in the tenant's write order.
    pub seq: u64,
    /// The memory it superseded when written.
    pub supersedes: Option<String>,
    /// The memory that superseded it (`None`: current).
    pub superseded_by: Option<String>,
    /// When it was superseded (0 while current).
    pub superseded_ms: u64,
}

/// Some of a cluster's members and the cluster's figures (the `member-set` record).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemberSet {
    /// Membership version.
    pub version: u64,
    /// Active members, all of them.
    pub count: u32,
    /// The members asked for, oldest first.
    pub members: Vec<Memory>,
}

/// A cluster summary row.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSummary {
    /// Row id.
    pub id: u64,
    /// Cluster.
    pub cluster: u64,
    /// Text.
    pub text: String,
    /// Hash of the member set it covers.
    pub member_hash: String,
    /// It covers the members with `seq <= covered_seq`.
    pub covered_seq: u64,
    /// How many it covers.
    pub covered: u32,
    /// Importance.
    pub importance: f32,
    /// Estimated tokens.
    pub tokens: u32,
    /// Model that wrote it.
    pub model: String,
    /// Calls that produced the current text.
    pub calls: u32,
    /// Their prompt tokens.
    pub prompt_tokens: u32,
    /// Their output tokens.
    pub output_tokens: u32,
    /// Created at.
    pub created_ms: u64,
    /// Text replaced at.
    pub updated_ms: u64,
}

/// A summary to write.
#[derive(Clone, Debug, PartialEq)]
pub struct SummaryWrite {
    /// Cluster.
    pub cluster: u64,
    /// Member hash of the summary it replaces (`None`: there must be none).
    pub expect: Option<String>,
    /// Hash of the member set.
    pub member_hash: String,
    /// The newest member covered.
    pub covered_seq: u64,
    /// Members covered.
    pub covered: u32,
    /// Membership version the members were read at.
    pub version: u64,
    /// Text.
    pub text: String,
    /// Estimated tokens.
    pub tokens: u32,
    /// Importance.
    pub importance: f32,
    /// Model.
    pub model: String,
    /// Embedding model of `vector`.
    pub vector_model: String,
    /// The text's vector.
    pub vector: Vec<f32>,
    /// Calls made.
    pub calls: u32,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens.
    pub output_tokens: u32,
    /// Now.
    pub now_ms: u64,
}

/// Memory or summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HitKind {
    /// A memory.
    Memory,
    /// A cluster summary.
    Summary,
}

/// A search candidate.
#[derive(Clone, Debug, PartialEq)]
pub struct Hit {
    /// Kind.
    pub kind: HitKind,
    /// Id.
    pub id: String,
    /// Text.
    pub text: String,
    /// Cosine similarity.
    pub similarity: f32,
    /// Importance.
    pub importance: f32,
    /// Cluster.
    pub cluster: u64,
    /// A summary's newest covered member (0 for a memory).
    pub covered_seq: u64,
    /// Members a summary covers (0 for a memory).
    pub covered: u32,
    /// The memory that superseded it (`None`: current, or a summary).
    pub superseded_by: Option<String>,
    /// When it was superseded (0 while current).
    pub superseded_ms: u64,
}

/// The I/O memory calls need (the `memory-store` import, plus the model, clock and log).
pub trait MemoryHost {
    /// Embed texts with the host's backend.
    fn embed(&mut self, texts: &[String]) -> Result<Embedding, Error>;
    /// Clusters of a scope.
    fn centroids(&mut self, scope: &Scope) -> Result<Vec<Centroid>, Error>;
    /// Store a memory (superseding the scope's current memory of its fact key).
    fn put_memory(&mut self, m: NewMemory) -> Result<Stored, Error>;
    /// The scope's current memory of a fact key, if any.
    fn current_memory(&mut self, scope: &Scope, fact_key: &str) -> Result<Option<Memory>, Error>;
    /// One memory by id.
    fn get_memory(&mut self, id: &str) -> Result<Option<Memory>, Error>;
    /// A cluster's active members after `after_seq` (0: all), oldest first, with its
    /// membership version and member count.
    fn members_after(&mut self, cluster: u64, after_seq: u64) -> Result<MemberSet, Error>;
    /// A cluster's members by rank (importance, then oldest, then id), `limit` from `offset`.
    fn top_members(&mut self, cluster: u64, offset: u32, limit: u32) -> Result<Vec<Memory>, Error>;
    /// Ids of a cluster's members with `seq <= upto_seq`, oldest first.
    fn member_ids(&mut self, cluster: u64, upto_seq: u64) -> Result<Vec<String>, Error>;
    /// Delete a memory.
    fn delete_memory(&mut self, id: &str) -> Result<Option<Memory>, Error>;
    /// Replace a cluster's vectors.
    fn set_vectors(
        &mut self,
        cluster: u64,
        model: &str,
        vectors: Vec<(String, Vec<f32>)>,
    ) -> Result<(), Error>;
    /// A cluster's summary.
    fn summary(&mut self, cluster: u64) -> Result<Option<ClusterSummary>, Error>;
    /// Write a summary if the expected hash holds.
    fn write_summary(&mut self, w: SummaryWrite) -> Result<bool, Error>;
    /// Delete a cluster's summary.
    fn delete_summary(&mut self, cluster: u64) -> Result<(), Error>;
    /// Record (or clear) why a cluster's last summary was discarded.
    fn set_cluster_note(&mut self, cluster: u64, note: Option<String>) -> Result<(), Error>;
    /// Nearest memories and summaries.
    fn search(
        &mut self,
        query: &[f32],
        model: &str,
        filter: &Filter,
        limit: u32,
    ) -> Result<Vec<Hit>, Error>;
    /// Run several model requests.
    fn generate_batch(&mut self, reqs: Vec<Request>) -> Vec<Result<Response, Error>>;
    /// Now.
    fn now_ms(&mut self) -> u64;
    /// A log line.
    fn log(&mut self, level: Level, msg: &str);
}

/// A `seq` past every member's (`members-after` then reads only the cluster's figures). The
/// largest a signed 64-bit column holds, so no store needs to clamp it.
pub const PAST_NEWEST: u64 = i64::MAX as u64;

/// How many ranked members an extractive summary reads at a time.
const RANK_PAGE: u32 = 32;

/// The importance of a memory written without one.
pub const DEFAULT_IMPORTANCE: f32 = 0.5;

/// Settings of memory calls (mirrors the WIT `memory-config`).
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryConfig {
    /// Embedding model (the lexical one runs here).
    pub embedder: String,
    /// Least cosine similarity to join a cluster.
    pub min_similarity: f32,
    /// Members a cluster needs for a summary.
    pub min_cluster_items: u32,
    /// Least similarity of a summary to its cluster's centroid.
    pub summary_min_similarity: f32,
    /// Most prompt tokens of one summary call (0: derived).
    pub prompt_budget: u32,
    /// A tenant's secret keying the lexical embedder's feature hashing (with a master key),
    /// so its stored vectors say nothing without it; `None`: unkeyed.
    pub lexical_key: Option<Vec<u8>>,
}

impl Default for MemoryConfig {
    /// The documented defaults, and their one source: the component exports them
    /// (`memories.default-memory-config`), and every host reads them from there.
    fn default() -> Self {
        MemoryConfig {
            embedder: embed::LEXICAL_MODEL.into(),
            min_similarity: 0.35,
            min_cluster_items: 3,
            summary_min_similarity: 0.3,
            prompt_budget: 0,
            lexical_key: None,
        }
    }
}

/// A memory to write.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryIn {
    /// Id (made by the host when the client gave none).
    pub id: String,
    /// Scope.
    pub scope: Scope,
    /// Text.
    pub text: String,
    /// Importance.
    pub importance: f32,
    /// The memory it replaces, named by the client.
    pub replaces: Option<String>,
}

/// What a write did with one memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Remembered {
    /// Id.
    pub id: String,
    /// Cluster.
    pub cluster: u64,
    /// False when already stored.
    pub created: bool,
    /// The cluster's active members.
    pub members: u32,
    /// The cluster should be summarized.
    pub due: bool,
    /// The memory it superseded.
    pub supersedes: Option<String>,
}

/// What summarizing a cluster did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Already current.
    Unchanged,
    /// First summary.
    Created,
    /// Regenerated.
    Refreshed,
    /// Under the minimum: summary deleted.
    Deleted,
    /// Under the minimum, no summary.
    TooFew,
    /// Another writer won.
    LostRace,
}

/// The result of summarizing one cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterOutcome {
    /// What happened.
    pub action: Action,
    /// The summary now.
    pub summary: Option<ClusterSummary>,
    /// Calls made.
    pub calls: u32,
    /// Prompt tokens spent.
    pub prompt_tokens: u32,
    /// Output tokens.
    pub output_tokens: u32,
}

/// What a delete did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Forgotten {
    /// Its cluster.
    pub cluster: u64,
    /// The cluster's summary covered it and was deleted.
    pub summary_deleted: bool,
    /// Summarize the cluster again.
    pub due: bool,
}

/// One recall result.
#[derive(Clone, Debug, PartialEq)]
pub struct Recalled {
    /// Kind.
    pub kind: HitKind,
    /// Id.
    pub id: String,
    /// Text.
    pub text: String,
    /// Weighted score.
    pub score: f32,
    /// Similarity.
    pub similarity: f32,
    /// Importance.
    pub importance: f32,
    /// Cluster.
    pub cluster: u64,
    /// Sources.
    pub sources: Vec<String>,
    /// The memory that superseded it (`None`: current).
    pub superseded_by: Option<String>,
    /// When it was superseded (0 while current).
    pub superseded_ms: u64,
}

fn invalid(m: impl Into<String>) -> Error {
    Error::InvalidInput(m.into())
}

fn check_field(what: &str, value: &str, required: bool) -> Result<(), Error> {
    if required && value.trim().is_empty() {
        return Err(invalid(format!("the memory's {what} is empty; give one")));
    }
    if value.chars().count() > MAX_FIELD_CHARS {
        return Err(invalid(format!(
            "the memory's {what} is longer than {MAX_FIELD_CHARS} characters; shorten it"
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(format!(
            "the memory's {what} holds control characters; remove them"
        )));
    }
    Ok(())
}

/// Check one memory a caller sent.
pub fn validate(m: &MemoryIn) -> Result<(), Error> {
    check_field("id", &m.id, true)?;
    check_field("user", &m.scope.user, true)?;
    check_field("project", &m.scope.project, false)?;
    check_field("environment", &m.scope.environment, false)?;
    check_field("type", &m.scope.kind, true)?;
    check_field("key", &m.scope.key, true)?;
    if m.text.trim().is_empty() {
        return Err(invalid(format!(
            "memory '{}' has no text; give the fact",
            m.id
        )));
    }
    if m.text.len() > MAX_MEMORY_BYTES {
        return Err(invalid(format!(
            "memory '{}' is {} bytes, over the {MAX_MEMORY_BYTES}-byte limit; a memory is one fact — split it",
            m.id,
            m.text.len()
        )));
    }
    if !(0.0..=1.0).contains(&m.importance) {
        return Err(invalid(format!(
            "memory '{}' has importance {}; give a number from 0 to 1",
            m.id, m.importance
        )));
    }
    Ok(())
}

fn check_config(cfg: &MemoryConfig) -> Result<(), Error> {
    if cfg.min_cluster_items < 2 {
        return Err(invalid(
            "SUMMARY_MIN_CLUSTER_ITEMS must be at least 2 (a summary of one memory is the memory)",
        ));
    }
    for (name, v) in [
        ("SUMMARY_CLUSTER_MIN_SIMILARITY", cfg.min_similarity),
        (
            "SUMMARY_MIN_CENTROID_SIMILARITY",
            cfg.summary_min_similarity,
        ),
    ] {
        if !(-1.0..=1.0).contains(&v) {
            return Err(invalid(format!(
                "{name} is {v}; give a cosine similarity from -1 to 1"
            )));
        }
    }
    if cfg.embedder.trim().is_empty() {
        return Err(invalid("the embedding model is empty; name one"));
    }
    Ok(())
}

/// Embed texts: the lexical embedder here, any other model through the host. The answer is
/// checked: one finite vector of the stated dimension per text.
pub fn embed_texts(
    h: &mut impl MemoryHost,
    cfg: &MemoryConfig,
    texts: &[String],
) -> Result<Embedding, Error> {
    if cfg.embedder == embed::LEXICAL_MODEL {
        let key = cfg.lexical_key.as_deref().filter(|k| !k.is_empty());
        return Ok(Embedding {
            // Keyed vectors live in a space of their own: never compared with unkeyed ones.
            model: match key {
                Some(_) => embed::LEXICAL_KEYED_MODEL.into(),
                None => embed::LEXICAL_MODEL.into(),
            },
            dim: embed::LEXICAL_DIM as u32,
            vectors: texts
                .iter()
                .map(|t| embed::lexical_keyed(t, embed::LEXICAL_DIM, key))
                .collect(),
            tokens: 0,
        });
    }
    if texts.is_empty() {
        return Ok(Embedding {
            model: cfg.embedder.clone(),
            dim: 0,
            vectors: Vec::new(),
            tokens: 0,
        });
    }
    let e = h.embed(texts)?;
    let bad = |why: String| Error::Server(format!("the embedding backend {why}"));
    if e.vectors.len() != texts.len() {
        return Err(bad(format!(
            "returned {} vectors for {} texts",
            e.vectors.len(),
            texts.len()
        )));
    }
    if e.dim == 0 {
        return Err(bad("reported dimension 0".into()));
    }
    for (i, v) in e.vectors.iter().enumerate() {
        if v.len() != e.dim as usize {
            return Err(bad(format!(
                "returned a vector of {} values for input {} of {}, not {}",
                v.len(),
                i + 1,
                texts.len(),
                e.dim
            )));
        }
        if v.iter().any(|x| !x.is_finite()) {
            return Err(bad(format!(
                "returned a vector with non-finite values for input {} of {}",
                i + 1,
                texts.len()
            )));
        }
    }
    Ok(e)
}

pub use crate::embed::cosine;

/// The cluster a vector joins: the nearest centroid of `model` at or over `min`, ties to the
/// older (lower id) cluster. `None`: open a new cluster.
pub fn nearest(centroids: &[Centroid], model: &str, vector: &[f32], min: f32) -> Option<u64> {
    let mut best: Option<(f32, u64)> = None;
    for c in centroids
        .iter()
        .filter(|c| c.model == model && c.members > 0)
    {
        let s = cosine(&c.vector, vector);
        if s < min {
            continue;
        }
        let better = match best {
            None => true,
            Some((bs, bid)) => s > bs || (s == bs && c.cluster < bid),
        };
        if better {
            best = Some((s, c.cluster));
        }
    }
    best.map(|(_, id)| id)
}

/// The hash a summary is keyed by: the XOR of each member id's SHA-256 (its first 16 bytes,
/// in hex). Order does not matter, and a member added is folded into a hash without the
/// others (`member_hash_with`).
pub fn member_hash<S: AsRef<str>>(ids: &[S]) -> String {
    hex(&ids.iter().fold([0u8; 16], |acc, id| xor(acc, id.as_ref())))
}

/// A member hash with `ids` added to it (a hash that is not 32 hex digits, as an older one,
/// counts as the empty set's: a set then gets a new identity, never a false match).
pub fn member_hash_with<S: AsRef<str>>(hash: &str, ids: &[S]) -> String {
    let mut acc = [0u8; 16];
    if hash.len() == 32 {
        for (i, a) in acc.iter_mut().enumerate() {
            *a = u8::from_str_radix(&hash[2 * i..2 * i + 2], 16).unwrap_or(0);
        }
    }
    hex(&ids.iter().fold(acc, |acc, id| xor(acc, id.as_ref())))
}

fn xor(mut acc: [u8; 16], id: &str) -> [u8; 16] {
    let d = Sha256::digest(id.as_bytes());
    for (a, b) in acc.iter_mut().zip(&d[..16]) {
        *a ^= b;
    }
    acc
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// A summary's importance: the largest of its members'.
pub fn propagated_importance(members: &[Memory]) -> f32 {
    members.iter().map(|m| m.importance).fold(0.0, f32::max)
}

/// The recall score of a hit.
pub fn score(similarity: f32, importance: f32) -> f32 {
    similarity * (0.5 + importance.clamp(0.0, 1.0) / 2.0)
}

/// Re-embed the clusters of `centroids` whose vectors come from another model than `model`,
/// and return the scope's centroids as they stand afterwards.
fn current_centroids(
    h: &mut impl MemoryHost,
    cfg: &MemoryConfig,
    scope: &Scope,
    model: &str,
) -> Result<Vec<Centroid>, Error> {
    let cs = h.centroids(scope)?;
    let stale: Vec<u64> = cs
        .iter()
        .filter(|c| c.model != model && c.members > 0)
        .map(|c| c.cluster)
        .collect();
    if stale.is_empty() {
        return Ok(cs);
    }
    for cluster in stale {
        let members = h.members_after(cluster, 0)?.members;
        let texts: Vec<String> = members.iter().map(|m| m.text.clone()).collect();
        let e = embed_texts(h, cfg, &texts)?;
        h.log(
            Level::Info,
            &format!(
                "cluster {cluster}: re-embedding {} memories with {} (the embedding model changed)",
                members.len(),
                e.model
            ),
        );
        let pairs = members.into_iter().map(|m| m.id).zip(e.vectors).collect();
        h.set_vectors(cluster, &e.model, pairs)?;
    }
    h.centroids(scope)
}

/// What a memory states, for superseding: a fact (its key), an ending or a change that names
/// only a value ("Biscuit passed away", "I moved from Blue Harbor to Wayne Health": the fact
/// is whichever has that value now), or nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stated {
    /// The fact key ([`fact_key`]).
    Fact(String),
    /// The value an ending or a change names.
    OfValue(String),
    /// No fact.
    Nothing,
}

/// The fact key of a statement of what (`lives in`, `car`, …).
pub fn fact_key(what: &str) -> String {
    format!("fact:{what}")
}

/// What a memory states: the first fact found in its text (said of its user or its key, in
/// the first or the third person), else an ending naming a value. A scope's key is a subject
/// with many facts (they cluster under it), so the key alone names no fact: a client that
/// knows a memory replaces another says so (`replaces`).
pub fn stated(scope: &Scope, text: &str) -> Stated {
    let said = crate::facts::said_of(&[scope.user.as_str(), scope.key.as_str()], text);
    let from = |s: &crate::facts::Said| {
        s.key
            .strip_prefix(crate::facts::FROM_VALUE)
            .map(String::from)
    };
    if let Some(s) = said.iter().find(|s| !s.key.is_empty() && from(s).is_none()) {
        return Stated::Fact(fact_key(&s.key));
    }
    if let Some(old) = said.iter().find_map(from) {
        return Stated::OfValue(old);
    }
    match said.into_iter().find(|s| s.act == crate::facts::Act::Ends) {
        Some(s) => Stated::OfValue(s.value),
        None => Stated::Nothing,
    }
}

/// How many of a scope's nearest memories an ending that names only a value is matched
/// against.
const ENDED_CANDIDATES: u32 = 20;

/// The fact key of the scope's current memory whose value an ending or a change names
/// ("Biscuit passed away" ends the memory "I have a dog named Biscuit"), empty when none of
/// the nearest does.
fn fact_of_value(
    h: &mut impl MemoryHost,
    scope: &Scope,
    model: &str,
    vector: &[f32],
    value: &str,
) -> Result<String, Error> {
    let filter = Filter {
        user: Some(scope.user.clone()),
        project: Some(scope.project.clone()),
        environment: Some(scope.environment.clone()),
        kind: Some(scope.kind.clone()),
        key: Some(scope.key.clone()),
        exact: false,
    };
    let names = [scope.user.as_str(), scope.key.as_str()];
    let hits: Vec<Hit> = h
        .search(vector, model, &filter, ENDED_CANDIDATES)?
        .into_iter()
        .filter(|x| x.kind == HitKind::Memory)
        .collect();
    // The memory holding the value may itself be a change named by the value before it
    // ("from Acme to Blue Harbor"): followed back a few steps, through the memories it
    // superseded (the one holding the value now is current).
    let mut value = value.to_string();
    for step in 0..4 {
        let holding = hits
            .iter()
            .filter(|x| step > 0 || x.superseded_by.is_none())
            .find_map(|x| {
                crate::facts::said_of(&names, &x.text)
                    .into_iter()
                    .find(|s| {
                        s.act == crate::facts::Act::Holds
                            && !s.key.is_empty()
                            && crate::facts::names(&s.value, &value)
                    })
            });
        match holding {
            None => break,
            Some(s) => match s.key.strip_prefix(crate::facts::FROM_VALUE) {
                Some(before) => value = before.to_string(),
                None => return Ok(fact_key(&s.key)),
            },
        }
    }
    Ok(String::new())
}

/// The memory that `m` replaces when its client names `id`: that one, or the memory now
/// current in its place, of the same scope.
fn replaced(h: &mut impl MemoryHost, m: &MemoryIn, id: &str) -> Result<Memory, Error> {
    if id == m.id {
        return Err(invalid(format!(
            "memory {id} cannot replace itself; name the memory it replaces"
        )));
    }
    let Some(current) = current_of(h, id)? else {
        return Err(invalid(format!(
            "memory {id}, named in `replaces`, does not exist; name a stored memory's id, or leave `replaces` out"
        )));
    };
    if current.scope != m.scope {
        return Err(invalid(format!(
            "memory {id}, named in `replaces`, belongs to another scope (user, project, environment, type or key); a memory replaces one of its own scope"
        )));
    }
    if current.id == m.id {
        return Err(invalid(format!(
            "memory {} already replaced memory {id}",
            m.id
        )));
    }
    Ok(current)
}

/// Store memories, each in its cluster; clusters that reach the minimum (or grow past it)
/// come back `due`. A memory that states the same fact as the scope's current memory of it
/// supersedes that one (the store marks it in the same write) and joins its cluster.
pub fn remember(
    h: &mut impl MemoryHost,
    items: &[MemoryIn],
    cfg: &MemoryConfig,
) -> Result<Vec<Remembered>, Error> {
    check_config(cfg)?;
    for m in items {
        validate(m)?;
    }
    let texts: Vec<String> = items.iter().map(|m| m.text.clone()).collect();
    let e = embed_texts(h, cfg, &texts)?;
    let now = h.now_ms();
    let mut out = Vec::with_capacity(items.len());
    // Centroids of the scopes seen in this call, kept current as memories join.
    let mut known: Vec<(Scope, Vec<Centroid>)> = Vec::new();
    for (m, vector) in items.iter().zip(e.vectors) {
        let slot = match known.iter().position(|(s, _)| *s == m.scope) {
            Some(i) => i,
            None => {
                let cs = current_centroids(h, cfg, &m.scope, &e.model)?;
                known.push((m.scope.clone(), cs));
                known.len() - 1
            }
        };
        let fact_key = match stated(&m.scope, &m.text) {
            Stated::Fact(k) => k,
            Stated::OfValue(v) => fact_of_value(h, &m.scope, &e.model, &vector, &v)?,
            Stated::Nothing => String::new(),
        };
        let replaces = match &m.replaces {
            Some(id) => Some(replaced(h, m, id)?),
            None => None,
        };
        let mut cluster = nearest(&known[slot].1, &e.model, &vector, cfg.min_similarity);
        // A change of a fact joins the cluster of what it changes, so that cluster's summary
        // is written again with the change in it.
        let old = match &replaces {
            Some(old) => Some(old.clone()),
            None if !fact_key.is_empty() => h.current_memory(&m.scope, &fact_key)?,
            None => None,
        };
        if let Some(old) = old
            && old.id != m.id
            && known[slot].1.iter().any(|c| c.cluster == old.cluster)
        {
            cluster = Some(old.cluster);
        }
        let stored = h.put_memory(NewMemory {
            id: m.id.clone(),
            scope: m.scope.clone(),
            text: m.text.clone(),
            importance: m.importance,
            tokens: estimate_tokens(&m.text),
            created_ms: now,
            model: e.model.clone(),
            vector: vector.clone(),
            cluster,
            fact_key,
            replaces: replaces.map(|r| r.id),
        })?;
        if stored.created {
            let cs = &mut known[slot].1;
            match cs.iter_mut().find(|c| c.cluster == stored.cluster) {
                Some(c) => {
                    // Incremental mean: c + (v - c) / n.
                    let n = stored.members.max(1) as f32;
                    for (x, v) in c.vector.iter_mut().zip(&vector) {
                        *x += (v - *x) / n;
                    }
                    c.members = stored.members;
                }
                None => cs.push(Centroid {
                    cluster: stored.cluster,
                    model: e.model.clone(),
                    vector,
                    members: stored.members,
                }),
            }
        }
        out.push(Remembered {
            id: m.id.clone(),
            cluster: stored.cluster,
            created: stored.created,
            members: stored.members,
            due: stored.created && stored.members >= cfg.min_cluster_items,
            supersedes: stored.superseded,
        });
    }
    Ok(out)
}

/// Delete a memory; a summary that covered it is deleted at once.
pub fn forget(
    h: &mut impl MemoryHost,
    id: &str,
    cfg: &MemoryConfig,
) -> Result<Option<Forgotten>, Error> {
    check_config(cfg)?;
    let Some(gone) = h.delete_memory(id)? else {
        return Ok(None);
    };
    let summary = h.summary(gone.cluster)?;
    let covered = summary.as_ref().is_some_and(|s| gone.seq <= s.covered_seq);
    if covered {
        h.delete_summary(gone.cluster)?;
    }
    let left = h.members_after(gone.cluster, PAST_NEWEST)?.count;
    Ok(Some(Forgotten {
        cluster: gone.cluster,
        summary_deleted: covered,
        due: left >= cfg.min_cluster_items,
    }))
}

/// Instructions for a summary of related facts.
pub const FACTS_SYSTEM: &str = "You condense related facts from a memory system into one \
summary. The facts below are about one subject, one per line. Write one paragraph of at most \
5 sentences that states every fact, merges duplicates and says so when facts conflict. Keep \
names, numbers, dates and identifiers exactly as written. A fact marked as no longer true was \
replaced by a later one: state the later one as what is true now, and the earlier one only as \
what it replaced. Do not add anything the facts do not say, do not greet and do not comment on \
the task. Output only the summary text.";

/// Instructions for folding new facts into a summary.
pub const FACTS_UPDATE_SYSTEM: &str = "You maintain the summary of related facts in a memory \
system. You are given the current summary and new facts about the same subject. Write one \
updated paragraph of at most 5 sentences that states everything in the current summary and \
every new fact, merges duplicates and says so when facts conflict. Keep names, numbers, dates \
and identifiers exactly as written. A new fact that replaces one in the summary is what is true \
now: say so, and keep the earlier one only as what it replaced. Do not add anything else. \
Output only the summary text.";

/// Instructions for merging summaries of parts of one cluster.
pub const FACTS_REDUCE_SYSTEM: &str = "You merge partial summaries of groups of related facts \
about one subject into one summary for a memory system. Write one paragraph of at most 5 \
sentences that keeps every fact the partial summaries state, merges duplicates and says so \
when facts conflict. Keep names, numbers, dates and identifiers exactly as written. Do not add \
anything else. Output only the summary text.";

fn built(system: &str, body: String) -> Built {
    let messages = vec![
        Message::new(Role::System, system),
        Message::new(Role::User, body),
    ];
    let chatml = prompt::render_chatml(&messages);
    Built { messages, chatml }
}

fn fact_line(text: &str) -> String {
    // One line per fact: newlines inside a fact would read as further facts.
    let flat: Vec<&str> = text.split_whitespace().collect();
    format!("- {}", prompt::neutralize(&flat.join(" ")))
}

/// A day, as summaries write it (`14 Apr 2025`).
fn day_of(ms: u64) -> String {
    crate::dates::Day::of_ms(ms.min(i64::MAX as u64) as i64).render_short()
}

/// A member as a summary prompt gives it: a superseded one marked, so the summary tells what
/// is true now from what it replaced.
pub fn fact_text(m: &Memory) -> String {
    match m.superseded_by {
        Some(_) => format!(
            "(no longer true since {}; a later fact replaced it) {}",
            day_of(m.superseded_ms),
            m.text
        ),
        None => m.text.clone(),
    }
}

/// The prompt for `facts`, folded into `previous` when given.
pub fn facts_prompt(facts: &[&str], previous: Option<&str>) -> Built {
    let lines: Vec<String> = facts.iter().map(|f| fact_line(f)).collect();
    match previous {
        None => built(
            FACTS_SYSTEM,
            format!("Facts:\n{}\n\nWrite the summary now.", lines.join("\n")),
        ),
        Some(p) => built(
            FACTS_UPDATE_SYSTEM,
            format!(
                "Current summary:\n{}\n\nNew facts:\n{}\n\nWrite the updated summary now.",
                prompt::neutralize(p.trim()),
                lines.join("\n")
            ),
        ),
    }
}

/// The prompt merging partial summaries.
pub fn reduce_prompt(parts: &[String]) -> Built {
    let body: Vec<String> = parts
        .iter()
        .enumerate()
        .map(|(i, p)| format!("Part {}:\n{}", i + 1, prompt::neutralize(p.trim())))
        .collect();
    built(
        FACTS_REDUCE_SYSTEM,
        format!(
            "Partial summaries:\n\n{}\n\nWrite the merged summary now.",
            body.join("\n\n")
        ),
    )
}

fn built_tokens(b: &Built) -> u32 {
    b.messages
        .iter()
        .map(|m| estimate_tokens(&m.content) + MESSAGE_OVERHEAD)
        .sum::<u32>()
        + MESSAGE_OVERHEAD
}

/// The prompt budget of one call.
pub fn budget(cfg: &Config, mcfg: &MemoryConfig) -> u32 {
    let derived = cfg
        .context_length
        .saturating_sub(cfg.max_output_tokens)
        .saturating_sub(64);
    if mcfg.prompt_budget == 0 {
        derived
    } else {
        mcfg.prompt_budget.min(derived)
    }
}

/// Calls and tokens spent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spent {
    /// Calls.
    pub calls: u32,
    /// Prompt tokens (reported, else estimated).
    pub prompt_tokens: u32,
    /// Output tokens (reported, else estimated).
    pub output_tokens: u32,
}

/// Run requests, check each answer, and return the cleaned texts (all or nothing).
fn run(
    h: &mut impl MemoryHost,
    cfg: &Config,
    reqs: Vec<Request>,
    spent: &mut Spent,
) -> Result<Vec<String>, Error> {
    let estimates: Vec<u32> = reqs.iter().map(crate::engine::prompt_estimate).collect();
    let answers = h.generate_batch(reqs);
    let mut out = Vec::with_capacity(answers.len());
    for (a, est) in answers.into_iter().zip(estimates) {
        let r = a?;
        spent.calls += 1;
        spent.prompt_tokens += r.prompt_tokens.unwrap_or(est);
        let cleaned = strip::strip_template_tokens(&r.text);
        spent.output_tokens += r.output_tokens.unwrap_or_else(|| estimate_tokens(&cleaned));
        quality::check(&cleaned, r.finish, cfg.max_output_tokens, est)
            .map_err(Error::RejectedOutput)?;
        out.push(cleaned);
    }
    Ok(out)
}

/// Summarize facts with the model within `budget` prompt tokens: one call when they fit, else
/// in parts (grouped by the map-reduce planner) merged level by level. Never truncates.
fn model_summary(
    h: &mut impl MemoryHost,
    cfg: &Config,
    budget: u32,
    facts: &[&str],
    previous: Option<&str>,
    spent: &mut Spent,
) -> Result<String, Error> {
    let whole = facts_prompt(facts, previous);
    if built_tokens(&whole) <= budget {
        return Ok(run(h, cfg, vec![crate::engine::request(cfg, whole)], spent)?.remove(0));
    }
    // Parts, merged in reduce prompts that must hold two answers at their longest.
    let reduce_fixed = built_tokens(&reduce_prompt(&[]));
    let longest = quality::output_ceiling(cfg.max_output_tokens) + crate::plan::LABEL_COST + 4;
    if reduce_fixed + 2 * longest > budget {
        return Err(Error::InvalidInput(format!(
            "the cluster's memories need more than one prompt, and a merge prompt of {budget} tokens cannot hold two answers of up to {} tokens; raise the prompt budget or the context length, or lower the output limit",
            cfg.max_output_tokens
        )));
    }
    // The fixed part of a prompt, then as many facts as fit.
    let fixed = built_tokens(&facts_prompt(&[], previous));
    let room = budget.saturating_sub(fixed);
    let sizes: Vec<u32> = facts
        .iter()
        .map(|f| estimate_tokens(&fact_line(f)) + 1)
        .collect();
    if let Some(i) = sizes.iter().position(|s| *s > room) {
        return Err(Error::InvalidInput(format!(
            "a memory of about {} tokens does not fit a summary prompt of {budget} tokens; raise the prompt budget or the context length",
            sizes[i]
        )));
    }
    let groups = group(&sizes, room);
    let reqs: Vec<Request> = groups
        .iter()
        .map(|g| crate::engine::request(cfg, facts_prompt(&facts[g.clone()], previous)))
        .collect();
    let mut parts = run(h, cfg, reqs, spent)?;
    // Merge level by level until one remains.
    while parts.len() > 1 {
        let sizes: Vec<u32> = parts.iter().map(|p| estimate_tokens(p) + 4).collect();
        let groups = plan_groups(&sizes, budget.saturating_sub(reduce_fixed)).ok_or_else(|| {
            Error::InvalidInput(format!(
                "two partial summaries do not fit a prompt of {budget} tokens; raise the prompt budget or the context length"
            ))
        })?;
        let reqs: Vec<Request> = groups
            .iter()
            .map(|g| crate::engine::request(cfg, reduce_prompt(&parts[g.clone()])))
            .collect();
        parts = run(h, cfg, reqs, spent)?;
    }
    Ok(parts.remove(0))
}

/// Group sizes into runs of at most `room`, in order (a single oversized item is its own group;
/// callers check that none is).
fn group(sizes: &[u32], room: u32) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut used) = (0, 0u32);
    for (i, &s) in sizes.iter().enumerate() {
        if i > start && used + s > room {
            out.push(start..i);
            start = i;
            used = 0;
        }
        used += s;
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

/// The summary without a model: the distinct facts, most important first, as sentences, up to
/// the output limit; facts beyond it are counted in a closing sentence, not dropped silently.
/// `ranked` is the cluster's best members in the order `top-members` returns, `total` its member
/// count: members not in `ranked` are counted as not shown.
pub fn extractive_summary(ranked: &[Memory], total: u32, max_tokens: u32) -> String {
    let mut seen = BTreeSet::new();
    let mut lines: Vec<String> = Vec::new();
    let mut used = 0u32;
    let mut left = (total as usize).saturating_sub(ranked.len());
    let by_id: BTreeMap<&str, &Memory> = ranked.iter().map(|m| (m.id.as_str(), m)).collect();
    for m in ranked {
        let flat = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut s = flat(&m.text);
        if let Some(next) = &m.superseded_by {
            // History: told under the memory that replaced it, or marked when that one is
            // not among those shown.
            if by_id.contains_key(next.as_str()) {
                continue;
            }
            s = format!("No longer true since {}: {s}", day_of(m.superseded_ms));
        }
        if !seen.insert(s.to_lowercase()) {
            continue;
        }
        if !s.ends_with(['.', '!', '?']) {
            s.push('.');
        }
        // What it replaced, newest first.
        let mut replaced: Vec<String> = Vec::new();
        let mut prev = m.supersedes.as_deref();
        while let Some(p) = prev.and_then(|p| by_id.get(p))
            && replaced.len() < MAX_SUCCESSION
        {
            let t = flat(&p.text);
            replaced.push(format!(
                "on {}: {}",
                day_of(p.superseded_ms),
                t.trim_end_matches(['.', '!', '?'])
            ));
            prev = p.supersedes.as_deref();
        }
        if !replaced.is_empty() {
            s.push_str(&format!(" (It replaced, {}.)", replaced.join("; ")));
        }
        let t = estimate_tokens(&s) + 1;
        if used + t > max_tokens && !lines.is_empty() {
            left += 1;
            continue;
        }
        used += t;
        lines.push(s);
    }
    let mut out = lines.join(" ");
    if left > 0 {
        out.push_str(&format!(
            " ({left} more related {} not shown.)",
            if left == 1 { "fact" } else { "facts" }
        ));
    }
    out
}

/// Read a cluster's best members, a page at a time, until they hold twice what an extractive
/// summary of `max_tokens` can show (or the cluster ends). Members further down could only
/// fill what little room is left; they are counted as not shown.
fn ranked_members(
    h: &mut impl MemoryHost,
    cluster: u64,
    max_tokens: u32,
) -> Result<Vec<Memory>, Error> {
    let mut out: Vec<Memory> = Vec::new();
    let mut tokens = 0u64;
    loop {
        let page = h.top_members(cluster, out.len() as u32, RANK_PAGE)?;
        let short = (page.len() as u32) < RANK_PAGE;
        tokens += page.iter().map(|m| u64::from(m.tokens) + 1).sum::<u64>();
        out.extend(page);
        if short || tokens > 2 * u64::from(max_tokens) {
            return Ok(out);
        }
    }
}

/// The centroid of a cluster (from its scope's centroids), if it has one of `model`.
fn centroid_of(
    h: &mut impl MemoryHost,
    scope: &Scope,
    cluster: u64,
    model: &str,
) -> Result<Option<Vec<f32>>, Error> {
    Ok(h.centroids(scope)?
        .into_iter()
        .find(|c| c.cluster == cluster && c.model == model)
        .map(|c| c.vector))
}

/// Bring a cluster's summary to its current member set.
///
/// The cost follows the members written since the summary, not the cluster's size: the store
/// returns the members after the summary's `covered_seq` with the cluster's count and
/// membership version, the member hash takes the new ids in, and a model folds only the new
/// facts into the current text (the extractive summary reads the best-ranked members a page
/// at a time). Only when the summary is missing, or its count no longer adds up, is it written
/// from every member.
pub fn summarize_cluster(
    h: &mut impl MemoryHost,
    cluster: u64,
    cfg: &Config,
    mcfg: &MemoryConfig,
) -> Result<ClusterOutcome, Error> {
    check_config(mcfg)?;
    let current = h.summary(cluster)?;
    let done = |action, summary, spent: Spent| ClusterOutcome {
        action,
        summary,
        calls: spent.calls,
        prompt_tokens: spent.prompt_tokens,
        output_tokens: spent.output_tokens,
    };
    let after = current.as_ref().map_or(0, |s| s.covered_seq);
    let mut set = h.members_after(cluster, after)?;
    if set.count < mcfg.min_cluster_items {
        return Ok(match current {
            Some(_) => {
                h.delete_summary(cluster)?;
                done(Action::Deleted, None, Spent::default())
            }
            None => done(Action::TooFew, None, Spent::default()),
        });
    }
    // Fold only the new members in when every covered member is still here (a delete of one
    // deletes the summary, so the count adds up); otherwise start over from every member.
    // A new member that supersedes a covered one changes what the summary says is true: the
    // whole cluster is summarized again, the superseded one marked.
    let supersedes_covered = set.members.iter().any(|m| m.supersedes.is_some());
    let incremental = current.as_ref().filter(|s| {
        u64::from(s.covered) + set.members.len() as u64 == u64::from(set.count)
            && !supersedes_covered
    });
    if let Some(s) = incremental
        && set.members.is_empty()
    {
        return Ok(done(Action::Unchanged, Some(s.clone()), Spent::default()));
    }
    if incremental.is_none() && after > 0 {
        set = h.members_after(cluster, 0)?;
        if set.count < mcfg.min_cluster_items {
            // Deleted meanwhile: the next run sees it.
            return Ok(done(Action::LostRace, current, Spent::default()));
        }
    }
    let new = &set.members;
    let Some(newest) = new.last() else {
        return Ok(done(Action::LostRace, current, Spent::default()));
    };
    let (hash, importance) = match incremental {
        Some(s) => (
            member_hash_with(&s.member_hash, &ids_of(new)),
            s.importance.max(propagated_importance(new)),
        ),
        None => (member_hash(&ids_of(new)), propagated_importance(new)),
    };
    let covered_seq = newest.seq;
    let scope = newest.scope.clone();
    let mut spent = Spent::default();
    let (text, model) = match cfg.engine {
        Engine::Extractive => {
            let ranked = ranked_members(h, cluster, cfg.max_output_tokens)?;
            (
                extractive_summary(&ranked, set.count, cfg.max_output_tokens),
                "extractive".to_string(),
            )
        }
        Engine::Llm => {
            let texts: Vec<String> = new.iter().map(fact_text).collect();
            let facts: Vec<&str> = texts.iter().map(String::as_str).collect();
            let previous = incremental.map(|s| s.text.as_str());
            let b = budget(cfg, mcfg);
            let text = model_summary(h, cfg, b, &facts, previous, &mut spent).inspect_err(|e| {
                if let Error::RejectedOutput(why) = e {
                    let _ = h.set_cluster_note(cluster, Some(format!("summary discarded: {why}")));
                }
            })?;
            (text, cfg.model.clone())
        }
    };
    // The semantic check: the summary must be about what its members are about.
    let e = embed_texts(h, mcfg, std::slice::from_ref(&text))?;
    let vector = e.vectors.into_iter().next().unwrap_or_default();
    match centroid_of(h, &scope, cluster, &e.model)? {
        Some(c) => {
            let sim = cosine(&c, &vector);
            if sim < mcfg.summary_min_similarity {
                let why = format!(
                    "the summary's similarity to its cluster is {sim:.3}, under the {:.3} required: it is not about its memories",
                    mcfg.summary_min_similarity
                );
                h.log(
                    Level::Warn,
                    &format!("cluster {cluster}: summary discarded: {why}"),
                );
                h.set_cluster_note(cluster, Some(format!("summary discarded: {why}")))?;
                return Err(Error::RejectedOutput(why));
            }
        }
        None => h.log(
            Level::Warn,
            &format!(
                "cluster {cluster}: no centroid of {} to check the summary against",
                e.model
            ),
        ),
    }
    let now = h.now_ms();
    let w = SummaryWrite {
        cluster,
        expect: current.as_ref().map(|s| s.member_hash.clone()),
        member_hash: hash,
        covered_seq,
        covered: set.count,
        version: set.version,
        tokens: estimate_tokens(&text),
        text,
        importance,
        model,
        vector_model: e.model,
        vector,
        calls: spent.calls,
        prompt_tokens: spent.prompt_tokens,
        output_tokens: spent.output_tokens,
        now_ms: now,
    };
    if !h.write_summary(w)? {
        let now = h.summary(cluster)?;
        return Ok(done(Action::LostRace, now, spent));
    }
    h.set_cluster_note(cluster, None)?;
    let stored = h.summary(cluster)?;
    let action = if current.is_some() {
        Action::Refreshed
    } else {
        Action::Created
    };
    Ok(done(action, stored, spent))
}

fn ids_of(members: &[Memory]) -> Vec<&str> {
    members.iter().map(|m| m.id.as_str()).collect()
}

/// The `k` best memories and summaries for `query`.
pub fn recall(
    h: &mut impl MemoryHost,
    query: &str,
    filter: &Filter,
    k: u32,
    summaries: bool,
    cfg: &MemoryConfig,
) -> Result<Vec<Recalled>, Error> {
    check_config(cfg)?;
    if query.trim().is_empty() {
        return Err(invalid("the recall query is empty; say what to recall"));
    }
    if query.len() > MAX_MEMORY_BYTES {
        return Err(invalid(format!(
            "the recall query is {} bytes, over the {MAX_MEMORY_BYTES}-byte limit",
            query.len()
        )));
    }
    let k = k.clamp(1, 100);
    // A question about a fact is asked in other words than the fact is told ("Where does
    // Robin live now?" / "We moved to Lyon"): the fact's own words go with it.
    let e = embed_texts(h, cfg, &[crate::facts::with_fact_words(query)])?;
    let q = e.vectors.into_iter().next().unwrap_or_default();
    // More candidates than asked for: importance can lift one from further down.
    let hits = h.search(&q, &e.model, filter, k.saturating_mul(4).max(20))?;
    let mut ranked: Vec<(Recalled, u64)> = hits
        .into_iter()
        // A memory that shares nothing with the query (a score of 0 or below) is no hit,
        // however few the others are.
        .filter(|x| score(x.similarity, x.importance) > 0.0)
        .filter(|x| match x.kind {
            HitKind::Memory => true,
            HitKind::Summary => summaries && x.covered >= cfg.min_cluster_items,
        })
        .map(|x| {
            let r = Recalled {
                score: score(x.similarity, x.importance),
                kind: x.kind,
                id: x.id,
                text: x.text,
                similarity: x.similarity,
                importance: x.importance,
                cluster: x.cluster,
                sources: Vec::new(),
                superseded_by: x.superseded_by,
                superseded_ms: x.superseded_ms,
            };
            (r, x.covered_seq)
        })
        .collect();
    ranked.sort_by(|(a, _), (b, _)| {
        b.score
            .total_cmp(&a.score)
            .then((a.kind == HitKind::Memory).cmp(&(b.kind == HitKind::Memory)))
            .then(a.id.cmp(&b.id))
    });
    ranked.truncate(k as usize);
    // A summary's sources, read for the summaries returned only.
    let mut out = Vec::with_capacity(ranked.len());
    for (mut r, covered_seq) in ranked {
        if r.kind == HitKind::Summary {
            r.sources = h.member_ids(r.cluster, covered_seq)?;
        }
        out.push(r);
    }
    current_first(h, &mut out)?;
    out.truncate(k as usize);
    for r in out.iter_mut().filter(|r| r.kind == HitKind::Memory) {
        if let Some(t) = readable_item(&r.text) {
            r.text = t;
        }
    }
    Ok(out)
}

/// A memory that holds a LangGraph store item (`{"namespace": [...], "key": ..., "value":
/// ...}`, the JSON envelope the Python adapter's store writes and reads back exactly) as a
/// recall shows it, to a person or a model: `key (namespace): field: value; …`. `None` for
/// any other text.
pub fn readable_item(text: &str) -> Option<String> {
    if !text.starts_with('{') {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let namespace = v.get("namespace")?.as_array()?;
    let key = v.get("key")?.as_str()?;
    let value = v.get("value")?;
    fn plain(v: &serde_json::Value) -> String {
        match v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Object(m) => m
                .iter()
                .map(|(k, x)| format!("{k}: {}", plain(x)))
                .collect::<Vec<_>>()
                .join("; "),
            serde_json::Value::Array(a) => a.iter().map(plain).collect::<Vec<_>>().join(", "),
            other => other.to_string(),
        }
    }
    let at: Vec<String> = namespace.iter().map(plain).collect();
    Some(format!("{key} ({}): {}", at.join("/"), plain(value)))
}

/// How many successors a superseded memory's chain is followed through.
const MAX_SUCCESSION: usize = 64;

/// The memory current in `next`'s place: `next`, or the one that superseded it, and so on.
fn current_of(h: &mut impl MemoryHost, next: &str) -> Result<Option<Memory>, Error> {
    let mut id = next.to_string();
    for _ in 0..MAX_SUCCESSION {
        let Some(m) = h.get_memory(&id)? else {
            return Ok(None);
        };
        match &m.superseded_by {
            Some(n) => id = n.clone(),
            None => return Ok(Some(m)),
        }
    }
    Ok(None)
}

/// Put the memory current in a superseded memory's place before it: moved up when the query
/// reached it further down, added (with the superseded one's score) when it did not.
fn current_first(h: &mut impl MemoryHost, out: &mut Vec<Recalled>) -> Result<(), Error> {
    let mut i = 0;
    while i < out.len() {
        let next = match (&out[i].kind, &out[i].superseded_by) {
            (HitKind::Memory, Some(n)) => n.clone(),
            _ => {
                i += 1;
                continue;
            }
        };
        if let Some(c) = current_of(h, &next)? {
            match out
                .iter()
                .position(|r| r.kind == HitKind::Memory && r.id == c.id)
            {
                Some(j) if j < i => {}
                Some(j) => {
                    let r = out.remove(j);
                    out.insert(i, r);
                    i += 1;
                }
                None => {
                    let r = &out[i];
                    let added = Recalled {
                        kind: HitKind::Memory,
                        id: c.id,
                        text: c.text,
                        score: r.score,
                        similarity: r.similarity,
                        importance: c.importance,
                        cluster: c.cluster,
                        sources: Vec::new(),
                        superseded_by: None,
                        superseded_ms: 0,
                    };
                    out.insert(i, added);
                    i += 1;
                }
            }
        }
        i += 1;
    }
    Ok(())
}

/// A finished answer as the host would give it (tests).
#[cfg(test)]
pub(crate) fn answer(text: &str) -> Response {
    Response {
        text: text.into(),
        finish: crate::types::Finish::Stop,
        prompt_tokens: None,
        output_tokens: None,
    }
}

#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;
