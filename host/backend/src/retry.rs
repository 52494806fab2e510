//! Retrying model requests: exponential backoff with jitter on failures that may pass by
//! themselves (timeouts, refused or dropped connections, HTTP 429 and 5xx, unparseable
//! answers). Failures that will not (a missing model, a prompt over the context, other 4xx)
//! are returned at once.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::types::{Error, Response};

/// How often and how patiently to retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, at least 1 (default 3).
    pub attempts: u32,
    /// Delay before the second attempt; it doubles each time (default 500 ms).
    pub base: Duration,
    /// Longest delay (default 10 s).
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 3,
            base: Duration::from_millis(500),
            max: Duration::from_secs(10),
        }
    }
}

/// The result of one attempt (of a generation by default; embeddings use it too).
pub enum Attempt<T = Response> {
    /// Final: success, or a failure that retrying cannot fix.
    Done(Result<T, Error>),
    /// A failure that may pass: try again if attempts remain.
    Retry(Error),
}

static SEED: AtomicU64 = AtomicU64::new(0x9E37_79B9_7F4A_7C15);

/// A pseudo-random number for jitter (splitmix64 over a counter mixed with a random value
/// drawn once per process, so processes retrying together do not jitter alike).
fn jitter_seed() -> u64 {
    static SALT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let salt = *SALT.get_or_init(|| {
        let mut b = [0u8; 8];
        // Without a random source the counter alone still spreads one process's retries.
        let _ = getrandom::fill(&mut b);
        u64::from_le_bytes(b)
    });
    let mut z = SEED.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed) ^ salt;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl RetryPolicy {
    /// The delay after failed attempt `n` (1-based): `base · 2^(n-1)`, capped at `max`, then
    /// "equal jitter": a uniform draw from the upper half, so concurrent clients spread out.
    pub fn delay(&self, n: u32, random: u64) -> Duration {
        let exp = self
            .base
            .saturating_mul(1u32 << (n.saturating_sub(1)).min(20))
            .min(self.max);
        let half = exp / 2;
        let extra = if half.is_zero() {
            0
        } else {
            random % (half.as_nanos() as u64 + 1)
        };
        half + Duration::from_nanos(extra)
    }

    /// Run `attempt` until it is done or the attempts run out.
    pub async fn run<T, F, Fut>(&self, mut attempt: F) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Attempt<T>>,
    {
        let attempts = self.attempts.max(1);
        let mut n = 1;
        loop {
            match attempt().await {
                Attempt::Done(r) => return r,
                Attempt::Retry(e) if n >= attempts => return Err(after_attempts(e, attempts)),
                Attempt::Retry(_) => {
                    tokio::time::sleep(self.delay(n, jitter_seed())).await;
                    n += 1;
                }
            }
        }
    }
}

/// Say how many attempts were made, in the error's own words.
fn after_attempts(e: Error, attempts: u32) -> Error {
    if attempts == 1 {
        return e;
    }
    let note = |m: String| format!("{m} (after {attempts} attempts)");
    match e {
        Error::Unreachable(m) => Error::Unreachable(note(m)),
        Error::Timeout(m) => Error::Timeout(note(m)),
        Error::Server(m) => Error::Server(note(m)),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::FinishReason;

    #[test]
    fn delays_grow_exponentially_with_bounded_jitter() {
        let p = RetryPolicy {
            attempts: 5,
            base: Duration::from_millis(100),
            max: Duration::from_millis(350),
        };
        for (n, lo, hi) in [(1, 50, 100), (2, 100, 200), (3, 175, 350), (4, 175, 350)] {
            for r in [0, 1, u64::MAX / 3, u64::MAX] {
                let d = p.delay(n, r).as_millis() as u64;
                assert!((lo..=hi).contains(&d), "attempt {n}: {d} ms");
            }
        }
        let spread: std::collections::BTreeSet<u128> = (0..50)
            .map(|_| p.delay(2, jitter_seed()).as_micros())
            .collect();
        assert!(spread.len() > 40, "jitter spreads delays");
    }

    #[tokio::test]
    async fn retries_until_success_or_the_last_attempt() {
        let p = RetryPolicy {
            attempts: 3,
            base: Duration::from_millis(1),
            max: Duration::from_millis(2),
        };
        let ok = || Response {
            text: "fine".into(),
            finish_reason: FinishReason::Stop,
            prompt_tokens: None,
            output_tokens: None,
            server_ms: None,
        };
        let mut calls = 0;
        let r = p
            .run(|| {
                calls += 1;
                let c = calls;
                async move {
                    if c < 3 {
                        Attempt::Retry(Error::Server("HTTP 503".into()))
                    } else {
                        Attempt::Done(Ok(ok()))
                    }
                }
            })
            .await;
        assert_eq!((r.unwrap().text, calls), ("fine".to_string(), 3));

        let mut calls = 0;
        let r = p
            .run(|| {
                calls += 1;
                async { Attempt::<Response>::Retry(Error::Server("HTTP 503".into())) }
            })
            .await;
        assert!(matches!(r, Err(Error::Server(ref m)) if m == "HTTP 503 (after 3 attempts)"));
        assert_eq!(calls, 3);

        let mut calls = 0;
        let r = p
            .run(|| {
                calls += 1;
                async { Attempt::<Response>::Done(Err(Error::ModelNotFound("m".into()))) }
            })
            .await;
        assert!(
            matches!(r, Err(Error::ModelNotFound(_))) && calls == 1,
            "no retry for a missing model"
        );
    }
}
