//! ONNX Runtime's profile of an engine's first run (Chrome trace format), read for the
//! placement: which provider ran which node.

use std::path::Path;

use kiln_crds::placement::{PlacedNode, Placement};
use serde::Deserialize;

/// A profile bigger than this is not read (a run of a million nodes, or a hostile graph).
const MAX_PROFILE_BYTES: u64 = 256 << 20;

/// One event of ONNX Runtime's profile (Chrome trace format), as far as placement needs it.
#[derive(Deserialize)]
struct ProfileEvent {
    #[serde(default)]
    cat: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    args: ProfileArgs,
}

#[derive(Deserialize, Default)]
struct ProfileArgs {
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    op_name: Option<String>,
}

/// The placement a profile shows: every node event with its provider, in execution order; a
/// node run again (a loop body) counts once.
pub fn read_profile(file: &Path, requested: &str) -> std::result::Result<Placement, String> {
    let meta = std::fs::metadata(file).map_err(|e| e.to_string())?;
    if meta.len() > MAX_PROFILE_BYTES {
        return Err(format!(
            "{} bytes, more than the {MAX_PROFILE_BYTES} read",
            meta.len()
        ));
    }
    let bytes = std::fs::read(file).map_err(|e| e.to_string())?;
    placement_of(&bytes, requested)
}

fn placement_of(profile: &[u8], requested: &str) -> std::result::Result<Placement, String> {
    let events: Vec<ProfileEvent> = serde_json::from_slice(profile).map_err(|e| e.to_string())?;
    let mut seen = std::collections::BTreeSet::new();
    let mut ran = Vec::new();
    for e in events {
        let (Some(provider), Some(op)) = (e.args.provider, e.args.op_name) else {
            continue;
        };
        let Some(node) = e.name.strip_suffix("_kernel_time") else {
            continue;
        };
        if e.cat != "Node" || !seen.insert((node.to_string(), op.clone(), provider.clone())) {
            continue;
        }
        ran.push((
            provider,
            PlacedNode {
                name: node.to_string(),
                op_type: op,
            },
        ));
    }
    Ok(Placement::measure(
        requested,
        ran.iter().map(|(p, n)| (p.as_str(), n.clone())),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_profile_gives_providers_boundaries_and_fallback() {
        let profile = br#"[
 {"cat":"Session","name":"session_initialization","args":{}},
 {"cat":"Node","name":"conv1_kernel_time","args":{"provider":"CUDAExecutionProvider","op_name":"Conv"}},
 {"cat":"Node","name":"shape_kernel_time","args":{"provider":"CPUExecutionProvider","op_name":"Shape"}},
 {"cat":"Node","name":"shape_fence_before","args":{"provider":"CPUExecutionProvider","op_name":"Shape"}},
 {"cat":"Node","name":"relu_kernel_time","args":{"provider":"CUDAExecutionProvider","op_name":"Relu"}},
 {"cat":"Node","name":"relu_kernel_time","args":{"provider":"CUDAExecutionProvider","op_name":"Relu"}}
]"#;
        let p = placement_of(profile, "CUDAExecutionProvider").expect("profile");
        assert_eq!(
            p.nodes,
            BTreeMap::from([("cuda".into(), 2), ("cpu".into(), 1)])
        );
        assert_eq!(p.partitions, 3);
        assert_eq!(
            p.fallback_nodes,
            vec![PlacedNode {
                name: "shape".into(),
                op_type: "Shape".into()
            }]
        );
        assert!(placement_of(b"{not json", "cpu").is_err());
    }
}
