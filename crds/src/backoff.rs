//! The one retry backoff of kiln: the operator's wait between compile attempts and the agent's
//! wait before it tries a failed artifact again. Pure arithmetic; no clock.

use std::time::Duration;

/// Most doublings: `base × 2^16` is far past any sensible `max`, and the shift cannot overflow.
const MAX_DOUBLINGS: u32 = 16;

/// The wait after the `attempt`-th failure in a row (from 1): `base`, doubling per failure, at
/// most `max`. Attempt 0 counts as 1. Saturating: never panics, whatever the inputs.
///
/// Doubling stops after 16 doublings (`base × 65536`); below `max` that bound only matters for
/// bases under `max / 65536`. A `max` below `base` caps the wait at `max`: a caller that wants
/// `base` to win (the agent's "at least `retry`") passes `max.max(base)`.
pub fn backoff(base: Duration, max: Duration, attempt: u32) -> Duration {
    let factor = 1u32 << attempt.saturating_sub(1).min(MAX_DOUBLINGS);
    base.saturating_mul(factor).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn doubles_from_base_to_max() {
        let (base, max) = (S(10), S(300));
        let waits: Vec<Duration> = (0..=7).map(|a| backoff(base, max, a)).collect();
        assert_eq!(
            waits,
            [S(10), S(10), S(20), S(40), S(80), S(160), S(300), S(300)]
        );
        assert_eq!(backoff(base, max, u32::MAX), max);
    }

    #[test]
    fn doubling_stops_after_sixteen_and_never_overflows() {
        let ms = Duration::from_millis(1);
        assert_eq!(backoff(ms, S(3600), 17), ms * 65536);
        assert_eq!(backoff(ms, S(3600), 40), ms * 65536);
        assert_eq!(backoff(Duration::MAX, Duration::MAX, 9), Duration::MAX);
    }

    #[test]
    fn serves_the_agents_rule_of_at_least_the_retry_interval() {
        // The agent: `retry`, doubling, at most ten minutes but never below `retry`.
        let agent = |retry: Duration, failures| backoff(retry, S(600).max(retry), failures);
        let r = S(60);
        assert_eq!(agent(r, 1), r);
        assert_eq!(agent(r, 2), r * 2);
        assert_eq!(agent(r, 4), r * 8);
        assert_eq!(agent(r, 30), S(600));
        assert_eq!(agent(S(5), 2), S(10));
        assert_eq!(agent(S(900), 3), S(900));
    }
}
