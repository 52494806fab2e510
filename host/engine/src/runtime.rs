//! Loading the guest component (with an on-disk cache of the compiled code) and calling it:
//! a fresh, isolated instance per call.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Engine as WasmEngine, Store as WasmStore, StoreLimitsBuilder};

use crate::bindings::{Engine as Guest, EnginePre};
use crate::clock::{Clock, SystemClock};
use crate::control::{CallControl, Cancelled};
use crate::imports::{HostState, LogSink};
use crate::llm::{LlmBackend, NoModel};
use crate::store::Store;
use crate::types::{
    Config, ContextRequest, ContextWindow, Error, FreshnessReport, Level, Message, NewEpisode,
    Outcome, ParseBatch, ParseError, ParseOptions, PlanReport, SummaryRow, describe,
};

/// The guest component built by `host/build.rs` and embedded in this crate.
pub static EMBEDDED_COMPONENT: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/abridge_guest.wasm"));

/// The WIT the component implements, as embedded (paths under `wit/`): the package
/// `abridge:engine@0.2.0` — what a host implements (its imports) and calls (its exports) —
/// and, in `deps/`, the few WASI 0.2.6 interfaces the component also imports (its `component`
/// world names them all).
pub static WIT_FILES: &[(&str, &str)] = &[
    ("abridge.wit", include_str!("../../../wit/abridge.wit")),
    (
        "deps/wasi-io.wit",
        include_str!("../../../wit/deps/wasi-io.wit"),
    ),
    (
        "deps/wasi-cli.wit",
        include_str!("../../../wit/deps/wasi-cli.wit"),
    ),
];

/// Guest instances this process made: every call into the component is one (a fresh instance
/// of the compiled component). What `/metrics` reports as `abridge_guest_instances_total`.
pub fn instances() -> u64 {
    INSTANCES.load(std::sync::atomic::Ordering::Relaxed)
}

static INSTANCES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The component's exports, by name (`abridge:engine/summarizer@0.2.0`, …).
pub fn export_names(runtime: &Runtime) -> Vec<String> {
    runtime
        .component
        .component_type()
        .exports(&runtime.engine)
        .map(|(name, _)| name.to_string())
        .collect()
}

/// SHA-256 of the embedded component, hex, as the build computed it (`abridge --version`
/// names it).
pub const EMBEDDED_SHA256: &str = env!("ABRIDGE_COMPONENT_SHA256");

/// SHA-256 of the embedded component, hex: what a host that loads it should check.
pub fn embedded_sha256() -> String {
    crate::text::hex(&Sha256::digest(EMBEDDED_COMPONENT))
}

/// The wasmtime version compiled in (part of the cache key).
pub const WASMTIME_VERSION: &str = "48.0.8";

/// Where the guest's bytes come from.
#[derive(Clone, Debug)]
pub enum ComponentSource {
    /// The component embedded at build time.
    Embedded,
    /// A `.wasm` component file.
    File(PathBuf),
}

/// How the component was made ready.
#[derive(Clone, Copy, Debug)]
pub struct LoadReport {
    /// Whether the compiled code came from the disk cache.
    pub from_cache: bool,
    /// Time to get a ready `Component`, in milliseconds.
    pub millis: f64,
}

/// A compiled, linked guest, shared by every call.
pub struct Runtime {
    engine: WasmEngine,
    pre: EnginePre<HostState>,
    component: Component,
    report: LoadReport,
}

/// The default cache directory: `$ABRIDGE_CACHE_DIR`, else `$XDG_CACHE_HOME/abridge`, else
/// `~/.cache/abridge`.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("ABRIDGE_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("abridge"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("abridge"))
}

