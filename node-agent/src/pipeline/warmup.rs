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
    /// Which provider ran which nodes (from the engine's first run).
    pub placement: Option<kiln_crds::placement::Placement>,
    /// Resident memory the engine added at its peak in load and warmup (set by
    /// [`crate::pipeline::ready::account_memory`]).
    pub peak_memory_bytes: Option<u64>,
    /// GPU memory this process held at its peak, after load and after warmup (NVML; `None`
    /// where nothing was measured; set by [`crate::pipeline::ready::warm_engine`] and
    /// [`crate::pipeline::ready::account_memory`]).
    pub peak_device_memory_bytes: Option<u64>,
    /// Latency of one fixture run once warmup is over: what the first request after Ready finds.
    pub first_request_seconds: f64,
    /// A language model's prefill and decode figures (of the run after warmup).
    pub generation: Option<crate::backend::Generation>,
}

/// Checks that the fixture's inputs are exactly what one of the engine's profiles takes: names,
/// shapes and element types.
pub fn check_inputs(engine: &dyn Engine, fixture: &FixtureFile) -> Result<()> {
    let profiles = engine.profiles();
    let fits = profiles.iter().any(|(_, shapes)| {
        shapes.len() == fixture.inputs.len()
            && shapes
                .iter()
                .all(|(n, s)| fixture.inputs.get(n).is_some_and(|t| &t.shape == s))
    });
    if !fits {
        let got: BTreeMap<&String, &Vec<usize>> =
            fixture.inputs.iter().map(|(n, t)| (n, &t.shape)).collect();
        let want: Vec<String> = profiles
            .iter()
            .map(|(p, s)| format!("{p}: {s:?}"))
            .collect();
        return Err(Error::InvalidSpec(format!(
            "fixture {} has inputs {got:?}, which match no compiled profile ({}); regenerate the fixture for a profile's shapes or add a profile",
            fixture.version,
            want.join("; ")
        )));
    }
    let wrong: Vec<String> = engine
        .input_dtypes()
        .iter()
        .filter_map(|(name, want)| {
            let got = fixture.inputs.get(name)?.dtype;
            (got != *want)
                .then(|| format!("input {name} is {got:?} in the fixture, {want:?} in the graph"))
        })
        .collect();
    if !wrong.is_empty() {
        return Err(Error::InvalidSpec(format!(
            "fixture {}: {}; regenerate the fixture with the graph's dtypes (kiln-agent fixtures)",
            fixture.version,
            wrong.join("; ")
        )));
    }
    Ok(())
}

/// Refuses NaN or ±Inf in a golden output unless `warmup.outputs[name].allowNonFinite` is set:
/// NaN would match NaN and an infinite golden value makes atol/rtol meaningless.
pub fn check_golden(fixture: &FixtureFile, warmup: &Warmup) -> Result<()> {
    for (name, want) in &fixture.outputs {
        if warmup.allows_non_finite(name) || warmup.excludes(name) {
            continue;
        }
        if let Some((i, g)) = want
            .to_f64()?
            .iter()
            .enumerate()
            .find(|(_, g)| !g.is_finite())
        {
            return Err(Error::InvalidSpec(format!(
                "fixture {} has a non-finite golden value for output {name}: element {i} is {g}; regenerate the fixture from inputs that give finite outputs, or set warmup.outputs[name={name}].allowNonFinite: true if {g} is the expected value",
                fixture.version
            )));
        }
    }
    Ok(())
}

