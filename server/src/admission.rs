//! Who runs, who waits and who is told to come back. The gate holds one permit per worker (an
//! engine instance, or a run slot of a shareable engine); at most `max_queue` requests wait for
//! one, in arrival order; past that a request is shed at once instead of queued without end. A
//! waiting request whose deadline passes leaves the queue unrun. Once draining, nothing new is
//! admitted; what was admitted runs. No engine, no HTTP: the server maps [`Shed`] to replies.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The admission state of one served model.
pub struct Gate {
    permits: Arc<Semaphore>,
    workers: AtomicUsize,
    max_queue: AtomicUsize,
    waiting: Arc<AtomicUsize>,
    draining: AtomicBool,
}

/// Why a request was not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shed {
    /// `max_queue` requests were already waiting.
    Full,
    /// Its deadline passed while it waited.
    Expired,
    /// The server is shutting down.
    Draining,
}

impl Shed {
    /// The reason as metrics and logs name it.
    pub fn reason(self) -> &'static str {
        match self {
            Shed::Full => "queue_full",
            Shed::Expired => "deadline",
            Shed::Draining => "draining",
        }
    }
}

/// A worker held until dropped: move it into the run so that a client who hangs up does not
/// free a worker its run still uses.
pub struct Admitted {
    _permit: OwnedSemaphorePermit,
    /// How long the request waited for its worker.
    pub waited: Duration,
}

/// Takes a waiting place; gives it back when the wait ends in any way (admitted, expired, or the
/// client gone and its future dropped).
struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

impl Gate {
    /// A closed gate: no worker, no place in line, until [`Gate::open`] once the model is loaded.
    pub fn new() -> Self {
        Gate {
            permits: Arc::new(Semaphore::new(0)),
            workers: AtomicUsize::new(0),
            max_queue: AtomicUsize::new(0),
            waiting: Arc::new(AtomicUsize::new(0)),
            draining: AtomicBool::new(false),
        }
    }

    /// Lets `workers` requests run at once and `max_queue` wait.
    pub fn open(&self, workers: usize, max_queue: usize) {
        self.max_queue.store(max_queue, Ordering::SeqCst);
        self.workers.fetch_add(workers, Ordering::SeqCst);
        self.permits.add_permits(workers);
    }

    /// A worker for a request that must start by `deadline`, waiting in line for it when all
    /// are busy; or why not.
    pub async fn admit(&self, deadline: Option<Instant>) -> Result<Admitted, Shed> {
        let arrived = Instant::now();
        if self.draining() {
            return Err(Shed::Draining);
        }
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return Ok(Admitted {
                _permit: permit,
                waited: Duration::ZERO,
            });
        }
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.max_queue() {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(Shed::Full);
        }
        let place = Place(self.waiting.clone());
        let acquire = self.permits.clone().acquire_owned();
        let permit = match deadline {
            Some(at) => tokio::time::timeout_at(at.into(), acquire)
                .await
                .map_err(|_| Shed::Expired)?,
            None => acquire.await,
        };
        drop(place);
        // The semaphore is never closed.
        let permit = permit.map_err(|_| Shed::Draining)?;
        if deadline.is_some_and(|at| Instant::now() >= at) {
            return Err(Shed::Expired);
        }
        Ok(Admitted {
            _permit: permit,
            waited: arrived.elapsed(),
        })
    }

    /// Whether a request arriving now would be shed for a full line: every worker busy and
    /// `max_queue` waiting. A snapshot, for refusing before the body is buffered; [`Gate::admit`]
    /// decides.
    pub fn full(&self) -> bool {
        self.permits.available_permits() == 0 && self.waiting() >= self.max_queue()
    }

    /// From now on nothing new is admitted.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether [`Gate::drain`] was called.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Requests waiting for a worker.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Requests running.
    pub fn running(&self) -> usize {
        self.workers
            .load(Ordering::SeqCst)
            .saturating_sub(self.permits.available_permits())
    }

    /// Workers, once open.
    pub fn workers(&self) -> usize {
        self.workers.load(Ordering::SeqCst)
    }

    /// The most requests that wait.
    pub fn max_queue(&self) -> usize {
        self.max_queue.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn past_the_queue_a_request_is_shed_and_a_freed_worker_takes_the_first_in_line() {
        let gate = Arc::new(Gate::new());
        gate.open(1, 2);
        assert!(!gate.full(), "a free worker");
        let running = gate.admit(None).await.unwrap();
        assert_eq!(gate.running(), 1);
        assert!(!gate.full(), "places in line");
        let (g1, g2) = (gate.clone(), gate.clone());
        let first = tokio::spawn(async move { g1.admit(None).await.map(|a| a.waited) });
        tokio::task::yield_now().await;
        let second = tokio::spawn(async move { g2.admit(None).await.map(|a| a.waited) });
        while gate.waiting() < 2 {
            tokio::task::yield_now().await;
        }
        assert!(gate.full());
        assert_eq!(gate.admit(None).await.err(), Some(Shed::Full));
        assert_eq!(gate.waiting(), 2, "a shed request takes no place");
        drop(running);
        let waited = first.await.unwrap().unwrap();
        assert!(waited > Duration::ZERO);
        assert!(!second.is_finished() || gate.running() <= 1);
        second.await.unwrap().unwrap();
        assert_eq!((gate.waiting(), gate.running()), (0, 0));
    }

    #[tokio::test]
    async fn a_deadline_passed_in_the_queue_leaves_unrun() {
        let gate = Gate::new();
        gate.open(1, 4);
        let _busy = gate.admit(None).await.unwrap();
        let at = Instant::now() + Duration::from_millis(30);
        assert_eq!(gate.admit(Some(at)).await.err(), Some(Shed::Expired));
        assert!(Instant::now() >= at);
        assert_eq!(gate.waiting(), 0, "the expired request left the queue");
    }

    #[tokio::test]
    async fn a_draining_gate_admits_nothing_new_but_lets_the_queue_run() {
        let gate = Arc::new(Gate::new());
        gate.open(1, 4);
        let busy = gate.admit(None).await.unwrap();
        let g = gate.clone();
        let queued = tokio::spawn(async move { g.admit(None).await.is_ok() });
        while gate.waiting() < 1 {
            tokio::task::yield_now().await;
        }
        gate.drain();
        assert_eq!(gate.admit(None).await.err(), Some(Shed::Draining));
        drop(busy);
        assert!(
            queued.await.unwrap(),
            "admitted before the drain, so it runs"
        );
    }

    #[tokio::test]
    async fn a_client_that_hangs_up_gives_its_place_back() {
        let gate = Gate::new();
        gate.open(1, 1);
        let _busy = gate.admit(None).await.unwrap();
        let gone = tokio::time::timeout(Duration::from_millis(10), gate.admit(None)).await;
        assert!(gone.is_err());
        assert_eq!(gate.waiting(), 0);
        let at = Instant::now() + Duration::from_millis(5);
        assert_eq!(
            gate.admit(Some(at)).await.err(),
            Some(Shed::Expired),
            "its place is free again"
        );
    }
}
