//! `abridge:engine/llm`: one request, or a batch run as a sliding window of bounded
//! concurrency (a new request starts as soon as one finishes). Each complete answer to a
//! request with a cache key is stored in the partial cache the moment it arrives, and a
//! cancelled call traps here.

use std::sync::Arc;

use super::HostState;
use crate::backend::LlmBackend;
use crate::bindings::abridge::engine::llm::Host;
use crate::control::{CallControl, Cancelled};
use crate::imports::LogSink;
use crate::store::Store;
use crate::types::{Error, FinishReason, Level, Request, Response};

/// One call, then caching and progress accounting.
async fn call(
    llm: &dyn LlmBackend,
    store: &dyn Store,
    log: &LogSink,
    control: Option<&CallControl>,
    mut req: Request,
) -> Result<Response, Error> {
    let key = req.cache_key.take();
    let r = llm.generate(req).await;
    if let (Some(key), Ok(resp)) = (key, &r)
        && resp.finish_reason == FinishReason::Stop
        && let Err(e) = store.put_partial(&key, &resp.text).await
    {
        // The cache only saves work; the answer itself is still good.
        log(
            Level::Warn,
            &format!("caching a partial summary failed: {e:?}"),
        );
    }
    if let Some(c) = control {
        c.answered();
    }
    r
}

/// Run `work` unless the call is cancelled first.
async fn unless_cancelled<T>(
    control: Option<&CallControl>,
    work: impl Future<Output = T>,
) -> wasmtime::Result<T> {
    match control {
        None => Ok(work.await),
        Some(c) => tokio::select! {
            r = work => Ok(r),
            () = c.cancelled() => Err(Cancelled.into()),
        },
    }
}

impl Host for HostState {
    async fn generate(&mut self, req: Request) -> wasmtime::Result<Result<Response, Error>> {
        let control = self.control.clone();
        let work = call(&*self.llm, &*self.store, &self.log, control.as_deref(), req);
        unless_cancelled(control.as_deref(), work).await
    }

    async fn generate_batch(
        &mut self,
        reqs: Vec<Request>,
    ) -> wasmtime::Result<Vec<Result<Response, Error>>> {
        let control = self.control.clone();
        let (llm, store, log) = (&*self.llm, &*self.store, &self.log);
        let one = |r| call(llm, store, log, control.as_deref(), r);
        if self.lockstep {
            // Fixed groups, each awaited in full: kept to measure against the sliding window.
            let group_size = self.batch_concurrency.max(1);
            let work = async {
                let mut out = Vec::with_capacity(reqs.len());
                let mut reqs = reqs.into_iter().peekable();
                while reqs.peek().is_some() {
                    let group: Vec<Request> = reqs.by_ref().take(group_size).collect();
                    out.extend(futures::future::join_all(group.into_iter().map(one)).await);
                }
                out
            };
            return unless_cancelled(control.as_deref(), work).await;
        }
        let permits = Arc::new(tokio::sync::Semaphore::new(self.batch_concurrency.max(1)));
        let calls = reqs.into_iter().map(|r| {
            let permits = permits.clone();
            async move {
                let _permit = permits
                    .acquire()
                    .await
                    .expect("the semaphore is never closed");
                one(r).await
            }
        });
        unless_cancelled(control.as_deref(), futures::future::join_all(calls)).await
    }
}
