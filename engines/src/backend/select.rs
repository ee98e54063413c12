//! Which engine candidate `backend.kind: auto` keeps: the rule, pure and deterministic.
//!
//! Candidates come in a fixed order (tract, ONNX Runtime on the CPU, ONNX Runtime's CUDA
//! provider: [`kiln_crds::compiled_target::Backend::candidates`]). Only candidates that passed
//! (compiled, parity within tolerance, precision and CPU-fallback policy held, measured) count.
//! The first passing one is kept unless a later one's steady p50 is more than [`MARGIN`] below
//! the one kept so far; so two engines within measurement noise of each other never trade
//! places, and the earlier-listed (fewer moving parts) wins a tie. A class's choice is made once
//! per compile key: the store then holds it, and the same key is never chosen again.

use kiln_crds::FailureReason;
use kiln_crds::engine::EngineCandidate;

/// How much faster (relative p50) a later candidate must be to replace the one kept.
pub const MARGIN: f64 = 0.10;

/// The kept candidate and the rule's words for why.
#[derive(Debug, PartialEq)]
pub struct Choice {
    /// Index into the candidates.
    pub index: usize,
    /// Why, with the figures.
    pub reason: String,
}

/// Chooses among `candidates`; when none passed, the reason most of them failed with (ties: the
/// earliest listed) and a message naming every candidate's failure.
pub fn choose(candidates: &[EngineCandidate]) -> Result<Choice, (FailureReason, String)> {
    let mut kept: Option<(usize, f64)> = None;
    for (i, c) in candidates.iter().enumerate() {
        let Some(p50) = c.p50_seconds.filter(|_| c.passed) else {
            continue;
        };
        match kept {
            Some((_, best)) if p50 >= best * (1.0 - MARGIN) => {}
            _ => kept = Some((i, p50)),
        }
    }
    let Some((index, _)) = kept else {
        return Err((common_reason(candidates), failures(candidates)));
    };
    Ok(Choice {
        index,
        reason: explain(candidates, index),
    })
}

fn ms(seconds: f64) -> String {
    format!("{:.3} ms", seconds * 1000.0)
}

/// "onnxruntime/cpu: p50 6.100 ms, 2.62x faster than tract (16.000 ms); …".
fn explain(candidates: &[EngineCandidate], index: usize) -> String {
    let chosen = &candidates[index];
    let p50 = chosen.p50_seconds.unwrap_or_default();
    let mut parts = vec![format!(
        "{} kept: p50 {} (p99 {}), parity {:.2e}",
        chosen.engine,
        ms(p50),
        ms(chosen.p99_seconds.unwrap_or_default()),
        chosen.parity_max_abs_error.unwrap_or_default()
    )];
    for (i, c) in candidates.iter().enumerate() {
        if i == index {
            continue;
        }
        parts.push(match (c.passed, c.p50_seconds) {
            (true, Some(other)) if p50 > 0.0 => {
                format!("{} p50 {} ({:.2}x)", c.engine, ms(other), other / p50)
            }
            _ => format!("{} did not pass ({})", c.engine, failure(c)),
        });
    }
    format!(
        "{}; a later candidate replaces an earlier one only when its p50 is more than {:.0}% lower",
        parts.join("; "),
        MARGIN * 100.0
    )
}

fn failure(c: &EngineCandidate) -> String {
    let reason = c.reason.map(|r| r.as_str()).unwrap_or("not measured");
    match &c.message {
        Some(m) => format!("{reason}: {m}"),
        None => reason.to_string(),
    }
}

fn failures(candidates: &[EngineCandidate]) -> String {
    if candidates.is_empty() {
        return "this worker has no engine for the class".into();
    }
    let parts: Vec<String> = candidates
        .iter()
        .map(|c| format!("{}: {}", c.engine, failure(c)))
        .collect();
    parts.join("; ")
}

