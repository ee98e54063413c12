//! ONNX Runtime's profile of an engine's first run (Chrome trace format), read for the
//! placement: which provider ran which node, for how long, and on tensors of which shapes.

use std::collections::BTreeMap;
use std::path::Path;

use kiln_crds::placement::{PlacedNode, Placement, RanNode, Work};
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
    /// Duration, microseconds.
    #[serde(default)]
    dur: i64,
    #[serde(default)]
    args: ProfileArgs,
}

#[derive(Deserialize, Default)]
struct ProfileArgs {
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    op_name: Option<String>,
    /// `[{"float":[1,3,224,224]}, …]`: one single-key object per input tensor. Kept as JSON
    /// so that a profile writing it otherwise loses only the shapes (its nodes read as compute),
    /// not the placement.
    #[serde(default)]
    input_type_shape: Option<serde_json::Value>,
    #[serde(default)]
    output_type_shape: Option<serde_json::Value>,
}

impl ProfileArgs {
    /// Every input and output tensor's dims, `None` unless the profile gives both lists in the
    /// form ONNX Runtime writes them.
    fn shapes(&self) -> Option<Vec<Vec<i64>>> {
        let mut all = tensor_dims(self.input_type_shape.as_ref()?)?;
        all.extend(tensor_dims(self.output_type_shape.as_ref()?)?);
        Some(all)
    }
}

/// The dims of each tensor of `[{"float":[1,3,224,224]}, …]`; `None` for anything else.
fn tensor_dims(list: &serde_json::Value) -> Option<Vec<Vec<i64>>> {
    let mut out = Vec::new();
    for tensor in list.as_array()? {
        let object = tensor.as_object().filter(|o| o.len() == 1)?;
        let dims = object.values().next()?.as_array()?;
        out.push(
            dims.iter()
                .map(serde_json::Value::as_i64)
                .collect::<Option<_>>()?,
        );
    }
    Some(out)
}

