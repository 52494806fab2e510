//! `abridge:engine/llm`: one request, or a batch run as a sliding window of bounded
//! concurrency (a new request starts as soon as one finishes).

use std::sync::Arc;

use super::HostState;
use crate::bindings::abridge::engine::llm::Host;
use crate::types::{Error, Request, Response};

impl Host for HostState {
    async fn generate(&mut self, req: Request) -> Result<Response, Error> {
        self.llm.generate(req).await
    }

    async fn generate_batch(&mut self, reqs: Vec<Request>) -> Vec<Result<Response, Error>> {
        if self.lockstep {
            // Fixed groups, each awaited in full: kept to measure against the sliding window.
            let mut out = Vec::with_capacity(reqs.len());
            let mut reqs = reqs.into_iter().peekable();
            while reqs.peek().is_some() {
                let group: Vec<Request> =
                    reqs.by_ref().take(self.batch_concurrency.max(1)).collect();
                out.extend(
                    futures::future::join_all(group.into_iter().map(|r| self.llm.generate(r)))
                        .await,
                );
            }
            return out;
        }
        let permits = Arc::new(tokio::sync::Semaphore::new(self.batch_concurrency.max(1)));
        let calls = reqs.into_iter().map(|r| {
            let (llm, permits) = (self.llm.clone(), permits.clone());
            async move {
                let _permit = permits
                    .acquire()
                    .await
                    .expect("the semaphore is never closed");
                llm.generate(r).await
            }
        });
        futures::future::join_all(calls).await
    }
}
