//! The export shell of the `memories` interface and the `memory-store` import, seen through
//! [`memory::MemoryHost`].

use super::bindings::abridge::engine::memory_store as ms;
use super::bindings::exports::abridge::engine::memories as mx;
use super::{Component, Imports, cfg_in, err_in, err_out, request_out, response_in};
use crate::memory::{self, MemoryHost};
use crate::{embed, types};

fn scope_in(s: ms::Scope) -> memory::Scope {
    memory::Scope {
        user: s.user,
        project: s.project,
        environment: s.environment,
        kind: s.kind,
        key: s.key,
    }
}

fn scope_out(s: &memory::Scope) -> ms::Scope {
    ms::Scope {
        user: s.user.clone(),
        project: s.project.clone(),
        environment: s.environment.clone(),
        kind: s.kind.clone(),
        key: s.key.clone(),
    }
}

fn filter_in(f: ms::Filter) -> memory::Filter {
    memory::Filter {
        user: f.user,
        project: f.project,
        environment: f.environment,
        kind: f.kind,
        key: f.key,
        exact: f.exact,
    }
}

fn filter_out(f: &memory::Filter) -> ms::Filter {
    ms::Filter {
        user: f.user.clone(),
        project: f.project.clone(),
        environment: f.environment.clone(),
        kind: f.kind.clone(),
        key: f.key.clone(),
        exact: f.exact,
    }
}

fn memory_in(m: ms::Memory) -> memory::Memory {
    memory::Memory {
        id: m.id,
        scope: scope_in(m.scope),
        text: m.text,
        importance: m.importance,
        tokens: m.tokens,
        created_ms: m.created_ms,
        cluster: m.cluster,
        seq: m.seq,
        supersedes: m.supersedes,
        superseded_by: m.superseded_by,
        superseded_ms: m.superseded_ms,
    }
}

fn members_in(v: Vec<ms::Memory>) -> Vec<memory::Memory> {
    v.into_iter().map(memory_in).collect()
}

fn summary_in(s: ms::ClusterSummary) -> memory::ClusterSummary {
    memory::ClusterSummary {
        id: s.id,
        cluster: s.cluster,
        text: s.text,
        member_hash: s.member_hash,
        covered_seq: s.covered_seq,
        covered: s.covered,
        importance: s.importance,
        tokens: s.tokens,
        model: s.model,
        calls: s.calls,
        prompt_tokens: s.prompt_tokens,
        output_tokens: s.output_tokens,
        created_ms: s.created_ms,
        updated_ms: s.updated_ms,
    }
}

fn summary_out(s: memory::ClusterSummary) -> ms::ClusterSummary {
    ms::ClusterSummary {
        id: s.id,
        cluster: s.cluster,
        text: s.text,
        member_hash: s.member_hash,
        covered_seq: s.covered_seq,
        covered: s.covered,
        importance: s.importance,
        tokens: s.tokens,
        model: s.model,
        calls: s.calls,
        prompt_tokens: s.prompt_tokens,
        output_tokens: s.output_tokens,
        created_ms: s.created_ms,
        updated_ms: s.updated_ms,
    }
}

fn kind_in(k: ms::HitKind) -> memory::HitKind {
    match k {
        ms::HitKind::Memory => memory::HitKind::Memory,
        ms::HitKind::Summary => memory::HitKind::Summary,
    }
}

fn kind_out(k: memory::HitKind) -> ms::HitKind {
    match k {
        memory::HitKind::Memory => ms::HitKind::Memory,
        memory::HitKind::Summary => ms::HitKind::Summary,
    }
}

fn mcfg_in(c: mx::MemoryConfig) -> memory::MemoryConfig {
    memory::MemoryConfig {
        embedder: c.embedder,
        min_similarity: c.min_similarity,
        min_cluster_items: c.min_cluster_items,
        summary_min_similarity: c.summary_min_similarity,
        prompt_budget: c.prompt_budget,
        lexical_key: c.lexical_key,
    }
}

fn mcfg_out(c: memory::MemoryConfig) -> mx::MemoryConfig {
    mx::MemoryConfig {
        embedder: c.embedder,
        min_similarity: c.min_similarity,
        min_cluster_items: c.min_cluster_items,
        summary_min_similarity: c.summary_min_similarity,
        prompt_budget: c.prompt_budget,
        lexical_key: c.lexical_key,
    }
}

impl MemoryHost for Imports {
    fn embed(&mut self, texts: &[String]) -> Result<memory::Embedding, types::Error> {
        let e = ms::embed(texts).map_err(err_in)?;
        Ok(memory::Embedding {
            model: e.model,
            dim: e.dim,
            vectors: e.vectors,
            tokens: e.tokens,
        })
    }

