//! `abridge:engine/llm`: one request, or a batch run as a sliding window of bounded
//! concurrency (a new request starts as soon as one finishes). Each complete answer to a
//! request with a cache key is stored in the partial cache the moment it arrives, and a
//! cancelled call traps here.

use super::HostState;
use crate::bindings::abridge::engine::llm::Host;
use crate::control::{CallControl, Cancelled};
use crate::imports::LogSink;
use crate::llm::LlmBackend;
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
        && let Err(e) = store
            .put_partial(
                &key,
                &crate::types::CachedAnswer {
                    text: resp.text.clone(),
                    prompt_tokens: resp.prompt_tokens.unwrap_or(0),
                    output_tokens: resp.output_tokens.unwrap_or(0),
                },
            )
            .await
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
        // A sliding window whose width is learned from the server (see backend::adaptive):
        // a new request starts as soon as one finishes and the limit allows.
        let adaptive = self.adaptive.clone();
        let work = async move {
            use futures::StreamExt;
            let n = reqs.len();
            let mut out: Vec<Option<Result<Response, Error>>> = (0..n).map(|_| None).collect();
            let mut pending = reqs.into_iter().enumerate();
            let mut running = futures::stream::FuturesUnordered::new();
            loop {
                let limit = adaptive.lock().expect("adaptive lock").limit();
                while running.len() < limit {
                    let Some((i, r)) = pending.next() else { break };
                    let f = one(r);
                    running.push(async move {
                        let started = std::time::Instant::now();
                        let r = f.await;
                        (i, r, started.elapsed())
                    });
                }
                let in_flight = running.len();
                let Some((i, r, took)) = running.next().await else {
                    break;
                };
                {
                    let mut a = adaptive.lock().expect("adaptive lock");
                    match &r {
                        Ok(resp) => a.answered(
                            took,
                            resp.server_ms
                                .map(|ms| std::time::Duration::from_millis(u64::from(ms))),
                            in_flight,
                        ),
                        Err(Error::Timeout(_)) => a.timed_out(),
                        Err(_) => {}
                    }
                }
                out[i] = Some(r);
            }
            out.into_iter()
                .map(|r| r.expect("every request answered"))
                .collect::<Vec<_>>()
        };
        unless_cancelled(control.as_deref(), work).await
    }
}
