//! The engine's pure calls (parsing, counting, planning) for a front end that has no database
//! and no model: `abridge ingest`'s line parser, the backfill dry run and the benches. A
//! front end never builds an engine itself; this one is built here, over a store in memory
//! that nothing outside the app can reach, and with no model.

use std::path::Path;
use std::sync::Arc;

use crate::backfill::DryRun;
use crate::error::{AppError, AppResult, ErrorKind};
use crate::runtime::{Abridge, CallError, Runtime};
use crate::types::LedgerEntry;
use crate::{LogFn, db};

/// An engine with no model and a private store in memory.
pub struct Pure {
    pub(crate) engine: Abridge,
}

impl Pure {
    /// A pure engine on `runtime` (the compiled guest), logging through `log`.
    pub fn new(runtime: Arc<Runtime>, log: LogFn) -> AppResult<Pure> {
        let engine = Abridge::builder()
            .runtime(runtime)
            .store(db::in_memory()?)
            .llm(Arc::new(abridge_engine::NoModel))
            .log(move |l, m| log(l, m))
            .build()
            .map_err(|e| AppError::new(ErrorKind::Internal, format!("{e:#}")))?;
        Ok(Pure { engine })
    }

    /// The guest's token estimate for `text`.
    pub async fn estimate_tokens(&self, text: &str) -> Result<u32, CallError> {
        self.engine.estimate_tokens(text).await
    }

    /// The identifiers the facts ledger takes from `text`.
    pub async fn identifiers(&self, text: &str) -> Result<Vec<LedgerEntry>, CallError> {
        self.engine.identifiers(text).await
    }

    /// A backfill dry run against the database at `db`: what each file would bring and cost,
    /// planned here; the database is only read, for the files it knows, and is not created
    /// when it does not exist.
    pub fn dry_run(self, db: &Path) -> AppResult<DryRun> {
        Ok(DryRun::new(self.engine, db::sources_if_present(db)?))
    }
}