impl Runtime {
    /// Compile (or load from `cache_dir`) the component and link it.
    pub fn load(source: &ComponentSource, cache_dir: Option<&Path>) -> Result<Runtime> {
        let bytes: std::borrow::Cow<'static, [u8]> = match source {
            ComponentSource::Embedded => EMBEDDED_COMPONENT.into(),
            ComponentSource::File(p) => std::fs::read(p)
                .with_context(|| format!("reading the component {}", p.display()))?
                .into(),
        };
        let mut config = wasmtime::Config::new();
        // Fuel bounds the guest's CPU per call (see sandbox.rs).
        config.consume_fuel(true);
        let engine = WasmEngine::new(&config)?;
        let started = Instant::now();
        let (component, from_cache) = compile_cached(&engine, &bytes, cache_dir)?;
        let report = LoadReport {
            from_cache,
            millis: started.elapsed().as_secs_f64() * 1e3,
        };
        let mut linker: Linker<HostState> = Linker::new(&engine);
        // Only wasi:io and wasi:cli, over a context that grants nothing (sandbox.rs).
        crate::sandbox::add_wasi_to_linker(&mut linker)?;
        Guest::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)?;
        let pre = EnginePre::new(linker.instantiate_pre(&component)?)?;
        Ok(Runtime {
            engine,
            pre,
            component,
            report,
        })
    }

    /// The embedded component, loaded once per process (from the default cache directory)
    /// and shared by every engine built without a runtime of its own.
    pub fn embedded() -> Result<Arc<Runtime>> {
        static EMBEDDED: std::sync::Mutex<Option<Arc<Runtime>>> = std::sync::Mutex::new(None);
        let mut slot = EMBEDDED.lock().expect("the runtime lock is poisoned");
        if let Some(r) = slot.as_ref() {
            return Ok(r.clone());
        }
        let r = Arc::new(Runtime::load(
            &ComponentSource::Embedded,
            default_cache_dir().as_deref(),
        )?);
        *slot = Some(r.clone());
        Ok(r)
    }

    /// How loading went.
    pub fn report(&self) -> LoadReport {
        self.report
    }

    /// The compiled component (to inspect its imports, for instance).
    pub fn component(&self) -> &Component {
        &self.component
    }

    /// The wasmtime engine.
    pub fn engine(&self) -> &WasmEngine {
        &self.engine
    }

    /// Names of the component's imports (`wasi:io/streams@0.2.6`, `abridge:engine/llm@0.2.0`, …).
    pub fn import_names(&self) -> Vec<String> {
        self.component
            .component_type()
            .imports(&self.engine)
            .map(|(name, _)| name.to_string())
            .collect()
    }
}

/// Compile `bytes`, or deserialize the compiled code cached under a key of wasmtime version,
/// engine configuration and component hash.
fn compile_cached(
    engine: &WasmEngine,
    bytes: &[u8],
    cache_dir: Option<&Path>,
) -> Result<(Component, bool)> {
    let Some(dir) = cache_dir else {
        return Ok((Component::new(engine, bytes)?, false));
    };
    let mut compat = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut compat);
    let digest = Sha256::digest(bytes);
    let key = format!(
        "abridge-guest-{WASMTIME_VERSION}-{:016x}-{}.cwasm",
        compat.finish(),
        crate::text::hex(&digest[..12])
    );
    let path = dir.join(&key);
    // The compiled code runs as native code: a flipped bit or an overwritten section would
    // run outside the sandbox. Each entry's SHA-256 is kept in a file of its own, and an
    // entry loads only when its bytes hash to it; otherwise it is compiled again.
    let sum_path = dir.join(format!("{key}.sha256"));
    // Read, not mmap: another process may replace or truncate the file while we run.
    if let Ok(data) = std::fs::read(&path) {
        let expected = std::fs::read_to_string(&sum_path).unwrap_or_default();
        if expected.trim() == crate::text::hex(&Sha256::digest(&data)) {
            // SAFETY: the bytes are exactly those this function wrote from our own
            // compilation (their hash matches the one recorded beside them), under a key
            // that includes the wasmtime version and engine configuration; wasmtime also
            // validates its header and refuses incompatible artifacts.
            if let Ok(c) = unsafe { Component::deserialize(engine, &data) } {
                // In use: newest again, so pruning keeps it.
                if let Ok(f) = std::fs::File::options().write(true).open(&path) {
                    let _ = f.set_modified(std::time::SystemTime::now());
                }
                return Ok((c, true));
            }
        }
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(&sum_path);
    }
    let component = Component::new(engine, bytes)?;
    // The cache is an optimisation: failing to write it is not an error.
    if std::fs::create_dir_all(dir).is_ok()
        && let Ok(data) = component.serialize()
    {
        // Write then rename, so a reader never sees a half-written file; the hash goes first,
        // so an artifact is never visible without the hash it must match.
        let tmp = |name: &str| dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let (tmp_sum, tmp_art) = (tmp(&format!("{key}.sha256")), tmp(&key));
        if std::fs::write(&tmp_sum, crate::text::hex(&Sha256::digest(&data))).is_ok()
            && std::fs::rename(&tmp_sum, &sum_path).is_ok()
            && std::fs::write(&tmp_art, &data).is_ok()
        {
            let _ = std::fs::rename(&tmp_art, &path);
        }
        let _ = std::fs::remove_file(&tmp_sum);
        let _ = std::fs::remove_file(&tmp_art);
        prune_cache(dir, CACHE_KEPT);
    }
    Ok((component, false))
}

