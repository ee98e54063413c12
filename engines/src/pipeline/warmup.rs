//! Warmup: run the versioned fixtures through a loaded engine for the configured iterations,
//! check every output against its golden value within atol/rtol, and measure latency. Nothing
//! here decides readiness; it reports, and the caller fails closed on any error.
//! Runs the engine it is given; touches nothing else.

use std::collections::BTreeMap;
use std::time::Instant;

use kiln_crds::compiled_target::Warmup;
use kiln_crds::kiln_node::WarmupFigures;

use crate::backend::Engine;
use crate::backend::Shapes;
use crate::backend::tensor::HostTensor;
use crate::pipeline::fixtures::FixtureFile;
use kiln_node_core::error::{Error, Result};

/// What a warmup measured (also the engine's process's answer, so serde).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
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
    /// where nothing was measured; set in the engine's process after warmup, `kiln-agent engine`,
    /// and by [`crate::pipeline::ready::account_memory`] after load).
    pub peak_device_memory_bytes: Option<u64>,
    /// Latency of one fixture run once warmup is over: what the first request after Ready finds.
    pub first_request_seconds: f64,
    /// A language model's prefill and decode figures: the median over the warmup iterations,
    /// the first request after Ready apart.
    pub generation: Option<crate::backend::Generation>,
}

impl WarmupReport {
    /// The figures a KilnNode row reports of this warmup and of a load that took
    /// `load_seconds`.
    pub fn figures(&self, load_seconds: f64) -> WarmupFigures {
        let bytes = |b: Option<u64>| b.map(|b| i64::try_from(b).unwrap_or(i64::MAX));
        WarmupFigures {
            load_seconds: Some(load_seconds),
            warmup_seconds: Some(self.total_seconds),
            p50_seconds: Some(self.p50_seconds),
            first_request_seconds: Some(self.first_request_seconds),
            parity_max_abs_error: Some(self.parity_max_abs_error),
            placement: self.placement.clone(),
            peak_memory_bytes: bytes(self.peak_memory_bytes),
            peak_device_memory_bytes: bytes(self.peak_device_memory_bytes),
            generation: self.generation,
        }
    }
}