/// Runs the fixture `warmup.iterations` times, checking parity on every run.
pub fn warm(engine: &dyn Engine, fixture: &FixtureFile, warmup: &Warmup) -> Result<WarmupReport> {
    check_inputs(engine, fixture)?;
    check_golden(fixture, warmup)?;
    let started = Instant::now();
    let mut report = WarmupReport {
        iterations: warmup.iterations,
        ..WarmupReport::default()
    };
    for iteration in 0..warmup.iterations {
        let t = Instant::now();
        let outputs = engine.run(&fixture.inputs)?;
        report.latencies.push(t.elapsed().as_secs_f64());
        let errors = parity(&outputs, fixture, warmup).map_err(|e| match e {
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
    report.placement = engine.placement();
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
    // The first request after Ready: one more run once warmup is over, parity-checked too.
    let t = Instant::now();
    let outputs = engine.run(&fixture.inputs)?;
    report.first_request_seconds = t.elapsed().as_secs_f64();
    report.generation = engine.generation();
    parity(&outputs, fixture, warmup).map_err(|e| match e {
        Error::ParityExceeded(m) => Error::ParityExceeded(format!("first run after warmup: {m}")),
        other => other,
    })?;
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

/// Compares outputs with golden values: `|a - g| <= atol + rtol * |g|` element-wise. Every
/// output the engine produces must have a golden value or be in `warmup.excludeOutputs`, with the
/// golden dtype and shape; a golden value may be NaN or ±Inf only where the output allows it,
/// and then matches only the same non-finite value. Returns the largest absolute error per
/// checked output.
pub fn parity(
    outputs: &BTreeMap<String, HostTensor>,
    fixture: &FixtureFile,
    warmup: &Warmup,
) -> Result<BTreeMap<String, f64>> {
    let golden = &fixture.outputs;
    let version = &fixture.version;
    check_golden(fixture, warmup)?;
    let stale: Vec<&String> = warmup
        .exclude_outputs
        .iter()
        .filter(|n| !outputs.contains_key(*n))
        .collect();
    if !stale.is_empty() {
        return Err(Error::InvalidSpec(format!(
            "warmup.excludeOutputs names {stale:?}, which the model does not produce (it produces {:?}); remove them",
            outputs.keys().collect::<Vec<_>>()
        )));
    }
    let unchecked: Vec<&String> = outputs
        .keys()
        .filter(|n| !golden.contains_key(*n) && !warmup.excludes(n))
        .collect();
    if !unchecked.is_empty() {
        return Err(Error::InvalidSpec(format!(
            "the model produces {unchecked:?} but fixture {version} has no golden value for them, so parity would not check them; regenerate the fixture with every output (kiln-agent fixtures), or list them in warmup.excludeOutputs"
        )));
    }
    let checked: Vec<&String> = golden.keys().filter(|n| !warmup.excludes(n)).collect();
    if checked.is_empty() {
        return Err(Error::InvalidSpec(format!(
            "fixture {version} leaves no output to check (the model produces {:?}, warmup.excludeOutputs is {:?}); keep at least one output out of warmup.excludeOutputs",
            outputs.keys().collect::<Vec<_>>(),
            warmup.exclude_outputs
        )));
    }
    let mut errors = BTreeMap::new();
    for name in checked {
        let want = &golden[name];
        let got = outputs.get(name).ok_or_else(|| {
            Error::InvalidSpec(format!(
                "fixture {version} has golden output {name:?}, the model produces {:?}; regenerate the fixture",
                outputs.keys().collect::<Vec<_>>()
            ))
        })?;
        if got.dtype != want.dtype {
            return Err(Error::InvalidSpec(format!(
                "output {name} is {:?} in the graph but {:?} in fixture {version}; regenerate the fixture with the graph's dtypes (kiln-agent fixtures)",
                got.dtype, want.dtype
            )));
        }
        if got.shape != want.shape {
            return Err(Error::ParityExceeded(format!(
                "output {name}: shape {:?}, golden shape {:?}",
                got.shape, want.shape
            )));
        }
        let tol = warmup.tolerance(name);
        let (mut a, mut g) = (got.to_f64()?, want.to_f64()?);
        if let Some(k) = warmup.first_elements(name) {
            a.truncate(k);
            g.truncate(k);
        }
        let mut max_abs = 0.0f64;
        let mut worst: Option<Outlier> = None;
        for (i, (a, g)) in a.iter().zip(g.iter()).enumerate() {
            // Only reached when allowed (check_golden): NaN matches NaN, Inf the same Inf.
            let err = if !g.is_finite() {
                if (g.is_nan() && a.is_nan()) || a == g {
                    0.0
                } else {
                    f64::INFINITY
                }
            } else {
                let err = (a - g).abs();
                if err.is_nan() { f64::INFINITY } else { err }
            };
            max_abs = max_abs.max(err);
            let allowed = if g.is_finite() {
                tol.atol + tol.rtol * g.abs()
            } else {
                0.0
            };
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

    fn outs(pairs: &[(&str, HostTensor)]) -> BTreeMap<String, HostTensor> {
        pairs
            .iter()
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect()
    }

    /// A fixture holding only golden outputs (parity does not read inputs).
    fn fx(golden: &[(&str, HostTensor)]) -> FixtureFile {
        FixtureFile {
            version: "v1".into(),
            model_sha256: None,
            tolerance: None,
            inputs: BTreeMap::new(),
            outputs: outs(golden),
        }
    }

    fn warmup(atol: f64, rtol: f64) -> Warmup {
        Warmup {
            iterations: 1,
            fixture_version: "v1".into(),
            default_tolerance: Tolerance { atol, rtol },
            outputs: vec![],
            exclude_outputs: vec![],
            latency_budget_p99_ms: None,
            memory_budget: None,
            device_memory_budget: None,
        }
    }

    fn allow_non_finite(mut w: Warmup, name: &str) -> Warmup {
        w.outputs.push(OutputTolerance {
            name: name.into(),
            atol: w.default_tolerance.atol,
            rtol: w.default_tolerance.rtol,
            allow_non_finite: true,
            first_elements: None,
        });
        w
    }

    #[test]
    fn first_elements_checks_only_a_prefix() {
        // Greedy tokens: the first two must match exactly, what follows a divergence may not.
        let got = outs(&[("tokens", t(&[5.0, 7.0, 9.0]))]);
        let want = fx(&[("tokens", t(&[5.0, 7.0, 1.0]))]);
        let mut w = warmup(0.0, 0.0);
        parity(&got, &want, &w).expect_err("all three are checked by default");
        w.outputs.push(OutputTolerance {
            name: "tokens".into(),
            atol: 0.0,
            rtol: 0.0,
            allow_non_finite: false,
            first_elements: Some(2),
        });
        parity(&got, &want, &w).expect("the first two match");
        let early = fx(&[("tokens", t(&[5.0, 8.0, 9.0]))]);
        let err = parity(&got, &early, &w).expect_err("the second differs");
        assert!(err.to_string().contains("element 1"), "{err}");
    }

    #[test]
    fn within_tolerance_passes_and_reports_the_error() {
        let got = outs(&[("y", t(&[1.0, 2.0005]))]);
        let want = fx(&[("y", t(&[1.0, 2.0]))]);
        let errs = parity(&got, &want, &warmup(1e-3, 0.0)).expect("within");
        assert!((errs["y"] - 5e-4).abs() < 1e-6);
    }

    #[test]
    fn outside_tolerance_names_the_output_and_the_error() {
        let got = outs(&[("y", t(&[1.0, 2.5]))]);
        let want = fx(&[("y", t(&[1.0, 2.0]))]);
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
            allow_non_finite: false,
            first_elements: None,
        });
        parity(&got, &want, &w).expect("per-output atol 0.6");
        // rtol scales with the golden magnitude.
        parity(&got, &want, &warmup(0.0, 0.26)).expect("rtol 0.26 * 2.0 > 0.5");
    }

    #[test]
    fn nan_output_fails_against_a_finite_golden_value() {
        let want = fx(&[("y", t(&[1.0]))]);
        let got = outs(&[("y", t(&[f32::NAN]))]);
        assert!(matches!(
            parity(&got, &want, &warmup(1.0, 1.0)),
            Err(Error::ParityExceeded(_))
        ));
    }

    #[test]
    fn non_finite_golden_is_refused_unless_allowed() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let want = fx(&[("y", t(&[1.0, bad]))]);
            let got = outs(&[("y", t(&[1.0, bad]))]);
            let err = parity(&got, &want, &warmup(1.0, 1.0)).expect_err("refused");
            let msg = err.to_string();
            assert!(matches!(err, Error::InvalidSpec(_)), "{msg}");
            assert!(
                msg.contains("fixture v1")
                    && msg.contains("output y")
                    && msg.contains("element 1")
                    && msg.contains(&format!("{}", f64::from(bad)))
                    && msg.contains("warmup.outputs[name=y].allowNonFinite: true"),
                "{msg}"
            );
            assert!(check_golden(&want, &warmup(1.0, 1.0)).is_err());
            parity(&got, &want, &allow_non_finite(warmup(0.0, 0.0), "y"))
                .expect("allowed, and the same non-finite value");
        }
    }

    #[test]
    fn allowed_non_finite_golden_matches_only_the_same_value() {
        let w = allow_non_finite(warmup(10.0, 10.0), "y");
        let cases: [(f32, f32); 5] = [
            (f32::NAN, 1.0),
            (f32::NAN, f32::INFINITY),
            (f32::INFINITY, f32::NEG_INFINITY),
            (f32::INFINITY, f32::NAN),
            (f32::NEG_INFINITY, f32::MAX),
        ];
        for (golden, got) in cases {
            let err = parity(&outs(&[("y", t(&[got]))]), &fx(&[("y", t(&[golden]))]), &w)
                .expect_err("a different value fails, however wide the tolerance");
            assert!(
                matches!(err, Error::ParityExceeded(_)),
                "{golden} vs {got}: {err}"
            );
        }
        // Finite elements of an allowed output still use the tolerance.
        parity(
            &outs(&[("y", t(&[f32::NAN, 2.0]))]),
            &fx(&[("y", t(&[f32::NAN, 1.0]))]),
            &w,
        )
        .expect("1.0 within atol 10");
    }

    #[test]
    fn an_output_without_golden_value_must_be_excluded() {
        let got = outs(&[("y", t(&[1.0])), ("debug", t(&[5.0]))]);
        let want = fx(&[("y", t(&[1.0]))]);
        let err = parity(&got, &want, &warmup(1.0, 1.0)).expect_err("unchecked output");
        let msg = err.to_string();
        assert!(matches!(err, Error::InvalidSpec(_)), "{msg}");
        assert!(
            msg.contains("\"debug\"") && msg.contains("warmup.excludeOutputs"),
            "{msg}"
        );
        let mut w = warmup(1.0, 1.0);
        w.exclude_outputs.push("debug".into());
        let errs = parity(&got, &want, &w).expect("excluded");
        assert_eq!(errs.keys().collect::<Vec<_>>(), ["y"]);
        // An exclusion the model does not produce is stale.
        w.exclude_outputs.push("gone".into());
        let msg = parity(&got, &want, &w).expect_err("stale").to_string();
        assert!(msg.contains("\"gone\"") && msg.contains("remove"), "{msg}");
        // Excluding everything leaves nothing to check.
        let mut all = warmup(1.0, 1.0);
        all.exclude_outputs = vec!["y".into(), "debug".into()];
        let msg = parity(&got, &want, &all).expect_err("vacuous").to_string();
        assert!(msg.contains("no output to check"), "{msg}");
    }

    #[test]
    fn golden_dtype_must_match_the_output() {
        let got = outs(&[("y", t(&[1.0]))]);
        let want = fx(&[(
            "y",
            HostTensor {
                dtype: Dtype::F64,
                shape: vec![1],
                data: 1.0f64.to_le_bytes().to_vec(),
            },
        )]);
        let err = parity(&got, &want, &warmup(1.0, 1.0)).expect_err("dtype");
        let msg = err.to_string();
        assert!(matches!(err, Error::InvalidSpec(_)), "{msg}");
        assert!(
            msg.contains("output y is F32 in the graph but F64"),
            "{msg}"
        );
    }

    #[test]
    fn shape_and_missing_output_are_errors() {
        let want = fx(&[("y", t(&[1.0, 2.0]))]);
        let got = outs(&[("y", t(&[1.0]))]);
        assert!(matches!(
            parity(&got, &want, &warmup(1.0, 1.0)),
            Err(Error::ParityExceeded(_))
        ));
        let mut w = warmup(1.0, 1.0);
        w.exclude_outputs.push("z".into());
        let other = outs(&[("z", t(&[1.0, 2.0]))]);
        let err = parity(&other, &want, &w).expect_err("golden y not produced");
        assert!(
            matches!(&err, Error::InvalidSpec(m) if m.contains("golden output \"y\"")),
            "{err}"
        );
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[3.0], 0.99), 3.0);
    }
}
