//! Expansion: the messages behind a summary row, for provenance.

#[allow(unused_imports)]
use super::*;

/// What `expand` returns (mirrors the WIT `expansion`).
#[derive(Clone, Debug, PartialEq)]
pub struct Expansion {
    /// The row.
    pub row: SummaryRow,
    /// The covered episodes (or the identifier's episode), one page.
    pub episodes: Vec<Episode>,
    /// The rows it compacted, oldest first.
    pub compacted: Vec<SummaryRow>,
    /// Where the next page starts, if the page was cut.
    pub next_after: Option<u64>,
}

/// Provenance: row `row_id` of the session and exactly the episodes it covers (a page of
/// `limit` after `after`), or with `identifier` the episode that ledger entry was last seen in.
pub fn expand(
    h: &mut impl Host,
    session: &str,
    row_id: u64,
    identifier: Option<&str>,
    after: u64,
    limit: u32,
) -> Result<Expansion, Error> {
    let history = h.summary_history(session)?;
    let Some(row) = history.iter().find(|r| r.id == row_id).cloned() else {
        return Err(Error::InvalidInput(format!(
            "session '{session}' has no summary row {row_id}; list its rows with 'abridge summaries {session} --all'"
        )));
    };
    let compacted: Vec<SummaryRow> = history
        .iter()
        .filter(|r| r.compacted_into == Some(row_id))
        .cloned()
        .collect();
    if let Some(id) = identifier {
        let Some(entry) = row.ledger.entries.iter().find(|e| e.text == id) else {
            return Err(Error::InvalidInput(format!(
                "summary row {row_id} has no ledger entry '{id}'; 'abridge expand {session} {row_id}' lists its ledger"
            )));
        };
        let episodes = h.episodes_after(session, entry.episode.saturating_sub(1), 1)?;
        return Ok(Expansion {
            row,
            episodes,
            compacted,
            next_after: None,
        });
    }
    let start = after.max(row.first_episode - 1);
    let limit = limit.clamp(1, 10_000);
    let mut episodes = Vec::new();
    if start < row.last_episode {
        let want = (row.last_episode - start).min(u64::from(limit)) as u32;
        episodes = h.episodes_after(session, start, want)?;
        episodes.retain(|e| e.id <= row.last_episode);
    }
    let next_after = episodes
        .last()
        .map(|e| e.id)
        .filter(|&l| l < row.last_episode);
    Ok(Expansion {
        row,
        episodes,
        compacted,
        next_after,
    })
}

/// The session's facts as they stand (see [`crate::facts`]): the events its summary rows
/// carry and those its episodes after the chain state (read a page at a time), the facts
/// changed most recently first; none for a coding session.
pub fn facts(h: &mut impl Host, session: &str) -> Result<Vec<crate::facts::Fact>, Error> {
    let rows = h.summaries(session)?;
    if rows
        .iter()
        .any(|r| crate::digest::is_coding(&r.ledger.entries))
    {
        return Ok(Vec::new());
    }
    let chain_end = rows.iter().map(|r| r.last_episode).max().unwrap_or(0);
    let mut unfolded = Ledger::default();
    let mut it = Paged::new(h, session, chain_end, u64::MAX);
    for e in &mut it {
        add_facts(&mut unfolded, &e);
    }
    it.check()?;
    let events = crate::facts::of_entries(
        rows.iter()
            .flat_map(|r| r.ledger.entries.iter())
            .chain(unfolded.entries.iter()),
    );
    let mut facts = crate::facts::timeline(&events);
    facts.sort_by_key(|f| std::cmp::Reverse(crate::facts::latest(f)));
    Ok(facts)
}
