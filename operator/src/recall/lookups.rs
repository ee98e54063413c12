//! Store lookups by compile key, remembered so that the registry is not asked the same question
//! on every reconcile (1,000 targets × 10 classes asked 10,000 times per pass, queue polls
//! included). What may be remembered, and for how long, is decided here, purely; the clock is
//! passed in. Touches nothing: the controller asks the store and records the answer.
//!
//! * A verified entry (a hit) is kept for good (bounded by `max_entries`, oldest first out): an
//!   entry stored under a key and signed does not change. It is dropped when a node reports the
//!   entry broken for the class that uses it (the artifact or manifest gone, corrupt or
//!   unverifiable: `HashMismatch`, `SignatureInvalid`, `StoreUnavailable`), so a registry that
//!   lost it gets a rebuild, and with the process (a new replica asks again).
//! * A miss (nothing, or an entry refused as corrupt or unsigned) is asked again once a compile
//!   Job of that key has finished since, or after `miss_recheck` at the latest.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use kiln_crds::{CompiledTarget, FailureReason};

use crate::plan::NodeView;
use crate::plan::{JobState, JobView, Stored};

/// Default for `--store-miss-recheck-seconds`.
pub const DEFAULT_MISS_RECHECK: Duration = Duration::from_secs(300);
/// Default for `--store-cache-entries`.
pub const DEFAULT_MAX_ENTRIES: usize = 65_536;

/// What was learnt of one key.
#[derive(Clone, Debug, PartialEq)]
enum Record {
    /// A verified entry.
    Hit(Box<Stored>),
    /// Nothing usable, as of `at`, with the key's Jobs that had finished by then.
    Miss {
        at: Instant,
        finished: BTreeSet<String>,
    },
}

/// What the cache answers for a key.
#[derive(Clone, Debug, PartialEq)]
pub enum Known {
    /// A verified entry, known for good.
    Hit(Box<Stored>),
    /// Nothing usable, and no reason to ask again yet.
    Miss,
}

/// The remembered lookups (behind one lock in the controller's context).
#[derive(Clone, Debug)]
pub struct LookupCache {
    records: HashMap<String, Record>,
    /// Keys in the order they were recorded, for eviction; may hold keys already gone.
    order: VecDeque<String>,
    max_entries: usize,
    miss_recheck: Duration,
}

impl LookupCache {
    /// A cache of at most `max_entries` keys whose misses are asked again after `miss_recheck`
    /// (zero: every time, as without a cache).
    pub fn new(max_entries: usize, miss_recheck: Duration) -> Self {
        Self {
            records: HashMap::new(),
            order: VecDeque::new(),
            max_entries: max_entries.max(1),
            miss_recheck,
        }
    }

    /// What is known of `key` now, or `None` when the store must be asked: never asked, a miss
    /// older than the re-check bound, or a miss older than a Job of the key that has finished
    /// since (`finished`: names of the key's finished Jobs the caller sees).
    pub fn get(&self, key: &str, finished: &BTreeSet<String>, now: Instant) -> Option<Known> {
        match self.records.get(key)? {
            Record::Hit(stored) => Some(Known::Hit(stored.clone())),
            Record::Miss { at, finished: seen } => {
                let expired = now.saturating_duration_since(*at) >= self.miss_recheck;
                let job_ended = !finished.is_subset(seen);
                (!expired && !job_ended).then_some(Known::Miss)
            }
        }
    }

    /// Records a verified entry.
    pub fn hit(&mut self, key: &str, stored: Stored) {
        self.record(key, Record::Hit(Box::new(stored)));
    }

    /// Records that `key` has no usable entry as of `now`, `finished` being the key's Jobs that
    /// had finished (kept with those recorded before, so another target's view adds to it).
    pub fn miss(&mut self, key: &str, finished: &BTreeSet<String>, now: Instant) {
        let mut finished = finished.clone();
        if let Some(Record::Miss { finished: seen, .. }) = self.records.get(key) {
            finished.extend(seen.iter().cloned());
        }
        self.record(key, Record::Miss { at: now, finished });
    }

    /// Forgets what is known of `key` (a node found its entry broken).
    pub fn forget(&mut self, key: &str) {
        self.records.remove(key);
    }

    /// Keys known.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether nothing is known.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn record(&mut self, key: &str, record: Record) {
        if self.records.insert(key.to_string(), record).is_none() {
            self.order.push_back(key.to_string());
        }
        while self.records.len() > self.max_entries {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.records.remove(&oldest);
        }
        // Keys forgotten or evicted leave stale names behind; keep the queue bounded too.
        if self.order.len() > 2 * self.max_entries {
            let records = &self.records;
            self.order.retain(|k| records.contains_key(k));
        }
    }
}

/// Per compile key, the names of the target's Jobs for it that have finished.
pub fn finished_jobs(jobs: &[JobView]) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for job in jobs {
        if !matches!(job.state, JobState::Active) {
            out.entry(job.compile_key.clone())
                .or_default()
                .insert(job.name.clone());
        }
    }
    out
}

/// Whether a node's failure says the stored entry itself is gone or bad (not the node).
fn store_broken(reason: Option<FailureReason>) -> bool {
    matches!(
        reason,
        Some(
            FailureReason::HashMismatch
                | FailureReason::SignatureInvalid
                | FailureReason::StoreUnavailable
        )
    )
}

