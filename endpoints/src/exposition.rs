//! Which metrics text format a scraper gets (HTTP content negotiation): OpenMetrics when its
//! `Accept` asks for it, else the Prometheus text format 0.0.4 (what `promtool check metrics`
//! and older scrapers read), made from prometheus-client's OpenMetrics text. Pure text in, text
//! out but for [`encode`], which reads the registry; shared by the operator and the agent so
//! both serve the same bytes for the same request.

use prometheus_client::registry::Registry;

/// `Content-Type` of an OpenMetrics response.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// `Content-Type` of a Prometheus text 0.0.4 response.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The registry's exposition for a scraper that sent `accept`: Prometheus text 0.0.4 unless it
/// asks for OpenMetrics ([`negotiate`]). Returns body and content type.
pub fn encode(registry: &Registry, accept: Option<&str>) -> (String, &'static str) {
    let mut out = String::new();
    // Encoding into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    negotiate(accept, &out)
}

/// The body and `Content-Type` for a scraper that sent `accept`, from an OpenMetrics exposition.
pub fn negotiate(accept: Option<&str>, openmetrics: &str) -> (String, &'static str) {
    if accept.is_some_and(wants_openmetrics) {
        (openmetrics.to_string(), OPENMETRICS)
    } else {
        (to_prometheus_text(openmetrics), PROMETHEUS_TEXT)
    }
}

/// True when `accept` ranks `application/openmetrics-text` above zero and at least as high as
/// any `text/plain` (Prometheus sends both, OpenMetrics first, with q-values).
pub fn wants_openmetrics(accept: &str) -> bool {
    let (mut openmetrics, mut text) = (0.0_f64, 0.0_f64);
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
            .map_or(1.0, |(_, v)| v.trim().parse().unwrap_or(0.0));
        match media.as_str() {
            "application/openmetrics-text" => openmetrics = openmetrics.max(q),
            "text/plain" | "text/*" | "*/*" => text = text.max(q),
            _ => {}
        }
    }
    openmetrics > 0.0 && openmetrics >= text
}

/// Prometheus text 0.0.4 from OpenMetrics text: counters' `HELP`/`TYPE` name the `_total`
/// series, `info` becomes a gauge named `_info`, `unknown` becomes `untyped`, and `# UNIT`,
/// `# EOF` and exemplars are dropped (0.0.4 has none of them).
pub fn to_prometheus_text(openmetrics: &str) -> String {
    // TYPE follows HELP in OpenMetrics, so read every family's type before writing any HELP.
    let kinds: std::collections::HashMap<&str, &str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split_once(' '))
        .map(|(name, kind)| (name, kind.trim()))
        .collect();
    let renamed = |name: &str| -> (String, &'static str) {
        let (suffix, kind) = match kinds.get(name).copied().unwrap_or("unknown") {
            "counter" => ("_total", "counter"),
            "info" => ("_info", "gauge"),
            "gauge" | "stateset" => ("", "gauge"),
            "histogram" => ("", "histogram"),
            "summary" => ("", "summary"),
            _ => ("", "untyped"),
        };
        (format!("{name}{suffix}"), kind)
    };
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split_once(' ').map_or(rest, |(n, _)| n);
            let (name, kind) = renamed(name);
            out.push_str(&format!("# TYPE {name} {kind}\n"));
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            // OpenMetrics may escape `"` in HELP; 0.0.4 escapes only `\` and newline.
            let help = help.replace("\\\"", "\"");
            out.push_str(&format!("# HELP {} {help}\n", renamed(name).0));
        } else if line.starts_with("# UNIT ") || line == "# EOF" || line.is_empty() {
            continue;
        } else if line.starts_with('#') {
            out.push_str(line);
            out.push('\n');
        } else {
            out.push_str(without_exemplar(line));
            out.push('\n');
        }
    }
    out
}