    fn centroids(&mut self, scope: &memory::Scope) -> Result<Vec<memory::Centroid>, types::Error> {
        Ok(ms::centroids(&scope_out(scope))
            .map_err(err_in)?
            .into_iter()
            .map(|c| memory::Centroid {
                cluster: c.cluster,
                model: c.model,
                vector: c.vector,
                members: c.members,
            })
            .collect())
    }

    fn put_memory(&mut self, m: memory::NewMemory) -> Result<memory::Stored, types::Error> {
        let s = ms::put_memory(&ms::NewMemory {
            id: m.id,
            scope: scope_out(&m.scope),
            text: m.text,
            importance: m.importance,
            tokens: m.tokens,
            created_ms: m.created_ms,
            model: m.model,
            vector: m.vector,
            cluster: m.cluster,
            fact_key: m.fact_key,
            replaces: m.replaces,
        })
        .map_err(err_in)?;
        Ok(memory::Stored {
            cluster: s.cluster,
            created: s.created,
            members: s.members,
            superseded: s.superseded,
        })
    }

    fn current_memory(
        &mut self,
        scope: &memory::Scope,
        fact_key: &str,
    ) -> Result<Option<memory::Memory>, types::Error> {
        Ok(ms::current_memory(&scope_out(scope), fact_key)
            .map_err(err_in)?
            .map(memory_in))
    }

    fn get_memory(&mut self, id: &str) -> Result<Option<memory::Memory>, types::Error> {
        Ok(ms::get_memory(id).map_err(err_in)?.map(memory_in))
    }

    fn members_after(
        &mut self,
        cluster: u64,
        after_seq: u64,
    ) -> Result<memory::MemberSet, types::Error> {
        let s = ms::members_after(cluster, after_seq).map_err(err_in)?;
        Ok(memory::MemberSet {
            version: s.version,
            count: s.count,
            members: members_in(s.members),
        })
    }

    fn top_members(
        &mut self,
        cluster: u64,
        offset: u32,
        limit: u32,
    ) -> Result<Vec<memory::Memory>, types::Error> {
        Ok(members_in(
            ms::top_members(cluster, offset, limit).map_err(err_in)?,
        ))
    }

    fn member_ids(&mut self, cluster: u64, upto_seq: u64) -> Result<Vec<String>, types::Error> {
        ms::member_ids(cluster, upto_seq).map_err(err_in)
    }

    fn delete_memory(&mut self, id: &str) -> Result<Option<memory::Memory>, types::Error> {
        Ok(ms::delete_memory(id).map_err(err_in)?.map(memory_in))
    }

    fn set_vectors(
        &mut self,
        cluster: u64,
        model: &str,
        vectors: Vec<(String, Vec<f32>)>,
    ) -> Result<(), types::Error> {
        ms::set_vectors(cluster, model, &vectors).map_err(err_in)
    }

    fn summary(&mut self, cluster: u64) -> Result<Option<memory::ClusterSummary>, types::Error> {
        Ok(ms::summary(cluster).map_err(err_in)?.map(summary_in))
    }

    fn write_summary(&mut self, w: memory::SummaryWrite) -> Result<bool, types::Error> {
        ms::write_summary(&ms::SummaryWrite {
            cluster: w.cluster,
            expect: w.expect,
            member_hash: w.member_hash,
            covered_seq: w.covered_seq,
            covered: w.covered,
            version: w.version,
            text: w.text,
            tokens: w.tokens,
            importance: w.importance,
            model: w.model,
            vector_model: w.vector_model,
            vector: w.vector,
            calls: w.calls,
            prompt_tokens: w.prompt_tokens,
            output_tokens: w.output_tokens,
            now_ms: w.now_ms,
        })
        .map_err(err_in)
    }

    fn delete_summary(&mut self, cluster: u64) -> Result<(), types::Error> {
        ms::delete_summary(cluster).map_err(err_in)
    }

    fn set_cluster_note(&mut self, cluster: u64, note: Option<String>) -> Result<(), types::Error> {
        ms::set_cluster_note(cluster, note.as_deref()).map_err(err_in)
    }

