//! Mirrors of the store's registry, named as containerd's `hosts.toml` names them: a list of
//! endpoints (`host`, a URL) tried in order, each with its `capabilities` (`pull`: manifests and
//! blobs by digest; `resolve`: by tag, which the attestation's `sha256-<hex>.att` is; both when
//! not given, as containerd), the origin last. A mirror gets no credentials (a pull-through cache
//! holds its own for the origin) and is trusted with nothing: every manifest and blob it serves
//! is verified as the origin's would be, and one that fails (unreachable, missing, wrong bytes)
//! is passed over for the next, its reason kept for the agent's metrics
//! ([`crate::Store::take_mirror_skips`]). Pure: the configuration and the reasons; the pulls
//! through mirrors are `OciStore`'s (`mod.rs`).

use serde::Deserialize;

use crate::Error;

/// One mirror endpoint, as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// `HOST[:PORT]`.
    pub host: String,
    /// Plain HTTP (`http://`).
    pub http: bool,
    /// May serve manifests and blobs by digest.
    pub pull: bool,
    /// May serve tags.
    pub resolve: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Configured {
    host: String,
    capabilities: Option<Vec<String>>,
}

/// Parses the mirrors of `KILN_REGISTRY_MIRRORS`: a JSON list such as
/// `[{"host": "http://cache.internal:5000", "capabilities": ["pull"]}]`.
pub fn parse(json: &str) -> std::result::Result<Vec<Endpoint>, String> {
    let configured: Vec<Configured> = serde_json::from_str(json).map_err(|e| {
        format!(
            "not a list of {{\"host\": \"https://HOST[:PORT]\", \"capabilities\": [\"pull\", \"resolve\"]}}: {e}"
        )
    })?;
    configured.into_iter().map(endpoint).collect()
}

fn endpoint(c: Configured) -> std::result::Result<Endpoint, String> {
    let (http, rest) = match c.host.split_once("://") {
        Some(("http", rest)) => (true, rest),
        Some(("https", rest)) => (false, rest),
        _ => {
            return Err(format!(
                "mirror {:?}: expected http:// or https://HOST[:PORT]",
                c.host
            ));
        }
    };
    let host = rest.trim_end_matches('/');
    if host.is_empty() || host.contains(['/', '?', '#', '@']) {
        return Err(format!(
            "mirror {:?}: only a scheme and HOST[:PORT]; kiln asks a mirror for the origin's repository path",
            c.host
        ));
    }
    let capabilities = c
        .capabilities
        .unwrap_or_else(|| vec!["pull".into(), "resolve".into()]);
    if let Some(other) = capabilities
        .iter()
        .find(|c| !matches!(c.as_str(), "pull" | "resolve" | "push"))
    {
        return Err(format!(
            "mirror {:?}: capability {other:?}; expected pull, resolve or push",
            c.host
        ));
    }
    Ok(Endpoint {
        host: host.into(),
        http,
        pull: capabilities.iter().any(|c| c == "pull"),
        resolve: capabilities.iter().any(|c| c == "resolve"),
    })
}

/// The metric label of an error a mirror gave.
pub(super) fn reason(err: &Error) -> &'static str {
    match err {
        Error::HashMismatch { .. } | Error::Refused { .. } => "hash_mismatch",
        Error::Unavailable { .. } => "unavailable",
        _ => "invalid",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors_are_read_as_containerd_names_them() {
        let m = parse(r#"[{"host": "http://cache:5000/", "capabilities": ["pull"]}, {"host": "https://m.example"}]"#)
            .expect("parsed");
        assert_eq!(
            m,
            vec![
                Endpoint {
                    host: "cache:5000".into(),
                    http: true,
                    pull: true,
                    resolve: false
                },
                Endpoint {
                    host: "m.example".into(),
                    http: false,
                    pull: true,
                    resolve: true
                },
            ]
        );
        assert_eq!(parse("[]").expect("parsed"), vec![]);
    }

    #[test]
    fn a_mirror_that_cannot_be_used_as_written_is_refused_saying_why() {
        for (json, says) in [
            (r#"[{"host": "cache:5000"}]"#, "http:// or https://"),
            (r#"[{"host": "ftp://cache"}]"#, "http:// or https://"),
            (
                r#"[{"host": "https://cache/v2/kiln"}]"#,
                "only a scheme and HOST",
            ),
            (
                r#"[{"host": "https://u:p@cache"}]"#,
                "only a scheme and HOST",
            ),
            (
                r#"[{"host": "https://cache", "capabilities": ["pul"]}]"#,
                "capability \"pul\"",
            ),
            (
                r#"[{"host": "https://cache", "skip_verify": true}]"#,
                "unknown field",
            ),
            (r#"{"host": "https://cache"}"#, "not a list"),
        ] {
            let e = parse(json).expect_err("refused");
            assert!(e.contains(says), "{json}: {e}");
        }
    }
}
