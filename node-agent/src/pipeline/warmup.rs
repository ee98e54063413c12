//! Warmup: run the versioned fixtures through a loaded engine for the configured iterations,
//! check every output against its golden value within atol/rtol, and measure latency. Nothing
//! here decides readiness; it reports, and the caller fails closed on any error.
//! Runs the engine it is given; touches nothing else.

use std::collections::BTreeMap;
use std::time::Instant;

use kiln_crds::compiled_target::Warmup;

use crate::backend::Engine;
use crate::error::{Error, Result};
use crate::pipeline::fixtures::FixtureFile;
use crate::pipeline::tensor::HostTensor;

/// What a warmup measured.
#[derive(Clone, Debug, Default)]
pub struct WarmupReport {
    /// Iterations run.
    pub iterations: u32,
    /// Largest absolute error of any output element in any iteration.
    pub parity_max_abs_error: f64,
    /// Per-output largest absolute error.
    pub per_output: BTreeMap<String, f64>,
    /// Every iteration's latency in seconds, in order.
    pub latencies: Vec<f64>,
    /// Latency of the first (cold) iteration.
    pub first_seconds: f64,
    /// Median of the steady iterations (all but the first; the first when there is one).
    pub p50_seconds: f64,
    /// 99th percentile of the steady iterations.
    pub p99_seconds: f64,
    /// Wall time of the whole warmup.
    pub total_seconds: f64,
}

/// Checks that the fixture's inputs are exactly what one of the engine's profiles takes.
pub fn check_inputs(engine: &dyn Engine, fixture: &FixtureFile) -> Result<()> {
    let profiles = engine.profiles();
    let fits = profiles.iter().any(|(_, shapes)| {
        shapes.len() == fixture.inputs.len()
            && shapes
                .iter()
                .all(|(n, s)| fixture.inputs.get(n).is_some_and(|t| &t.shape == s))
    });
    if fits {
        return Ok(());
    }
    let got: BTreeMap<&String, &Vec<usize>> =
        fixture.inputs.iter().map(|(n, t)| (n, &t.shape)).collect();
    let want: Vec<String> = profiles
        .iter()
        .map(|(p, s)| format!("{p}: {s:?}"))
        .collect();
    Err(Error::InvalidSpec(format!(
        "fixture {} has inputs {got:?}, which match no compiled profile ({}); regenerate the fixture for a profile's shapes or add a profile",
        fixture.version,
        want.join("; ")
    )))
}