    fn search(
        &mut self,
        query: &[f32],
        model: &str,
        filter: &memory::Filter,
        limit: u32,
    ) -> Result<Vec<memory::Hit>, types::Error> {
        Ok(ms::search(query, model, &filter_out(filter), limit)
            .map_err(err_in)?
            .into_iter()
            .map(|h| memory::Hit {
                kind: kind_in(h.kind),
                id: h.id,
                text: h.text,
                similarity: h.similarity,
                importance: h.importance,
                cluster: h.cluster,
                covered_seq: h.covered_seq,
                covered: h.covered,
                superseded_by: h.superseded_by,
                superseded_ms: h.superseded_ms,
            })
            .collect())
    }

    fn generate_batch(
        &mut self,
        reqs: Vec<types::Request>,
    ) -> Vec<Result<types::Response, types::Error>> {
        let reqs: Vec<_> = reqs.into_iter().map(request_out).collect();
        super::llm::generate_batch(&reqs)
            .into_iter()
            .map(|r| r.map(response_in).map_err(err_in))
            .collect()
    }

    fn now_ms(&mut self) -> u64 {
        super::clock::now_ms()
    }

    fn log(&mut self, level: types::Level, msg: &str) {
        crate::engine::Host::log(self, level, msg)
    }
}

impl mx::Guest for Component {
    fn default_memory_config() -> mx::MemoryConfig {
        mcfg_out(memory::MemoryConfig::default())
    }

    fn remember(
        items: Vec<mx::MemoryIn>,
        cfg: mx::MemoryConfig,
    ) -> Result<Vec<mx::Remembered>, super::wit::Error> {
        let items: Vec<memory::MemoryIn> = items
            .into_iter()
            .map(|m| memory::MemoryIn {
                id: m.id,
                scope: scope_in(m.scope),
                text: m.text,
                importance: m.importance.unwrap_or(memory::DEFAULT_IMPORTANCE),
                replaces: m.replaces,
            })
            .collect();
        memory::remember(&mut Imports, &items, &mcfg_in(cfg))
            .map(|r| {
                r.into_iter()
                    .map(|r| mx::Remembered {
                        id: r.id,
                        cluster: r.cluster,
                        created: r.created,
                        members: r.members,
                        due: r.due,
                        supersedes: r.supersedes,
                    })
                    .collect()
            })
            .map_err(err_out)
    }

    fn summarize_cluster(
        cluster: u64,
        cfg: super::summarizer::Config,
        mcfg: mx::MemoryConfig,
    ) -> Result<mx::ClusterOutcome, super::wit::Error> {
        let o = memory::summarize_cluster(&mut Imports, cluster, &cfg_in(cfg), &mcfg_in(mcfg))
            .map_err(err_out)?;
        Ok(mx::ClusterOutcome {
            action: match o.action {
                memory::Action::Unchanged => mx::ClusterAction::Unchanged,
                memory::Action::Created => mx::ClusterAction::Created,
                memory::Action::Refreshed => mx::ClusterAction::Refreshed,
                memory::Action::Deleted => mx::ClusterAction::Deleted,
                memory::Action::TooFew => mx::ClusterAction::TooFew,
                memory::Action::LostRace => mx::ClusterAction::LostRace,
            },
            summary: o.summary.map(summary_out),
            calls: o.calls,
            prompt_tokens: o.prompt_tokens,
            output_tokens: o.output_tokens,
        })
    }

    fn forget(
        id: String,
        mcfg: mx::MemoryConfig,
    ) -> Result<Option<mx::Forgotten>, super::wit::Error> {
        Ok(memory::forget(&mut Imports, &id, &mcfg_in(mcfg))
            .map_err(err_out)?
            .map(|f| mx::Forgotten {
                cluster: f.cluster,
                summary_deleted: f.summary_deleted,
                due: f.due,
            }))
    }

    fn recall(
        query: String,
        filter: ms::Filter,
        k: u32,
        summaries: bool,
        mcfg: mx::MemoryConfig,
    ) -> Result<Vec<mx::Recalled>, super::wit::Error> {
        let r = memory::recall(
            &mut Imports,
            &query,
            &filter_in(filter),
            k,
            summaries,
            &mcfg_in(mcfg),
        )
        .map_err(err_out)?;
        Ok(r.into_iter()
            .map(|x| mx::Recalled {
                kind: kind_out(x.kind),
                id: x.id,
                text: x.text,
                score: x.score,
                similarity: x.similarity,
                importance: x.importance,
                cluster: x.cluster,
                sources: x.sources,
                superseded_by: x.superseded_by,
                superseded_ms: x.superseded_ms,
            })
            .collect())
    }

    fn embed_lexical(texts: Vec<String>) -> Vec<Vec<f32>> {
        texts
            .iter()
            .map(|t| embed::lexical(t, embed::LEXICAL_DIM))
            .collect()
    }
}
