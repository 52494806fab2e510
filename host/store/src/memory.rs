//! An in-memory [`Store`]: for tests, benchmarks and embedders that keep state elsewhere.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;

use super::Store;
use crate::rules::check_chain;
use crate::types::{
    CachedAnswer, Calibration, Compaction, Episode, Error, FailureMarker, NewEpisode, SessionStats,
    SummaryRow, SummaryWrite,
};

#[derive(Default)]
struct Session {
    episodes: Vec<Episode>,
    keys: std::collections::BTreeSet<String>,
    /// Each episode's source key (index = id - 1), so a pop frees it.
    episode_keys: Vec<String>,
    total_tokens: u64,
    /// The running content bytes through each episode (index = id - 1).
    bytes_through: Vec<u64>,
    /// The active chain.
    rows: Vec<SummaryRow>,
    /// Rows compacted out of the active chain (kept, never deleted).
    compacted: Vec<SummaryRow>,
    changed: u64,
}

/// A [`Store`] that keeps everything in memory, with the same rules as [`super::SqliteStore`].
#[derive(Default)]
pub struct MemoryStore {
    inner: Mutex<(BTreeMap<String, Session>, u64, u64)>, // sessions, next row id, change counter
    calibration: Mutex<BTreeMap<String, (u64, u64)>>,
    partials: Mutex<BTreeMap<String, CachedAnswer>>,
    failures: Mutex<BTreeMap<String, FailureMarker>>,
    /// The app's tables (jobs, sources, marks, modes, tokens).
    pub(super) tables: Mutex<super::memory_tables::Tables>,
    recall: Mutex<super::recall::RecallTables>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    pub(super) fn recall<T>(&self, f: impl FnOnce(&mut super::recall::RecallTables) -> T) -> T {
        f(&mut self
            .recall
            .lock()
            .expect("the store's lock is poisoned by an earlier panic"))
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut BTreeMap<String, Session>, &mut u64, &mut u64) -> T,
    ) -> T {
        let mut g = self
            .inner
            .lock()
            .expect("the store's lock is poisoned by an earlier panic");
        let (sessions, next_id, counter) = &mut *g;
        f(sessions, next_id, counter)
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn append_episodes(
        &self,
        session: &str,
        episodes: Vec<NewEpisode>,
    ) -> Result<u32, Error> {
        Ok(self.with(|sessions, _, counter| {
            let s = sessions.entry(session.to_string()).or_default();
            let mut added = 0;
            for e in episodes {
                if !s.keys.insert(e.source_key.clone()) {
                    continue;
                }
                s.episode_keys.push(e.source_key);
                let id = s.episodes.len() as u64 + 1;
                s.total_tokens += u64::from(e.tokens);
                let before = s.bytes_through.last().copied().unwrap_or(0);
                s.bytes_through.push(before + e.content.len() as u64);
                s.episodes.push(Episode {
                    id,
                    role: e.role,
                    content: e.content,
                    timestamp_ms: e.timestamp_ms,
                    tokens: e.tokens,
                    speaker: e.speaker,
                    tokens_through: s.total_tokens,
                });
                added += 1;
            }
            if added > 0 {
                *counter += 1;
                s.changed = *counter;
            }
            added
        }))
    }

    async fn bytes_through(
        &self,
        session: &str,
        id: u64,
    ) -> Result<Option<(u64, Option<i64>)>, Error> {
        Ok(self.with(|sessions, _, _| {
            let s = sessions.get(session)?;
            let i = usize::try_from(id.checked_sub(1)?).ok()?;
            Some((*s.bytes_through.get(i)?, s.episodes.get(i)?.timestamp_ms))
        }))
    }

    async fn stats(&self, session: &str) -> Result<SessionStats, Error> {
        Ok(self.with(|sessions, _, _| match sessions.get(session) {
            Some(s) => SessionStats {
                episodes: s.episodes.len() as u64,
                total_tokens: s.total_tokens,
                last_episode: s.episodes.len() as u64,
            },
            None => SessionStats {
                episodes: 0,
                total_tokens: 0,
                last_episode: 0,
            },
        }))
    }

    async fn episodes_after(
        &self,
        session: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<Episode>, Error> {
        Ok(self.with(|sessions, _, _| {
            sessions.get(session).map_or_else(Vec::new, |s| {
                s.episodes
                    .iter()
                    .skip(after as usize)
                    .take(limit as usize)
                    .cloned()
                    .collect()
            })
        }))
    }

    async fn latest_summary(&self, session: &str) -> Result<Option<SummaryRow>, Error> {
        Ok(self.with(|sessions, _, _| sessions.get(session).and_then(|s| s.rows.last().cloned())))
    }

    async fn summaries(&self, session: &str) -> Result<Vec<SummaryRow>, Error> {
        Ok(self.with(|sessions, _, _| {
            sessions
                .get(session)
                .map_or_else(Vec::new, |s| s.rows.clone())
        }))
    }

    async fn summary_history(&self, session: &str) -> Result<Vec<SummaryRow>, Error> {
        Ok(self.with(|sessions, _, _| {
            let Some(s) = sessions.get(session) else {
                return Vec::new();
            };
            let mut all: Vec<SummaryRow> = s.rows.iter().chain(&s.compacted).cloned().collect();
            all.sort_by(|a, b| {
                a.first_episode
                    .cmp(&b.first_episode)
                    .then(b.level.cmp(&a.level))
                    .then(a.id.cmp(&b.id))
            });
            all
        }))
    }

    async fn compact_summaries(&self, session: &str, c: Compaction) -> Result<SummaryRow, Error> {
        self.with(|sessions, next_id, _| {
            let s = sessions.get_mut(session).ok_or_else(|| {
                Error::InvalidInput(format!("no session '{session}' in the store"))
            })?;
            let (first, last, level) = crate::rules::check_compaction(session, &s.rows, &c)?;
            *next_id += 1;
            let id = *next_id;
            let row = SummaryRow {
                id,
                first_episode: first,
                last_episode: last,
                content: c.content,
                tokens: c.tokens,
                prompt_tokens: c.prompt_tokens,
                output_tokens: c.output_tokens,
                model: c.model,
                created_ms: c.now_ms,
                updated_ms: c.now_ms,
                skipped: c.skipped,
                level,
                compacted_into: None,
                ledger: c.ledger,
                ledger_dropped: c.ledger_dropped,
            };
            let folded: Vec<SummaryRow> = s.rows.drain(..c.rows.len()).collect();
            for mut r in folded {
                r.compacted_into = Some(id);
                s.compacted.push(r);
            }
            s.rows.insert(0, row.clone());
            Ok(row)
        })
    }

    async fn write_summary(&self, session: &str, w: SummaryWrite) -> Result<SummaryRow, Error> {
        self.with(|sessions, next_id, _| {
            let s = sessions.get_mut(session).ok_or_else(|| {
                Error::InvalidInput(format!("no session '{session}' in the store"))
            })?;
            let at = w
                .replaces
                .and_then(|id| s.rows.iter().position(|r| r.id == id));
            let target = at.map(|i| (s.rows[i].first_episode, s.rows[i].last_episode));
            check_chain(session, s.episodes.len() as u64, s.rows.last(), target, &w)?;
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
                ledger_dropped: w.ledger_dropped,
            };
            match w.replaces {
                Some(id) => {
                    let r = &mut s.rows[at.expect("check_chain saw the row")];
                    *r = SummaryRow {
                        id,
                        created_ms: r.created_ms,
                        level: r.level,
                        ..row
                    };
                    Ok(r.clone())
                }
                None => {
                    *next_id += 1;
                    let row = SummaryRow {
                        id: *next_id,
                        ..row
                    };
                    s.rows.push(row.clone());
                    Ok(row)
                }
            }
        })
    }

    async fn failure(&self, session: &str) -> Result<Option<FailureMarker>, Error> {
        Ok(self
            .failures
            .lock()
            .expect("the store's lock is poisoned by an earlier panic")
            .get(session)
            .cloned())
    }

    async fn set_failure(&self, session: &str, marker: Option<FailureMarker>) -> Result<(), Error> {
        let mut f = self
            .failures
            .lock()
            .expect("the store's lock is poisoned by an earlier panic");
        match marker {
            Some(m) => f.insert(session.to_string(), m),
            None => f.remove(session),
        };
        Ok(())
    }

    async fn reset_session(&self, session: &str) -> Result<(), Error> {
        self.tables
            .lock()
            .expect("the store's lock is poisoned by an earlier panic")
            .reset_session(session);
        self.failures
            .lock()
            .expect("the store's lock is poisoned by an earlier panic")
            .remove(session);
        self.inner
            .lock()
            .expect("the store's lock is poisoned by an earlier panic")
            .0
            .remove(session);
        Ok(())
    }

    async fn pop_episode(&self, session: &str) -> Result<Option<super::Popped>, Error> {
        let popped = self.with(|sessions, _, counter| {
            let s = sessions.get_mut(session)?;
            let episode = s.episodes.pop()?;
            if let Some(key) = s.episode_keys.pop() {
                s.keys.remove(&key);
            }
            s.bytes_through.pop();
            s.total_tokens -= u64::from(episode.tokens);
            let mut history: Vec<SummaryRow> =
                s.rows.drain(..).chain(s.compacted.drain(..)).collect();
            let plan = crate::rules::pop_plan(&history, episode.id);
            history.retain(|r| plan.drop.binary_search(&r.id).is_err());
            for r in history {
                if plan.reopen.binary_search(&r.id).is_ok() {
                    s.rows.push(SummaryRow {
                        compacted_into: None,
                        ..r
                    });
                } else if r.compacted_into.is_some() {
                    s.compacted.push(r);
                } else {
                    s.rows.push(r);
                }
            }
            s.rows.sort_by_key(|r| r.first_episode);
            *counter += 1;
            s.changed = *counter;
            Some(super::Popped {
                episode,
                dropped: plan.drop,
                reopened: plan.reopen,
            })
        });
        if let Some(p) = &popped {
            self.tables
                .lock()
                .expect("the store's lock is poisoned by an earlier panic")
                .pop_side(session, p.episode.id);
        }
        Ok(popped)
    }

    async fn partial(&self, key: &str) -> Result<Option<CachedAnswer>, Error> {
        Ok(self
            .partials
            .lock()
            .expect("the store's lock is poisoned by an earlier panic")
            .get(key)
            .cloned())
    }

    async fn put_partial(&self, key: &str, answer: &CachedAnswer) -> Result<(), Error> {
        self.partials
            .lock()
            .expect("the store's lock is poisoned by an earlier panic")
            .insert(key.to_string(), answer.clone());
        Ok(())
    }

    async fn calibration(&self, model: &str) -> Result<Option<Calibration>, Error> {
        let c = self
            .calibration
            .lock()
            .expect("the store's lock is poisoned by an earlier panic");
        Ok(c.get(model).map(|&(estimated, reported)| Calibration {
            estimated,
            reported,
        }))
    }

    async fn record_calibration(
        &self,
        model: &str,
        estimated: u32,
        reported: u32,
    ) -> Result<(), Error> {
        let mut c = self
            .calibration
            .lock()
            .expect("the store's lock is poisoned by an earlier panic");
        let e = c.entry(model.to_string()).or_insert((0, 0));
        e.0 += u64::from(estimated);
        e.1 += u64::from(reported);
        Ok(())
    }

    async fn sessions(&self) -> Result<Vec<String>, Error> {
        Ok(self.with(|sessions, _, _| {
            let mut v: Vec<(&String, u64)> = sessions.iter().map(|(k, s)| (k, s.changed)).collect();
            v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
            v.into_iter().map(|(k, _)| k.clone()).collect()
        }))
    }
}