/// Compiled components kept in the cache (each about 30 MB): the most recently used ones.
const CACHE_KEPT: usize = 4;

/// Remove all but the `keep` most recently used compiled components (and their hashes) from
/// the cache: every upgrade or new build adds one, and nothing else would take them away.
fn prune_cache(dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut found: Vec<(std::time::SystemTime, std::path::PathBuf)> = entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("abridge-guest-") && name.ends_with(".cwasm")
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    found.sort_by_key(|e| std::cmp::Reverse(e.0));
    for (_, path) in found.into_iter().skip(keep) {
        let _ = std::fs::remove_file(&path);
        let mut sum = path.into_os_string();
        sum.push(".sha256");
        let _ = std::fs::remove_file(sum);
    }
}

#[cfg(test)]
mod cache_tests {
    use super::prune_cache;

    #[test]
    fn the_hash_the_build_computed_is_the_embedded_components() {
        assert_eq!(super::EMBEDDED_SHA256, super::embedded_sha256());
        assert_eq!(super::EMBEDDED_SHA256.len(), 64);
    }

    #[test]
    fn the_cache_keeps_the_most_recently_used_components_and_nothing_else_of_theirs() {
        let dir = tempfile::tempdir().unwrap();
        let now = std::time::SystemTime::now();
        for i in 0..6u64 {
            let name = format!("abridge-guest-48.0.8-0-{i}.cwasm");
            let f = std::fs::File::create(dir.path().join(&name)).unwrap();
            f.set_modified(now - std::time::Duration::from_secs(600 - i * 60))
                .unwrap();
            std::fs::write(dir.path().join(format!("{name}.sha256")), "x").unwrap();
        }
        std::fs::write(dir.path().join("other.txt"), "kept").unwrap();
        prune_cache(dir.path(), 4);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut want: Vec<String> = (2..6u64)
            .flat_map(|i| {
                let n = format!("abridge-guest-48.0.8-0-{i}.cwasm");
                [n.clone(), format!("{n}.sha256")]
            })
            .collect();
        want.push("other.txt".into());
        want.sort();
        assert_eq!(left, want);
    }
}

/// What can go wrong calling the engine.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The engine reported an actionable error (see [`Error`]).
    #[error("{}", describe(.0))]
    Engine(Error),
    /// The guest trapped or could not be instantiated (a bug, or a sandbox limit).
    #[error("the engine failed: {0:#}")]
    Host(anyhow::Error),
    /// The call was cancelled through its [`CallControl`]; nothing was written.
    #[error("cancelled; nothing was written (answers already received stay cached)")]
    Cancelled,
}

impl From<anyhow::Error> for CallError {
    fn from(e: anyhow::Error) -> Self {
        CallError::Host(e)
    }
}

impl From<wasmtime::Error> for CallError {
    fn from(e: wasmtime::Error) -> Self {
        CallError::Host(anyhow::Error::from(e))
    }
}

/// A prompt in both renderings (see the WIT `text.built-prompt`).
pub use crate::bindings::exports::abridge::engine::text::BuiltPrompt;

/// One call of a `summarizer` export in a fresh instance (with an optional [`CallControl`]):
/// a trap becomes [`CallError::Host`] (or `Cancelled`), an engine error [`CallError::Engine`].
macro_rules! summarizer {
    ($self:ident, $control:expr, $method:ident($($arg:expr),*)) => {{
        let (mut store, g) = $self.instance_with($control).await?;
        g.abridge_engine_summarizer()
            .$method(&mut store, $($arg),*)
            .await
            .map_err(|e| $self.trap(e))?
            .map_err(CallError::Engine)
    }};
}

/// A `summarizer` call that works through a session's episodes (catching up, planning): its
/// CPU budget grows with the session (one more per-call budget per
/// [`TOKENS_PER_BUDGET`](crate::sandbox::TOKENS_PER_BUDGET) stored tokens), so a long
/// transcript is not cut off by a limit meant for runaway loops.
macro_rules! summarizer_sized {
    ($self:ident, $session:expr, $control:expr, $method:ident($($arg:expr),*)) => {{
        let fuel = $self.fuel_for($session).await;
        let (mut store, g) = $self.instance_with($control).await?;
        store.set_fuel(fuel).map_err(|e| $self.trap(e))?;
        g.abridge_engine_summarizer()
            .$method(&mut store, $($arg),*)
            .await
            .map_err(|e| $self.trap_with(e, fuel))?
            .map_err(CallError::Engine)
    }};
}

