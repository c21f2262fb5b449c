//! What a caller's reviews may cost. Every call is reviewed before anything
//! else (a TokenReview, or the Argo Server's `/api/v1/userinfo` for an SSO
//! token, then SubjectAccessReviews), and anyone can make a call, so reviews
//! have a budget of their own: their own client (never the pod deletions'
//! write budget or its fairness flows, so junk calls cannot slow a retry),
//! a token bucket, and a cap on the reviews one source has waiting or in
//! flight, so one address cannot queue ahead of every other caller.
//!
//! Who a token is (or that it is no one) is remembered for a short while,
//! keyed by a hash of the token, in a bounded map: a UI's clicks and a
//! batch's calls cost one review, and a junk token repeated costs one too.

use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hashlink::LruCache;
use leaky_bucket::RateLimiter;
use sha2::{Digest, Sha256};

use crate::argoapi::listener::Shares;
use crate::argoapi::wire::{Code, Status};

/// How long who a token is stays known: Argo's server remembers a good
/// token a minute (ARGO_SERVER_TOKEN_REVIEW_CACHE_TTL's default).
pub const KNOWN_FOR: Duration = Duration::from_secs(60);
/// How long a refused token stays refused without asking again: short, so a
/// token that just became valid (a clock skew, a new binding) works soon.
pub const REFUSED_FOR: Duration = Duration::from_secs(10);
/// How many tokens are remembered (Argo's server: 1,000).
pub const REMEMBERED: usize = 1000;
/// How long one review (or the Argo Server's `/userinfo`) may take: a call
/// answers Unavailable rather than hang on a server that does not answer.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// How long a call waits for a review's turn before it is answered 503.
const WAIT: Duration = Duration::from_secs(2);

/// The reviews' budget; each is a flag and a chart value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Reviews per second, and how many may go at once after a quiet spell.
    pub qps: u32,
    pub burst: u32,
    /// Reviews one source may have waiting or in flight.
    pub per_source: usize,
    /// Reviews everyone may have waiting or in flight.
    pub total: usize,
}

impl Default for Budget {
    fn default() -> Self {
        // A call costs one TokenReview (none when its token is known) and
        // three SubjectAccessReviews: 50/s serves a dozen calls a second, far
        // beyond what people click, and costs the API server little (both
        // are answered from memory).
        Budget {
            qps: 50,
            burst: 100,
            per_source: 8,
            total: 128,
        }
    }
}

/// Who a token is (`auth::Authenticated`), or its refusal.
type Answer<T> = Result<T, Status>;

/// A remembered answer and until when it holds, by the SHA-256 of its token.
type Known<T> = LruCache<[u8; 32], (Instant, Answer<T>)>;

/// The reviews of callers, within their budget; `T` is who a token is.
pub struct Reviews<T> {
    /// A client of its own, outside rewind's write budget.
    client: kube::Client,
    bucket: RateLimiter,
    in_flight: Arc<Shares>,
    known: Mutex<Known<T>>,
}

impl<T: Clone> Reviews<T> {
    pub fn new(client: kube::Client, budget: Budget) -> Self {
        let burst = budget.burst.max(1) as usize;
        let qps = budget.qps.max(1);
        // leaky-bucket refuses an interval under a millisecond: a high rate
        // refills a tenth of a second's tokens at once.
        let (refill, interval) = match qps {
            10.. => ((qps / 10) as usize, Duration::from_millis(100)),
            _ => (1, Duration::from_secs(1) / qps),
        };
        let bucket = RateLimiter::builder()
            .initial(burst)
            .max(burst)
            .refill(refill)
            .interval(interval)
            .build();
        Reviews {
            client,
            bucket,
            in_flight: Shares::new(budget.total, budget.per_source),
            known: Mutex::new(LruCache::new(REMEMBERED)),
        }
    }

    /// The client reviews are asked with.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// Runs `ask` (one review) once `source` has a share of the reviews in
    /// flight and the bucket a token; 503 when either would take too long.
    pub async fn spend<R>(
        &self,
        source: IpAddr,
        ask: impl Future<Output = R>,
    ) -> Result<R, Status> {
        let Some(_share) = self.in_flight.try_take(source) else {
            return Err(Status::new(
                Code::Unavailable,
                "too many reviews of callers from this address are in flight; try again in a second",
            ));
        };
        if tokio::time::timeout(WAIT, self.bucket.acquire_one())
            .await
            .is_err()
        {
            return Err(Status::new(
                Code::Unavailable,
                "rewind's budget for reviewing callers is spent for now (--argo-api-review-qps); try again in a second",
            ));
        }
        Ok(ask.await)
    }

    /// Who `token` is: remembered, or asked with `ask` within the budget.
    /// A definite answer (who, or a refusal) is remembered; trouble asking
    /// is not.
    pub async fn identity<F>(&self, source: IpAddr, token: &str, ask: F) -> Answer<T>
    where
        F: Future<Output = Answer<T>>,
    {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = Instant::now();
        if let Some(answer) = self.remembered(&key, now) {
            return answer;
        }
        let answer = self.spend(source, ask).await?;
        let keep = match &answer {
            Ok(_) => Some(KNOWN_FOR),
            Err(status) if status.code == Code::Unauthenticated => Some(REFUSED_FOR),
            Err(_) => None,
        };
        if let Some(keep) = keep {
            self.known
                .lock()
                .expect("the review cache lock is never poisoned")
                .insert(key, (now + keep, answer.clone()));
        }
        answer
    }

