//! Recall's writes, written once for both SQL stores (see [`crate::sql`]): each runs in the
//! store's open transaction, its SQL in the store's dialect, its rules from
//! [`crate::rules`].

use crate::rules::{self, Dialect};
use crate::sql::{SUM, SUMMARY_VECTOR, Tx, VECTOR, Val, memory_cols, memory_from};
use crate::types::{ClusterSummaryWrite, Error, Memory, NewMemory, StoredMemory};

/// The next change number of the clusters (the sweeper's cursor).
fn next_changed(d: Dialect) -> &'static str {
    match d {
        Dialect::Sqlite => "(SELECT COALESCE(MAX(changed_seq), 0) + 1 FROM clusters)",
        Dialect::Postgres => "nextval('clusters_changed')",
    }
}

/// A membership change of `cluster`: its version moves (a summary of the old members is
/// stale), and the sweeper sees it.
pub(crate) async fn bump(tx: &mut impl Tx, tenant: &str, cluster: u64) -> Result<(), Error> {
    let d = tx.dialect();
    let sql = format!(
        "UPDATE clusters SET version = version + 1, changed_seq = {} WHERE tenant = {} AND id = {}",
        next_changed(d),
        d.param(1),
        d.param(2)
    );
    tx.exec(&sql, &[tenant.into(), cluster.into()]).await?;
    Ok(())
}

/// A cluster's member count (0: no such cluster).
pub(crate) async fn members(tx: &mut impl Tx, tenant: &str, cluster: u64) -> Result<u32, Error> {
    let d = tx.dialect();
    let sql = format!(
        "SELECT members FROM clusters WHERE tenant = {} AND id = {}",
        d.param(1),
        d.param(2)
    );
    match tx.row(&sql, &[tenant.into(), cluster.into()]).await? {
        Some(r) => Ok(r.int(0)? as u32),
        None => Ok(0),
    }
}

/// The memory `m` supersedes and its cluster: the one its client named, if it is still
/// current, else the newest current memory of its scope with its fact key (a keyed hash).
async fn superseded(
    tx: &mut impl Tx,
    tenant: &str,
    m: &NewMemory,
) -> Result<Option<(String, u64)>, Error> {
    let d = tx.dialect();
    let p = |n: usize| d.param(n);
    let (cond, arg): (&str, Val) = match (&m.replaces, m.fact_key.as_str()) {
        (Some(id), _) => ("id", id.as_str().into()),
        (None, "") => return Ok(None),
        (None, k) => ("fact_key", k.into()),
    };
    let s = &m.scope;
    let sql = format!(
        "SELECT id, cluster FROM memories WHERE tenant = {} AND {cond} = {} AND {} = {} AND project = {} AND environment = {} AND kind = {} AND key = {} AND id <> {} AND superseded_by IS NULL ORDER BY seq DESC LIMIT 1",
        p(1),
        p(2),
        d.user_column(),
        p(3),
        p(4),
        p(5),
        p(6),
        p(7),
        p(8)
    );
    let args = [
        &[tenant.into(), arg][..],
        &crate::once::recall::scope_vals(s),
        &[m.id.as_str().into()],
    ]
    .concat();
    match tx.row(&sql, &args).await? {
        Some(r) => Ok(Some((r.text(0)?, r.u64(1)?))),
        None => Ok(None),
    }
}

