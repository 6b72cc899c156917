//! Retry delays: exponential from a base, capped, with ±20% jitter. The
//! jitter is narrow enough that each delay is still longer than the one
//! before it (2 × 0.8 > 1.2) until the cap.

use std::time::Duration;

/// The delay before retry number `failures` (1 for the first retry);
/// `jitter` is a number in [0, 1).
pub fn delay(base: Duration, max: Duration, failures: u32, jitter: f64) -> Duration {
    let exp = 2f64.powi(failures.saturating_sub(1).min(30) as i32);
    let raw = (base.as_secs_f64() * exp).min(max.as_secs_f64());
    Duration::from_secs_f64(raw * (0.8 + 0.4 * jitter.clamp(0.0, 1.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_even_with_worst_case_jitter_and_respect_the_cap() {
        let (base, max) = (Duration::from_secs(1), Duration::from_secs(60));
        for n in 1..6 {
            let longest_now = delay(base, max, n, 0.999);
            let shortest_next = delay(base, max, n + 1, 0.0);
            assert!(shortest_next > longest_now, "retry {n}: {shortest_next:?} <= {longest_now:?}");
        }
        assert_eq!(delay(base, max, 1, 0.5), Duration::from_secs(1));
        assert_eq!(delay(base, max, 3, 0.5), Duration::from_secs(4));
        assert!(delay(base, max, 20, 1.0) <= Duration::from_secs(72));
        assert!(delay(base, max, 20, 0.0) >= Duration::from_secs(48));
    }
}
