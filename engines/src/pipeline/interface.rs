//! The declared interface against the graph: `ModelArtifact.spec.inputs` (and `spec.outputs`
//! when given) must name exactly the graph's inputs (outputs), with the graph's dtypes and dims
//! it can take. Checked at compile time, where the graph is read, before anything is built.
//! Pure.

use std::collections::BTreeSet;

use kiln_crds::model_artifact::{ModelArtifactSpec, TensorSpec};

pub use crate::backend::tensor::host_dtype;
use crate::backend::{GraphInterface, TensorInfo};
use kiln_node_core::error::{Error, Result};

/// Checks `spec.inputs` against the graph's inputs, and `spec.outputs` (when not empty) against
/// its outputs.
pub fn check_declared(spec: &ModelArtifactSpec, graph: &GraphInterface) -> Result<()> {
    check_list("spec.inputs", &spec.inputs, &graph.inputs)?;
    if !spec.outputs.is_empty() {
        check_list("spec.outputs", &spec.outputs, &graph.outputs)?;
    }
    Ok(())
}

fn check_list(field: &str, declared: &[TensorSpec], graph: &[TensorInfo]) -> Result<()> {
    let want: BTreeSet<&String> = graph.iter().map(|t| &t.name).collect();
    let got: BTreeSet<&String> = declared.iter().map(|t| &t.name).collect();
    if want != got {
        let missing: Vec<_> = want.difference(&got).collect();
        let extra: Vec<_> = got.difference(&want).collect();
        return Err(Error::InvalidSpec(format!(
            "{field} names {got:?}, the graph has {want:?} (undeclared: {missing:?}, not in the graph: {extra:?}); make {field} name exactly the graph's tensors"
        )));
    }
    for (i, d) in declared.iter().enumerate() {
        let Some(g) = graph.iter().find(|g| g.name == d.name) else {
            continue;
        };
        let at = format!("{field}[{i}] ({})", d.name);
        if let Some(g_dtype) = g.dtype
            && host_dtype(d.dtype) != g_dtype
        {
            return Err(Error::InvalidSpec(format!(
                "{at}.dtype is {:?}, the graph's is {g_dtype:?}; set {field}[{i}].dtype to the graph's",
                d.dtype
            )));
        }
        let Some(g_dims) = &g.dims else {
            continue;
        };
        if g_dims.len() != d.dims.len() {
            return Err(Error::InvalidSpec(format!(
                "{at}.dims has {} dims, the graph's has {} ({}); declare one dim per graph dim",
                d.dims.len(),
                g_dims.len(),
                show(g_dims)
            )));
        }
        for (j, (dd, gd)) in d.dims.iter().zip(g_dims).enumerate() {
            // A symbolic declared dim takes any graph dim (profiles bind it); a fixed one must
            // equal a fixed graph dim.
            if let (Some(size), Some(g_size)) = (dd.size, gd)
                && usize::try_from(size).ok() != Some(*g_size)
            {
                return Err(Error::InvalidSpec(format!(
                    "{at}.dims[{j}].size is {size}, the graph's dim is {g_size} ({}); fix {field}[{i}].dims[{j}]",
                    show(g_dims)
                )));
            }
        }
    }
    Ok(())
}

fn show(dims: &[Option<usize>]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| d.map_or_else(|| "?".to_string(), |n| n.to_string()))
        .collect();
    format!("[{}]", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::Dtype;

    fn spec(yaml: &str) -> ModelArtifactSpec {
        serde_saphyr::from_str(yaml).expect("spec yaml")
    }

    fn graph() -> GraphInterface {
        GraphInterface {
            inputs: vec![TensorInfo {
                name: "x".into(),
                dtype: Some(Dtype::F32),
                dims: Some(vec![None, Some(16)]),
            }],
            outputs: vec![TensorInfo {
                name: "y".into(),
                dtype: Some(Dtype::F32),
                dims: Some(vec![None, Some(10)]),
            }],
        }
    }

    const BASE: &str = r#"
source: {uri: "file://m.onnx", sha256: "00", size: 1}
format: onnx
"#;

    fn check(io: &str) -> Result<()> {
        check_declared(&spec(&format!("{BASE}{io}")), &graph())
    }

    #[test]
    fn matching_declaration_passes_and_outputs_are_optional() {
        check("inputs: [{name: x, dtype: f32, dims: [{symbol: b, min: 1, max: 8}, {size: 16}]}]")
            .expect("inputs only");
        check(
            "inputs: [{name: x, dtype: f32, dims: [{size: 4}, {symbol: f, min: 1, max: 16}]}]\noutputs: [{name: \"y\", dtype: f32, dims: [{symbol: b, min: 1, max: 8}, {size: 10}]}]",
        )
        .expect("fixed declared against symbolic graph dim, symbolic against fixed");
    }

    #[test]
    fn names_dtypes_and_dims_must_match_the_graph() {
        let msg = |io: &str| match check(io) {
            Err(Error::InvalidSpec(m)) => m,
            other => panic!("{io}: {other:?}"),
        };
        let m = msg("inputs: [{name: input, dtype: f32, dims: [{size: 1}, {size: 16}]}]");
        assert!(
            m.contains("spec.inputs names {\"input\"}") && m.contains("undeclared: [\"x\"]"),
            "{m}"
        );
        let m = msg("inputs: [{name: x, dtype: i64, dims: [{size: 1}, {size: 16}]}]");
        assert!(
            m.contains("spec.inputs[0] (x).dtype is I64, the graph's is F32"),
            "{m}"
        );
        let m = msg("inputs: [{name: x, dtype: f32, dims: [{size: 1}, {size: 15}]}]");
        assert!(
            m.contains("spec.inputs[0] (x).dims[1].size is 15, the graph's dim is 16"),
            "{m}"
        );
        let m = msg("inputs: [{name: x, dtype: f32, dims: [{size: 16}]}]");
        assert!(m.contains("has 1 dims, the graph's has 2 ([?, 16])"), "{m}");
        let m = msg(
            "inputs: [{name: x, dtype: f32, dims: [{size: 1}, {size: 16}]}]\noutputs: [{name: z, dtype: f32, dims: []}]",
        );
        assert!(m.contains("spec.outputs names {\"z\"}"), "{m}");
    }
}