/// One call of a `memories` export in a fresh instance.
macro_rules! memories {
    ($self:ident, $method:ident($($arg:expr),*)) => {{
        let (mut store, g) = $self.instance().await?;
        g.abridge_engine_memories()
            .$method(&mut store, $($arg),*)
            .await
            .map_err(|e| $self.trap(e))?
            .map_err(CallError::Engine)
    }};
}

/// The engine, ready to call: a shared compiled guest plus the embedder's LLM, store, clock
/// and log sink. Each call runs in a fresh instance, so a trap in one call cannot affect
/// another.
pub struct Abridge {
    runtime: Arc<Runtime>,
    llm: Arc<dyn LlmBackend>,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    log: LogSink,
    batch_concurrency: usize,
    adaptive: Arc<std::sync::Mutex<crate::adaptive::Adaptive>>,
    lockstep: bool,
    memory_limit: usize,
    fuel: u64,
    recall: Option<crate::imports::RecallBinding>,
}

/// A streaming transcript parser inside the sandbox (see [`Abridge::parser`]).
pub struct TranscriptParser<'a> {
    abridge: &'a Abridge,
    store: WasmStore<HostState>,
    guest: Guest,
    res: wasmtime::component::ResourceAny,
}

/// One call on the parser resource, with a fresh fuel budget.
macro_rules! parser_call {
    ($self:ident, $method:ident($($arg:expr),*)) => {{
        $self
            .store
            .set_fuel($self.abridge.fuel)
            .map_err(|e| $self.abridge.trap(e))?;
        $self
            .guest
            .abridge_engine_transcripts()
            .parser()
            .$method(&mut $self.store, $self.res $(, $arg)*)
            .await
            .map_err(|e| $self.abridge.trap(e))
    }};
}

impl TranscriptParser<'_> {
    /// Parse the next bytes; the outer error is a trap (a sandbox limit), the inner one what
    /// is wrong with the file.
    pub async fn feed(
        &mut self,
        chunk: &[u8],
    ) -> Result<Result<ParseBatch, ParseError>, CallError> {
        parser_call!(self, call_feed(chunk))
    }

    /// End of input: the last line and the whole-file checks.
    pub async fn finish(&mut self) -> Result<Result<ParseBatch, ParseError>, CallError> {
        parser_call!(self, call_finish())
    }
}

/// Builds an [`Abridge`].
pub struct AbridgeBuilder {
    source: ComponentSource,
    runtime: Option<Arc<Runtime>>,
    cache_dir: Option<PathBuf>,
    llm: Arc<dyn LlmBackend>,
    store: Option<Arc<dyn Store>>,
    clock: Arc<dyn Clock>,
    log: LogSink,
    batch_concurrency: usize,
    lockstep: bool,
    memory_limit: usize,
    fuel: u64,
    recall: Option<crate::imports::RecallBinding>,
}

impl Abridge {
    /// Start building: embedded component, default cache dir, no model (extractive only),
    /// system clock, log lines dropped, batch concurrency 6, 256 MiB guest memory cap.
    pub fn builder() -> AbridgeBuilder {
        AbridgeBuilder {
            source: ComponentSource::Embedded,
            runtime: None,
            cache_dir: default_cache_dir(),
            llm: Arc::new(NoModel),
            store: None,
            clock: Arc::new(SystemClock),
            log: Arc::new(|_, _| {}),
            batch_concurrency: 6,
            lockstep: false,
            memory_limit: crate::sandbox::DEFAULT_MEMORY_LIMIT,
            fuel: crate::sandbox::DEFAULT_FUEL,
            recall: None,
        }
    }

    /// The loaded runtime (shareable with other `Abridge` values).
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The LLM backend.
    pub fn llm(&self) -> &Arc<dyn LlmBackend> {
        &self.llm
    }

    async fn instance(&self) -> Result<(WasmStore<HostState>, Guest), CallError> {
        self.instance_with(None).await
    }

