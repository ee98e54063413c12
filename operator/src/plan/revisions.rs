//! Stage 4: the numbered revisions. A new one once every class has an artifact and the set
//! differs from the newest, trimmed to the history kept; the revision nodes should serve (the
//! pin, else the newest); promotion to known-good once the rollout meets its threshold. Reads
//! and returns revision lists; nothing else. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_crds::compiled_target::{ClassArtifact, ClassStatus, Revision};

/// `revisions` with a new one appended when every class row has an artifact and that set is
/// not the newest revision's, keeping the newest `keep`.
pub fn record(
    mut revisions: Vec<Revision>,
    rows: &[ClassStatus],
    generation: Option<i64>,
    keep: usize,
    now: &Time,
) -> Vec<Revision> {
    if rows.iter().any(|r| r.artifact_digest.is_none()) {
        return revisions;
    }
    let artifacts: Vec<ClassArtifact> = rows
        .iter()
        .map(|c| ClassArtifact {
            class: c.class.clone(),
            compile_key: c.compile_key.clone().unwrap_or_default(),
            digest: c.artifact_digest.clone().unwrap_or_default(),
            manifest_digest: c.manifest_digest.clone().unwrap_or_default(),
        })
        .collect();
    if revisions.last().map(|r| &r.artifacts) == Some(&artifacts) {
        return revisions;
    }
    let number = revisions.last().map_or(1, |r| r.number + 1);
    revisions.push(Revision {
        number,
        generation: generation.unwrap_or_default(),
        known_good: false,
        created_at: Some(now.clone()),
        artifacts,
    });
    let drop = revisions.len().saturating_sub(keep);
    revisions.drain(..drop);
    revisions
}

/// The revision nodes should serve: the pinned one while it is listed, else the newest.
pub fn current(revisions: &[Revision], pinned: Option<i64>) -> Option<i64> {
    match pinned {
        Some(pin) if revisions.iter().any(|r| r.number == pin) => Some(pin),
        _ => revisions.last().map(|r| r.number),
    }
}

/// Marks `current` known-good when the rollout `met` its threshold and it is not yet; returns
/// the revisions and the number promoted, if one was.
pub fn promote(
    mut revisions: Vec<Revision>,
    current: Option<i64>,
    met: bool,
) -> (Vec<Revision>, Option<i64>) {
    let promoted = revisions
        .iter_mut()
        .find(|r| met && Some(r.number) == current && !r.known_good)
        .map(|r| {
            r.known_good = true;
            r.number
        });
    (revisions, promoted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).expect("time"))
    }

    fn row(class: &str, digest: Option<&str>) -> ClassStatus {
        ClassStatus {
            class: class.into(),
            compile_key: Some(format!("key-{class}")),
            artifact_digest: digest.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn a_revision_needs_every_class_and_a_new_set_and_history_is_trimmed() {
        let partial = [row("a", Some("d1")), row("b", None)];
        assert!(record(Vec::new(), &partial, Some(1), 3, &now()).is_empty());
        let mut revisions = Vec::new();
        for (generation, digest) in [(1, "d1"), (1, "d1"), (2, "d2"), (3, "d3"), (4, "d4")] {
            let rows = [row("a", Some(digest)), row("b", Some("e"))];
            revisions = record(revisions, &rows, Some(generation), 3, &now());
        }
        let numbers: Vec<i64> = revisions.iter().map(|r| r.number).collect();
        assert_eq!(
            numbers,
            [2, 3, 4],
            "same artifacts: no new revision; newest 3 kept"
        );
        assert_eq!(revisions[2].generation, 4);
        assert_eq!(revisions[2].artifacts[0].digest, "d4");
        assert_eq!(revisions[2].created_at, Some(now()), "when it was recorded");
    }

    #[test]
    fn the_pin_wins_while_listed_and_only_the_current_revision_is_promoted() {
        let rows = [row("a", Some("d1"))];
        let mut revisions = record(Vec::new(), &rows, Some(1), 10, &now());
        revisions = record(revisions, &[row("a", Some("d2"))], Some(2), 10, &now());
        assert_eq!(current(&revisions, Some(1)), Some(1));
        assert_eq!(
            current(&revisions, Some(7)),
            Some(2),
            "a pin not listed: newest"
        );
        assert_eq!(current(&[], None), None);
        let (revisions, promoted) = promote(revisions, Some(1), false);
        assert_eq!(promoted, None, "threshold not met");
        let (revisions, promoted) = promote(revisions, Some(1), true);
        assert_eq!(promoted, Some(1));
        assert!(revisions[0].known_good && !revisions[1].known_good);
        assert_eq!(promote(revisions, Some(1), true).1, None, "once");
    }
}