    fn remembered(&self, key: &[u8; 32], now: Instant) -> Option<Answer<T>> {
        let mut known = self
            .known
            .lock()
            .expect("the review cache lock is never poisoned");
        match known.get(key) {
            Some((until, answer)) if *until > now => Some(answer.clone()),
            Some(_) => {
                known.remove(key);
                None
            }
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn reviews(budget: Budget) -> Reviews<String> {
        // A client that is never called: these tests ask with closures.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        Reviews::new(kube::Client::try_from(config).unwrap(), budget)
    }

    fn alice() -> String {
        "alice".into()
    }

    #[tokio::test]
    async fn answers_are_remembered_refusals_briefly_and_trouble_not_at_all() {
        let reviews = reviews(Budget::default());
        let asked = AtomicUsize::new(0);
        let source: IpAddr = "10.0.0.1".parse().unwrap();
        let asked = &asked;
        // Counted when asked (polled), as a review costs only then.
        let ask = |answer: Answer<String>| async move {
            asked.fetch_add(1, Ordering::SeqCst);
            answer
        };
        for _ in 0..3 {
            assert_eq!(
                reviews.identity(source, "good", ask(Ok(alice()))).await,
                Ok(alice())
            );
        }
        assert_eq!(
            asked.load(Ordering::SeqCst),
            1,
            "a known token is asked once"
        );
        let refused = Status::new(Code::Unauthenticated, "token not valid");
        for _ in 0..3 {
            assert_eq!(
                reviews
                    .identity(source, "junk", ask(Err(refused.clone())))
                    .await,
                Err(refused.clone())
            );
        }
        assert_eq!(
            asked.load(Ordering::SeqCst),
            2,
            "a refused token is asked once"
        );
        let trouble = Status::new(Code::Unavailable, "the API server is away");
        for _ in 0..2 {
            let _ = reviews
                .identity(source, "later", ask(Err(trouble.clone())))
                .await;
        }
        assert_eq!(asked.load(Ordering::SeqCst), 4, "trouble is asked again");
        // A refusal is forgotten once its time passed.
        let key: [u8; 32] = Sha256::digest(b"junk").into();
        assert!(
            reviews
                .remembered(&key, Instant::now() + REFUSED_FOR)
                .is_none()
        );
    }

    #[tokio::test]
    async fn the_cache_is_bounded() {
        let reviews = reviews(Budget {
            qps: 1_000_000,
            burst: 1_000_000,
            ..Budget::default()
        });
        let source: IpAddr = "10.0.0.1".parse().unwrap();
        for i in 0..REMEMBERED + 50 {
            let refused = Status::new(Code::Unauthenticated, "no");
            let _ = reviews
                .identity(source, &format!("junk-{i}"), async {
                    Err::<String, _>(refused)
                })
                .await;
        }
        assert_eq!(reviews.known.lock().unwrap().len(), REMEMBERED);
    }

    #[tokio::test]
    async fn one_source_cannot_hold_every_review() {
        let reviews = Arc::new(reviews(Budget {
            per_source: 2,
            ..Budget::default()
        }));
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let (release, held) = tokio::sync::watch::channel(false);
        let mut holding = Vec::new();
        for _ in 0..2 {
            let (reviews, mut held) = (reviews.clone(), held.clone());
            holding.push(tokio::spawn(async move {
                reviews
                    .spend(a, async move {
                        let _ = held.wait_for(|released| *released).await;
                    })
                    .await
            }));
        }
        tokio::task::yield_now().await;
        while reviews.in_flight.held() < 2 {
            tokio::task::yield_now().await;
        }
        let third = reviews.spend(a, async {}).await.unwrap_err();
        assert_eq!(third.code, Code::Unavailable);
        assert!(
            reviews.spend(b, async {}).await.is_ok(),
            "another source is served"
        );
        release.send(true).unwrap();
        for h in holding {
            assert!(h.await.unwrap().is_ok());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_spent_budget_answers_unavailable_instead_of_waiting_long() {
        let reviews = reviews(Budget {
            qps: 1,
            burst: 1,
            ..Budget::default()
        });
        let source: IpAddr = "10.0.0.1".parse().unwrap();
        // Five at once, a token a second: the first now, the next two within
        // the 2 s a call may wait, the last two would wait 3 and 4 s.
        let answers =
            futures::future::join_all((0..5).map(|_| reviews.spend(source, async {}))).await;
        let served = answers.iter().filter(|a| a.is_ok()).count();
        assert!((2..=3).contains(&served), "{answers:?}");
        for refused in answers.iter().filter_map(|a| a.as_ref().err()) {
            assert_eq!(refused.code, Code::Unavailable);
            assert!(
                refused.message.contains("--argo-api-review-qps"),
                "{}",
                refused.message
            );
        }
    }
}
