//! Which artifact a node serves for a target: the one the target asks for now, and what follows
//! when it fails under the target's fallback policy. Pure: target status and cache entries in,
//! decision out; no client, no disk.

use kiln_crds::compiled_target::{CompiledTargetStatus, Fallback, FallbackPolicy};

use kiln_node_core::cache::KnownGood;

/// One class's artifact of one revision: what the agent pulls, verifies, loads and warms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pick {
    /// Revision number.
    pub revision: i64,
    /// Class id whose artifact this is.
    pub class: String,
    /// Compile key (the store's index).
    pub compile_key: String,
    /// sha256 of the artifact (lowercase hex, no prefix).
    pub digest: String,
    /// Digest of the stored build manifest (`sha256:<hex>`), what the store pulls by.
    pub manifest_digest: String,
}

/// The artifact `class` must serve now: the pinned revision when the target pins one, else the
/// current revision. Its artifact comes from the revision's list; for the current revision,
/// `status.classes` also counts (the operator fills it first). `Err` says what is missing, for a
/// `Pending` row.
pub fn wanted(
    status: Option<&CompiledTargetStatus>,
    pinned: Option<i64>,
    class: &str,
) -> Result<Pick, String> {
    let status = status.ok_or("the target has no status yet; waiting for the operator")?;
    let newest = status.revisions.iter().map(|r| r.number).max();
    let revision = pinned
        .or(status.revision)
        .or(newest)
        .ok_or("the target has no revision yet; waiting for a compiled artifact")?;
    let listed = status
        .revisions
        .iter()
        .find(|r| r.number == revision)
        .and_then(|r| r.artifacts.iter().find(|a| a.class == class))
        .filter(|a| !a.manifest_digest.is_empty())
        .map(|a| Pick {
            revision,
            class: class.to_string(),
            compile_key: a.compile_key.clone(),
            digest: strip(&a.digest),
            manifest_digest: a.manifest_digest.clone(),
        });
    if let Some(pick) = listed {
        return Ok(pick);
    }
    if Some(revision) == status.revision
        && let Some(c) = status.classes.iter().find(|c| c.class == class)
        && let (Some(key), Some(digest), Some(manifest)) =
            (&c.compile_key, &c.artifact_digest, &c.manifest_digest)
    {
        return Ok(Pick {
            revision,
            class: class.to_string(),
            compile_key: key.clone(),
            digest: strip(digest),
            manifest_digest: manifest.clone(),
        });
    }
    if pinned == Some(revision) && !status.revisions.iter().any(|r| r.number == revision) {
        return Err(format!(
            "rollout.pinnedRevision {revision} is not among the target's revisions"
        ));
    }
    Err(format!(
        "revision {revision} has no pullable artifact (digest and manifest digest) for class {class} yet; waiting for its compile"
    ))
}

fn strip(digest: &str) -> String {
    digest.strip_prefix("sha256:").unwrap_or(digest).to_string()
}

/// What to do after the wanted artifact failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Not ready; the pod gate goes False with the reason.
    FailClosed,
    /// Serve this cached revision that passed on this node, once its bytes re-verify.
    Previous(KnownGood),
    /// Try the fallback class's artifact of the same revision.
    Class(Pick),
    /// Try these engine candidates of the same class and revision, in order, until one passes.
    Candidates(Vec<Pick>),
}

/// The engine candidates that passed at the compile of `failed`'s artifact besides the kept one,
/// in the candidates' order, each as a pick of the same revision and class: what
/// `fallback.policy: NextCandidate` tries. From the failed artifact's verified build manifest;
/// empty for a manifest of another artifact, one without a selection (not `auto`), or
/// candidates not stored.
pub fn alternates(manifest: &kiln_crds::BuildManifest, failed: &Pick) -> Vec<Pick> {
    let Some(selection) = &manifest.selection else {
        return Vec::new();
    };
    if strip(&manifest.artifact_digest) != failed.digest {
        return Vec::new();
    }
    selection
        .candidates
        .iter()
        .filter(|c| c.passed && c.engine != selection.engine)
        .filter_map(|c| {
            Some(Pick {
                revision: failed.revision,
                class: failed.class.clone(),
                compile_key: c.compile_key.clone()?,
                digest: strip(c.artifact_digest.as_deref()?),
                manifest_digest: c.manifest_digest.clone()?,
            })
        })
        .filter(|p| p.digest != failed.digest)
        .collect()
}

