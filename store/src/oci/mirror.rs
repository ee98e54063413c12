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

/// The mirrors of `registry` in `KILN_REGISTRY_MIRRORS`, which is either a JSON list of
/// endpoints, the mirrors of the store's registry, such as
/// `[{"host": "http://cache.internal:5000", "capabilities": ["pull"]}]`; or an object of such
/// lists keyed by the registry they mirror (`HOST[:PORT]`, as containerd's
/// `certs.d/HOST[:PORT]/hosts.toml`), with `_default` for every registry not named, so that
/// `oci://` model sources in other registries are pulled through mirrors too. The list form is
/// only ever given for the store's registry (`engines/src/pipeline/fetch.rs` passes the object
/// form alone to another registry); every list is checked, named or not.
pub fn parse(json: &str, registry: &str) -> std::result::Result<Vec<Endpoint>, String> {
    let list =
        "a list of {\"host\": \"https://HOST[:PORT]\", \"capabilities\": [\"pull\", \"resolve\"]}";
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
    let endpoints = |v: serde_json::Value, of: &str| {
        let configured: Vec<Configured> =
            serde_json::from_value(v).map_err(|e| format!("{of}not {list}: {e}"))?;
        configured
            .into_iter()
            .map(endpoint)
            .collect::<std::result::Result<Vec<_>, _>>()
    };
    match value {
        serde_json::Value::Object(by_registry) => {
            let mut mine = None;
            let mut default = Vec::new();
            for (name, v) in by_registry {
                let parsed = endpoints(v, &format!("{name:?}: "))?;
                if name == registry {
                    mine = Some(parsed);
                } else if name == "_default" {
                    default = parsed;
                } else if name.is_empty() || name.contains(['/', '@', '?', '#']) {
                    return Err(format!(
                        "{name:?}: key the mirrors by the registry they mirror, HOST[:PORT], or _default"
                    ));
                }
            }
            Ok(mine.unwrap_or(default))
        }
        v => endpoints(v, "")
            .map_err(|e| format!("{e}; or an object of such lists keyed by registry HOST[:PORT]")),
    }
}

/// Whether `json` is the object form of [`parse`] (mirrors keyed by registry), which applies to
/// any registry, not only the store's.
pub fn keyed_by_registry(json: &str) -> bool {
    json.trim_start().starts_with('{')
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
        let m = parse(
            r#"[{"host": "http://cache:5000/", "capabilities": ["pull"]}, {"host": "https://m.example"}]"#,
            "registry:5000",
        )
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
        assert_eq!(parse("[]", "registry:5000").expect("parsed"), vec![]);
    }

    #[test]
    fn mirrors_keyed_by_registry_apply_to_that_registry_else_the_default() {
        let json = r#"{"models.example": [{"host": "https://hub-cache"}],
            "_default": [{"host": "http://cache:5000", "capabilities": ["pull"]}]}"#;
        let hosts = |registry| -> Vec<String> {
            parse(json, registry)
                .expect("parsed")
                .into_iter()
                .map(|e| e.host)
                .collect()
        };
        assert_eq!(hosts("models.example"), ["hub-cache"]);
        assert_eq!(hosts("registry:5000"), ["cache:5000"]);
        let no_default = r#"{"models.example": [{"host": "https://hub-cache"}]}"#;
        assert_eq!(parse(no_default, "registry:5000").expect("parsed"), vec![]);
        assert!(keyed_by_registry(json) && !keyed_by_registry("[]"));
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
            (r#"{"host": "https://cache"}"#, "\"host\": not a list"),
            (r#""cache""#, "or an object of such lists"),
            (r#"{"r": [{"host": "cache"}]}"#, "http:// or https://"),
            (r#"{"r/kiln": []}"#, "HOST[:PORT], or _default"),
            ("[", "not JSON"),
        ] {
            let e = parse(json, "r").expect_err("refused");
            assert!(e.contains(says), "{json}: {e}");
        }
    }
}
