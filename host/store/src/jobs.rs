//! Durable summarization jobs as stored: a job's state, its record, and the answers of the
//! store's claim and heartbeat calls. The job service that runs them is the app's.

use crate::tenant::Tenant;

use abridge_engine::types::Config;

/// Where a job stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for a worker.
    Queued,
    /// A worker holds its lease.
    Running,
    /// Every episode up to the target is covered.
    Succeeded,
    /// The last attempt failed (see `error`); nothing was written by it.
    Failed,
    /// Cancelled by a user; nothing was written by the cancelled attempt.
    Cancelled,
}

impl JobState {
    /// The name stored and printed.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    /// The state of a stored name.
    pub fn parse(s: &str) -> JobState {
        match s {
            "queued" => JobState::Queued,
            "running" => JobState::Running,
            "succeeded" => JobState::Succeeded,
            "cancelled" => JobState::Cancelled,
            _ => JobState::Failed,
        }
    }

    /// Whether the job may still run (queued or running).
    pub fn is_active(self) -> bool {
        matches!(self, JobState::Queued | JobState::Running)
    }
}

/// One job row.
#[derive(Clone, Debug)]
pub struct Job {
    /// Row id.
    pub id: u64,
    /// The tenant whose session it summarizes.
    pub tenant: Tenant,
    /// The session it summarizes (the tenant's own id for it).
    pub session: String,
    /// The last episode id it must cover.
    pub target: u64,
    /// State.
    pub state: JobState,
    /// The engine configuration it runs with (recorded so a resumed job asks the same
    /// questions, which the partial cache answers).
    pub config: Config,
    /// A user asked to cancel it while it ran.
    pub cancel_requested: bool,
    /// Progress: the stage (0 map, 1.. reduce levels), answers in hand, answers needed.
    pub level: u32,
    /// Answers of the stage in hand.
    pub done: u32,
    /// Answers the stage needs.
    pub total: u32,
    /// Model calls the plan expected in all.
    pub calls_planned: u32,
    /// Model answers received over all attempts.
    pub answers: u64,
    /// Attempts started.
    pub attempts: u32,
    /// The last attempt's error.
    pub error: Option<String>,
    /// Who holds the lease (`host:pid`).
    pub lease_owner: Option<String>,
    /// Until when, ms since the epoch.
    pub lease_until_ms: Option<u64>,
    /// Timestamps, ms since the epoch.
    pub created_ms: u64,
    /// When the first attempt started.
    pub started_ms: Option<u64>,
    /// Last change.
    pub updated_ms: u64,
    /// When it reached a final state.
    pub finished_ms: Option<u64>,
}

impl Job {
    /// The session's key in the tables: the tenant's and the session's id in one column.
    pub(crate) fn key(&self) -> String {
        self.tenant.key(&self.session)
    }
}

/// The outcome of trying to take a job.
#[derive(Debug)]
pub enum Claim {
    /// The job is ours to run (attempts counted, lease taken).
    Taken(Job),
    /// Another live worker holds it.
    Busy(Job),
    /// It already reached a final state.
    Finished(Job),
}

/// What a heartbeat learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Beat {
    /// Keep going.
    Go,
    /// A user asked to cancel the job.
    Cancel,
    /// Another worker took the job over (this one's lease ran out).
    Lost,
}