/// Store a memory into its cluster (the one named, or a new one), keeping the cluster's
/// vector sum and count; a memory already stored under its id is checked to be the same
/// one and left as it is. The memory it supersedes (see [`superseded`]) is marked with it
/// in the same transaction, kept as it was otherwise.
pub(crate) async fn put_memory(
    tx: &mut impl Tx,
    tenant: &str,
    m: NewMemory,
) -> Result<StoredMemory, Error> {
    let d = tx.dialect();
    let p = |n: usize| d.param(n);
    tx.lock_clusters(tenant).await?;
    let vk = tx.vector_keys(tenant).await?;
    let existing = tx
        .row(
            &format!(
                "SELECT {} FROM memories WHERE tenant = {} AND id = {}",
                memory_cols(d),
                p(1),
                p(2)
            ),
            &[tenant.into(), m.id.as_str().into()],
        )
        .await?;
    if let Some(raw) = existing {
        let (mut e, stored) = memory_from(&raw)?;
        e.text = tx
            .reveal(tenant, crate::keyring::place::MEMORY, &e.id, stored)
            .await?;
        rules::check_same_memory(&e, &m)?;
        let members = members(tx, tenant, e.cluster).await?;
        return Ok(StoredMemory {
            cluster: e.cluster,
            created: false,
            members,
            superseded: None,
        });
    }
    let s = &m.scope;
    let (cluster, sum) = match m.cluster {
        Some(id) => {
            let sql = format!(
                "SELECT sum, model, {}, project, environment, kind, key FROM clusters WHERE tenant = {} AND id = {}",
                d.user_column(),
                p(1),
                p(2)
            );
            let row = match tx.row(&sql, &[tenant.into(), id.into()]).await? {
                Some(r) => Some((r.bytes(0)?, r.text(1)?, r.scope(2)?)),
                None => None,
            };
            rules::check_named_cluster(
                id,
                row.as_ref()
                    .map(|(_, model, scope)| (scope, model.as_str())),
                &m,
            )?;
            let sum = match row {
                Some(r) => vk.open(SUM, &id.to_string(), &r.0)?,
                None => Vec::new(),
            };
            (id, sum)
        }
        None => {
            let next = format!(
                "SELECT COALESCE(MAX(id), 0) + 1 FROM clusters WHERE tenant = {}",
                p(1)
            );
            let id = match tx.row(&next, &[tenant.into()]).await? {
                Some(r) => r.u64(0)?,
                None => 1,
            };
            let sql = format!(
                "INSERT INTO clusters (tenant, id, {}, project, environment, kind, key, model, sum) VALUES ({})",
                d.user_column(),
                (1..=9).map(p).collect::<Vec<_>>().join(", ")
            );
            let zero = vk.seal(SUM, &id.to_string(), &vec![0f32; m.vector.len()])?;
            tx.exec(
                &sql,
                &[
                    tenant.into(),
                    id.into(),
                    s.user.as_str().into(),
                    s.project.as_str().into(),
                    s.environment.as_str().into(),
                    s.kind.as_str().into(),
                    s.key.as_str().into(),
                    m.model.as_str().into(),
                    zero.into(),
                ],
            )
            .await?;
            (id, Vec::new())
        }
    };
    let sum = rules::joined_sum(cluster, sum, &m)?;
    let next = format!(
        "SELECT COALESCE(MAX(seq), 0) + 1 FROM memories WHERE tenant = {}",
        p(1)
    );
    let seq = match tx.row(&next, &[tenant.into()]).await? {
        Some(r) => r.int(0)?,
        None => 1,
    };
    let (text, sealed) = tx
        .seal(tenant, crate::keyring::place::MEMORY, &m.id, &m.text)
        .await?;
    let old = superseded(tx, tenant, &m).await?;
    let sql = format!(
        "INSERT INTO memories (tenant, id, {}, project, environment, kind, key, text, sealed, importance, tokens, created_ms, cluster, model, vector, seq, fact_key, supersedes) VALUES ({})",
        d.user_column(),
        (1..=18).map(p).collect::<Vec<_>>().join(", ")
    );
    tx.exec(
        &sql,
        &[
            tenant.into(),
            m.id.as_str().into(),
            s.user.as_str().into(),
            s.project.as_str().into(),
            s.environment.as_str().into(),
            s.kind.as_str().into(),
            s.key.as_str().into(),
            text.into(),
            sealed.into(),
            m.importance.into(),
            m.tokens.into(),
            m.created_ms.into(),
            cluster.into(),
            m.model.as_str().into(),
            vk.seal(VECTOR, &m.id, &m.vector)?.into(),
            seq.into(),
            m.fact_key.as_str().into(),
            old.as_ref().map(|(id, _)| id.clone()).into(),
        ],
    )
    .await?;
    if let Some((old_id, old_cluster)) = &old {
        let sql = format!(
            "UPDATE memories SET superseded_by = {}, superseded_ms = {} WHERE tenant = {} AND id = {}",
            p(3),
            p(4),
            p(1),
            p(2)
        );
        tx.exec(
            &sql,
            &[
                tenant.into(),
                old_id.as_str().into(),
                m.id.as_str().into(),
                m.created_ms.into(),
            ],
        )
        .await?;
        // Its cluster's summary told it as current.
        if *old_cluster != cluster {
            bump(tx, tenant, *old_cluster).await?;
        }
    }
    tx.memory_written(tenant, &m.id, &m.vector).await?;
    let sql = format!(
        "UPDATE clusters SET sum = {}, members = members + 1 WHERE tenant = {} AND id = {}",
        p(3),
        p(1),
        p(2)
    );
    let sealed_sum = vk.seal(SUM, &cluster.to_string(), &sum)?;
    tx.exec(&sql, &[tenant.into(), cluster.into(), sealed_sum.into()])
        .await?;
    bump(tx, tenant, cluster).await?;
    let members = members(tx, tenant, cluster).await?;
    Ok(StoredMemory {
        cluster,
        created: true,
        members,
        superseded: old.map(|(id, _)| id),
    })
}

