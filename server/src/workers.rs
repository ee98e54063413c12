//! The threads engine runs happen on: one long-lived thread per worker, started with the server
//! and each warmed once before it is ready. Not tokio's blocking pool, whose threads end after
//! ten idle seconds: a request after a quiet spell would then run on a new thread, its stack
//! and the engine's per-thread scratch (tract's kernels keep theirs in thread-locals) touched
//! for the first time, which is the slow first request a new client sees.

use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Barrier, Mutex};

type Job = Box<dyn FnOnce() + Send>;

/// A fixed set of named threads taking jobs in arrival order.
pub struct Workers {
    jobs: Sender<Job>,
    count: usize,
}

impl Workers {
    /// `count` threads (at least one), named `kiln-serve-N`.
    pub fn start(count: usize) -> std::io::Result<Self> {
        let count = count.max(1);
        let (jobs, queue) = channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for n in 0..count {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("kiln-serve-{n}"))
                .spawn(move || take(&queue))?;
        }
        Ok(Workers { jobs, count })
    }

    /// Runs `job` on a worker thread; its result, or `None` when the job panicked or the
    /// workers are gone.
    pub async fn run<R: Send + 'static>(
        &self,
        job: impl FnOnce() -> R + Send + 'static,
    ) -> Option<R> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.jobs
            .send(Box::new(move || {
                let _ = answer.send(job());
            }))
            .ok()?;
        answered.await.ok()
    }

    /// Runs `job` once on every thread, all at once (each holds its thread until all have
    /// run), and returns the results. What a thread's first run costs is paid here, before
    /// the server is ready.
    pub fn on_each<R: Send + 'static>(
        &self,
        job: impl Fn() -> R + Send + Sync + 'static,
    ) -> Vec<R> {
        let job = Arc::new(job);
        let all = Arc::new(Barrier::new(self.count));
        let (answer, answers) = channel();
        for _ in 0..self.count {
            let (job, all, answer) = (job.clone(), all.clone(), answer.clone());
            let sent = self.jobs.send(Box::new(move || {
                let _ = answer.send(job());
                all.wait();
            }));
            if sent.is_err() {
                break;
            }
        }
        drop(answer);
        answers.iter().collect()
    }
}

/// A worker's life: take a job, run it, until the sender is gone. A job that panics takes only
/// its own answer with it.
fn take(queue: &Mutex<Receiver<Job>>) {
    loop {
        let job = match queue.lock() {
            Ok(q) => q.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_is_warmed_once_and_runs_go_to_the_same_threads_later() {
        let workers = Workers::start(3).unwrap();
        let mut warmed = workers.on_each(|| std::thread::current().name().map(String::from));
        warmed.sort();
        assert_eq!(
            warmed,
            ["kiln-serve-0", "kiln-serve-1", "kiln-serve-2"].map(|n| Some(n.to_string()))
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for _ in 0..10 {
            let name = rt.block_on(workers.run(|| std::thread::current().name().map(String::from)));
            assert!(warmed.contains(&name.unwrap()));
        }
        let panicked = rt.block_on(workers.run(|| -> u8 { panic!("a bad run") }));
        assert_eq!(panicked, None, "a panic is no answer");
        assert_eq!(
            rt.block_on(workers.run(|| 7)),
            Some(7),
            "and the worker lives on"
        );
    }
}