/// The fallback for `failed`, tried under the target's `generation`, under `fallback`.
/// `known_good` are this target's cached entries that passed on this node (any order);
/// `status`/`pinned` as in [`wanted`]; `alternates` as [`alternates`] gives them. The same artifact that passed under an earlier generation
/// (say, before the warmup fixture changed) counts as previous: the node stays on it.
pub fn after_failure(
    fallback: &Fallback,
    failed: &Pick,
    generation: Option<i64>,
    known_good: &[KnownGood],
    status: Option<&CompiledTargetStatus>,
    pinned: Option<i64>,
    alternates: &[Pick],
) -> Next {
    match fallback.policy {
        FallbackPolicy::FailClosed => Next::FailClosed,
        FallbackPolicy::NextCandidate if alternates.is_empty() => Next::FailClosed,
        FallbackPolicy::NextCandidate => Next::Candidates(alternates.to_vec()),
        FallbackPolicy::PreviousKnownGood => known_good
            .iter()
            .filter(|k| {
                !(k.revision == failed.revision
                    && k.digest == failed.digest
                    && k.generation == generation)
            })
            // A newer revision that once passed is not "previous": after a rollback (pin) the
            // node must not jump forward to what was rolled back.
            .filter(|k| k.revision <= failed.revision)
            .max_by_key(|k| (k.revision, k.passed_at))
            .cloned()
            .map_or(Next::FailClosed, Next::Previous),
        FallbackPolicy::Class => match &fallback.class {
            // The fallback class itself failed (or this node is in it): nothing left to try.
            Some(class) if *class != failed.class => {
                let mut pick = wanted(status, pinned.or(Some(failed.revision)), class);
                if let Ok(p) = &mut pick {
                    p.revision = failed.revision;
                }
                pick.map_or(Next::FailClosed, Next::Class)
            }
            _ => Next::FailClosed,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A target status as the operator writes it, in YAML.
    fn status(yaml: &str) -> CompiledTargetStatus {
        serde_saphyr::from_str(yaml).expect("status fixture")
    }

    const TWO_REVISIONS: &str = r#"
revision: 2
classes:
  - {class: cpu-a, compileKey: k2cpu, artifactDigest: "sha256:d2cpu", manifestDigest: "sha256:m-k2cpu"}
  - {class: gpu-b, compileKey: k2gpu, artifactDigest: d2gpu, manifestDigest: "sha256:m-k2gpu"}
revisions:
  - number: 1
    knownGood: true
    artifacts:
      - {class: cpu-a, compileKey: k1cpu, digest: d1cpu, manifestDigest: "sha256:m-k1cpu"}
      - {class: gpu-b, compileKey: k1gpu, digest: d1gpu, manifestDigest: "sha256:m-k1gpu"}
  - number: 2
    artifacts:
      - {class: gpu-b, compileKey: k2gpu, digest: d2gpu, manifestDigest: "sha256:m-k2gpu"}
  - number: 3
    artifacts:
      # Written before the store reported its manifest digest: not pullable yet.
      - {class: gpu-b, compileKey: k3gpu, digest: d3gpu}
"#;

    fn pick(revision: i64, class: &str, key: &str, digest: &str) -> Pick {
        Pick {
            revision,
            class: class.into(),
            compile_key: key.into(),
            digest: digest.into(),
            manifest_digest: format!("sha256:m-{key}"),
        }
    }

    fn good(revision: i64, digest: &str, passed_at: i64) -> KnownGood {
        KnownGood {
            revision,
            class: "gpu-b".into(),
            compile_key: format!("k-{digest}"),
            digest: digest.into(),
            passed_at,
            generation: Some(1),
            fixture_digest: None,
        }
    }

    fn good_at(generation: i64, revision: i64, digest: &str, passed_at: i64) -> KnownGood {
        KnownGood {
            generation: Some(generation),
            ..good(revision, digest, passed_at)
        }
    }

    #[test]
    fn current_revision_from_the_revision_list_then_from_classes() {
        let s = status(TWO_REVISIONS);
        assert_eq!(
            wanted(Some(&s), None, "gpu-b"),
            Ok(pick(2, "gpu-b", "k2gpu", "d2gpu"))
        );
        // Revision 2 lists no cpu artifact yet; status.classes has it (prefix stripped).
        assert_eq!(
            wanted(Some(&s), None, "cpu-a"),
            Ok(pick(2, "cpu-a", "k2cpu", "d2cpu"))
        );
        let err = wanted(Some(&s), None, "tpu-c").expect_err("no such class");
        assert!(err.contains("tpu-c") && err.contains("revision 2"), "{err}");
        assert!(wanted(None, None, "gpu-b").is_err());
        // No manifest digest yet: waiting, not pulling by anything weaker.
        let err = wanted(Some(&s), Some(3), "gpu-b").expect_err("no manifest digest");
        assert!(err.contains("revision 3"), "{err}");
        assert!(wanted(Some(&status("{}")), None, "gpu-b").is_err());
    }

    #[test]
    fn a_pinned_revision_wins_and_must_exist() {
        let s = status(TWO_REVISIONS);
        assert_eq!(
            wanted(Some(&s), Some(1), "cpu-a"),
            Ok(pick(1, "cpu-a", "k1cpu", "d1cpu"))
        );
        let err = wanted(Some(&s), Some(7), "cpu-a").expect_err("unknown pin");
        assert!(err.contains("pinnedRevision 7"), "{err}");
    }

    fn policy(p: FallbackPolicy, class: Option<&str>) -> Fallback {
        Fallback {
            policy: p,
            class: class.map(String::from),
        }
    }

    #[test]
    fn fail_closed_never_serves_anything_else() {
        let s = status(TWO_REVISIONS);
        let failed = pick(2, "gpu-b", "k2gpu", "d2gpu");
        let cached = [good(1, "d1gpu", 10)];
        assert_eq!(
            after_failure(
                &policy(FallbackPolicy::FailClosed, None),
                &failed,
                Some(2),
                &cached,
                Some(&s),
                None,
                &[]
            ),
            Next::FailClosed
        );
    }

    #[test]
    fn previous_known_good_takes_the_newest_earlier_pass_and_never_the_failed_one() {
        let s = status(TWO_REVISIONS);
        let pkg = policy(FallbackPolicy::PreviousKnownGood, None);
        let failed = pick(3, "gpu-b", "k3", "d3");
        let cached = [
            good(1, "d1gpu", 10),
            good(2, "d2gpu", 20),
            good_at(2, 3, "d3", 5), // passed under this very spec, now fails: not a fallback
            good(4, "d4", 30),      // newer than what is asked for (a rollback pin): not a fallback
        ];
        assert_eq!(
            after_failure(&pkg, &failed, Some(2), &cached, Some(&s), None, &[]),
            Next::Previous(good(2, "d2gpu", 20))
        );
        // Same revision passed twice (re-rolled with another fixture): the later pass wins.
        let twice = [good(1, "a", 10), good(1, "b", 40)];
        assert_eq!(
            after_failure(&pkg, &failed, Some(2), &twice, Some(&s), None, &[]),
            Next::Previous(good(1, "b", 40))
        );
        // Nothing cached passed here: fail closed.
        assert_eq!(
            after_failure(
                &pkg,
                &failed,
                Some(2),
                &[good_at(2, 3, "d3", 1)],
                Some(&s),
                None,
                &[]
            ),
            Next::FailClosed
        );
        // The warmup spec changed (generation 2) and revision 3 fails it: the node stays on
        // revision 3 as it passed under generation 1.
        assert_eq!(
            after_failure(
                &pkg,
                &failed,
                Some(2),
                &[good(3, "d3", 1)],
                Some(&s),
                None,
                &[]
            ),
            Next::Previous(good(3, "d3", 1))
        );
        assert_eq!(
            after_failure(&pkg, &failed, Some(2), &[], Some(&s), None, &[]),
            Next::FailClosed
        );
    }

    #[test]
    fn class_fallback_uses_the_named_class_artifact_of_the_same_revision() {
        let s = status(TWO_REVISIONS);
        let to_cpu = policy(FallbackPolicy::Class, Some("cpu-a"));
        let failed = pick(2, "gpu-b", "k2gpu", "d2gpu");
        assert_eq!(
            after_failure(&to_cpu, &failed, Some(2), &[], Some(&s), None, &[]),
            Next::Class(pick(2, "cpu-a", "k2cpu", "d2cpu"))
        );
        // With a pin, the pinned revision's cpu artifact.
        let failed1 = pick(1, "gpu-b", "k1gpu", "d1gpu");
        assert_eq!(
            after_failure(&to_cpu, &failed1, Some(2), &[], Some(&s), Some(1), &[]),
            Next::Class(pick(1, "cpu-a", "k1cpu", "d1cpu"))
        );
        // The fallback class's own artifact failed: nothing further.
        let cpu_failed = pick(2, "cpu-a", "k2cpu", "d2cpu");
        assert_eq!(
            after_failure(&to_cpu, &cpu_failed, Some(2), &[], Some(&s), None, &[]),
            Next::FailClosed
        );
        // The named class has no artifact: fail closed.
        let to_tpu = policy(FallbackPolicy::Class, Some("tpu-c"));
        assert_eq!(
            after_failure(&to_tpu, &failed, Some(2), &[], Some(&s), None, &[]),
            Next::FailClosed
        );
    }

    fn manifest_with(selection: serde_json::Value) -> kiln_crds::BuildManifest {
        kiln_node_core::test_support::manifest(serde_json::json!({
            "compileKey": "kauto", "artifactDigest": "dkept", "backend": "onnxruntime",
            "selection": selection
        }))
    }

    #[test]
    fn next_candidate_tries_the_other_passing_candidates_of_the_failed_artifact_in_order() {
        let manifest = manifest_with(serde_json::json!({
            "engine": "onnxruntime/cuda", "reason": "fastest",
            "candidates": [
                {"engine": "tract", "passed": true, "compileKey": "kt", "artifactDigest": "sha256:dt", "manifestDigest": "sha256:m-kt"},
                {"engine": "onnxruntime/cpu", "passed": false, "reason": "ParityExceeded"},
                {"engine": "onnxruntime/cuda", "passed": true},
                {"engine": "other", "passed": true, "compileKey": "ko"}
            ]
        }));
        let failed = pick(2, "gpu-b", "kauto", "dkept");
        // Only what passed, was stored (key and both digests) and is not the kept one.
        let alt = alternates(&manifest, &failed);
        assert_eq!(alt, vec![pick(2, "gpu-b", "kt", "dt")]);
        let next = policy(FallbackPolicy::NextCandidate, None);
        let s = status(TWO_REVISIONS);
        assert_eq!(
            after_failure(&next, &failed, Some(2), &[], Some(&s), None, &alt),
            Next::Candidates(alt.clone())
        );
        // Nothing to try: fail closed; other policies ignore the candidates.
        assert_eq!(
            after_failure(&next, &failed, Some(2), &[], Some(&s), None, &[]),
            Next::FailClosed
        );
        assert_eq!(
            after_failure(
                &policy(FallbackPolicy::FailClosed, None),
                &failed,
                Some(2),
                &[],
                Some(&s),
                None,
                &alt
            ),
            Next::FailClosed
        );
        // The manifest of another artifact, or one without a selection, offers nothing: an
        // alternate that itself fails does not lead to further alternates.
        let other = pick(2, "gpu-b", "kt", "dt");
        assert!(alternates(&manifest, &other).is_empty());
        assert!(alternates(&manifest_with(serde_json::Value::Null), &failed).is_empty());
    }
}