/// A sample line without its ` # {…} value` exemplar; label values may contain `#`, so the
/// search starts after the label set's closing brace.
fn without_exemplar(line: &str) -> &str {
    let mut after_labels = 0;
    // A label set starts right after the name, before the first space.
    let open = line
        .find('{')
        .filter(|&o| line.find(' ').is_none_or(|sp| o < sp));
    if let Some(open) = open {
        let (mut in_quotes, mut escaped) = (false, false);
        for (i, c) in line[open..].char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if in_quotes => escaped = true,
                '"' => in_quotes = !in_quotes,
                '}' if !in_quotes => {
                    after_labels = open + i + 1;
                    break;
                }
                _ => {}
            }
        }
    }
    match line[after_labels..].find(" # ") {
        Some(at) => &line[..after_labels + at],
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OM: &str = "\
# HELP kiln_jobs Compile Jobs by \\\"class\\\".
# TYPE kiln_jobs counter
kiln_jobs_total{class=\"a # {b}\",result=\"ok\"} 3 # {trace=\"x\"} 1.0
# HELP kiln_up_seconds Uptime.
# TYPE kiln_up_seconds gauge
# UNIT kiln_up_seconds seconds
kiln_up_seconds 4.5
# HELP kiln_build Build.
# TYPE kiln_build info
kiln_build_info{version=\"1\"} 1
# HELP kiln_odd Odd.
# TYPE kiln_odd unknown
kiln_odd 1
# HELP kiln_lat Latency.
# TYPE kiln_lat histogram
kiln_lat_sum 0.5
kiln_lat_count 1
kiln_lat_bucket{le=\"+Inf\"} 1
# EOF
";

    #[test]
    fn counters_name_the_total_series_and_openmetrics_only_parts_go() {
        let text = to_prometheus_text(OM);
        let want = "\
# HELP kiln_jobs_total Compile Jobs by \"class\".
# TYPE kiln_jobs_total counter
kiln_jobs_total{class=\"a # {b}\",result=\"ok\"} 3
# HELP kiln_up_seconds Uptime.
# TYPE kiln_up_seconds gauge
kiln_up_seconds 4.5
# HELP kiln_build_info Build.
# TYPE kiln_build_info gauge
kiln_build_info{version=\"1\"} 1
# HELP kiln_odd Odd.
# TYPE kiln_odd untyped
kiln_odd 1
# HELP kiln_lat Latency.
# TYPE kiln_lat histogram
kiln_lat_sum 0.5
kiln_lat_count 1
kiln_lat_bucket{le=\"+Inf\"} 1
";
        assert_eq!(text, want);
    }

    #[test]
    fn a_counter_family_without_samples_still_gets_total() {
        let text = to_prometheus_text("# HELP c C.\n# TYPE c counter\n# EOF\n");
        assert_eq!(text, "# HELP c_total C.\n# TYPE c_total counter\n");
    }

    #[test]
    fn exemplar_without_labels_is_dropped() {
        assert_eq!(without_exemplar("c_total 2 # {id=\"1\"} 1.0"), "c_total 2");
        assert_eq!(without_exemplar("c_total 2"), "c_total 2");
        assert_eq!(
            without_exemplar(r#"c_total{a="x\"}#"} 2"#),
            r#"c_total{a="x\"}#"} 2"#
        );
    }

    #[test]
    fn accept_header_picks_the_format() {
        // What Prometheus 2.x sends.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(wants_openmetrics(prometheus));
        assert!(wants_openmetrics("application/openmetrics-text"));
        for plain in [
            "",
            "*/*",
            "text/plain",
            "text/plain;version=0.0.4",
            "text/plain, application/openmetrics-text;q=0.5",
            "application/openmetrics-text;q=0",
            "application/json",
        ] {
            assert!(!wants_openmetrics(plain), "{plain:?}");
        }
        let (body, ct) = negotiate(Some(prometheus), OM);
        assert_eq!((body.as_str(), ct), (OM, OPENMETRICS));
        let (body, ct) = negotiate(None, OM);
        assert_eq!(ct, PROMETHEUS_TEXT);
        assert!(!body.contains("# EOF") && body.contains("# TYPE kiln_jobs_total counter"));
    }
}
