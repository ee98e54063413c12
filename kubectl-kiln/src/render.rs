//! The human tables of each report (`-o json|yaml` serialise the reports instead).

use kiln_crds::compiled_target::FallbackPolicy;

use crate::report::{HistoryRow, Status, Why, bytes, ms, or_dash, short, table};

/// `status`: a summary line, the classes, then the nodes.
pub fn status(s: &Status) -> String {
    let mut out = format!(
        "{}/{}: {} (revision {}{})\n\n",
        s.namespace,
        s.name,
        if s.ready { "Ready" } else { "NOT READY" },
        or_dash(s.revision),
        s.pinned_revision
            .map(|p| format!(", pinned to {p}"))
            .unwrap_or_default()
    );
    if let Some(b) = &s.auto_rollback {
        out.push_str(&format!(
            "Rolled back automatically from revision {} to {}: class {} {}\n",
            b.from_revision,
            b.to_revision,
            b.class,
            or_dash(b.reason.map(|r| r.as_str()))
        ));
    }
    out.push_str(&format!("{}\n\n", s.summary));
    let classes: Vec<Vec<String>> = s
        .classes
        .iter()
        .map(|c| {
            vec![
                c.class.clone(),
                c.phase.to_string(),
                or_dash(c.engine.as_deref()),
                format!("{}/{}", c.ready_nodes, c.nodes),
                c.failed_nodes.to_string(),
                or_dash(c.reason.map(|r| r.as_str())),
                c.message.clone().unwrap_or_default(),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "CLASS", "PHASE", "ENGINE", "READY", "FAILED", "REASON", "MESSAGE",
        ],
        &classes,
    ));
    // Why `auto` kept each class's engine, in full (too long for a column).
    for c in &s.classes {
        if let Some(why) = &c.engine_reason {
            out.push_str(&format!("{}: {why}\n", c.class));
        }
    }
    out.push('\n');
    let nodes: Vec<Vec<String>> = s.nodes.iter().map(node_cells).collect();
    if nodes.is_empty() {
        out.push_str("no node reports on this target yet\n");
    } else {
        out.push_str(&table(
            &[
                "NODE",
                "CLASS",
                "PHASE",
                "SERVES",
                "WANTS",
                "FALLBACK",
                "PARITY",
                "LOAD_MS",
                "WARMUP_MS",
                "P50_MS",
                "MEM",
                "GPU_MEM",
                "TTFT_MS",
                "DECODE_TOK/S",
                "FIRST_REQ_TTFT_MS",
                "REASON",
            ],
            &nodes,
        ));
    }
    out
}

/// One node's cells in `status`'s node table, in its columns' order.
fn node_cells(n: &crate::report::NodeRow) -> Vec<String> {
    vec![
        n.node.clone(),
        n.class.clone(),
        n.phase.as_str().to_string(),
        n.revision.to_string(),
        or_dash(n.desired_revision),
        or_dash(n.fallback.map(FallbackPolicy::as_str)),
        or_dash(n.parity_max_abs_error.map(|e| format!("{e:.2e}"))),
        ms(n.load_seconds),
        ms(n.warmup_seconds),
        ms(n.p50_seconds),
        bytes(n.peak_memory_bytes),
        bytes(n.peak_device_memory_bytes),
        ms(n.generation.map(|g| g.prefill_seconds)),
        or_dash(
            n.generation
                .map(|g| format!("{:.1}", g.decode_tokens_per_second)),
        ),
        ms(n.generation.and_then(|g| g.first_request_prefill_seconds)),
        or_dash(n.reason.map(|r| r.as_str())),
    ]
}

/// `history`: one line per revision and class, newest first.
pub fn history(rows: &[HistoryRow]) -> String {
    let mut lines = Vec::new();
    for r in rows {
        let mark = if r.current { "*" } else { "" };
        for (i, a) in r.artifacts.iter().enumerate() {
            let first = i == 0;
            lines.push(vec![
                if first {
                    format!("{}{mark}", r.number)
                } else {
                    String::new()
                },
                if first {
                    r.generation.to_string()
                } else {
                    String::new()
                },
                if first {
                    if r.known_good { "yes" } else { "no" }.to_string()
                } else {
                    String::new()
                },
                if first {
                    or_dash(r.created_at.as_ref().map(|t| t.0.to_string()))
                } else {
                    String::new()
                },
                a.class.clone(),
                short(&a.compile_key),
                short(&a.digest),
                if first {
                    if r.served_by.is_empty() {
                        "-".into()
                    } else {
                        r.served_by.join(",")
                    }
                } else {
                    String::new()
                },
            ]);
        }
    }
    if lines.is_empty() {
        return "no revisions yet\n".into();
    }
    table(
        &[
            "REVISION",
            "GENERATION",
            "KNOWN-GOOD",
            "CREATED",
            "CLASS",
            "COMPILE-KEY",
            "DIGEST",
            "SERVED-BY",
        ],
        &lines,
    ) + "(* = what nodes should serve now)\n"
}

/// `why`: the subject, each problem, the latest Events.
pub fn why(w: &Why) -> String {
    let mut out = format!("{}\n", w.subject);
    if w.ready {
        out.push_str("  nothing wrong: ready\n");
    }
    for p in &w.problems {
        out.push_str(&format!(
            "  {}\n    failing step: {}\n    reason:       {}\n    message:      {}\n",
            p.at,
            p.step,
            or_dash(p.reason.map(|r| r.as_str())),
            p.message
        ));
    }
    if !w.events.is_empty() {
        out.push_str("\nlast events:\n");
        let rows: Vec<Vec<String>> = w
            .events
            .iter()
            .map(|e| {
                vec![
                    or_dash(e.time.as_ref().map(|t| t.0.to_string())),
                    e.type_.clone(),
                    e.reason.clone(),
                    e.message.clone(),
                ]
            })
            .collect();
        out.push_str(&table(&["TIME", "TYPE", "REASON", "MESSAGE"], &rows));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{HISTORY, nodes, target};

    #[test]
    fn status_shows_the_engine_and_each_nodes_memory() {
        let shown = status(&crate::report::status(&target(HISTORY), &nodes()));
        assert!(
            shown.contains("onnxruntime/cpu")
                && shown.contains("cpu: onnxruntime/cpu kept: p50 6.100 ms"),
            "{shown}"
        );
        // Host and GPU memory per node; a node that measured none shows a dash, not 0.
        let a = shown.lines().find(|l| l.starts_with("a ")).expect("node a");
        assert!(a.contains("52.4 MB") && a.contains("1.3 GB"), "{shown}");
        // A language model's steady time to first token and decode rate, and the first
        // request after Ready apart; other nodes show dashes.
        assert!(
            a.contains(" 12.50 ") && a.contains(" 41.3 ") && a.contains(" 500.00 "),
            "{shown}"
        );
        assert!(
            shown.contains("TTFT_MS") && shown.contains("DECODE_TOK/S"),
            "{shown}"
        );
        assert!(shown.contains("GPU_MEM"), "{shown}");
        // The fallback column names the policy as specs, status and metrics do.
        let b = shown.lines().find(|l| l.starts_with("b ")).expect("node b");
        assert!(b.contains(" PreviousKnownGood "), "{shown}");
    }
}