    async fn instance_with(
        &self,
        control: Option<Arc<CallControl>>,
    ) -> Result<(WasmStore<HostState>, Guest), CallError> {
        let state = HostState {
            wasi: crate::sandbox::empty_ctx(),
            table: ResourceTable::new(),
            llm: self.llm.clone(),
            store: self.store.clone(),
            clock: self.clock.clone(),
            log: self.log.clone(),
            batch_concurrency: self.batch_concurrency,
            adaptive: self.adaptive.clone(),
            lockstep: self.lockstep,
            control,
            limits: StoreLimitsBuilder::new()
                .memory_size(self.memory_limit)
                .instances(8)
                .trap_on_grow_failure(true)
                .build(),
            recall: self.recall.clone(),
        };
        let mut store = WasmStore::new(&self.runtime.engine, state);
        store.limiter(|s| &mut s.limits);
        store.set_fuel(self.fuel).map_err(|e| self.trap(e))?;
        INSTANCES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let guest = self
            .runtime
            .pre
            .instantiate_async(&mut store)
            .await
            .map_err(|e| self.trap(e))?;
        Ok((store, guest))
    }

    /// The CPU budget of a call that works through `session`: the per-call budget, once more
    /// per [`TOKENS_PER_BUDGET`](crate::sandbox::TOKENS_PER_BUDGET) tokens the session holds
    /// (the per-call budget alone when its figures cannot be read; the call itself then
    /// reports the store's error).
    async fn fuel_for(&self, session: &str) -> u64 {
        let tokens = self
            .store
            .stats(session)
            .await
            .map_or(0, |s| s.total_tokens);
        let extra = u128::from(self.fuel) * u128::from(tokens)
            / u128::from(crate::sandbox::TOKENS_PER_BUDGET);
        self.fuel
            .saturating_add(u64::try_from(extra).unwrap_or(u64::MAX))
    }

    /// Turn a trap into an error that names the limit it hit, if any.
    fn trap(&self, e: wasmtime::Error) -> CallError {
        self.trap_with(e, self.fuel)
    }

    /// [`trap`](Self::trap) for a call that was given `fuel`.
    fn trap_with(&self, e: wasmtime::Error, fuel: u64) -> CallError {
        let e = anyhow::Error::from(e);
        if e.downcast_ref::<Cancelled>().is_some() {
            return CallError::Cancelled;
        }
        if matches!(
            e.downcast_ref::<wasmtime::Trap>(),
            Some(wasmtime::Trap::OutOfFuel)
        ) {
            return CallError::Host(e.context(format!(
                "the engine used up its CPU budget of {fuel} fuel units in one call; raise it with AbridgeBuilder::fuel"
            )));
        }
        // StoreLimits with trap_on_grow_failure says "forcing trap when growing memory".
        if format!("{e:#}").contains("growing memory") {
            return CallError::Host(e.context(format!(
                "the engine needed more than its {} MiB memory limit in one call; raise it with AbridgeBuilder::memory_limit",
                self.memory_limit >> 20
            )));
        }
        CallError::Host(e.context(
            "the engine trapped (a bug in the guest); the store is unchanged by this call",
        ))
    }

    /// Store memories, each in its cluster (see the WIT `memories.remember`).
    pub async fn remember(
        &self,
        items: &[crate::types::MemoryIn],
        cfg: &crate::types::MemoryConfig,
    ) -> Result<Vec<crate::types::Remembered>, CallError> {
        memories!(self, call_remember(items, cfg))
    }

    /// Bring a cluster's summary to its member set.
    pub async fn summarize_cluster(
        &self,
        cluster: u64,
        cfg: &Config,
        mcfg: &crate::types::MemoryConfig,
    ) -> Result<crate::types::ClusterOutcome, CallError> {
        memories!(self, call_summarize_cluster(cluster, cfg, mcfg))
    }

    /// Delete a memory (and a summary that covered it).
    pub async fn forget(
        &self,
        id: &str,
        mcfg: &crate::types::MemoryConfig,
    ) -> Result<Option<crate::types::Forgotten>, CallError> {
        memories!(self, call_forget(id, mcfg))
    }

    /// The best memories and summaries for a query.
    pub async fn recall(
        &self,
        query: &str,
        filter: &crate::types::MemoryFilter,
        k: u32,
        summaries: bool,
        mcfg: &crate::types::MemoryConfig,
    ) -> Result<Vec<crate::types::Recalled>, CallError> {
        memories!(self, call_recall(query, filter, k, summaries, mcfg))
    }

