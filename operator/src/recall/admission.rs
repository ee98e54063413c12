//! Compile admission: keeps the compile Jobs of all targets within `--max-concurrent-compiles`.
//! [`crate::plan::admit`] (pure, part of the plan) decides how many of one target's compile
//! candidates get a slot; the slot ledger ([`TakenSlots`]) remembers the slots this replica took for Jobs the Job cache may not show
//! yet, so that while the watch lags neither the target itself (which would post its Jobs
//! again) nor other targets (which would take the same slots) lose sight of them.
//!
//! May read the Job cache, through [`JobCache`]. May not write anything to the API or read a
//! clock (callers pass `now`). The decisions take the ledger as an argument: the controller holds
//! its mutex ([`lock`]) from counting the running compiles to taking the slots, and that is what
//! makes concurrent reconciles safe; only [`PendingSlots`] takes it itself, to give slots back.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::plan::{JobState, JobView, NewJob};

/// How long a slot taken for a Job counts as running while the cache does not show the Job.
pub const SLOT_MEMO: Duration = Duration::from_secs(60);

/// The slot ledger: Job → the slot this replica took for it.
pub type TakenSlots = BTreeMap<JobRef, Taken>;

/// A Job by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct JobRef {
    /// Namespace (the target's).
    pub namespace: String,
    /// Job name.
    pub name: String,
}

/// A compile slot taken for a Job: whose it is, what it builds, when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taken {
    /// uid of the target the Job compiles for.
    owner: String,
    /// Compile key the Job builds.
    compile_key: String,
    /// Attempt number of the Job.
    attempt: u32,
    /// When the slot was taken.
    at: Instant,
}

impl Taken {
    fn fresh(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.at) < SLOT_MEMO
    }
}

/// What admission reads from the Job cache (only the operator's own compile Jobs are in it).
pub trait JobCache {
    /// Whether the cache shows the Job.
    fn shows(&self, job: &JobRef) -> bool;
    /// Compile Jobs in the cache still running (not finished, not being deleted) that target
    /// `uid` does not own.
    fn running_not_owned_by(&self, uid: &str) -> usize;
}

impl JobCache for Store<Job> {
    fn shows(&self, job: &JobRef) -> bool {
        self.get(&ObjectRef::new(&job.name).within(&job.namespace))
            .is_some()
    }

    fn running_not_owned_by(&self, uid: &str) -> usize {
        self.state()
            .iter()
            .filter(|j| !j.owner_references().iter().any(|o| o.uid == uid))
            .filter(|j| {
                j.metadata.deletion_timestamp.is_none() && crate::job::observe::outcome(j).is_none()
            })
            .count()
    }
}

/// The ledger, even if a panic elsewhere left its mutex poisoned (the map stays consistent:
/// every change to it is a single insert, remove or retain).
pub fn lock(slots: &Mutex<TakenSlots>) -> MutexGuard<'_, TakenSlots> {
    slots.lock().unwrap_or_else(PoisonError::into_inner)
}

/// This target's Jobs created moments ago that the cache does not show yet: running, not
/// missing (under load the watch lags, and each reconcile would post them again).
pub fn created_not_cached(
    slots: &TakenSlots,
    namespace: &str,
    uid: &str,
    cache: &impl JobCache,
    now: Instant,
) -> Vec<JobView> {
    slots
        .iter()
        .filter(|(job, t)| {
            job.namespace == namespace && t.owner == uid && t.fresh(now) && !cache.shows(job)
        })
        .map(|(job, t)| JobView {
            name: job.name.clone(),
            compile_key: t.compile_key.clone(),
            attempt: t.attempt,
            state: JobState::Active,
            finished_at: None,
            deleting: false,
        })
        .collect()
}

/// Compile Jobs of other targets still running: those in the cache, and the slots taken for
/// Jobs the cache does not show yet. Forgets the slots of Jobs the cache shows now (from here
/// on they count from the cache) and of those it surely would by now.
pub fn running_elsewhere(
    slots: &mut TakenSlots,
    uid: &str,
    cache: &impl JobCache,
    now: Instant,
) -> usize {
    slots.retain(|job, t| t.fresh(now) && !cache.shows(job));
    cache.running_not_owned_by(uid) + slots.values().filter(|t| t.owner != uid).count()
}

