//! The engine's [`Store`] written once: a session's episodes, its summary chain, its failure
//! marker, the partial answers and the calibration, over either SQL store's transactions.

use async_trait::async_trait;

use super::{SessionKey, big, sealed_val, terms_key};
use crate::Store;
use crate::keyring::{Stored, place};
use crate::rules::Dialect;
use crate::sql::{Backend, Row, Tx, Txn, Val};
use crate::tables::{Popped, SessionRows};
use crate::types::{
    CachedAnswer, Calibration, Compaction, Episode, Error, FailureMarker, LedgerEntry, NewEpisode,
    Role, SessionStats, SummaryRow, SummaryWrite, TermMatches,
};

const ROW_COLS: &str = "id, first_episode, last_episode, content, tokens, prompt_tokens, output_tokens, model, created_ms, updated_ms, skipped, level, compacted_into, ledger, ledger_dropped, sealed";

const EPISODE_COLS: &str =
    "id, role, content, timestamp_ms, tokens, speaker, sealed, tokens_through";

/// The next change number of the sessions (their order in a listing: newest change first).
fn next_changed(d: Dialect) -> &'static str {
    match d {
        Dialect::Sqlite => "(SELECT COALESCE(MAX(changed_seq), 0) + 1 FROM sessions)",
        Dialect::Postgres => "nextval('sessions_changed')",
    }
}

/// The session's episode count and token total, its row locked for the rest of the
/// transaction (PostgreSQL: writers of one session, on any instance, take turns; SQLite's
/// write holds the file); `None` when there is no session.
async fn lock_session(t: &mut impl Tx, session: &SessionKey) -> Result<Option<(u64, u64)>, Error> {
    let lock = match t.dialect() {
        Dialect::Postgres => " FOR UPDATE",
        Dialect::Sqlite => "",
    };
    match t
        .row(
            &format!("SELECT episodes, total_tokens FROM sessions WHERE id = $1{lock}"),
            &[session.into()],
        )
        .await?
    {
        Some(r) => Ok(Some((r.u64(0)?, r.u64(1)?))),
        None => Ok(None),
    }
}

/// A summary row of [`ROW_COLS`], its prose and ledger opened.
async fn summary_from(t: &mut impl Tx, session: &SessionKey, r: &Row) -> Result<SummaryRow, Error> {
    let level = r.int(11)? as u32;
    let first = r.u64(1)?;
    let sealed = r.int(15)? as u32;
    let tenant = session.tenant();
    let name = place::summary(session.key(), level, first);
    let content = Stored {
        bytes: r.bytes(3)?,
        sealed,
    };
    let ledger = Stored {
        bytes: r.bytes(13)?,
        sealed,
    };
    let content = t.reveal(tenant, place::SUMMARY, &name, content).await?;
    let ledger = t.reveal(tenant, place::LEDGER, &name, ledger).await?;
    Ok(SummaryRow {
        id: r.u64(0)?,
        first_episode: first,
        last_episode: r.u64(2)?,
        content,
        tokens: r.int(4)? as u32,
        prompt_tokens: r.int(5)? as u32,
        output_tokens: r.int(6)? as u32,
        model: r.text(7)?,
        created_ms: r.u64(8)?,
        updated_ms: r.u64(9)?,
        skipped: crate::skipped_from_json(&r.text(10)?),
        level,
        compacted_into: r.opt_int(12)?.map(|x| x as u64),
        ledger: crate::ledger_from_json(&ledger),
        ledger_dropped: r.int(14)? as u32,
    })
}

/// The session's summary rows `filter` (after `session = $1`) selects, opened.
async fn summary_rows(
    t: &mut impl Tx,
    session: &SessionKey,
    filter: &str,
) -> Result<Vec<SummaryRow>, Error> {
    let rows = t
        .rows(
            &format!("SELECT {ROW_COLS} FROM summaries WHERE session = $1{filter}"),
            &[session.into()],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        out.push(summary_from(t, session, r).await?);
    }
    Ok(out)
}