fn common_reason(candidates: &[EngineCandidate]) -> FailureReason {
    let reasons: Vec<FailureReason> = candidates.iter().filter_map(|c| c.reason).collect();
    let count = |r: &FailureReason| reasons.iter().filter(|x| *x == r).count();
    let mut best: Option<FailureReason> = None;
    for r in &reasons {
        if best.is_none_or(|b| count(r) > count(&b)) {
            best = Some(*r);
        }
    }
    best.unwrap_or(FailureReason::CompileFailed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passed(engine: &str, p50_ms: f64) -> EngineCandidate {
        EngineCandidate {
            engine: engine.into(),
            passed: true,
            p50_seconds: Some(p50_ms / 1000.0),
            p99_seconds: Some(p50_ms * 1.2 / 1000.0),
            parity_max_abs_error: Some(1e-6),
            ..EngineCandidate::default()
        }
    }

    fn failed(engine: &str, reason: FailureReason, message: &str) -> EngineCandidate {
        EngineCandidate {
            engine: engine.into(),
            reason: Some(reason),
            message: Some(message.into()),
            ..EngineCandidate::default()
        }
    }

    #[test]
    fn the_fastest_passing_candidate_is_kept_and_the_reason_has_the_figures() {
        let c = [passed("tract", 16.0), passed("onnxruntime/cpu", 6.1)];
        let choice = choose(&c).expect("one passes");
        assert_eq!(choice.index, 1);
        assert!(
            choice.reason.contains("onnxruntime/cpu kept: p50 6.100 ms")
                && choice.reason.contains("tract p50 16.000 ms (2.62x)"),
            "{}",
            choice.reason
        );
    }

    #[test]
    fn a_later_candidate_within_the_margin_does_not_replace_an_earlier_one() {
        // 5% faster is noise: the earlier-listed engine stays, whichever order noise gives.
        for later in [9.5, 10.0, 10.4] {
            let c = [passed("tract", 10.0), passed("onnxruntime/cpu", later)];
            assert_eq!(choose(&c).expect("passes").index, 0, "later {later} ms");
        }
        // Clearly faster (more than 10%) does.
        let c = [passed("tract", 10.0), passed("onnxruntime/cpu", 8.9)];
        assert_eq!(choose(&c).expect("passes").index, 1);
        // The margin is against the kept one, not the first: a third must beat the second.
        let c = [
            passed("tract", 10.0),
            passed("onnxruntime/cpu", 5.0),
            passed("onnxruntime/cuda", 4.8),
        ];
        assert_eq!(choose(&c).expect("passes").index, 1);
    }

    #[test]
    fn failed_candidates_are_evidence_not_errors() {
        let c = [
            failed("tract", FailureReason::UnsupportedOperator, "If on /If"),
            passed("onnxruntime/cpu", 30.0),
            failed("onnxruntime/cuda", FailureReason::ParityExceeded, "2.4e-2"),
        ];
        let choice = choose(&c).expect("one passes");
        assert_eq!(choice.index, 1);
        assert!(
            choice
                .reason
                .contains("tract did not pass (UnsupportedOperator: If on /If)")
                && choice
                    .reason
                    .contains("onnxruntime/cuda did not pass (ParityExceeded: 2.4e-2)"),
            "{}",
            choice.reason
        );
    }

    #[test]
    fn none_passing_fails_with_every_candidates_reason() {
        let c = [
            failed("tract", FailureReason::CompileFailed, "NNEF"),
            failed("onnxruntime/cpu", FailureReason::ParityExceeded, "1e-2"),
            failed("onnxruntime/cuda", FailureReason::ParityExceeded, "2e-2"),
        ];
        let (reason, message) = choose(&c).expect_err("none passes");
        assert_eq!(reason, FailureReason::ParityExceeded, "the most common");
        for part in [
            "tract: CompileFailed: NNEF",
            "onnxruntime/cpu: ParityExceeded: 1e-2",
            "onnxruntime/cuda: ParityExceeded: 2e-2",
        ] {
            assert!(message.contains(part), "{message}");
        }
        // A tie goes to the earliest listed.
        let c = [
            failed("tract", FailureReason::UnsupportedOperator, "Loop"),
            failed(
                "onnxruntime/cpu",
                FailureReason::IncompatibleRuntime,
                "no lib",
            ),
        ];
        assert_eq!(
            choose(&c).expect_err("none").0,
            FailureReason::UnsupportedOperator
        );
        // A passed flag without a measurement is not eligible.
        let unmeasured = EngineCandidate {
            engine: "tract".into(),
            passed: true,
            ..EngineCandidate::default()
        };
        assert!(choose(&[unmeasured]).is_err());
    }
}