/// Checks that the fixture's inputs are exactly what one of the engine's profiles takes: names,
/// shapes and element types.
pub fn check_inputs(engine: &dyn Engine, fixture: &FixtureFile) -> Result<()> {
    let profiles = engine.profiles();
    if !fits_a_profile(&profiles, &fixture.inputs) {
        return Err(Error::InvalidSpec(format!(
            "fixture {} has inputs {:?}, which match no compiled profile ({}); regenerate the fixture for a profile's shapes or add a profile",
            fixture.version,
            shapes_of(&fixture.inputs),
            describe_profiles(&profiles)
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

/// Whether `inputs` are exactly one profile's: the same names, each with the profile's shape.
/// Pure.
pub fn fits_a_profile(
    profiles: &[(String, Shapes)],
    inputs: &BTreeMap<String, HostTensor>,
) -> bool {
    profiles.iter().any(|(_, shapes)| {
        shapes.len() == inputs.len()
            && shapes
                .iter()
                .all(|(n, s)| inputs.get(n).is_some_and(|t| &t.shape == s))
    })
}

/// Input name → shape, for messages.
pub fn shapes_of(inputs: &BTreeMap<String, HostTensor>) -> BTreeMap<&String, &Vec<usize>> {
    inputs.iter().map(|(n, t)| (n, &t.shape)).collect()
}

/// The compiled profiles as `name: {input: shape}`, `; `-separated, for messages.
pub fn describe_profiles(profiles: &[(String, Shapes)]) -> String {
    profiles
        .iter()
        .map(|(p, s)| format!("{p}: {s:?}"))
        .collect::<Vec<_>>()
        .join("; ")
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

/// Runs the fixture `warmup.iterations` times, checking parity on every run. A fixture of
/// several samples is alternated (iteration i runs sample i mod n, each against its own golden
/// outputs), so an engine that replays captured work must read each run's inputs to pass.
pub fn warm(engine: &dyn Engine, fixture: &FixtureFile, warmup: &Warmup) -> Result<WarmupReport> {
    let samples = checked_samples(engine, fixture, warmup)?;
    if engine.replays_captured_work() {
        enough_runs_to_replay(warmup.iterations, samples.len())?;
    }
    let started = Instant::now();
    let mut report = WarmupReport {
        iterations: warmup.iterations,
        ..WarmupReport::default()
    };
    let mut generations = Vec::new();
    for iteration in 0..warmup.iterations as usize {
        let sample = &samples[iteration % samples.len()];
        let t = Instant::now();
        let outputs = engine.run(&sample.inputs)?;
        report.latencies.push(t.elapsed().as_secs_f64());
        generations.extend(engine.generation());
        let which = format!(
            "iteration {}{}",
            iteration + 1,
            sample_name(iteration, &samples)
        );
        let errors = parity(&outputs, sample, warmup).map_err(|e| within(e, &which))?;
        for (name, err) in errors {
            let slot = report.per_output.entry(name).or_insert(0.0);
            *slot = slot.max(err);
            report.parity_max_abs_error = report.parity_max_abs_error.max(err);
        }
    }
    report.total_seconds = started.elapsed().as_secs_f64();
    report.placement = engine.placement();
    report.first_seconds = report.latencies.first().copied().unwrap_or(0.0);
    (report.p50_seconds, report.p99_seconds) = steady_percentiles(&report.latencies);
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
    // The first request after Ready: one more run once warmup is over (the next sample in
    // turn, so with one iteration a replaying engine still runs a second input set),
    // parity-checked too.
    let next = warmup.iterations as usize;
    let sample = &samples[next % samples.len()];
    let t = Instant::now();
    let outputs = engine.run(&sample.inputs)?;
    report.first_request_seconds = t.elapsed().as_secs_f64();
    // A language model's figures: the median of the warmup runs, the first request apart.
    report.generation = crate::backend::Generation::steady(&generations, engine.generation());
    let which = format!("first run after warmup{}", sample_name(next, &samples));
    parity(&outputs, sample, warmup).map_err(|e| within(e, &which))?;
    Ok(report)
}

/// Runs every sample of the fixture once, in order, checking parity on each: the compile's
/// check of a built engine. Returns the largest absolute error per output over all samples.
pub fn check_samples(
    engine: &dyn Engine,
    fixture: &FixtureFile,
    warmup: &Warmup,
) -> Result<BTreeMap<String, f64>> {
    let samples = checked_samples(engine, fixture, warmup)?;
    let mut worst = BTreeMap::new();
    for (i, sample) in samples.iter().enumerate() {
        let outputs = engine.run(&sample.inputs)?;
        let which = format!("compile check{}", sample_name(i, &samples));
        for (name, err) in parity(&outputs, sample, warmup).map_err(|e| within(e, &which))? {
            let slot: &mut f64 = worst.entry(name).or_insert(0.0);
            *slot = slot.max(err);
        }
    }
    Ok(worst)
}

/// The fixture's samples, each checked against the engine's profiles and for finite golden
/// values, its text against the engine's tokenizer and chat template (`pipeline::text`), and,
/// for an engine that replays captured work, told apart by parity.
fn checked_samples(
    engine: &dyn Engine,
    fixture: &FixtureFile,
    warmup: &Warmup,
) -> Result<Vec<FixtureFile>> {
    let samples = fixture.samples();
    for sample in &samples {
        check_inputs(engine, sample)?;
        check_golden(sample, warmup)?;
    }
    // The text before any run: a changed tokenizer or template is its own reason, not a
    // parity error on tokens that were never the fixture's.
    crate::pipeline::text::check(engine.tokenizer(), fixture)?;
    if engine.replays_captured_work() {
        check_replay_samples(&samples, warmup)?;
    }
    Ok(samples)
}

/// An engine that replays captured work (CUDA graphs) passes a check only if a replay that
/// ignored the new inputs would fail it: the fixture needs at least two samples, and no
/// sample's golden outputs may pass parity as another's (a stale replay returns the outputs of
/// the inputs it captured). Pure.
pub fn check_replay_samples(samples: &[FixtureFile], warmup: &Warmup) -> Result<()> {
    let version = samples.first().map_or("?", |s| s.version.as_str());
    if samples.len() < 2 {
        return Err(Error::InvalidSpec(format!(
            "backend.cuda.cudaGraphs replays a captured graph, and only a second input set shows that a replay reads new inputs, but fixture {version} has one sample; make it with at least two (kiln-agent fixtures --samples 2, or one --inputs file per sample)"
        )));
    }
    for (i, a) in samples.iter().enumerate() {
        for (j, b) in samples.iter().enumerate().filter(|(j, _)| *j != i) {
            match parity(&a.outputs, b, warmup) {
                Err(Error::ParityExceeded(_)) => {}
                Ok(_) => {
                    return Err(Error::InvalidSpec(format!(
                        "fixture {version}: the golden outputs of sample {} pass parity as sample {}'s, so a CUDA graph replay that ignored the new inputs would pass warmup; make the samples from inputs whose outputs differ beyond the tolerance",
                        i + 1,
                        j + 1
                    )));
                }
                Err(other) => return Err(other),
            }
        }
    }
    Ok(())
}

/// An engine that replays captured work captures on an early run (ONNX Runtime's CUDA graphs:
/// a profile's second); only if every sample runs at least twice in warmup is each one replayed
/// after the capture. Pure.
pub fn enough_runs_to_replay(iterations: u32, samples: usize) -> Result<()> {
    let least = 2 * samples;
    if (iterations as usize) < least {
        return Err(Error::InvalidSpec(format!(
            "backend.cuda.cudaGraphs: warmup.iterations {iterations} runs the fixture's {samples} samples fewer than twice each, so not every sample is replayed after the graph is captured; set warmup.iterations to at least {least}"
        )));
    }
    Ok(())
}

/// `" (sample k of n)"` for a fixture of several samples, else nothing.
fn sample_name(run: usize, samples: &[FixtureFile]) -> String {
    if samples.len() < 2 {
        return String::new();
    }
    format!(" (sample {} of {})", run % samples.len() + 1, samples.len())
}

/// A parity failure with the run it happened in.
fn within(e: Error, which: &str) -> Error {
    match e {
        Error::ParityExceeded(m) => Error::ParityExceeded(format!("{which}: {m}")),
        other => other,
    }
}

/// The p50 and p99 of the steady runs: every latency but the first (the cold one), or the
/// first when it is the only one; nearest rank. Pure.
pub fn steady_percentiles(latencies: &[f64]) -> (f64, f64) {
    let mut steady = latencies
        .get(1..)
        .filter(|s| !s.is_empty())
        .unwrap_or(latencies)
        .to_vec();
    steady.sort_by(f64::total_cmp);
    (percentile(&steady, 0.50), percentile(&steady, 0.99))
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
    let checked = checked_outputs(outputs, fixture, warmup)?;
    let version = &fixture.version;
    let mut errors = BTreeMap::new();
    for name in checked {
        let got = outputs.get(name).ok_or_else(|| {
            Error::InvalidSpec(format!(
                "fixture {version} has golden output {name:?}, the model produces {:?}; regenerate the fixture",
                outputs.keys().collect::<Vec<_>>()
            ))
        })?;
        let max_abs = compare_output(name, got, &fixture.outputs[name], version, warmup)?;
        errors.insert(name.clone(), max_abs);
    }
    Ok(errors)
}

/// The golden outputs parity checks: every produced output golden or excluded, no exclusion of
/// an output the model does not produce, at least one left to check.
fn checked_outputs<'f>(
    outputs: &BTreeMap<String, HostTensor>,
    fixture: &'f FixtureFile,
    warmup: &Warmup,
) -> Result<Vec<&'f String>> {
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
    Ok(checked)
}

/// One output against its golden value: dtype and shape as the golden's, every element (the
/// first `firstElements` where declared) within its tolerance. Returns the largest absolute
/// error.
fn compare_output(
    name: &str,
    got: &HostTensor,
    want: &HostTensor,
    version: &str,
    warmup: &Warmup,
) -> Result<f64> {
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
    Ok(max_abs)
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
            more: Vec::new(),
            text: Default::default(),
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

    /// y = 2x on f32[2], as a CUDA graph engine would compute it: `stale` replays the outputs
    /// of the first run's inputs (what a graph replay that does not read rebound inputs
    /// returns); otherwise every run reads its inputs.
    struct Replaying {
        stale: bool,
        captured: std::sync::Mutex<Option<BTreeMap<String, HostTensor>>>,
    }

    impl Replaying {
        fn new(stale: bool) -> Self {
            Self {
                stale,
                captured: std::sync::Mutex::new(None),
            }
        }
    }

    impl Engine for Replaying {
        fn run(
            &self,
            inputs: &BTreeMap<String, HostTensor>,
        ) -> Result<BTreeMap<String, HostTensor>> {
            let x = inputs["x"].to_f64()?;
            let y: Vec<f32> = x.iter().map(|v| (v * 2.0) as f32).collect();
            let fresh = outs(&[("y", t(&y))]);
            let mut captured = self.captured.lock().expect("lock");
            let replay = captured.get_or_insert_with(|| fresh.clone()).clone();
            Ok(if self.stale { replay } else { fresh })
        }
        fn profiles(&self) -> Vec<(String, crate::backend::Shapes)> {
            vec![("p".into(), BTreeMap::from([("x".into(), vec![2])]))]
        }
        fn input_dtypes(&self) -> BTreeMap<String, Dtype> {
            BTreeMap::from([("x".into(), Dtype::F32)])
        }
        fn replays_captured_work(&self) -> bool {
            true
        }
    }

    fn two_samples(second_x: [f32; 2]) -> FixtureFile {
        let y2: Vec<f32> = second_x.iter().map(|v| v * 2.0).collect();
        FixtureFile {
            version: "v1".into(),
            model_sha256: None,
            tolerance: None,
            inputs: outs(&[("x", t(&[1.0, 2.0]))]),
            outputs: outs(&[("y", t(&[2.0, 4.0]))]),
            more: vec![crate::pipeline::fixtures::Sample {
                inputs: outs(&[("x", t(&second_x))]),
                outputs: outs(&[("y", t(&y2))]),
            }],
            text: Default::default(),
        }
    }

    #[test]
    fn a_stale_replay_fails_parity_and_a_true_one_passes() {
        let fixture = two_samples([3.0, 5.0]);
        let mut w = warmup(1e-3, 1e-3);
        w.iterations = 4;
        let report = warm(&Replaying::new(false), &fixture, &w).expect("reads every input");
        assert_eq!(report.latencies.len(), 4);
        assert_eq!(report.parity_max_abs_error, 0.0);
        let err = warm(&Replaying::new(true), &fixture, &w).expect_err("stale");
        assert!(
            matches!(&err, Error::ParityExceeded(m) if m.starts_with("iteration 2 (sample 2 of 2): output y")),
            "{err}"
        );
        // Too few iterations to replay every sample after the capture.
        w.iterations = 3;
        let err = warm(&Replaying::new(false), &fixture, &w).expect_err("3 runs of 2 samples");
        assert!(
            matches!(&err, Error::InvalidSpec(m) if m.contains("warmup.iterations to at least 4")),
            "{err}"
        );
        enough_runs_to_replay(4, 2).expect("twice each");
        // The first request after warmup runs the next sample in turn, checked too: a replay
        // that goes stale only then fails.
        struct StaleLate(Replaying, std::sync::atomic::AtomicUsize);
        impl Engine for StaleLate {
            fn run(
                &self,
                inputs: &BTreeMap<String, HostTensor>,
            ) -> Result<BTreeMap<String, HostTensor>> {
                let n = self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let fresh = self.0.run(inputs)?;
                // From the fifth run on, the outputs of the last sample warmup ran.
                Ok(if n < 4 {
                    fresh
                } else {
                    outs(&[("y", t(&[6.0, 10.0]))])
                })
            }
            fn profiles(&self) -> Vec<(String, crate::backend::Shapes)> {
                self.0.profiles()
            }
            fn input_dtypes(&self) -> BTreeMap<String, Dtype> {
                self.0.input_dtypes()
            }
            fn replays_captured_work(&self) -> bool {
                true
            }
        }
        w.iterations = 4;
        let late = StaleLate(Replaying::new(false), Default::default());
        let err = warm(&late, &two_samples([3.0, 5.0]), &w).expect_err("stale at the fifth run");
        assert!(
            matches!(&err, Error::ParityExceeded(m) if m.starts_with("first run after warmup (sample 1 of 2)")),
            "{err}"
        );
        // The compile's check runs every sample too.
        check_samples(&Replaying::new(false), &fixture, &w).expect("compile check");
        let err = check_samples(&Replaying::new(true), &fixture, &w).expect_err("stale");
        assert!(
            matches!(&err, Error::ParityExceeded(m) if m.starts_with("compile check (sample 2 of 2)")),
            "{err}"
        );
    }

    #[test]
    fn a_replaying_engine_needs_samples_parity_tells_apart() {
        let w = warmup(1e-3, 1e-3);
        let mut one = two_samples([3.0, 5.0]);
        one.more.clear();
        let err = warm(&Replaying::new(false), &one, &w).expect_err("one sample");
        assert!(
            matches!(&err, Error::InvalidSpec(m) if m.contains("fixture v1 has one sample") && m.contains("--samples 2")),
            "{err}"
        );
        // Outputs within tolerance of each other: a stale replay would pass.
        let close = two_samples([1.0, 2.0004]);
        let err = warm(&Replaying::new(true), &close, &w).expect_err("alike");
        assert!(
            matches!(&err, Error::InvalidSpec(m) if m.contains("sample 1 pass parity as sample 2")),
            "{err}"
        );
        // An engine that computes every run is held to nothing more: one sample serves.
        struct Plain(Replaying);
        impl Engine for Plain {
            fn run(
                &self,
                inputs: &BTreeMap<String, HostTensor>,
            ) -> Result<BTreeMap<String, HostTensor>> {
                self.0.run(inputs)
            }
            fn profiles(&self) -> Vec<(String, crate::backend::Shapes)> {
                self.0.profiles()
            }
            fn input_dtypes(&self) -> BTreeMap<String, Dtype> {
                self.0.input_dtypes()
            }
        }
        warm(&Plain(Replaying::new(false)), &one, &w).expect("plain engine, one sample");
    }
}
