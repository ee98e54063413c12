//! How often one target's status may be written: at most once per `--status-write-interval-ms`
//! (default 1 s). A rollout across 1,000 nodes changes a target's ready-node counts up to a
//! thousand times; each change written at once was a status write (and its watch event to every
//! watcher) per node report. A change that comes sooner than the interval after this replica's
//! last write of that target waits for the rest of it, and whatever changed meanwhile goes out in
//! that one write, so the target's status lags its nodes by at most the interval. A first write
//! (a new target, a restarted operator), a write that goes with a Job created or deleted, and a
//! write that observes a new generation of the spec are never held: a Job is news of its own
//! (its Event is tied to the status that names the Job), and a user who changed the spec reads
//! the status that answers it at once (kstatus counts a lagging `observedGeneration` as InProgress).
//! The decision is pure ([`wait`]); [`Pacer`] keeps the last write per target.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Whether a status write is news that is never held: it goes with Jobs created or deleted
/// (`jobs_changed`), or it observes a generation of the spec the old status had not.
pub fn is_news(
    jobs_changed: bool,
    old_generation: Option<i64>,
    new_generation: Option<i64>,
) -> bool {
    jobs_changed || old_generation != new_generation
}

/// How long a status write must wait, if at all: `None` to write now. `last` is when this
/// replica last wrote the target's status; `news` whether the write is never held ([`is_news`]).
pub fn wait(
    last: Option<Instant>,
    now: Instant,
    interval: Duration,
    news: bool,
) -> Option<Duration> {
    if news {
        return None;
    }
    let due = last?.checked_add(interval)?;
    due.checked_duration_since(now).filter(|d| !d.is_zero())
}

/// When this replica last wrote each target's status (by uid), and the interval.
pub struct Pacer {
    /// The shortest time between two status writes of one target (zero: no pacing).
    interval: Duration,
    /// Target uid → when its status was last written.
    last: Mutex<HashMap<String, Instant>>,
}

impl Pacer {
    /// A pacer with no writes recorded.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: Mutex::new(HashMap::new()),
        }
    }

    /// How long the status write of target `uid` must wait ([`wait`]).
    pub fn wait(&self, uid: &str, now: Instant, news: bool) -> Option<Duration> {
        let last = self.last.lock().ok()?.get(uid).copied();
        wait(last, now, self.interval, news)
    }

    /// Records a status write of target `uid` at `now`.
    pub fn wrote(&self, uid: &str, now: Instant) {
        if self.interval.is_zero() {
            return;
        }
        if let Ok(mut last) = self.last.lock() {
            last.insert(uid.to_string(), now);
        }
    }

    /// Forgets writes that no longer hold anything back (older than the interval at `now`).
    pub fn forget_old(&self, now: Instant) {
        if let Ok(mut last) = self.last.lock() {
            last.retain(|_, at| now.saturating_duration_since(*at) < self.interval);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_waits_for_the_rest_of_the_interval_after_the_last_one() {
        let t0 = Instant::now();
        let second = Duration::from_secs(1);
        let ms = Duration::from_millis;
        // Nothing written yet (a new target, a restarted operator): at once.
        assert_eq!(wait(None, t0, second, false), None);
        // 300 ms after the last write: 700 ms more.
        assert_eq!(wait(Some(t0), t0 + ms(300), second, false), Some(ms(700)));
        // At or past the interval: at once.
        assert_eq!(wait(Some(t0), t0 + second, second, false), None);
        assert_eq!(wait(Some(t0), t0 + ms(1500), second, false), None);
        // With a Job created or deleted: at once.
        assert_eq!(wait(Some(t0), t0 + ms(1), second, true), None);
        // No pacing.
        assert_eq!(wait(Some(t0), t0, Duration::ZERO, false), None);
    }

    #[test]
    fn jobs_and_a_new_generation_are_news_node_reports_are_not() {
        assert!(is_news(true, Some(3), Some(3)));
        assert!(is_news(false, Some(3), Some(4)));
        assert!(is_news(false, None, Some(1)));
        assert!(!is_news(false, Some(4), Some(4)));
    }

    #[test]
    fn a_burst_of_changes_is_at_most_one_write_per_interval() {
        // A change every 10 ms for 5 s, written whenever the pacer allows: one write at once,
        // then at most one per interval, and the last change goes out within the interval.
        let pacer = Pacer::new(Duration::from_secs(1));
        let t0 = Instant::now();
        let mut writes = Vec::new();
        for step in 0..=500u64 {
            let now = t0 + Duration::from_millis(step * 10);
            if pacer.wait("u", now, false).is_none() {
                pacer.wrote("u", now);
                writes.push(now);
            }
        }
        assert_eq!(writes.len(), 6, "{writes:?}");
        for pair in writes.windows(2) {
            assert!(pair[1] - pair[0] >= Duration::from_secs(1));
        }
        // What was held at the end is written when its requeue comes, at most an interval later.
        let last = *writes.last().expect("a write");
        let end = t0 + Duration::from_millis(5000);
        let due = pacer.wait("u", end, false).unwrap_or_default();
        assert!(end + due - last <= Duration::from_secs(1));
        // Another target is not held by this one's writes.
        assert_eq!(pacer.wait("other", end, false), None);
        // Old writes are forgotten; recent ones stay.
        pacer.forget_old(end + Duration::from_secs(2));
        assert_eq!(pacer.wait("u", end, false), None);
    }
}
