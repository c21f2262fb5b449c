//! One token bucket that the server can pause.

use std::num::NonZeroU32;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use leaky_bucket::RateLimiter;
use tokio::time::Instant;

/// A request rate: `qps` tokens per second, at most `burst` saved up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub qps: NonZeroU32,
    pub burst: NonZeroU32,
}

impl Rate {
    /// `None` when either value is zero.
    pub const fn new(qps: u32, burst: u32) -> Option<Rate> {
        match (NonZeroU32::new(qps), NonZeroU32::new(burst)) {
            (Some(qps), Some(burst)) => Some(Rate { qps, burst }),
            _ => None,
        }
    }
}

/// A token bucket (leaky-bucket's `RateLimiter`, chosen over governor because its waits run on
/// tokio's clock, so tests can use a paused clock) plus a pause the server can order with
/// Retry-After.
///
/// The bucket starts full (`burst` tokens, like client-go's limiter) and holds at most `burst`;
/// refills are spread evenly at exactly `qps` per second. So the tokens taken in any half-open
/// window `[t, t + d)` are at most `burst` (saved before `t`) plus the refills inside the window,
/// `qps * d` when `d` is a whole number of refill intervals: never more than `burst + qps` in
/// any one-second window.
#[derive(Debug)]
pub(super) struct TokenBucket {
    limiter: RateLimiter,
    paused_until: Mutex<Option<Instant>>,
}

impl TokenBucket {
    pub(super) fn new(rate: Rate) -> Self {
        let burst = rate.burst.get() as usize;
        let (refill, interval) = refill_schedule(rate);
        TokenBucket {
            limiter: RateLimiter::builder()
                .initial(burst)
                .max(burst)
                .refill(refill)
                .interval(interval)
                .fair(true)
                .build(),
            paused_until: Mutex::new(None),
        }
    }

    /// Waits for a pause to end and a token; returns how long that took. The caller must send its
    /// request right away: a token is the permission to send now.
    pub(super) async fn acquire(&self) -> Duration {
        let start = Instant::now();
        loop {
            if let Some(until) = self.paused_until() {
                tokio::time::sleep_until(until).await;
            }
            self.limiter.acquire_one().await;
            if self.paused_until().is_none() {
                return start.elapsed();
            }
            // The pause began while this request waited for its token: the token is dropped so
            // that nothing is sent before the pause ends.
        }
    }

    /// Waits for a pause (and any pause ordered meanwhile) to end; returns how long that took.
    pub(super) async fn sit_out_pause(&self) -> Duration {
        let start = Instant::now();
        while let Some(until) = self.paused_until() {
            tokio::time::sleep_until(until).await;
        }
        start.elapsed()
    }

    /// Sends nothing more for `pause` (a longer pause already ordered stays).
    pub(super) fn pause(&self, pause: Duration) {
        let until = Instant::now() + pause;
        let mut paused_until = self
            .paused_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *paused_until = Some(paused_until.map_or(until, |current| current.max(until)));
    }

    fn paused_until(&self) -> Option<Instant> {
        let paused_until = *self
            .paused_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        paused_until.filter(|until| *until > Instant::now())
    }
}

/// Tokens per refill and the refill interval (whole milliseconds, as leaky-bucket counts them)
/// that give exactly `qps` per second with the smallest refills; when even those would exceed
/// the burst, one token per `ceil(1000 / qps)` ms, a little under `qps` but never over it.
fn refill_schedule(rate: Rate) -> (usize, Duration) {
    let qps = rate.qps.get();
    let common = gcd(qps, 1000);
    let (refill, millis) = (qps / common, 1000 / common);
    if refill <= rate.burst.get() {
        (refill as usize, Duration::from_millis(u64::from(millis)))
    } else {
        (1, Duration::from_millis(u64::from(1000u32.div_ceil(qps))))
    }
}

// Euclid, hand-written: two lines are not worth a dependency.
fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(qps: u32, burst: u32) -> Rate {
        Rate::new(qps, burst).expect("non-zero rate")
    }

    #[test]
    fn refills_give_exactly_qps_with_the_smallest_steps() {
        let ms = Duration::from_millis;
        assert_eq!(refill_schedule(rate(20, 30)), (1, ms(50)));
        assert_eq!(refill_schedule(rate(30, 30)), (3, ms(100)));
        assert_eq!(refill_schedule(rate(200, 300)), (1, ms(5)));
        assert_eq!(refill_schedule(rate(7, 10)), (7, ms(1000)));
        assert_eq!(refill_schedule(rate(2500, 10)), (5, ms(2)));
    }

    #[test]
    fn refills_never_exceed_qps_when_the_burst_is_small() {
        let ms = Duration::from_millis;
        assert_eq!(refill_schedule(rate(7, 1)), (1, ms(143)));
        assert_eq!(refill_schedule(rate(2500, 1)), (1, ms(1)));
    }

    #[test]
    fn zero_is_no_rate() {
        assert_eq!(Rate::new(0, 30), None);
        assert_eq!(Rate::new(20, 0), None);
    }

    #[tokio::test(start_paused = true)]
    async fn starts_full_then_refills_at_qps() {
        let bucket = TokenBucket::new(rate(20, 30));
        let start = Instant::now();
        for _ in 0..30 {
            assert_eq!(bucket.acquire().await, Duration::ZERO);
        }
        for n in 1..=20 {
            bucket.acquire().await;
            assert_eq!(start.elapsed(), Duration::from_millis(50 * n));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_holds_tokens_back_until_it_ends() {
        let bucket = TokenBucket::new(rate(20, 30));
        let start = Instant::now();
        bucket.pause(Duration::from_secs(2));
        bucket.pause(Duration::from_secs(1));
        assert_eq!(bucket.acquire().await, Duration::from_secs(2));
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }
}
