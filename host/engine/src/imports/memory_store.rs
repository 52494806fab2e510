//! `abridge:engine/memory-store`: forwards to the tenant's view of a
//! [`crate::store::RecallStore`] and to the embedding backend.

use std::sync::Arc;

use super::HostState;
use crate::bindings::abridge::engine::memory_store::Host;
use crate::embedder::Embedder;
use crate::store::RecallStore;
use crate::types::{
    Centroid, ClusterSummary, ClusterSummaryWrite, Embedding, Error, Hit, MemberSet, Memory,
    MemoryFilter, NewMemory, Scope, StoredMemory,
};

/// What the memory import reaches: one tenant's rows and the embedder.
#[derive(Clone)]
pub struct RecallBinding {
    /// The store (every call passes the tenant).
    pub store: Arc<dyn RecallStore>,
    /// The tenant all calls are scoped to.
    pub tenant: String,
    /// The embedding backend (`None`: only the guest's lexical embedder is available).
    pub embedder: Option<Arc<dyn Embedder>>,
}

impl HostState {
    fn recall(&self) -> Result<&RecallBinding, Error> {
        self.recall.as_ref().ok_or_else(|| {
            Error::InvalidInput(
                "this engine has no memory store: build it with AbridgeBuilder::memories".into(),
            )
        })
    }
}

impl Host for HostState {
    async fn embed(&mut self, texts: Vec<String>) -> Result<Embedding, Error> {
        let b = self.recall()?;
        let Some(e) = &b.embedder else {
            return Err(Error::InvalidInput(
                "no embedding backend is configured; use the offline embedder (abridge-lexical-v1) or set ABRIDGE_EMBED_MODEL".into(),
            ));
        };
        let v = e.embed(&texts).await?;
        Ok(Embedding {
            model: v.model,
            dim: v.dim as u32,
            vectors: v.vectors,
            tokens: v.tokens.unwrap_or(0).min(u64::from(u32::MAX)) as u32,
        })
    }

    async fn centroids(&mut self, scope: Scope) -> Result<Vec<Centroid>, Error> {
        let b = self.recall()?;
        b.store.centroids(&b.tenant, &scope).await
    }

    async fn put_memory(&mut self, m: NewMemory) -> Result<StoredMemory, Error> {
        let b = self.recall()?;
        b.store.put_memory(&b.tenant, m).await
    }

    async fn current_memory(
        &mut self,
        scope: Scope,
        fact_key: String,
    ) -> Result<Option<Memory>, Error> {
        let b = self.recall()?;
        b.store.current_memory(&b.tenant, &scope, &fact_key).await
    }

    async fn get_memory(&mut self, id: String) -> Result<Option<Memory>, Error> {
        let b = self.recall()?;
        b.store.get_memory(&b.tenant, &id).await
    }

    async fn members_after(&mut self, cluster: u64, after_seq: u64) -> Result<MemberSet, Error> {
        let b = self.recall()?;
        b.store.members_after(&b.tenant, cluster, after_seq).await
    }

    async fn top_members(
        &mut self,
        cluster: u64,
        offset: u32,
        limit: u32,
    ) -> Result<Vec<Memory>, Error> {
        let b = self.recall()?;
        b.store
            .top_members(&b.tenant, cluster, offset, limit.min(1_000))
            .await
    }

    async fn member_ids(&mut self, cluster: u64, upto_seq: u64) -> Result<Vec<String>, Error> {
        let b = self.recall()?;
        b.store.member_ids(&b.tenant, cluster, upto_seq).await
    }

    async fn delete_memory(&mut self, id: String) -> Result<Option<Memory>, Error> {
        let b = self.recall()?;
        b.store.delete_memory(&b.tenant, &id).await
    }

    async fn set_vectors(
        &mut self,
        cluster: u64,
        model: String,
        vectors: Vec<(String, Vec<f32>)>,
    ) -> Result<(), Error> {
        let b = self.recall()?;
        b.store
            .set_vectors(&b.tenant, cluster, &model, vectors)
            .await
    }

    async fn summary(&mut self, cluster: u64) -> Result<Option<ClusterSummary>, Error> {
        let b = self.recall()?;
        b.store.cluster_summary(&b.tenant, cluster).await
    }

    async fn write_summary(&mut self, w: ClusterSummaryWrite) -> Result<bool, Error> {
        let b = self.recall()?;
        b.store.write_cluster_summary(&b.tenant, w).await
    }

    async fn delete_summary(&mut self, cluster: u64) -> Result<(), Error> {
        let b = self.recall()?;
        b.store.delete_cluster_summary(&b.tenant, cluster).await
    }

    async fn set_cluster_note(&mut self, cluster: u64, note: Option<String>) -> Result<(), Error> {
        let b = self.recall()?;
        b.store.set_cluster_note(&b.tenant, cluster, note).await
    }

    async fn search(
        &mut self,
        query: Vec<f32>,
        model: String,
        filter: MemoryFilter,
        limit: u32,
    ) -> Result<Vec<Hit>, Error> {
        let b = self.recall()?;
        b.store
            .search(&b.tenant, &query, &model, &filter, limit.min(10_000))
            .await
    }
}
