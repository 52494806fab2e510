//! The documented defaults, read from their one source: the component exports them
//! (`summarizer.default-config`, `memories.default-memory-config`), and this host asks it once
//! per process. `Config::default()`, `MemoryConfig::default()` and `ContextRequest::default()`
//! answer from here, so no default is restated in Rust (the npm package asks the same export).

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;

use crate::runtime::{Abridge, Runtime};
use crate::store::Store;
use crate::types::{
    CachedAnswer, Calibration, Compaction, Config, ContextRequest, Episode, Error, FailureMarker,
    MemoryConfig, NewEpisode, SessionStats, SummaryRow, SummaryWrite,
};

/// Every default the component documents.
#[derive(Clone, Debug)]
pub struct Defaults {
    /// Engine settings.
    pub config: Config,
    /// A context request.
    pub context: ContextRequest,
    /// Memory settings.
    pub memory: MemoryConfig,
}

static DEFAULTS: OnceLock<Defaults> = OnceLock::new();

/// The component's defaults, asked once per process (the embedded component, from the shared
/// runtime; see [`Runtime::embedded`]).
///
/// # Panics
/// When the embedded component cannot be loaded or answers with an error: the build embeds
/// and checks it, so this is a broken build, not a condition to handle.
pub fn defaults() -> &'static Defaults {
    DEFAULTS.get_or_init(|| {
        // A thread of its own: the export is an async call, and the caller may be inside an
        // async runtime (where blocking on another executor's future is not allowed).
        std::thread::spawn(|| {
            let runtime = Runtime::embedded().expect("loading the embedded engine component");
            futures::executor::block_on(read(runtime))
        })
        .join()
        .expect("reading the component's defaults")
    })
}

async fn read(runtime: Arc<Runtime>) -> Defaults {
    let engine = Abridge::builder()
        .runtime(runtime)
        .store(Arc::new(NoStore))
        .build()
        .expect("an engine over the embedded component");
    let (config, context, memory) = engine
        .default_configs()
        .await
        .expect("the component's default-config export");
    Defaults {
        config,
        context,
        memory,
    }
}

/// A store for calls that import nothing: every call is refused.
struct NoStore;

fn none<T>() -> Result<T, Error> {
    Err(Error::Storage(
        "this engine reads defaults only and has no store".into(),
    ))
}

#[async_trait]
impl Store for NoStore {
    async fn append_episodes(&self, _: &str, _: Vec<NewEpisode>) -> Result<u32, Error> {
        none()
    }
    async fn stats(&self, _: &str) -> Result<SessionStats, Error> {
        none()
    }
    async fn episodes_after(&self, _: &str, _: u64, _: u32) -> Result<Vec<Episode>, Error> {
        none()
    }
    async fn bytes_through(&self, _: &str, _: u64) -> Result<Option<(u64, Option<i64>)>, Error> {
        none()
    }
    async fn latest_summary(&self, _: &str) -> Result<Option<SummaryRow>, Error> {
        none()
    }
    async fn summaries(&self, _: &str) -> Result<Vec<SummaryRow>, Error> {
        none()
    }
    async fn summary_history(&self, _: &str) -> Result<Vec<SummaryRow>, Error> {
        none()
    }
    async fn write_summary(&self, _: &str, _: SummaryWrite) -> Result<SummaryRow, Error> {
        none()
    }
    async fn compact_summaries(&self, _: &str, _: Compaction) -> Result<SummaryRow, Error> {
        none()
    }
    async fn failure(&self, _: &str) -> Result<Option<FailureMarker>, Error> {
        none()
    }
    async fn set_failure(&self, _: &str, _: Option<FailureMarker>) -> Result<(), Error> {
        none()
    }
    async fn reset_session(&self, _: &str) -> Result<(), Error> {
        none()
    }
    async fn partial(&self, _: &str) -> Result<Option<CachedAnswer>, Error> {
        none()
    }
    async fn put_partial(&self, _: &str, _: &CachedAnswer) -> Result<(), Error> {
        none()
    }
    async fn calibration(&self, _: &str) -> Result<Option<Calibration>, Error> {
        none()
    }
    async fn record_calibration(&self, _: &str, _: u32, _: u32) -> Result<(), Error> {
        none()
    }
    async fn search_episodes(
        &self,
        _: Option<&str>,
        _: Option<&str>,
        _: &[String],
        _: u32,
    ) -> Result<crate::types::TermMatches, Error> {
        none()
    }
}