    /// The offline lexical embedder's vectors.
    pub async fn embed_lexical(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, CallError> {
        let (mut store, g) = self.instance().await?;
        g.abridge_engine_memories()
            .call_embed_lexical(&mut store, texts)
            .await
            .map_err(|e| self.trap(e))
    }

    /// Create a fresh instance and drop it, without calling the guest: what every call pays
    /// before its work starts (for benchmarks).
    pub async fn instantiate_only(&self) -> Result<(), CallError> {
        self.instance().await.map(drop)
    }

    /// Append episodes (the guest fills in token estimates); returns how many were new.
    pub async fn append(&self, session: &str, episodes: &[NewEpisode]) -> Result<u32, CallError> {
        summarizer!(self, None, call_append(session, episodes))
    }

    /// Messages as a client posts them, in one call: each checked (one that is wrong fails the
    /// call, nothing stored), appended as [`append`](Self::append) does, and — given `cfg` —
    /// the session's verdict after the write. `keys` holds a source key for each message, used
    /// when it has no id of its own (the WIT `post`).
    pub async fn post(
        &self,
        session: &str,
        messages: &[crate::types::PostedMessage],
        keys: &[String],
        cfg: Option<&Config>,
    ) -> Result<crate::types::Posted, CallError> {
        summarizer!(self, None, call_post(session, messages, keys, cfg))
    }

    /// Append an imported transcript's episodes: as [`append`](Self::append), but an episode
    /// without a timestamp stays without one (an import's clock is not a message's time).
    pub async fn append_imported(
        &self,
        session: &str,
        episodes: &[NewEpisode],
    ) -> Result<u32, CallError> {
        summarizer!(self, None, call_append_imported(session, episodes))
    }

    /// Run the trigger after an episode write; summarize until caught up if it holds.
    pub async fn after_episode_written(
        &self,
        session: &str,
        cfg: &Config,
    ) -> Result<Outcome, CallError> {
        summarizer_sized!(
            self,
            session,
            None,
            call_after_episode_written(session, cfg)
        )
    }

    /// Summarize now, ignoring the trigger, until every episode is covered.
    pub async fn summarize_now(&self, session: &str, cfg: &Config) -> Result<Outcome, CallError> {
        self.summarize_now_with(session, cfg, None).await
    }

    /// [`summarize_now`](Self::summarize_now) with a [`CallControl`] to watch its progress
    /// and cancel it.
    pub async fn summarize_now_with(
        &self,
        session: &str,
        cfg: &Config,
        control: Option<Arc<CallControl>>,
    ) -> Result<Outcome, CallError> {
        summarizer_sized!(self, session, control, call_summarize_now(session, cfg))
    }

    /// Summarize until episode `upto` is covered, whatever the trigger, the mode or a backoff
    /// say (see the WIT `catch-up`): how a job brings its session up to its target.
    /// `control` reports progress and cancels, as for [`Abridge::summarize_now_with`].
    pub async fn catch_up_with(
        &self,
        session: &str,
        cfg: &Config,
        upto: u64,
        control: Option<Arc<CallControl>>,
    ) -> Result<Outcome, CallError> {
        summarizer_sized!(self, session, control, call_catch_up(session, cfg, upto))
    }

    /// What `summarize_now` would do, without calling the model or writing anything.
    pub async fn plan(&self, session: &str, cfg: &Config) -> Result<PlanReport, CallError> {
        summarizer_sized!(self, session, None, call_plan(session, cfg))
    }

    /// The session's freshness under `cfg` (mode, backoff), from the clock; no model call.
    pub async fn freshness(
        &self,
        session: &str,
        cfg: &Config,
    ) -> Result<FreshnessReport, CallError> {
        summarizer!(self, None, call_freshness(session, cfg))
    }

    /// The session's freshness as a context of `budget` tokens keeping at most
    /// `refresh_after` messages beyond the summary sees it: what that context could not carry
    /// is due (see the WIT `context-freshness`; `budget` 0 checks no budget).
    pub async fn context_freshness(
        &self,
        session: &str,
        cfg: &Config,
        refresh_after: u32,
        budget: u32,
    ) -> Result<FreshnessReport, CallError> {
        summarizer!(
            self,
            None,
            call_context_freshness(session, cfg, refresh_after, budget)
        )
    }

    /// Refresh the session if it is due under `cfg.mode`; a failure keeps the previous
    /// summary and records a failure marker with a backoff.
    pub async fn refresh(&self, session: &str, cfg: &Config) -> Result<Outcome, CallError> {
        self.refresh_with(session, cfg, None).await
    }

    /// [`refresh`](Self::refresh) with a [`CallControl`].
    pub async fn refresh_with(
        &self,
        session: &str,
        cfg: &Config,
        control: Option<Arc<CallControl>>,
    ) -> Result<Outcome, CallError> {
        summarizer_sized!(self, session, control, call_refresh(session, cfg))
    }

    /// The context for the next model call: the summary plus recent turns within a budget.
    pub async fn context(
        &self,
        session: &str,
        req: ContextRequest,
        cfg: &Config,
    ) -> Result<ContextWindow, CallError> {
        summarizer!(self, None, call_context(session, &req, cfg))
    }

    /// Full-text search of `session`'s messages, or of every session the store holds: the
    /// `limit` best hits after the first `offset` (see the WIT `summarizer.search`).
    pub async fn search(
        &self,
        session: Option<&str>,
        query: &str,
        offset: u32,
        limit: u32,
    ) -> Result<crate::types::SearchPage, CallError> {
        summarizer!(self, None, call_search(session, query, offset, limit))
    }

    /// The full-text index's terms of each `(speaker, content)`, as `append` stores them
    /// (for indexing episodes stored before the index existed).
    pub async fn index_terms(
        &self,
        episodes: &[(Option<String>, String)],
    ) -> Result<Vec<String>, CallError> {
        let (mut store, g) = self.instance().await?;
        g.abridge_engine_text()
            .call_index_terms(&mut store, episodes)
            .await
            .map_err(|e| self.trap(e))
    }

    /// Delete the session's episodes, summaries and failure marker.
    pub async fn reset(&self, session: &str) -> Result<(), CallError> {
        summarizer!(self, None, call_reset(session))
    }

    /// The session's summary chain, oldest first.
    pub async fn chain(&self, session: &str) -> Result<Vec<SummaryRow>, CallError> {
        summarizer!(self, None, call_chain(session))
    }

    /// The session's facts as they stand, the facts changed most recently first (the WIT
    /// `summarizer.facts`).
    pub async fn facts(&self, session: &str) -> Result<Vec<crate::types::Fact>, CallError> {
        summarizer!(self, None, call_facts(session))
    }

    /// Every summary row of a session, compacted ones included.
    pub async fn history(&self, session: &str) -> Result<Vec<SummaryRow>, CallError> {
        summarizer!(self, None, call_history(session))
    }

    /// Provenance: a summary row and the episodes it covers (a page of `limit` after `after`),
    /// or with `identifier` the episode that ledger entry was last seen in.
    pub async fn expand(
        &self,
        session: &str,
        row: u64,
        identifier: Option<&str>,
        after: u64,
        limit: u32,
    ) -> Result<crate::types::Expansion, CallError> {
        summarizer!(
            self,
            None,
            call_expand(session, row, identifier, after, limit)
        )
    }

    /// A transcript parser running in a sandboxed instance of its own (the same fuel, per
    /// call, and memory limits as every engine call): feed it a file's bytes in any chunking.
    pub async fn parser(&self, opts: &ParseOptions) -> Result<TranscriptParser<'_>, CallError> {
        let (mut store, g) = self.instance().await?;
        let res = g
            .abridge_engine_transcripts()
            .parser()
            .call_constructor(&mut store, opts)
            .await
            .map_err(|e| self.trap(e))?;
        Ok(TranscriptParser {
            abridge: self,
            store,
            guest: g,
            res,
        })
    }