const ACTIVE: &str = " AND compacted_into IS NULL ORDER BY first_episode";
const LATEST: &str = " AND compacted_into IS NULL ORDER BY last_episode DESC, id DESC LIMIT 1";

/// Summary row `id`, opened.
async fn summary_by_id(
    t: &mut impl Tx,
    session: &SessionKey,
    id: u64,
) -> Result<SummaryRow, Error> {
    let r = t
        .row(
            &format!("SELECT {ROW_COLS} FROM summaries WHERE id = $1"),
            &[id.into()],
        )
        .await?
        .ok_or_else(|| Error::Storage(format!("summary row {id} vanished")))?;
    summary_from(t, session, &r).await
}

/// A summary's prose and ledger as stored, and their key version.
async fn sealed_summary(
    t: &mut impl Tx,
    session: &SessionKey,
    (level, first): (u32, u64),
    content: &str,
    ledger: &[LedgerEntry],
) -> Result<(Val, Val, u32), Error> {
    let d = t.dialect();
    let tenant = session.tenant();
    let name = place::summary(session.key(), level, first);
    let content = t.seal(tenant, place::SUMMARY, &name, content).await?;
    let version = content.1;
    let ledger = t
        .seal(tenant, place::LEDGER, &name, &crate::ledger_to_json(ledger))
        .await?;
    Ok((sealed_val(d, content), sealed_val(d, ledger), version))
}

/// Episodes with `id > after`, ascending, at most `limit`, opened.
async fn read_episodes(
    t: &mut impl Tx,
    session: &SessionKey,
    after: u64,
    limit: u32,
) -> Result<Vec<Episode>, Error> {
    episode_rows(
        t,
        session,
        &format!(
            "SELECT {EPISODE_COLS} FROM episodes WHERE session = $1 AND id > $2 ORDER BY id LIMIT $3"
        ),
        &[session.into(), big(after), limit.into()],
    )
    .await
}

/// The episodes with `ids` of `session`, ascending, in one statement.
async fn read_episodes_by_id(
    t: &mut impl Tx,
    session: &SessionKey,
    ids: &[u64],
) -> Result<Vec<Episode>, Error> {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let list = (0..ids.len())
        .map(|i| format!("${}", i + 2))
        .collect::<Vec<_>>()
        .join(", ");
    let mut args: Vec<Val> = Vec::with_capacity(ids.len() + 1);
    args.push(session.into());
    args.extend(ids.iter().map(|&id| big(id)));
    episode_rows(
        t,
        session,
        &format!(
            "SELECT {EPISODE_COLS} FROM episodes WHERE session = $1 AND id IN ({list}) ORDER BY id"
        ),
        &args,
    )
    .await
}

/// The episodes of `sql`'s rows ([`EPISODE_COLS`]), their text opened.
async fn episode_rows(
    t: &mut impl Tx,
    session: &SessionKey,
    sql: &str,
    args: &[Val],
) -> Result<Vec<Episode>, Error> {
    let rows = t.rows(sql, args).await?;
    let tenant = session.tenant();
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let id = r.u64(0)?;
        let sealed = r.int(6)? as u32;
        let name = place::episode(session.key(), id);
        let content = Stored {
            bytes: r.bytes(2)?,
            sealed,
        };
        let content = t.reveal(tenant, place::EPISODE, &name, content).await?;
        let speaker = match r.opt_bytes(5)? {
            Some(bytes) => Some(
                t.reveal(tenant, place::SPEAKER, &name, Stored { bytes, sealed })
                    .await?,
            ),
            None => None,
        };
        out.push(Episode {
            id,
            role: Role::parse(&r.text(1)?).unwrap_or(Role::User),
            content,
            timestamp_ms: r.opt_int(3)?,
            tokens: r.int(4)? as u32,
            speaker,
            tokens_through: r.u64(7)?,
        });
    }
    Ok(out)
}

