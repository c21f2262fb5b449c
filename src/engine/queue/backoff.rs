//! Per-item exponential backoff for transient failures.

use std::time::Duration;

/// Delay before retrying an item that failed `n` times in a row: `base * 2^n`, capped at `cap`,
/// then shortened by a random fraction of at most `jitter`.
///
/// Like client-go's per-item limiter (5 ms doubling), but jittered so that the hundreds of items
/// that fail together during an API server hiccup do not all come back in the same millisecond.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Delay after the first failure.
    pub base: Duration,
    /// Upper bound of any delay.
    pub cap: Duration,
    /// Largest fraction (0.0 to 1.0) taken off a delay at random; 0.0 disables jitter.
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_millis(5),
            cap: Duration::from_secs(60),
            jitter: 0.5,
        }
    }
}

impl Backoff {
    /// The delay after `failures` earlier failures (0 for the first failure).
    pub(super) fn delay(&self, failures: u32, rng: &mut fastrand::Rng) -> Duration {
        let factor = 2u32.checked_pow(failures).unwrap_or(u32::MAX);
        let exponential = self.base.saturating_mul(factor).min(self.cap);
        let cut = self.jitter.clamp(0.0, 1.0) * rng.f64();
        exponential.mul_f64(1.0 - cut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_base_up_to_cap_without_jitter() {
        let backoff = Backoff {
            base: Duration::from_millis(5),
            cap: Duration::from_secs(1),
            jitter: 0.0,
        };
        let mut rng = fastrand::Rng::with_seed(1);
        let delays: Vec<_> = (0..10)
            .map(|n| backoff.delay(n, &mut rng).as_millis())
            .collect();
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        assert_eq!(backoff.delay(u32::MAX, &mut rng), Duration::from_secs(1));
    }

    #[test]
    fn jitter_stays_between_half_and_full_delay() {
        let backoff = Backoff::default();
        let mut rng = fastrand::Rng::with_seed(7);
        let delays: Vec<_> = (0..1000).map(|_| backoff.delay(3, &mut rng)).collect();
        let full = Duration::from_millis(40);
        assert!(delays.iter().all(|d| *d <= full && *d >= full / 2));
        assert!(
            delays.iter().any(|d| *d < full),
            "jitter never shortened a delay"
        );
    }
}