/// Delete a memory, taking its vector out of its cluster's sum; the memory as it was (its
/// text opened, or as stored when it no longer opens: it is deleted all the same) and its
/// embedding model, or `None` when there was none.
pub(crate) async fn delete_memory(
    tx: &mut impl Tx,
    tenant: &str,
    id: &str,
) -> Result<Option<(Memory, String)>, Error> {
    let d = tx.dialect();
    let p = |n: usize| d.param(n);
    tx.lock_clusters(tenant).await?;
    let sql = format!(
        "SELECT {}, model, vector FROM memories WHERE tenant = {} AND id = {}",
        memory_cols(d),
        p(1),
        p(2)
    );
    let Some(row) = tx.row(&sql, &[tenant.into(), id.into()]).await? else {
        return Ok(None);
    };
    let (raw, stored) = memory_from(&row)?;
    let (model, vector) = (row.text(16)?, row.bytes(17)?);
    let m = match tx
        .reveal(tenant, crate::keyring::place::MEMORY, &raw.id, stored)
        .await
    {
        Ok(text) => Memory { text, ..raw },
        Err(_) => raw,
    };
    let sql = format!(
        "DELETE FROM memories WHERE tenant = {} AND id = {}",
        p(1),
        p(2)
    );
    tx.exec(&sql, &[tenant.into(), id.into()]).await?;
    // What it superseded is current again (its cluster's summary told it as history), and
    // nothing names it any more.
    let sql = format!(
        "SELECT DISTINCT cluster FROM memories WHERE tenant = {} AND superseded_by = {}",
        p(1),
        p(2)
    );
    let restored: Vec<u64> = tx
        .rows(&sql, &[tenant.into(), id.into()])
        .await?
        .iter()
        .map(|r| r.u64(0))
        .collect::<Result<_, _>>()?;
    for (set, col) in [
        ("superseded_by = NULL, superseded_ms = 0", "superseded_by"),
        ("supersedes = NULL", "supersedes"),
    ] {
        let sql = format!(
            "UPDATE memories SET {set} WHERE tenant = {} AND {col} = {}",
            p(1),
            p(2)
        );
        tx.exec(&sql, &[tenant.into(), id.into()]).await?;
    }
    for c in restored.into_iter().filter(|c| *c != m.cluster) {
        bump(tx, tenant, c).await?;
    }
    let sql = format!(
        "SELECT model, sum, members FROM clusters WHERE tenant = {} AND id = {}",
        p(1),
        p(2)
    );
    let r = tx
        .row(&sql, &[tenant.into(), m.cluster.into()])
        .await?
        .ok_or_else(|| {
            Error::Storage(format!(
                "memory {id} belongs to cluster {}, which is missing",
                m.cluster
            ))
        })?;
    let (cmodel, sum, members) = (r.text(0)?, r.bytes(1)?, r.int(2)? as u32);
    let left = members.saturating_sub(1);
    let vk = tx.vector_keys(tenant).await?;
    let cid = m.cluster.to_string();
    let sum = rules::left_sum(
        vk.open(SUM, &cid, &sum)?,
        left,
        &cmodel,
        &model,
        &vk.open(VECTOR, id, &vector)?,
    );
    let sql = format!(
        "UPDATE clusters SET sum = {}, members = {} WHERE tenant = {} AND id = {}",
        p(3),
        p(4),
        p(1),
        p(2)
    );
    let sealed_sum = vk.seal(SUM, &cid, &sum)?;
    tx.exec(
        &sql,
        &[
            tenant.into(),
            m.cluster.into(),
            sealed_sum.into(),
            left.into(),
        ],
    )
    .await?;
    bump(tx, tenant, m.cluster).await?;
    Ok(Some((m, model)))
}