/// The items stored with episodes `ids` of `session`, opened (those stored without one are
/// absent). One range query per run of consecutive ids: a page of messages is one run, a
/// context's shown episodes its pins and its recent tail.
async fn read_items(
    t: &mut impl Tx,
    session: &SessionKey,
    ids: &[u64],
) -> Result<std::collections::BTreeMap<u64, String>, Error> {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let tenant = session.tenant();
    let mut out = std::collections::BTreeMap::new();
    for run in sorted.chunk_by(|a, b| b == &(a + 1)) {
        let (first, last) = (run[0], run[run.len() - 1]);
        let rows = t
            .rows(
                "SELECT id, item, sealed FROM episodes WHERE session = $1 AND id BETWEEN $2 AND $3 AND item IS NOT NULL",
                &[session.into(), big(first), big(last)],
            )
            .await?;
        for r in &rows {
            let id = r.u64(0)?;
            let stored = Stored {
                bytes: r.bytes(1)?,
                sealed: r.int(2)? as u32,
            };
            let name = place::episode(session.key(), id);
            out.insert(id, t.reveal(tenant, place::ITEM, &name, stored).await?);
        }
    }
    Ok(out)
}

#[async_trait]
impl<B: Backend> Store for super::Sql<B> {
    async fn append_episodes(
        &self,
        session: &str,
        episodes: Vec<NewEpisode>,
    ) -> Result<u32, Error> {
        let session = &self.name(session)?;
        let column = session.column();
        let key = if episodes.iter().any(|e| !e.terms.trim().is_empty()) {
            Some(terms_key(self, column).await?)
        } else {
            None
        };
        writing!(self, |t| {
            let d = t.dialect();
            // A session new to the index is indexed as its episodes arrive.
            t.exec(
                "INSERT INTO sessions (id, tenant, indexed) VALUES ($1, $2, 1) ON CONFLICT (id) DO NOTHING",
                &[session.into(), column.into()],
            )
            .await?;
            let (count, mut through) = lock_session(&mut t, session)
                .await?
                .ok_or_else(|| Error::Storage(format!("session '{}' vanished", session.id())))?;
            let mut next = count + 1;
            // The running byte total the new episodes continue.
            let mut bytes = match t
                .row(
                    "SELECT COALESCE((SELECT bytes_through FROM episodes WHERE session = $1 ORDER BY id DESC LIMIT 1), 0)",
                    &[session.into()],
                )
                .await?
            {
                Some(r) => r.u64(0)?,
                None => 0,
            };
            let tenant = session.tenant();
            let (mut added, mut tokens) = (0u32, 0u64);
            let mut docs: Vec<(u64, String)> = Vec::new();
            for e in &episodes {
                let name = place::episode(session.key(), next);
                let content = t.seal(tenant, place::EPISODE, &name, &e.content).await?;
                let sealed = content.1;
                let speaker = match &e.speaker {
                    Some(sp) => sealed_val(d, t.seal(tenant, place::SPEAKER, &name, sp).await?),
                    None => Val::Null,
                };
                let item = match &e.item {
                    Some(it) => sealed_val(d, t.seal(tenant, place::ITEM, &name, it).await?),
                    None => Val::Null,
                };
                let upto = through + u64::from(e.tokens);
                let upto_bytes = bytes + e.content.len() as u64;
                let n = t
                    .exec(
                        "INSERT INTO episodes (session, id, role, content, timestamp_ms, source_key, tokens, speaker, sealed, tokens_through, bytes_through, item)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT DO NOTHING",
                        &[
                            session.into(),
                            next.into(),
                            e.role.as_str().into(),
                            sealed_val(d, content),
                            e.timestamp_ms.into(),
                            e.source_key.as_str().into(),
                            e.tokens.into(),
                            speaker,
                            sealed.into(),
                            upto.into(),
                            upto_bytes.into(),
                            item,
                        ],
                    )
                    .await?;
                if n == 1 {
                    if !e.terms.trim().is_empty() {
                        docs.push((next, e.terms.clone()));
                    }
                    next += 1;
                    added += 1;
                    tokens += u64::from(e.tokens);
                    through = upto;
                    bytes = upto_bytes;
                }
            }
            if let Some(key) = key.as_deref()
                && !docs.is_empty()
            {
                crate::terms::index(&mut t, key, session, &docs, true).await?;
            }
            if added > 0 {
                t.exec(
                    &format!(
                        "UPDATE sessions SET episodes = episodes + $2, total_tokens = total_tokens + $3, changed_seq = {} WHERE id = $1",
                        next_changed(d)
                    ),
                    &[session.into(), added.into(), tokens.into()],
                )
                .await?;
            }
            Ok(added)
        })
    }