    /// The message for a parse error of the input `name` (see the WIT
    /// `transcripts.describe-error`): worded by the guest, the same in every host.
    pub async fn describe_parse_error(
        &self,
        name: &str,
        e: &ParseError,
        format_flag: &str,
    ) -> Result<String, CallError> {
        let (mut store, g) = self.instance().await?;
        g.abridge_engine_transcripts()
            .call_describe_error(&mut store, name, e, format_flag)
            .await
            .map_err(|e| self.trap(e))
    }

    /// The component's documented defaults: engine settings, a context request and memory
    /// settings (see [`crate::defaults`], which asks this once per process).
    pub async fn default_configs(
        &self,
    ) -> Result<(Config, ContextRequest, crate::types::MemoryConfig), CallError> {
        let (mut store, g) = self.instance().await?;
        let (config, context) = g
            .abridge_engine_summarizer()
            .call_default_config(&mut store)
            .await
            .map_err(|e| self.trap(e))?;
        let memory = g
            .abridge_engine_memories()
            .call_default_memory_config(&mut store)
            .await
            .map_err(|e| self.trap(e))?;
        Ok((config, context, memory))
    }

    /// The guest's token estimate for `text`.
    pub async fn estimate_tokens(&self, text: &str) -> Result<u32, CallError> {
        let (mut store, g) = self.instance().await?;
        g.abridge_engine_text()
            .call_estimate_tokens(&mut store, text)
            .await
            .map_err(|e| self.trap(e))
    }