/// Write a cluster's summary (a new row, or its row updated in place) unless the rule of
/// [`rules::summary_write_allowed`] refuses it (members changed since they were read, or the
/// summary already covers these members); whether it was written.
pub(crate) async fn write_cluster_summary(
    tx: &mut impl Tx,
    tenant: &str,
    w: ClusterSummaryWrite,
) -> Result<bool, Error> {
    let d = tx.dialect();
    let p = |n: usize| d.param(n);
    // Under the tenant's lock no member can come or go between the check and the write.
    tx.lock_clusters(tenant).await?;
    let sql = format!(
        "SELECT id, member_hash FROM cluster_summaries WHERE tenant = {} AND cluster = {}",
        p(1),
        p(2)
    );
    let current = match tx.row(&sql, &[tenant.into(), w.cluster.into()]).await? {
        Some(r) => Some((r.u64(0)?, r.text(1)?)),
        None => None,
    };
    let sql = format!(
        "SELECT version FROM clusters WHERE tenant = {} AND id = {}",
        p(1),
        p(2)
    );
    let version = match tx.row(&sql, &[tenant.into(), w.cluster.into()]).await? {
        Some(r) => Some(r.u64(0)?),
        None => None,
    };
    let hash = current.as_ref().map(|(_, h)| h.as_str());
    if !rules::summary_write_allowed(hash, &w, version) {
        return Ok(false);
    }
    let (id, update) = match current {
        Some((id, _)) => (id, true),
        None => {
            let sql = format!(
                "SELECT COALESCE(MAX(id), 0) + 1 FROM cluster_summaries WHERE tenant = {}",
                p(1)
            );
            let id = match tx.row(&sql, &[tenant.into()]).await? {
                Some(r) => r.u64(0)?,
                None => 1,
            };
            (id, false)
        }
    };
    let vk = tx.vector_keys(tenant).await?;
    let rid = id.to_string();
    let (text, sealed) = tx
        .seal(
            tenant,
            crate::keyring::place::CLUSTER_SUMMARY,
            &rid,
            &w.text,
        )
        .await?;
    let vector = vk.seal(SUMMARY_VECTOR, &rid, &w.vector)?;
    // Parameters 1 and 2 find the row; 3 on are its columns.
    let columns = [
        ("text", Val::from(text)),
        ("sealed", sealed.into()),
        ("member_hash", w.member_hash.into()),
        ("covered_seq", rules::seq_arg(w.covered_seq).into()),
        ("covered", w.covered.into()),
        ("importance", w.importance.into()),
        ("tokens", w.tokens.into()),
        ("model", w.model.into()),
        ("calls", w.calls.into()),
        ("prompt_tokens", w.prompt_tokens.into()),
        ("output_tokens", w.output_tokens.into()),
        ("vector_model", w.vector_model.into()),
        ("vector", vector.into()),
        ("updated_ms", w.now_ms.into()),
    ];
    let mut args: Vec<Val> = vec![tenant.into(), id.into()];
    let sql = if update {
        let set: Vec<String> = columns
            .iter()
            .enumerate()
            .map(|(i, (c, _))| format!("{c} = {}", p(i + 3)))
            .collect();
        format!(
            "UPDATE cluster_summaries SET {} WHERE tenant = {} AND id = {}",
            set.join(", "),
            p(1),
            p(2)
        )
    } else {
        let names: Vec<&str> = columns.iter().map(|(c, _)| *c).collect();
        let at: Vec<String> = (3..=columns.len() + 4).map(p).collect();
        args.push(w.cluster.into());
        args.push(w.now_ms.into());
        format!(
            "INSERT INTO cluster_summaries (tenant, id, {}, cluster, created_ms) VALUES ({}, {}, {})",
            names.join(", "),
            p(1),
            p(2),
            at.join(", ")
        )
    };
    // The columns' values go between the key and the insert's two extra columns.
    let extra = args.split_off(2);
    args.extend(columns.into_iter().map(|(_, v)| v));
    args.extend(extra);
    tx.exec(&sql, &args).await?;
    Ok(true)
}

/// Re-embed a cluster's members under `model`: each member named in `vectors` gets its new
/// vector, and the cluster's sum becomes theirs (a member not named is left out of it).
pub(crate) async fn set_vectors(
    tx: &mut impl Tx,
    tenant: &str,
    cluster: u64,
    model: &str,
    vectors: &[(String, Vec<f32>)],
) -> Result<(), Error> {
    let d = tx.dialect();
    let p = |n: usize| d.param(n);
    tx.lock_clusters(tenant).await?;
    let vk = tx.vector_keys(tenant).await?;
    let sql = format!(
        "UPDATE memories SET model = {}, vector = {} WHERE tenant = {} AND id = {} AND cluster = {}",
        p(4),
        p(5),
        p(1),
        p(2),
        p(3)
    );
    let mut reached = Vec::new();
    for (id, v) in vectors {
        let args = [
            tenant.into(),
            id.as_str().into(),
            cluster.into(),
            model.into(),
            vk.seal(VECTOR, id, v)?.into(),
        ];
        if tx.exec(&sql, &args).await? == 1 {
            tx.memory_written(tenant, id, v).await?;
            reached.push(v.as_slice());
        }
    }
    let sum = rules::sum_of(reached);
    let sql = format!(
        "UPDATE clusters SET model = {}, sum = {} WHERE tenant = {} AND id = {}",
        p(3),
        p(4),
        p(1),
        p(2)
    );
    let sealed_sum = vk.seal(SUM, &cluster.to_string(), &sum)?;
    tx.exec(
        &sql,
        &[
            tenant.into(),
            cluster.into(),
            model.into(),
            sealed_sum.into(),
        ],
    )
    .await?;
    bump(tx, tenant, cluster).await
}