    async fn stats(&self, session: &str) -> Result<SessionStats, Error> {
        let session = &self.name(session)?;
        reading!(self, |t| {
            let (episodes, total_tokens) = match t
                .row(
                    "SELECT episodes, total_tokens FROM sessions WHERE id = $1",
                    &[session.into()],
                )
                .await?
            {
                Some(r) => (r.u64(0)?, r.u64(1)?),
                None => (0, 0),
            };
            Ok(SessionStats {
                episodes,
                total_tokens,
                last_episode: episodes,
            })
        })
    }

    async fn episodes_after(
        &self,
        session: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<Episode>, Error> {
        let session = &self.name(session)?;
        reading!(self, |t| read_episodes(&mut t, session, after, limit).await)
    }

    async fn episodes(&self, session: &str, ids: &[u64]) -> Result<Vec<Episode>, Error> {
        let session = &self.name(session)?;
        reading!(self, |t| read_episodes_by_id(&mut t, session, ids).await)
    }

    async fn bytes_through(
        &self,
        session: &str,
        id: u64,
    ) -> Result<Option<(u64, Option<i64>)>, Error> {
        let session = &self.name(session)?;
        reading!(self, |t| match t
            .row(
                "SELECT bytes_through, timestamp_ms FROM episodes WHERE session = $1 AND id = $2",
                &[session.into(), big(id)],
            )
            .await?
        {
            Some(r) => Ok(Some((r.u64(0)?, r.opt_int(1)?))),
            None => Ok(None),
        })
    }

    async fn latest_summary(&self, session: &str) -> Result<Option<SummaryRow>, Error> {
        let session = &self.name(session)?;
        reading!(self, |t| Ok(summary_rows(&mut t, session, LATEST)
            .await?
            .pop()))
    }

    async fn summaries(&self, session: &str) -> Result<Vec<SummaryRow>, Error> {
        let session = &self.name(session)?;
        reading!(self, |t| summary_rows(&mut t, session, ACTIVE).await)
    }

    async fn summary_history(&self, session: &str) -> Result<Vec<SummaryRow>, Error> {
        let session = &self.name(session)?;
        reading!(self, |t| summary_rows(
            &mut t,
            session,
            " ORDER BY first_episode, level DESC, id"
        )
        .await)
    }

    async fn write_summary(&self, session: &str, w: SummaryWrite) -> Result<SummaryRow, Error> {
        let session = &self.name(session)?;
        writing!(self, |t| {
            // The session's row lock makes the check and the write one step for every writer.
            let (episodes, _) = lock_session(&mut t, session).await?.ok_or_else(|| {
                Error::InvalidInput(format!("no session '{}' in the store", session.id()))
            })?;
            let prev = summary_rows(&mut t, session, LATEST).await?.pop();
            let target = match w.replaces {
                Some(id) => match t
                    .row(
                        "SELECT first_episode, last_episode, level FROM summaries WHERE id = $1 AND session = $2 AND compacted_into IS NULL",
                        &[big(id), session.into()],
                    )
                    .await?
                {
                    Some(r) => Some((r.u64(0)?, r.u64(1)?, r.int(2)? as u32)),
                    None => None,
                },
                None => None,
            };
            crate::rules::check_chain(
                session.key(),
                episodes,
                prev.as_ref(),
                target.map(|(a, b, _)| (a, b)),
                &w,
            )?;
            // The row keeps its level and first episode (the chain check said so): its name.
            let level = target.map_or(0, |(_, _, level)| level);
            let (content, ledger, sealed) = sealed_summary(
                &mut t,
                session,
                (level, w.first_episode),
                &w.content,
                &w.ledger,
            )
            .await?;
            // A new row is keyed by its session, an update by the row it replaces; the values
            // are the same.
            let (key, sql) = match w.replaces {
                None => (
                    Val::from(session),
                    "INSERT INTO summaries (session, first_episode, last_episode, content, tokens, prompt_tokens, output_tokens, model, created_ms, updated_ms, skipped, ledger, ledger_dropped, sealed)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $10, $11, $12, $13) RETURNING id",
                ),
                Some(id) => (
                    big(id),
                    "UPDATE summaries SET first_episode = $2, last_episode = $3, content = $4, tokens = $5, prompt_tokens = $6, output_tokens = $7, model = $8, updated_ms = $9, skipped = $10, ledger = $11, ledger_dropped = $12, sealed = $13 WHERE id = $1 RETURNING id",
                ),
            };
            let id = t
                .row(
                    sql,
                    &[
                        key,
                        big(w.first_episode),
                        big(w.last_episode),
                        content,
                        w.tokens.into(),
                        w.prompt_tokens.into(),
                        w.output_tokens.into(),
                        w.model.as_str().into(),
                        big(w.now_ms),
                        crate::skipped_to_json(&w.skipped).into(),
                        ledger,
                        w.ledger_dropped.into(),
                        sealed.into(),
                    ],
                )
                .await?
                .ok_or_else(|| Error::Storage("the summary row vanished".into()))?
                .u64(0)?;
            summary_by_id(&mut t, session, id).await
        })
    }

    async fn compact_summaries(&self, session: &str, c: Compaction) -> Result<SummaryRow, Error> {
        let session = &self.name(session)?;
        writing!(self, |t| {
            lock_session(&mut t, session).await?;
            let active = summary_rows(&mut t, session, ACTIVE).await?;
            let (first, last, level) = crate::rules::check_compaction(session.key(), &active, &c)?;
            let (content, ledger, sealed) =
                sealed_summary(&mut t, session, (level, first), &c.content, &c.ledger).await?;
            let id = t
                .row(
                    "INSERT INTO summaries (session, first_episode, last_episode, content, tokens, prompt_tokens, output_tokens, model, created_ms, updated_ms, skipped, level, ledger, ledger_dropped, sealed)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $10, $11, $12, $13, $14) RETURNING id",
                    &[
                        session.into(),
                        big(first),
                        big(last),
                        content,
                        c.tokens.into(),
                        c.prompt_tokens.into(),
                        c.output_tokens.into(),
                        c.model.as_str().into(),
                        big(c.now_ms),
                        crate::skipped_to_json(&c.skipped).into(),
                        level.into(),
                        ledger,
                        c.ledger_dropped.into(),
                        sealed.into(),
                    ],
                )
                .await?
                .ok_or_else(|| Error::Storage("the summary row vanished".into()))?
                .u64(0)?;
            for r in &c.rows {
                t.exec(
                    "UPDATE summaries SET compacted_into = $2 WHERE id = $1 AND session = $3",
                    &[big(*r), id.into(), session.into()],
                )
                .await?;
            }
            summary_by_id(&mut t, session, id).await
        })
    }

    async fn failure(&self, session: &str) -> Result<Option<FailureMarker>, Error> {
        let session = &self.name(session)?;
        reading!(self, |t| {
            match t
            .row(
                "SELECT failures, last_error, retry_after_ms, failed_ms FROM failure_markers WHERE session = $1",
                &[session.into()],
            )
            .await?
        {
            Some(r) => Ok(Some(FailureMarker {
                failures: r.int(0)? as u32,
                last_error: r.text(1)?,
                retry_after_ms: r.u64(2)?,
                failed_ms: r.u64(3)?,
            })),
            None => Ok(None),
        }
        })
    }

    async fn set_failure(&self, session: &str, marker: Option<FailureMarker>) -> Result<(), Error> {
        let session = &self.name(session)?;
        writing!(self, |t| {
            match marker {
                None => {
                    t.exec(
                        "DELETE FROM failure_markers WHERE session = $1",
                        &[session.into()],
                    )
                    .await?
                }
                Some(m) => {
                    t.exec(
                        "INSERT INTO failure_markers (session, failures, last_error, retry_after_ms, failed_ms) VALUES ($1, $2, $3, $4, $5)
                         ON CONFLICT (session) DO UPDATE SET failures = excluded.failures, last_error = excluded.last_error, retry_after_ms = excluded.retry_after_ms, failed_ms = excluded.failed_ms",
                        &[
                            session.into(),
                            m.failures.into(),
                            m.last_error.as_str().into(),
                            big(m.retry_after_ms),
                            big(m.failed_ms),
                        ],
                    )
                    .await?
                }
            };
            Ok(())
        })
    }

    async fn reset_session(&self, session: &str) -> Result<(), Error> {
        let session = &self.name(session)?;
        writing!(self, |t| {
            // The session's writers are waited for (and wait) on its row.
            lock_session(&mut t, session).await?;
            let d = t.dialect();
            for step in crate::rules::RESET_CASCADE {
                t.exec(&crate::rules::reset_sql(*step, d), &[session.into()])
                    .await?;
            }
            Ok(())
        })?;
        self.scrub().await;
        Ok(())
    }

    async fn partial(&self, key: &str) -> Result<Option<CachedAnswer>, Error> {
        let key = &self.name(key)?;
        reading!(self, |t| {
            let Some(r) = t
                .row(
                    "SELECT text, prompt_tokens, output_tokens, sealed FROM partials WHERE key = $1",
                    &[key.into()],
                )
                .await?
            else {
                return Ok(None);
            };
            let stored = Stored {
                bytes: r.bytes(0)?,
                sealed: r.int(3)? as u32,
            };
            let text = t
                .reveal(key.tenant(), place::PARTIAL, key.key(), stored)
                .await?;
            Ok(Some(CachedAnswer {
                text,
                prompt_tokens: r.int(1)?.clamp(0, u32::MAX as i64) as u32,
                output_tokens: r.int(2)?.clamp(0, u32::MAX as i64) as u32,
            }))
        })
    }

    async fn put_partial(&self, key: &str, answer: &CachedAnswer) -> Result<(), Error> {
        let key = &self.name(key)?;
        writing!(self, |t| {
            let text = t
                .seal(key.tenant(), place::PARTIAL, key.key(), &answer.text)
                .await?;
            let sealed = text.1;
            let text = sealed_val(t.dialect(), text);
            t.exec(
                "INSERT INTO partials (key, text, prompt_tokens, output_tokens, sealed) VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (key) DO UPDATE SET text = excluded.text, prompt_tokens = excluded.prompt_tokens, output_tokens = excluded.output_tokens, sealed = excluded.sealed",
                &[
                    key.into(),
                    text,
                    answer.prompt_tokens.into(),
                    answer.output_tokens.into(),
                    sealed.into(),
                ],
            )
            .await
            .map(drop)
        })
    }

    async fn calibration(&self, model: &str) -> Result<Option<Calibration>, Error> {
        reading!(self, |t| match t
            .row(
                "SELECT estimated, reported FROM calibration WHERE model = $1",
                &[model.into()],
            )
            .await?
        {
            Some(r) => Ok(Some(Calibration {
                estimated: r.u64(0)?,
                reported: r.u64(1)?,
            })),
            None => Ok(None),
        })
    }

    async fn record_calibration(
        &self,
        model: &str,
        estimated: u32,
        reported: u32,
    ) -> Result<(), Error> {
        writing!(self, |t| {
            t
            .exec(
                "INSERT INTO calibration (model, estimated, reported) VALUES ($1, $2, $3)
                 ON CONFLICT (model) DO UPDATE SET estimated = calibration.estimated + excluded.estimated, reported = calibration.reported + excluded.reported",
                &[model.into(), estimated.into(), reported.into()],
            )
            .await
            .map(drop)
        })
    }

    async fn search_episodes(
        &self,
        tenant: Option<&str>,
        session: Option<&str>,
        terms: &[String],
        limit: u32,
    ) -> Result<TermMatches, Error> {
        // A bound view searches its tenant's sessions only, and names them by their ids.
        let session = session.map(|s| self.name(s)).transpose()?;
        let column = match &session {
            Some(s) => s.column().to_string(),
            None => crate::terms::column_of(self.bound().map(|t| t.name()).or(tenant)),
        };
        let key = terms_key(self, &column).await?;
        let session = session.as_ref().map(SessionKey::key);
        let mut m = reading!(self, |t| crate::terms::search(
            &mut t, &key, &column, session, terms, limit
        )
        .await)?;
        m.matches.retain_mut(|x| match self.id_of(&x.session) {
            Some(id) => {
                x.session = id.to_string();
                true
            }
            None => false,
        });
        Ok(m)
    }
}

#[async_trait]
impl<B: Backend> SessionRows for super::Sql<B> {
    async fn sessions(&self) -> Result<Vec<String>, Error> {
        reading!(self, |t| t
            .rows("SELECT id FROM sessions ORDER BY changed_seq DESC, id", &[])
            .await?
            .iter()
            .filter_map(|r| match r.text(0) {
                Ok(key) => self.id_of(&key).map(|id| Ok(id.to_string())),
                Err(e) => Some(Err(e)),
            })
            .collect())
    }

