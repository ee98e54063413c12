//! For the components' tests only (feature `test-support`, a dev-dependency): checks an
//! exposition with the real `promtool`. Panics are the point here: they fail the calling test.

use std::io::Write;
use std::process::{Command, Stdio};

/// Whether a missing prerequisite must fail the test instead of skipping it: under CI
/// (`CI=true`, as `.ci/run` runs the suite), where every prerequisite is installed by the suite
/// itself and a skip would be a capability that silently stopped being tested.
pub fn must_run() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// A test that cannot run here for `why` (naming what installs its prerequisite): under CI
/// ([`must_run`]) a failure, elsewhere one line on stderr and the caller returns.
pub fn skip(why: &str) {
    assert!(!must_run(), "required under CI=true, but {why}");
    eprintln!("SKIPPED: {why}");
}

/// `promtool check metrics` on `text`; `Err` with the reason when promtool is absent and this
/// is not root (scripts/test.sh installs it as root, so there its absence is a failure), nor CI.
pub fn promtool_check(text: &str) -> Result<(), String> {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let uid = std::fs::read_to_string("/proc/self/status")
                .unwrap_or_default()
                .lines()
                .find_map(|l| {
                    l.strip_prefix("Uid:")?
                        .split_whitespace()
                        .next()
                        .map(String::from)
                });
            assert!(
                uid.as_deref() != Some("0") && !must_run(),
                "promtool is missing: scripts/test.sh installs it (Debian package prometheus)"
            );
            return Err("promtool not installed and not root (scripts/test.sh installs it)".into());
        }
        Err(e) => panic!("cannot run promtool: {e}"),
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool check metrics rejects the exposition:\n{}{}\n--- exposition:\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The chart's Grafana dashboard (`charts/kiln/files/dashboards/kiln.json`).
pub const DASHBOARD: &str = include_str!("../../charts/kiln/files/dashboards/kiln.json");

/// Every `kiln_…` metric name in the dashboard's queries (panel `expr`s and template variable
/// queries) that starts with `prefix`.
pub fn dashboard_metrics(prefix: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = DASHBOARD;
    while let Some(at) = rest.find("kiln_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        if name.starts_with(prefix) {
            names.insert(name.to_string());
        }
        rest = &tail[end..];
    }
    names
}

/// The names of `dashboard` that `exposition` (Prometheus text or OpenMetrics) does not export:
/// a name counts when a `# TYPE` line declares it, or its family (without `_total`, `_bucket`,
/// `_sum` or `_count`, or with `_total`).
pub fn not_exported(
    dashboard: &std::collections::BTreeSet<String>,
    exposition: &str,
) -> Vec<String> {
    let families: std::collections::BTreeSet<&str> = exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split_whitespace().next())
        .collect();
    dashboard
        .iter()
        .filter(|name| {
            let stripped = ["_total", "_bucket", "_sum", "_count"]
                .iter()
                .filter_map(|s| name.strip_suffix(s));
            let with_total = format!("{name}_total");
            !(families.contains(name.as_str())
                || families.contains(with_total.as_str())
                || stripped.into_iter().any(|f| families.contains(f)))
        })
        .cloned()
        .collect()
}