/// The compile keys (of the target's class rows) whose entry a node reports broken.
pub fn broken_keys(target: &CompiledTarget, nodes: &[NodeView]) -> BTreeSet<String> {
    let classes: BTreeSet<&str> = nodes
        .iter()
        .flat_map(|n| &n.targets)
        .filter(|row| store_broken(row.reason))
        .map(|row| row.class.as_str())
        .collect();
    target
        .status
        .iter()
        .flat_map(|s| &s.classes)
        .filter(|c| classes.contains(c.class.as_str()))
        .filter_map(|c| c.compile_key.clone())
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn stored(d: &str) -> Stored {
        Stored {
            digest: d.into(),
            manifest_digest: format!("sha256:{d}"),
            placement: None,
            engine: None,
        }
    }

    fn names(n: &[&str]) -> BTreeSet<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_hit_is_kept_for_good_and_a_miss_until_its_bound() {
        let t0 = Instant::now();
        let mut c = LookupCache::new(10, Duration::from_secs(300));
        assert_eq!(c.get("k", &names(&[]), t0), None, "never asked");
        c.hit("k", stored("a"));
        let later = t0 + Duration::from_secs(10 * 365 * 86_400);
        assert_eq!(
            c.get("k", &names(&[]), later),
            Some(Known::Hit(Box::new(stored("a"))))
        );
        c.miss("m", &names(&[]), t0);
        assert_eq!(
            c.get("m", &names(&[]), t0 + Duration::from_secs(299)),
            Some(Known::Miss)
        );
        assert_eq!(c.get("m", &names(&[]), t0 + Duration::from_secs(300)), None);
    }

    #[test]
    fn a_miss_is_asked_again_once_a_job_of_its_key_finished() {
        let t0 = Instant::now();
        let mut c = LookupCache::new(10, Duration::from_secs(300));
        c.miss("m", &names(&["job-1"]), t0);
        assert_eq!(
            c.get("m", &names(&["job-1"]), t0),
            Some(Known::Miss),
            "already seen"
        );
        assert_eq!(
            c.get("m", &names(&["job-1", "job-2"]), t0),
            None,
            "job-2 finished since"
        );
        // Recorded again after asking: another target's finished Jobs add to the list.
        c.miss("m", &names(&["job-2"]), t0);
        assert_eq!(c.get("m", &names(&["job-1"]), t0), Some(Known::Miss));
        assert_eq!(c.get("m", &names(&["job-2"]), t0), Some(Known::Miss));
    }

    #[test]
    fn zero_recheck_asks_every_time_and_forget_drops_a_hit() {
        let t0 = Instant::now();
        let mut c = LookupCache::new(10, Duration::ZERO);
        c.miss("m", &names(&[]), t0);
        assert_eq!(c.get("m", &names(&[]), t0), None);
        c.hit("k", stored("a"));
        c.forget("k");
        assert_eq!(c.get("k", &names(&[]), t0), None);
    }

    #[test]
    fn the_cache_is_bounded_oldest_first() {
        let t0 = Instant::now();
        let mut c = LookupCache::new(3, Duration::from_secs(300));
        for k in ["a", "b", "c", "d"] {
            c.hit(k, stored(k));
        }
        assert_eq!(c.len(), 3);
        assert_eq!(c.get("a", &names(&[]), t0), None, "the oldest went");
        assert!(c.get("d", &names(&[]), t0).is_some());
        for i in 0..100 {
            c.hit(&format!("x{i}"), stored("x"));
            c.forget(&format!("x{i}"));
        }
        assert!(c.order.len() <= 6, "{}", c.order.len());
    }

    #[test]
    fn finished_jobs_and_broken_keys_come_from_jobs_and_node_rows() {
        let job = |name: &str, key: &str, state| JobView {
            name: name.into(),
            compile_key: key.into(),
            attempt: 1,
            state,
            finished_at: None,
            deleting: false,
        };
        let f = finished_jobs(&[
            job("j1", "k1", JobState::Active),
            job("j2", "k1", JobState::Succeeded),
            job(
                "j3",
                "k2",
                JobState::Failed {
                    reason: FailureReason::CompileFailed,
                    message: String::new(),
                },
            ),
        ]);
        assert_eq!(f.get("k1"), Some(&names(&["j2"])));
        assert_eq!(f.get("k2"), Some(&names(&["j3"])));

        let target: CompiledTarget = serde_saphyr::from_str(
            "apiVersion: kiln.dev/v1alpha1\nkind: CompiledTarget\nmetadata: {name: t, namespace: ns}\nspec: {modelRef: {name: m}, backend: {kind: tract}, warmup: {fixtureVersion: v1}, profiles: [{name: b, dims: {batch: 1}}]}\nstatus:\n  classes:\n  - {class: c1, nodes: 1, phase: Compiled, compileKey: k1}\n  - {class: c2, nodes: 1, phase: Compiled, compileKey: k2}\n",
        )
        .unwrap();
        let row = |class: &str, reason| kiln_crds::kiln_node::NodeTargetStatus {
            namespace: "ns".into(),
            name: "t".into(),
            class: class.into(),
            reason,
            ..Default::default()
        };
        let node = NodeView {
            name: "n".into(),
            labels: Default::default(),
            class_labels: Default::default(),
            reported: true,
            targets: vec![
                row("c1", Some(FailureReason::HashMismatch)),
                row("c2", Some(FailureReason::ParityExceeded)),
            ],
        };
        assert_eq!(broken_keys(&target, &[node]), names(&["k1"]));
    }
}