    async fn pop_episode(&self, session: &str) -> Result<Option<Popped>, Error> {
        let session = &self.name(session)?;
        let popped = writing!(self, |t| {
            // The session's writers are waited for (and wait) on its row.
            let last = lock_session(&mut t, session).await?.map_or(0, |(n, _)| n);
            if last == 0 {
                return Ok(None);
            }
            let episode = read_episodes(&mut t, session, last - 1, 1)
                .await?
                .pop()
                .ok_or_else(|| {
                    Error::Storage(format!(
                        "session '{}' counts {last} episodes but episode {last} is not stored",
                        session.id()
                    ))
                })?;
            let item = read_items(&mut t, session, &[last]).await?.remove(&last);
            let history = summary_rows(&mut t, session, "").await?;
            let plan = crate::rules::pop_plan(&history, last);
            for id in &plan.drop {
                t.exec(
                    "DELETE FROM summaries WHERE id = $1 AND session = $2",
                    &[big(*id), session.into()],
                )
                .await?;
            }
            for id in &plan.reopen {
                t.exec(
                    "UPDATE summaries SET compacted_into = NULL WHERE id = $1 AND session = $2",
                    &[big(*id), session.into()],
                )
                .await?;
            }
            t.exec(
                "DELETE FROM episodes WHERE session = $1 AND id = $2",
                &[session.into(), big(last)],
            )
            .await?;
            let d = t.dialect();
            t.exec(
                &format!(
                    "UPDATE sessions SET episodes = episodes - 1, total_tokens = total_tokens - $2, changed_seq = {} WHERE id = $1",
                    next_changed(d)
                ),
                &[session.into(), episode.tokens.into()],
            )
            .await?;
            for step in crate::rules::POP_CASCADE {
                let (sql, binds) = crate::rules::pop_sql(*step, d);
                if binds {
                    t.exec(&sql, &[session.into(), big(last)]).await?;
                } else {
                    t.exec(&sql, &[session.into()]).await?;
                }
            }
            Ok(Some(Popped {
                episode,
                item,
                dropped: plan.drop,
                reopened: plan.reopen,
            }))
        })?;
        if popped.is_some() {
            self.scrub().await;
        }
        Ok(popped)
    }

    async fn items(
        &self,
        session: &str,
        ids: &[u64],
    ) -> Result<std::collections::BTreeMap<u64, String>, Error> {
        let session = &self.name(session)?;
        reading!(self, |t| read_items(&mut t, session, ids).await)
    }
}