/// Takes a slot for each Job target `uid` is about to create in `namespace`.
pub fn take(slots: &mut TakenSlots, namespace: &str, uid: &str, jobs: &[NewJob], now: Instant) {
    for new in jobs {
        let job = JobRef {
            namespace: namespace.to_string(),
            name: new.name.clone(),
        };
        let slot = Taken {
            owner: uid.to_string(),
            compile_key: new.compile_key.clone(),
            attempt: new.attempt,
            at: now,
        };
        slots.insert(job, slot);
    }
}

/// Slots to give back however applying a plan ends: those taken for Jobs that were not
/// created, and those of Jobs that were deleted. Given back on drop.
pub struct PendingSlots<'a> {
    slots: &'a Mutex<TakenSlots>,
    namespace: &'a str,
    jobs: Vec<String>,
}

impl<'a> PendingSlots<'a> {
    /// Slots of the Jobs about to be created, given back unless [`Self::created`] keeps them.
    pub fn new(slots: &'a Mutex<TakenSlots>, namespace: &'a str, creating: &[NewJob]) -> Self {
        Self {
            slots,
            namespace,
            jobs: creating.iter().map(|j| j.name.clone()).collect(),
        }
    }

    /// The Job exists: its slot stays taken until the cache shows it.
    pub fn created(&mut self, job: &str) {
        self.jobs.retain(|name| name != job);
    }

    /// The Job is deleted: it holds no slot.
    pub fn deleted(&mut self, job: &str) {
        self.jobs.push(job.to_string());
    }
}

