//! The compile of `backend.kind: auto`: every engine candidate of the class is compiled,
//! checked against the fixture (parity, precision, CPU-fallback policy) and measured over the
//! warmup iterations on this machine — the class's own hardware in a compile Job — and the one
//! [`crate::backend::select`] keeps becomes the class's artifact. A candidate that fails is
//! evidence in the build manifest, not an error; the compile fails only when none passes.
//! Writes candidate artifacts beside `target.out`; the caller stores the kept one and the other
//! passing ones (for `fallback.policy: NextCandidate`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use kiln_crds::BuildManifest;
use kiln_crds::compiled_target::{BackendKind, Precision};
use kiln_crds::engine::{EngineCandidate, EngineSelection};

use crate::backend::auto::{Auto, Candidate};
use crate::backend::{Backend, select};
use crate::pipeline::compile::{Inputs, Target, compile_isolated};
use crate::pipeline::spec::Spec;
use kiln_node_core::error::{Error, Result};

/// A candidate that passed: its artifact and manifest.
struct Built {
    artifact: PathBuf,
    manifest: BuildManifest,
}

/// A passing candidate besides the kept one, to be stored as its own entry.
pub struct Alternate {
    /// Its index among the selection's candidates.
    pub index: usize,
    /// The artifact, beside the kept one.
    pub artifact: PathBuf,
    /// Its manifest, under its own (concrete) compile key.
    pub manifest: BuildManifest,
}

/// Compiles, checks and measures every candidate, keeps the fastest that passed (by
/// [`select::choose`]) at `target.out`, and returns its manifest under the `auto` compile key,
/// recording every candidate, with the other passing candidates.
pub fn compile_auto(
    spec: &Spec,
    inputs: &Inputs,
    auto: &Auto,
    target: &Target<'_>,
) -> Result<(BuildManifest, Vec<Alternate>)> {
    let started = Instant::now();
    let dir = target.out.parent().unwrap_or(Path::new("."));
    let mut reports = Vec::new();
    let mut built = Vec::new();
    for (i, candidate) in auto.candidates.iter().enumerate() {
        let out = dir.join(format!("candidate-{i}"));
        let engine = candidate.spec.engine_name();
        tracing::info!(compile_key = %target.key, engine, "building engine candidate");
        let tried = candidate
            .backend
            .as_ref()
            .map_err(|e| (e.reason(), e.to_string()))
            .and_then(|backend| {
                try_candidate(spec, inputs, candidate, backend.as_ref(), target, &out)
                    .map_err(|e| (e.reason(), e.to_string()))
            });
        match tried {
            Ok((report, manifest)) => {
                reports.push(report);
                built.push(Some(Built {
                    artifact: out,
                    manifest,
                }));
            }
            Err((reason, message)) => {
                tracing::info!(compile_key = %target.key, engine, %reason, error = %message, "engine candidate did not pass");
                let _ = std::fs::remove_file(&out);
                reports.push(EngineCandidate {
                    engine,
                    reason: Some(reason),
                    message: Some(message),
                    ..EngineCandidate::default()
                });
                built.push(None);
            }
        }
    }
    let choice = select::choose(&reports)
        .map_err(|(reason, message)| Error::NoCandidate { reason, message })?;
    let mut kept = None;
    let mut alternates = Vec::new();
    for (index, b) in built.into_iter().enumerate() {
        match b {
            Some(b) if index == choice.index => kept = Some(b),
            Some(b) => alternates.push(Alternate {
                index,
                artifact: b.artifact,
                manifest: b.manifest,
            }),
            None => {}
        }
    }
    let Built {
        artifact,
        mut manifest,
    } = kept.ok_or_else(|| Error::CompileFailed("the kept candidate has no artifact".into()))?;
    std::fs::rename(&artifact, target.out).map_err(|e| Error::store(target.out, e))?;
    tracing::info!(compile_key = %target.key, engine = %reports[choice.index].engine, why = %choice.reason, "engine chosen");
    manifest.compile_key = target.key.to_string();
    manifest.compile_seconds = started.elapsed().as_secs_f64();
    manifest.selection = Some(EngineSelection {
        engine: reports[choice.index].engine.clone(),
        reason: choice.reason,
        candidates: reports,
    });
    Ok((manifest, alternates))
}

/// One candidate: compile with its concrete backend (under its own compile key, as if the
/// target had named it), then load and warm it with the target's iterations.
fn try_candidate(
    spec: &Spec,
    inputs: &Inputs,
    candidate: &Candidate,
    backend: &dyn Backend,
    target: &Target<'_>,
    out: &Path,
) -> Result<(EngineCandidate, BuildManifest)> {
    let sub = concrete(spec, candidate);
    let key = crate::pipeline::compile::key_with(&sub, &backend.identity(), target.class);
    let (manifest, measured) = compile_isolated(
        &sub,
        inputs,
        backend,
        &Target {
            out,
            key: &key,
            ..*target
        },
        true,
    )?;
    let report = measured
        .ok_or_else(|| Error::EngineAnswer("a candidate's compile came back unmeasured".into()))?;
    Ok((
        EngineCandidate {
            engine: candidate.spec.engine_name(),
            passed: true,
            compile_seconds: Some(manifest.compile_seconds),
            placement: manifest.placement.clone(),
            ..report
        },
        manifest,
    ))
}

/// The target as if it named the candidate's backend. tract computes exact fp32, which is what
/// `tf32` allows at most, so it is built as fp32.
fn concrete(spec: &Spec, candidate: &Candidate) -> Spec {
    let mut sub = spec.clone();
    sub.target.spec.backend = candidate.spec.clone();
    if candidate.spec.kind == BackendKind::Tract && sub.target.spec.precision == Precision::Tf32 {
        sub.target.spec.precision = Precision::Fp32;
    }
    sub
}