/// Runs the fixture `warmup.iterations` times, checking parity on every run.
pub fn warm(engine: &dyn Engine, fixture: &FixtureFile, warmup: &Warmup) -> Result<WarmupReport> {
    check_inputs(engine, fixture)?;
    let started = Instant::now();
    let mut report = WarmupReport {
        iterations: warmup.iterations,
        ..WarmupReport::default()
    };
    for iteration in 0..warmup.iterations {
        let t = Instant::now();
        let outputs = engine.run(&fixture.inputs)?;
        report.latencies.push(t.elapsed().as_secs_f64());
        let errors = parity(&outputs, &fixture.outputs, warmup).map_err(|e| match e {
            Error::ParityExceeded(m) => {
                Error::ParityExceeded(format!("iteration {}: {m}", iteration + 1))
            }
            other => other,
        })?;
        for (name, err) in errors {
            let slot = report.per_output.entry(name).or_insert(0.0);
            *slot = slot.max(err);
            report.parity_max_abs_error = report.parity_max_abs_error.max(err);
        }
    }
    report.total_seconds = started.elapsed().as_secs_f64();
    report.first_seconds = report.latencies.first().copied().unwrap_or(0.0);
    let mut steady: Vec<f64> = if report.latencies.len() > 1 {
        report.latencies[1..].to_vec()
    } else {
        report.latencies.clone()
    };
    steady.sort_by(f64::total_cmp);
    report.p50_seconds = percentile(&steady, 0.50);
    report.p99_seconds = percentile(&steady, 0.99);
    if let Some(budget_ms) = warmup.latency_budget_p99_ms
        && report.p99_seconds * 1000.0 > budget_ms
    {
        return Err(Error::LatencyBudgetExceeded(format!(
            "steady p99 {:.3} ms is above the budget of {budget_ms} ms (p50 {:.3} ms, {} iterations)",
            report.p99_seconds * 1000.0,
            report.p50_seconds * 1000.0,
            warmup.iterations
        )));
    }
    Ok(report)
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Compares outputs with golden values: `|a - g| <= atol + rtol * |g|` element-wise, NaN only
/// where the golden value is NaN. Returns the largest absolute error per output.
pub fn parity(
    outputs: &BTreeMap<String, HostTensor>,
    golden: &BTreeMap<String, HostTensor>,
    warmup: &Warmup,
) -> Result<BTreeMap<String, f64>> {
    let mut errors = BTreeMap::new();
    for (name, want) in golden {
        let got = outputs.get(name).ok_or_else(|| {
            Error::InvalidSpec(format!(
                "fixture has golden output {name:?}, the model produces {:?}; regenerate the fixture",
                outputs.keys().collect::<Vec<_>>()
            ))
        })?;
        if got.shape != want.shape {
            return Err(Error::ParityExceeded(format!(
                "output {name}: shape {:?}, golden shape {:?}",
                got.shape, want.shape
            )));
        }
        let tol = warmup.tolerance(name);
        let (a, g) = (got.to_f64()?, want.to_f64()?);
        let mut max_abs = 0.0f64;
        let mut worst: Option<Outlier> = None;
        for (i, (a, g)) in a.iter().zip(g.iter()).enumerate() {
            if g.is_nan() && a.is_nan() {
                continue;
            }
            let err = (a - g).abs();
            let err = if err.is_nan() { f64::INFINITY } else { err };
            max_abs = max_abs.max(err);
            let allowed = tol.atol + tol.rtol * g.abs();
            if err > allowed && worst.as_ref().is_none_or(|w| err > w.error) {
                worst = Some(Outlier {
                    index: i,
                    error: err,
                    got: *a,
                    golden: *g,
                });
            }
        }
        if let Some(w) = worst {
            return Err(Error::ParityExceeded(format!(
                "output {name}: max abs error {max_abs:.3e}; element {} is {} against golden {} (error {:.3e} > atol {} + rtol {} * |golden|)",
                w.index, w.got, w.golden, w.error, tol.atol, tol.rtol
            )));
        }
        errors.insert(name.clone(), max_abs);
    }
    Ok(errors)
}

/// The element of an output furthest outside its tolerance.
struct Outlier {
    /// Its index, row-major.
    index: usize,
    /// Its absolute error.
    error: f64,
    /// What the engine produced.
    got: f64,
    /// The golden value.
    golden: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_crds::compiled_target::{OutputTolerance, Tolerance};
    use safetensors::Dtype;

    fn t(values: &[f32]) -> HostTensor {
        HostTensor {
            dtype: Dtype::F32,
            shape: vec![values.len()],
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    fn warmup(atol: f64, rtol: f64) -> Warmup {
        Warmup {
            iterations: 1,
            fixture_version: "v1".into(),
            default_tolerance: Tolerance { atol, rtol },
            outputs: vec![],
            latency_budget_p99_ms: None,
        }
    }

    #[test]
    fn within_tolerance_passes_and_reports_the_error() {
        let got = BTreeMap::from([("y".to_string(), t(&[1.0, 2.0005]))]);
        let want = BTreeMap::from([("y".to_string(), t(&[1.0, 2.0]))]);
        let errs = parity(&got, &want, &warmup(1e-3, 0.0)).expect("within");
        assert!((errs["y"] - 5e-4).abs() < 1e-6);
    }

    #[test]
    fn outside_tolerance_names_the_output_and_the_error() {
        let got = BTreeMap::from([("y".to_string(), t(&[1.0, 2.5]))]);
        let want = BTreeMap::from([("y".to_string(), t(&[1.0, 2.0]))]);
        let err = parity(&got, &want, &warmup(1e-3, 1e-3))
            .expect_err("outside")
            .to_string();
        assert!(
            err.contains("output y") && err.contains("element 1") && err.contains("5.000e-1"),
            "{err}"
        );
        // A per-output tolerance overrides the default.
        let mut w = warmup(1e-3, 1e-3);
        w.outputs.push(OutputTolerance {
            name: "y".into(),
            atol: 0.6,
            rtol: 0.0,
        });
        parity(&got, &want, &w).expect("per-output atol 0.6");
        // rtol scales with the golden magnitude.
        parity(&got, &want, &warmup(0.0, 0.26)).expect("rtol 0.26 * 2.0 > 0.5");
    }

    #[test]
    fn nan_fails_unless_golden_is_nan() {
        let want = BTreeMap::from([("y".to_string(), t(&[1.0]))]);
        let got = BTreeMap::from([("y".to_string(), t(&[f32::NAN]))]);
        assert!(parity(&got, &want, &warmup(1.0, 1.0)).is_err());
        let want_nan = BTreeMap::from([("y".to_string(), t(&[f32::NAN]))]);
        parity(&got, &want_nan, &warmup(0.0, 0.0)).expect("NaN golden, NaN output");
    }

    #[test]
    fn shape_and_missing_output_are_errors() {
        let want = BTreeMap::from([("y".to_string(), t(&[1.0, 2.0]))]);
        let got = BTreeMap::from([("y".to_string(), t(&[1.0]))]);
        assert!(matches!(
            parity(&got, &want, &warmup(1.0, 1.0)),
            Err(Error::ParityExceeded(_))
        ));
        let other = BTreeMap::from([("z".to_string(), t(&[1.0, 2.0]))]);
        assert!(matches!(
            parity(&other, &want, &warmup(1.0, 1.0)),
            Err(Error::InvalidSpec(_))
        ));
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[3.0], 0.99), 3.0);
    }
}