impl Drop for PendingSlots<'_> {
    fn drop(&mut self) {
        if self.jobs.is_empty() {
            return;
        }
        let mut slots = lock(self.slots);
        for name in &self.jobs {
            slots.remove(&JobRef {
                namespace: self.namespace.to_string(),
                name: name.clone(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::admit;

    /// A Job cache as a list: (Job, owner uid, running).
    #[derive(Default)]
    struct Cache(Vec<(JobRef, String, bool)>);

    impl Cache {
        fn add(&mut self, name: &str, owner: &str, running: bool) {
            self.0.push((job(name), owner.to_string(), running));
        }
    }

    impl JobCache for Cache {
        fn shows(&self, job: &JobRef) -> bool {
            self.0.iter().any(|(j, _, _)| j == job)
        }
        fn running_not_owned_by(&self, uid: &str) -> usize {
            self.0.iter().filter(|(_, o, r)| *r && o != uid).count()
        }
    }

    fn job(name: &str) -> JobRef {
        JobRef {
            namespace: "ml".into(),
            name: name.into(),
        }
    }

    fn new_job(name: &str) -> NewJob {
        NewJob {
            name: name.into(),
            class: "c".into(),
            facts: Default::default(),
            compile_key: format!("key-of-{name}"),
            attempt: 1,
            node_selector: crate::plan::NodeLabel {
                key: "kiln.dev/class".into(),
                value: "c".into(),
            },
            runner: Default::default(),
        }
    }

    #[test]
    fn two_targets_racing_for_the_last_free_slot_get_exactly_the_limit() {
        let mut cache = Cache::default();
        for i in 0..3 {
            cache.add(&format!("other-{i}"), "other", true);
        }
        let now = Instant::now();
        for _ in 0..50 {
            let slots = Mutex::new(TakenSlots::new());
            let barrier = std::sync::Barrier::new(2);
            let admitted: usize = std::thread::scope(|s| {
                let racers: Vec<_> = ["a", "b"]
                    .into_iter()
                    .map(|uid| {
                        let (slots, barrier, cache) = (&slots, &barrier, &cache);
                        s.spawn(move || {
                            barrier.wait();
                            // What the controller does under the lock.
                            let mut taken = lock(slots);
                            let elsewhere = running_elsewhere(&mut taken, uid, cache, now);
                            let a = admit(4, elsewhere, 1);
                            let jobs: Vec<NewJob> = (0..a.admitted)
                                .map(|_| new_job(&format!("{uid}-1")))
                                .collect();
                            take(&mut taken, "ml", uid, &jobs, now);
                            a.admitted
                        })
                    })
                    .collect();
                racers.into_iter().map(|r| r.join().expect("racer")).sum()
            });
            assert_eq!(admitted, 1, "3 running + 1 = the limit of 4");
            assert_eq!(lock(&slots).len(), 1);
        }
    }

    #[test]
    fn a_created_job_counts_until_the_cache_shows_it_then_from_the_cache_then_is_forgotten() {
        let t0 = Instant::now();
        let mut slots = TakenSlots::new();
        let mut cache = Cache::default();
        take(&mut slots, "ml", "a", &[new_job("a-1")], t0);
        // The cache lags: target a sees its Job as running, target b counts its slot.
        let own = created_not_cached(&slots, "ml", "a", &cache, t0);
        assert_eq!(
            own.iter()
                .map(|j| (j.name.as_str(), j.attempt, &j.state))
                .collect::<Vec<_>>(),
            [("a-1", 1, &JobState::Active)]
        );
        assert_eq!(own[0].compile_key, "key-of-a-1");
        assert!(created_not_cached(&slots, "other-ns", "a", &cache, t0).is_empty());
        assert!(created_not_cached(&slots, "ml", "b", &cache, t0).is_empty());
        assert_eq!(running_elsewhere(&mut slots, "b", &cache, t0), 1);
        assert_eq!(
            running_elsewhere(&mut slots, "a", &cache, t0),
            0,
            "not elsewhere"
        );
        // The cache shows it: the slot leaves the ledger and the Job counts once, from the cache.
        cache.add("a-1", "a", true);
        let t1 = t0 + Duration::from_secs(5);
        assert!(created_not_cached(&slots, "ml", "a", &cache, t1).is_empty());
        assert_eq!(running_elsewhere(&mut slots, "b", &cache, t1), 1);
        assert!(slots.is_empty());
        // A slot whose Job the cache never shows is forgotten after the memo window.
        take(&mut slots, "ml", "a", &[new_job("a-2")], t1);
        let late = t1 + SLOT_MEMO;
        assert!(created_not_cached(&slots, "ml", "a", &cache, late).is_empty());
        assert_eq!(running_elsewhere(&mut slots, "b", &cache, late), 1);
        assert!(slots.is_empty());
    }

    #[test]
    fn failed_creates_and_deleted_jobs_give_their_slots_back() {
        let slots = Mutex::new(TakenSlots::new());
        let now = Instant::now();
        let jobs = [new_job("a-1"), new_job("a-2"), new_job("a-3")];
        take(&mut lock(&slots), "ml", "a", &jobs, now);
        take(&mut lock(&slots), "ml", "a", &[new_job("old-1")], now);
        {
            let mut pending = PendingSlots::new(&slots, "ml", &jobs);
            pending.deleted("old-1");
            pending.created("a-1");
            // a-2's create failed, a-3 was never tried (an earlier error ended apply).
        }
        let left: Vec<String> = lock(&slots).keys().map(|j| j.name.clone()).collect();
        assert_eq!(left, ["a-1"]);
    }

    #[test]
    fn a_new_leader_with_an_empty_ledger_counts_from_the_cache_only() {
        let mut cache = Cache::default();
        cache.add("b-1", "b", true);
        cache.add("b-2", "b", false);
        cache.add("a-1", "a", true);
        let mut slots = TakenSlots::new();
        let now = Instant::now();
        assert_eq!(running_elsewhere(&mut slots, "a", &cache, now), 1);
        assert_eq!(running_elsewhere(&mut slots, "c", &cache, now), 2);
        assert!(created_not_cached(&slots, "ml", "a", &cache, now).is_empty());
    }
}