    /// The identifiers the facts ledger takes from `text` (the guest's rules; `episode` 0).
    pub async fn identifiers(
        &self,
        text: &str,
    ) -> Result<Vec<crate::types::LedgerEntry>, CallError> {
        let (mut store, g) = self.instance().await?;
        g.abridge_engine_text()
            .call_identifiers(&mut store, text)
            .await
            .map_err(|e| self.trap(e))
    }

    /// The guest's summarization prompt for `conversation` (an update prompt with `previous`).
    pub async fn build_prompt(
        &self,
        conversation: &[Message],
        previous: Option<&str>,
    ) -> Result<BuiltPrompt, CallError> {
        let (mut store, g) = self.instance().await?;
        g.abridge_engine_text()
            .call_build_prompt(&mut store, conversation, previous)
            .await
            .map_err(|e| self.trap(e))
    }

    /// The guest's cleaning of raw model output.
    pub async fn strip_template_tokens(&self, text: &str) -> Result<String, CallError> {
        let (mut store, g) = self.instance().await?;
        g.abridge_engine_text()
            .call_strip_template_tokens(&mut store, text)
            .await
            .map_err(|e| self.trap(e))
    }
}

impl AbridgeBuilder {
    /// Use this component instead of the embedded one.
    pub fn component(mut self, source: ComponentSource) -> Self {
        self.source = source;
        self
    }

    /// Reuse an already loaded runtime (skips loading entirely).
    pub fn runtime(mut self, runtime: Arc<Runtime>) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// Where compiled code is cached (`None`: compile every time).
    pub fn cache_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.cache_dir = dir;
        self
    }

    /// The language model.
    pub fn llm(mut self, llm: Arc<dyn LlmBackend>) -> Self {
        self.llm = llm;
        self
    }

    /// The store (required).
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// The clock.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Where the guest's log lines go.
    pub fn log(mut self, sink: impl Fn(Level, &str) + Send + Sync + 'static) -> Self {
        self.log = Arc::new(sink);
        self
    }

    /// Most model requests of one batch in flight at once (default 6).
    pub fn batch_concurrency(mut self, n: usize) -> Self {
        self.batch_concurrency = n.max(1);
        self
    }

    /// Run batches in fixed groups of `batch_concurrency`, each awaited in full, instead of a
    /// sliding window (for comparison in benchmarks; slower under uneven latency).
    pub fn lockstep_batches(mut self, on: bool) -> Self {
        self.lockstep = on;
        self
    }

    /// Cap on the guest's linear memory in bytes (default 256 MiB).
    pub fn memory_limit(mut self, bytes: usize) -> Self {
        self.memory_limit = bytes;
        self
    }

    /// Fuel per call, about one unit per guest instruction (default
    /// [`crate::sandbox::DEFAULT_FUEL`]). A call that runs out ends with an error.
    pub fn fuel(mut self, units: u64) -> Self {
        self.fuel = units;
        self
    }

    /// Give the engine a memory store scoped to `tenant` and, optionally, an embedding backend
    /// (without one only the guest's offline lexical embedder works).
    pub fn memories(
        mut self,
        store: Arc<dyn crate::store::RecallStore>,
        tenant: &str,
        embedder: Option<Arc<dyn crate::embedder::Embedder>>,
    ) -> Self {
        self.recall = Some(crate::imports::RecallBinding {
            store,
            tenant: tenant.to_string(),
            embedder,
        });
        self
    }

    /// Load the component (unless a runtime was given) and finish.
    pub fn build(self) -> Result<Abridge> {
        let store = self
            .store
            .context("Abridge needs a store: call .store(...)")?;
        let runtime = match self.runtime {
            Some(r) => r,
            None if matches!(self.source, ComponentSource::Embedded)
                && self.cache_dir == default_cache_dir() =>
            {
                Runtime::embedded()?
            }
            None => Arc::new(Runtime::load(&self.source, self.cache_dir.as_deref())?),
        };
        Ok(Abridge {
            runtime,
            llm: self.llm,
            store,
            clock: self.clock,
            log: self.log,
            batch_concurrency: self.batch_concurrency,
            adaptive: Arc::new(std::sync::Mutex::new(crate::adaptive::Adaptive::new(
                self.batch_concurrency,
            ))),
            lockstep: self.lockstep,
            memory_limit: self.memory_limit,
            fuel: self.fuel,
            recall: self.recall,
        })
    }
}