/// The placement a profile shows: every node event with its provider, in execution order; a
/// node run again (a loop body) counts once, its kernel time summed over its runs.
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
    let mut index: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    let mut ran: Vec<RanNode> = Vec::new();
    for e in events {
        let (Some(provider), Some(op)) = (&e.args.provider, &e.args.op_name) else {
            continue;
        };
        let Some(node) = e.name.strip_suffix("_kernel_time") else {
            continue;
        };
        if e.cat != "Node" {
            continue;
        }
        let work = Work::of(op, e.args.shapes().as_deref());
        let key = (node.to_string(), op.clone(), provider.clone());
        if let Some(seen) = index.get(&key).and_then(|&i: &usize| ran.get_mut(i)) {
            seen.kernel_micros += e.dur.max(0);
            seen.work = seen.work.and(work);
            continue;
        }
        index.insert(key, ran.len());
        ran.push(RanNode {
            provider: provider.clone(),
            node: PlacedNode {
                name: node.to_string(),
                op_type: op.clone(),
            },
            kernel_micros: e.dur.max(0),
            work,
        });
    }
    Ok(Placement::measure(requested, ran))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu_fallback::check;
    use kiln_crds::FailureReason;
    use kiln_crds::compiled_target::{CpuFallback, CpuFallbackPolicy};

    /// One node event as ONNX Runtime 1.31 writes it (`dur` in µs, shapes per tensor).
    fn event(name: &str, provider: &str, op: &str, dur: i64, io: (&str, &str)) -> String {
        format!(
            r#"{{"cat":"Node","pid":1,"tid":1,"dur":{dur},"ts":0,"ph":"X","name":"{name}_kernel_time","args":{{"op_name":"{op}","provider":"{provider}","input_type_shape":{},"output_type_shape":{}}}}}"#,
            io.0, io.1
        )
    }

    const CUDA: &str = "CUDAExecutionProvider";
    const CPU: &str = "CPUExecutionProvider";

    /// A detector's head as a GPU run profiles it: convolutions on CUDA, the reshape target
    /// computed on the CPU from int64 shape vectors, copied back, and `extra` appended.
    fn detector(extra: &[String]) -> Vec<u8> {
        let mut events = vec![
            r#"{"cat":"Session","name":"session_initialization","dur":5000,"args":{}}"#.to_string(),
            event(
                "conv",
                CUDA,
                "Conv",
                900,
                (
                    r#"[{"float":[1,3,640,640]},{"float":[16,3,3,3]}]"#,
                    r#"[{"float":[1,16,320,320]}]"#,
                ),
            ),
            event(
                "shape",
                CPU,
                "Shape",
                2,
                (r#"[{"float":[1,16,320,320]}]"#, r#"[{"int64":[4]}]"#),
            ),
            event(
                "gather",
                CPU,
                "Gather",
                1,
                (r#"[{"int64":[4]},{"int64":[]}]"#, r#"[{"int64":[]}]"#),
            ),
            event(
                "unsqueeze",
                CPU,
                "Unsqueeze",
                1,
                (r#"[{"int64":[]},{"int64":[1]}]"#, r#"[{"int64":[1]}]"#),
            ),
            event(
                "concat",
                CPU,
                "Concat",
                1,
                (r#"[{"int64":[1]},{"int64":[1]}]"#, r#"[{"int64":[2]}]"#),
            ),
            event(
                "copy",
                CUDA,
                "MemcpyFromHost",
                5,
                (r#"[{"int64":[2]}]"#, r#"[{"int64":[2]}]"#),
            ),
            event(
                "reshape",
                CUDA,
                "Reshape",
                20,
                (
                    r#"[{"float":[1,16,320,320]},{"int64":[2]}]"#,
                    r#"[{"float":[16,102400]}]"#,
                ),
            ),
        ];
        events.extend(extra.iter().cloned());
        format!("[{}]", events.join(",\n")).into_bytes()
    }

    fn policy(policy: CpuFallbackPolicy, max_share_percent: Option<u32>) -> CpuFallback {
        CpuFallback {
            policy,
            max_share_percent,
        }
    }

    #[test]
    fn a_profile_gives_providers_boundaries_kernel_time_and_transfers() {
        let relu = event("relu", CUDA, "Relu", 50, ("[]", "[]"));
        let p = placement_of(&detector(&[relu.clone(), relu]), CUDA).expect("profile");
        assert_eq!(
            p.nodes,
            BTreeMap::from([("cuda".into(), 4), ("cpu".into(), 4)]),
            "relu counted once"
        );
        assert_eq!(p.partitions, 3);
        assert!((p.kernel_seconds["cuda"] - 1025e-6).abs() < 1e-12, "{p:?}");
        assert!((p.kernel_seconds["cpu"] - 5e-6).abs() < 1e-12, "{p:?}");
        assert_eq!(p.transfer_count, 1);
        assert!((p.transfer_seconds - 5e-6).abs() < 1e-12);
        assert_eq!((p.fallback_node_count, p.shape_node_count), (4, 4));
        assert_eq!(p.compute_node_count, 0);
        let names: Vec<&str> = p.shape_nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["shape", "gather", "unsqueeze", "concat"]);
        assert!((p.fallback_time_share - 5.0 / 1030.0).abs() < 1e-12);
        assert!(placement_of(b"{not json", "cpu").is_err());
        // Shapes in another form are lost, not the placement: the node reads as compute.
        let odd = event("odd", CPU, "Gather", 1, (r#""[4]""#, r#"[{"int64":[1]}]"#));
        let p = placement_of(&detector(&[odd]), CUDA).expect("profile");
        assert_eq!((p.shape_node_count, p.compute_node_count), (4, 1));
    }

    #[test]
    fn shape_nodes_on_the_cpu_pass_forbidden_but_not_strict() {
        let p = placement_of(&detector(&[]), CUDA).expect("profile");
        check(
            "onnxruntime",
            &policy(CpuFallbackPolicy::Forbidden, None),
            &p,
        )
        .expect("only shape arithmetic on the CPU");
        let err = check("onnxruntime", &policy(CpuFallbackPolicy::Strict, None), &p)
            .expect_err("strict: no node on the CPU");
        assert!(err.to_string().contains("shape (Shape)"), "{err}");
    }

    #[test]
    fn a_compute_node_on_the_cpu_fails_forbidden_and_a_big_time_share_up_to_share() {
        let nms = event(
            "nms",
            CPU,
            "NonMaxSuppression",
            300,
            (
                r#"[{"float":[1,8400,4]},{"float":[1,80,8400]}]"#,
                r#"[{"int64":[300,3]}]"#,
            ),
        );
        let p = placement_of(&detector(&[nms]), CUDA).expect("profile");
        assert_eq!((p.shape_node_count, p.compute_node_count), (4, 1));
        let err = check(
            "onnxruntime",
            &policy(CpuFallbackPolicy::Forbidden, None),
            &p,
        )
        .expect_err("NonMaxSuppression is work");
        assert_eq!(err.reason(), FailureReason::UnsupportedOperator);
        let text = err.to_string();
        assert!(text.contains("nms (NonMaxSuppression)"), "{text}");
        assert!(
            !text.contains("gather (Gather)"),
            "shape nodes are not blamed: {text}"
        );
        // 305 of 1230 µs on the CPU: 24.8% of the time (by nodes it would be 5 of 8).
        let err = check(
            "onnxruntime",
            &policy(CpuFallbackPolicy::UpToShare, Some(20)),
            &p,
        )
        .expect_err("24.8% of the time > 20%");
        assert!(
            err.to_string().contains("24.8% of the kernel time"),
            "{err}"
        );
        check(
            "onnxruntime",
            &policy(CpuFallbackPolicy::UpToShare, Some(25)),
            &p,
        )
        .expect("24.8% ≤ 25%");
    }
}
