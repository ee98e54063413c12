//! Dynamic batching (`--max-batch`, `--batch-delay-us`): single-sample requests that arrive
//! within the delay of each other run as one engine run, when the artifact has a profile for
//! that many rows ([`sizes`], pure) and a batched run answered each row exactly as the row
//! alone did at load ([`Batcher::start`]). The stacking and splitting along the first axis are
//! pure ([`stack`], [`split`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kiln_engines::backend::Shapes;
use kiln_engines::backend::tensor::HostTensor;
use tokio::sync::{mpsc, oneshot};

use crate::model::{Refusal, Served};

/// Named tensors.
pub type Tensors = BTreeMap<String, HostTensor>;

/// A batch's answer to one of its requests, the engine's time for the whole batch, and
/// whether this request is the batch's first (so each engine run is counted once).
pub type Answer = (Result<Tensors, Refusal>, Duration, bool);

/// The row counts single-sample requests can be stacked into: 1, and each `b` up to `max` for
/// which a profile takes every input as `[b, rest…]` where a profile takes it as `[1, rest…]`.
/// Ascending. Pure.
pub fn sizes(profiles: &[(String, Shapes)], max: usize) -> Vec<usize> {
    let rest = |shapes: &Shapes, b: usize| -> Option<BTreeMap<String, Vec<usize>>> {
        shapes
            .iter()
            .map(|(n, s)| (s.first() == Some(&b)).then(|| (n.clone(), s[1..].to_vec())))
            .collect()
    };
    let Some(single) = row_profile(profiles).and_then(|s| rest(&s, 1)) else {
        return Vec::new();
    };
    let mut out: Vec<usize> = profiles
        .iter()
        .filter_map(|(_, s)| {
            let b = *s.values().next()?.first()?;
            (b <= max && rest(s, b).as_ref() == Some(&single)).then_some(b)
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The first profile that takes one row in every input. Pure.
pub fn row_profile(profiles: &[(String, Shapes)]) -> Option<Shapes> {
    profiles
        .iter()
        .find(|(_, s)| !s.is_empty() && s.values().all(|d| d.first() == Some(&1)))
        .map(|(_, s)| s.clone())
}

/// `n` requests cut into runs of the allowed `sizes` (ascending, starting at 1), largest
/// first. Pure.
pub fn chunks(mut n: usize, sizes: &[usize]) -> Vec<usize> {
    let mut out = Vec::new();
    while n > 0 {
        let k = sizes.iter().rev().find(|&&b| b <= n).copied().unwrap_or(1);
        out.push(k);
        n -= k;
    }
    out
}

/// The requests' inputs stacked along the first axis, in order. Pure.
pub fn stack(requests: &[&Tensors]) -> Result<Tensors, String> {
    let first = requests.first().ok_or("no request to stack")?;
    let mut out = Tensors::new();
    for (name, t) in first.iter() {
        let mut data = Vec::with_capacity(t.data.len() * requests.len());
        for r in requests {
            let u = r.get(name).ok_or(format!("input {name:?} missing"))?;
            if u.dtype != t.dtype || u.shape != t.shape {
                return Err(format!("input {name:?} differs between stacked requests"));
            }
            data.extend_from_slice(&u.data);
        }
        let mut shape = t.shape.clone();
        *shape
            .first_mut()
            .ok_or(format!("input {name:?} has no axis"))? *= requests.len();
        out.insert(
            name.clone(),
            HostTensor {
                dtype: t.dtype,
                shape,
                data,
            },
        );
    }
    Ok(out)
}

/// A batch's outputs split into its `k` rows' answers. Every output must lead with `k` rows.
/// Pure.
pub fn split(outputs: &Tensors, k: usize) -> Result<Vec<Tensors>, String> {
    let mut out = vec![Tensors::new(); k];
    for (name, t) in outputs {
        if t.shape.first() != Some(&k) || t.data.len() % k != 0 {
            return Err(format!(
                "output {name:?} of a batch of {k} has shape {:?}: not one row per request",
                t.shape
            ));
        }
        let row = t.data.len() / k;
        let mut shape = t.shape.clone();
        shape[0] = 1;
        for (i, part) in out.iter_mut().enumerate() {
            part.insert(
                name.clone(),
                HostTensor {
                    dtype: t.dtype,
                    shape: shape.clone(),
                    data: t.data[i * row..(i + 1) * row].to_vec(),
                },
            );
        }
    }
    Ok(out)
}

/// A request waiting for its batch.
struct Pending {
    inputs: Tensors,
    answer: oneshot::Sender<Answer>,
}

/// Gathers single-sample requests into batches and runs them on the server's workers.
pub struct Batcher {
    queue: mpsc::UnboundedSender<Pending>,
    /// The row counts batches are made of.
    pub sizes: Vec<usize>,
    /// The one-row profile's shapes: the requests batched.
    row: Shapes,
}

impl Batcher {
    /// A batcher for `served` gathering up to `max` requests within `delay`, with the sizes
    /// whose batched run matched each row alone on `sample` (checked here, on the engine);
    /// `None` when no size above 1 is left. Must run inside the tokio runtime.
    pub fn start(
        served: Arc<Served>,
        max: usize,
        delay: Duration,
        sample: &Tensors,
    ) -> Option<Self> {
        let profiles = served.pool.first().profiles();
        let row = row_profile(&profiles)?;
        if !fits(&row, sample) {
            tracing::warn!(
                "the fixture's first sample is not one row: batching cannot be checked, so it is off"
            );
            return None;
        }
        let alone = served.infer(sample, None).ok()?;
        let mut sizes = sizes(&profiles, max);
        sizes.retain(|&b| b == 1 || same_as_alone(&served, sample, &alone, b));
        if sizes.len() < 2 {
            return None;
        }
        let (queue, waiting) = mpsc::unbounded_channel();
        tokio::spawn(gather(served, waiting, max, delay, sizes.clone()));
        Some(Batcher { queue, sizes, row })
    }

    /// Whether a request with `inputs` (already checked against the model) goes into a batch:
    /// exactly the one-row profile's shapes.
    pub fn takes(&self, inputs: &Tensors) -> bool {
        fits(&self.row, inputs)
    }

    /// Runs `inputs` (one row) in the next batch.
    pub async fn run(&self, inputs: Tensors) -> Option<Answer> {
        let (answer, answered) = oneshot::channel();
        self.queue.send(Pending { inputs, answer }).ok()?;
        answered.await.ok()
    }
}

/// Whether `inputs` have exactly the shapes of `row`. Pure.
fn fits(row: &Shapes, inputs: &Tensors) -> bool {
    inputs.len() == row.len() && inputs.iter().all(|(n, t)| row.get(n) == Some(&t.shape))
}

/// Whether `b` stacked copies of `sample` answer each row byte for byte as `sample` alone did
/// (`alone`).
fn same_as_alone(served: &Served, sample: &Tensors, alone: &Tensors, b: usize) -> bool {
    let batched = stack(&vec![sample; b])
        .ok()
        .and_then(|s| served.infer(&s, None).ok())
        .and_then(|o| split(&o, b).ok());
    let same = batched.is_some_and(|rows| rows.iter().all(|r| r == alone));
    if !same {
        tracing::warn!(
            rows = b,
            "a batch of this size does not answer each row as it alone: not batched"
        );
    }
    same
}

/// The batcher's loop: the first request waits at most `delay` for company, up to `max`; the
/// group runs in chunks of the allowed sizes, each on a worker.
async fn gather(
    served: Arc<Served>,
    mut waiting: mpsc::UnboundedReceiver<Pending>,
    max: usize,
    delay: Duration,
    sizes: Vec<usize>,
) {
    while let Some(first) = waiting.recv().await {
        let mut group = vec![first];
        let until = tokio::time::Instant::now() + delay;
        while group.len() < max {
            match tokio::time::timeout_at(until, waiting.recv()).await {
                Ok(Some(p)) => group.push(p),
                _ => break,
            }
        }
        for k in chunks(group.len(), &sizes) {
            let part: Vec<Pending> = group.drain(..k).collect();
            tokio::spawn(run(served.clone(), part));
        }
    }
}

/// One batch on a worker; each request gets its row, or the batch's refusal.
async fn run(served: Arc<Served>, part: Vec<Pending>) {
    let (inputs, answers): (Vec<Tensors>, Vec<oneshot::Sender<Answer>>) =
        part.into_iter().map(|p| (p.inputs, p.answer)).unzip();
    let k = inputs.len();
    let job = served.clone();
    let ran = served
        .workers
        .run(move || {
            let started = std::time::Instant::now();
            let refs: Vec<&Tensors> = inputs.iter().collect();
            let outputs = stack(&refs)
                .map_err(Refusal::Engine)
                .and_then(|s| job.infer(&s, None))
                .and_then(|o| split(&o, k).map_err(Refusal::Engine));
            (outputs, started.elapsed())
        })
        .await;
    let (rows, took) = match ran {
        Some((Ok(rows), took)) => (rows.into_iter().map(Ok).collect::<Vec<_>>(), took),
        Some((Err(e), took)) => ((0..k).map(|_| Err(e.clone())).collect(), took),
        None => (
            (0..k)
                .map(|_| Err(Refusal::Engine("the run panicked".into())))
                .collect(),
            Duration::ZERO,
        ),
    };
    for (i, (answer, row)) in answers.into_iter().zip(rows).enumerate() {
        let _ = answer.send((row, took, i == 0));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn t(shape: &[usize], fill: u8) -> HostTensor {
        HostTensor {
            dtype: safetensors::Dtype::U8,
            shape: shape.to_vec(),
            data: vec![fill; shape.iter().product()],
        }
    }

    fn profile(b: usize, width: usize) -> (String, Shapes) {
        (
            format!("b{b}"),
            Shapes::from([("x".to_string(), vec![b, width])]),
        )
    }

    #[test]
    fn sizes_are_the_profiles_that_differ_from_one_row_only_in_rows() {
        let profiles = [
            profile(1, 16),
            profile(4, 16),
            profile(8, 16),
            profile(2, 32),
        ];
        assert_eq!(sizes(&profiles, 8), [1, 4, 8]);
        assert_eq!(sizes(&profiles, 4), [1, 4]);
        assert!(sizes(&[profile(4, 16)], 8).is_empty(), "no one-row profile");
        assert_eq!(chunks(7, &[1, 4]), [4, 1, 1, 1]);
        assert_eq!(chunks(9, &[1, 4, 8]), [8, 1]);
    }

    #[test]
    fn stacked_rows_split_back_to_each_request_in_order() {
        let requests: Vec<Tensors> = (1..=3)
            .map(|i| Tensors::from([("x".to_string(), t(&[1, 2], i))]))
            .collect();
        let refs: Vec<&Tensors> = requests.iter().collect();
        let stacked = stack(&refs).unwrap();
        assert_eq!(stacked["x"].shape, [3, 2]);
        assert_eq!(stacked["x"].data, [1, 1, 2, 2, 3, 3]);
        assert_eq!(split(&stacked, 3).unwrap(), requests);
        let wrong = Tensors::from([("y".to_string(), t(&[1, 6], 0))]);
        let refused = split(&wrong, 3).unwrap_err();
        assert!(refused.contains("not one row per request"), "{refused}");
        let odd = [
            &requests[0],
            &Tensors::from([("x".to_string(), t(&[1, 3], 0))]),
        ];
        assert!(stack(&odd).is_err());
    }
}
