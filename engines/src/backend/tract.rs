//! The built-in tract backend. Compile: ONNX → typed with each profile's concrete dims →
//! decluttered → NNEF. The artifact is a deterministic tar holding one NNEF tarball per profile
//! and an index; load optimises each profile for this CPU.
//! Reads the model, writes (fsynced) only the artifact path it is given.

use std::collections::BTreeMap;
use std::path::Path;

use kiln_crds::compiled_target::Precision;
use serde::{Deserialize, Serialize};
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::*;

use super::archive::{append, entries};
use super::tract_unsupported as unsupported;
use super::{Backend, CompileRequest, Compiled, Engine, InputInfo, Shapes};
use crate::backend::tensor::HostTensor;
use kiln_node_core::error::{Error, Result, chain};

/// tract, linked into kiln-agent.
pub struct Tract;

/// The tract version this binary links (kept equal to the workspace's tract dependency).
pub const TRACT_VERSION: &str = "0.23.9";
const MEDIA_TYPE: &str = "application/vnd.kiln.tract.nnef-profiles.v1.tar";
const INDEX: &str = "kiln-profiles.json";

/// The index inside an artifact: input and output order of every profile's graph.
#[derive(Serialize, Deserialize)]
struct Index {
    profiles: Vec<ProfileEntry>,
}

#[derive(Serialize, Deserialize)]
struct ProfileEntry {
    name: String,
    file: String,
    inputs: Vec<(String, Vec<usize>)>,
    outputs: Vec<String>,
}

type Plan = std::sync::Arc<TypedSimplePlan>;

impl Backend for Tract {
    fn name(&self) -> &'static str {
        "tract"
    }

    fn version(&self) -> String {
        TRACT_VERSION.to_string()
    }

    fn media_type(&self) -> &'static str {
        MEDIA_TYPE
    }

    fn compile(&self, req: &CompileRequest<'_>) -> Result<Compiled> {
        if req.precision != Precision::Fp32 {
            return Err(Error::InvalidSpec(format!(
                "the tract backend compiles precision fp32 only, not {}; set precision: fp32",
                req.precision.as_str()
            )));
        }
        if let Some(flag) = req.flags.keys().next() {
            return Err(Error::InvalidSpec(format!(
                "the tract backend takes no flags; remove backend.flags.{flag}"
            )));
        }
        if req.provider != kiln_crds::compiled_target::ExecutionProvider::Cpu {
            return Err(Error::InvalidSpec(format!(
                "the tract backend runs on the CPU, not {}; set backend.executionProvider: cpu or kind: onnxruntime",
                req.provider.as_str()
            )));
        }
        let mut log = Vec::new();
        let nnef = super::tract_nnef::framework();
        let mut index = Index {
            profiles: Vec::new(),
        };
        let mut outer = tar::Builder::new(Vec::new());
        let mut outputs = Vec::new();
        for (profile, shapes) in req.profiles {
            let (typed, entry) = typed_for(req.model, profile, shapes, true, &mut log)?;
            let mut nnef_tar = Vec::new();
            nnef.write_to_tar_with_config(&typed, &mut nnef_tar, false, true)
                .map_err(|e| {
                    Error::CompileFailed(format!("profile {profile}: writing NNEF: {}", chain(&e)))
                })?;
            log.push(format!(
                "profile {profile}: NNEF {} bytes, {} nodes",
                nnef_tar.len(),
                typed.nodes().len()
            ));
            append(&mut outer, &entry.file, &nnef_tar)?;
            outputs.clone_from(&entry.outputs);
            index.profiles.push(entry);
        }
        let index_json =
            serde_json::to_vec_pretty(&index).map_err(|e| Error::CompileFailed(e.to_string()))?;
        append(&mut outer, INDEX, &index_json)?;
        let bytes = outer
            .into_inner()
            .map_err(|e| Error::CompileFailed(e.to_string()))?;
        kiln_store::staged::write_synced(req.out, &bytes).map_err(|e| Error::store(req.out, e))?;
        Ok(Compiled {
            outputs,
            log,
            machine_bound: None,
            resolved: BTreeMap::new(),
        })
    }

    fn load(&self, artifact: &Path) -> Result<Box<dyn Engine>> {
        let load_failed = |m: String| Error::LoadFailed(format!("{}: {m}", artifact.display()));
        let files = entries(artifact).map_err(load_failed)?;
        let index: Index = files
            .get(INDEX)
            .ok_or_else(|| load_failed(format!("no {INDEX}: not a kiln tract artifact")))
            .and_then(|b| {
                serde_json::from_slice(b).map_err(|e| load_failed(format!("{INDEX}: {e}")))
            })?;
        let nnef = super::tract_nnef::framework();
        let mut profiles = Vec::new();
        for entry in index.profiles {
            let bytes = files
                .get(&entry.file)
                .ok_or_else(|| load_failed(format!("missing {}", entry.file)))?;
            let plan = nnef
                .model_for_read(&mut bytes.as_slice())
                .and_then(|m| m.into_optimized())
                .and_then(|m| m.into_runnable())
                .map_err(|e| load_failed(format!("profile {}: {}", entry.name, chain(&e))))?;
            profiles.push((entry, plan));
        }
        Ok(Box::new(TractEngine { profiles }))
    }

    fn reference(&self, model: &Path, shapes: &Shapes) -> Result<Box<dyn Engine>> {
        let mut log = Vec::new();
        let (typed, entry) = typed_for(model, "reference", shapes, false, &mut log)?;
        let plan = typed
            .into_runnable()
            .map_err(|e| Error::LoadFailed(chain(&e)))?;
        Ok(Box::new(TractEngine {
            profiles: vec![(entry, plan)],
        }))
    }

    fn inputs(&self, model: &Path) -> Result<Vec<InputInfo>> {
        let inference = read_onnx(&tract_onnx::onnx(), model)?;
        let outlets = inference
            .input_outlets()
            .map_err(|e| Error::CompileFailed(chain(&e)))?;
        outlets
            .iter()
            .enumerate()
            .map(|(ix, o)| {
                let fact = inference
                    .input_fact(ix)
                    .map_err(|e| Error::CompileFailed(chain(&e)))?;
                let dt = fact.datum_type.concretize().unwrap_or(f32::datum_type());
                let dtype = crate::backend::tensor::safetensors_dtype(dt).ok_or_else(|| {
                    Error::UnsupportedOperator {
                        backend: "tract".into(),
                        operators: vec![format!("input dtype {dt:?}")],
                    }
                })?;
                let dims = fact
                    .shape
                    .dims()
                    .map(|d| d.concretize().and_then(|d| d.to_usize().ok()))
                    .collect();
                Ok(InputInfo {
                    name: inference.node(o.node).name.clone(),
                    dtype,
                    dims,
                })
            })
            .collect()
    }

    fn interface(&self, model: &Path) -> Result<super::GraphInterface> {
        // Output shapes and types as the file states them (tract ignores them by default).
        let inference = read_onnx(&tract_onnx::onnx().with_ignore_output_shapes(false), model)?;
        let failed = |e: TractError| Error::CompileFailed(chain(&e));
        let mut graph = super::GraphInterface::default();
        for (ix, o) in inference
            .input_outlets()
            .map_err(failed)?
            .iter()
            .enumerate()
        {
            let fact = inference.input_fact(ix).map_err(failed)?;
            graph
                .inputs
                .push(tensor_info(inference.node(o.node).name.clone(), fact));
        }
        for (ix, o) in inference
            .output_outlets()
            .map_err(failed)?
            .iter()
            .enumerate()
        {
            let fact = inference.output_fact(ix).map_err(failed)?;
            let name = inference
                .outlet_label(*o)
                .map(str::to_string)
                .unwrap_or_else(|| inference.node(o.node).name.clone());
            graph.outputs.push(tensor_info(name, fact));
        }
        // A graph input or output of a type no fixture can hold (strings, complex numbers) can
        // be neither fed nor compared: refused here, not at the first warmup run.
        let mut unsupported = Vec::new();
        for (what, facts) in [
            ("input", inference.input_outlets()),
            ("output", inference.output_outlets()),
        ] {
            for (ix, o) in facts.map_err(failed)?.iter().enumerate() {
                let fact = if what == "input" {
                    inference.input_fact(ix)
                } else {
                    inference.output_fact(ix)
                }
                .map_err(failed)?;
                if let Some(dt) = fact.datum_type.concretize()
                    && crate::backend::tensor::safetensors_dtype(dt).is_none()
                {
                    let name = inference
                        .outlet_label(*o)
                        .map(str::to_string)
                        .unwrap_or_else(|| inference.node(o.node).name.clone());
                    unsupported.push(format!("{what} {name} of dtype {dt:?}"));
                }
            }
        }
        if !unsupported.is_empty() {
            return Err(Error::UnsupportedOperator {
                backend: "tract".into(),
                operators: unsupported,
            });
        }
        Ok(graph)
    }
}

/// The newest ai.onnx operator set and IR version an ONNX release defines (onnx 1.23: opset 28,
/// IR version 14). tract parses a model that claims a newer one anyway (it only logs a warning
/// outside opsets 9 to 18), reading its operators as the versions it knows; such a model comes
/// from a future exporter or is forged, and is refused rather than built on a guess.
const NEWEST_OPSET: i64 = 28;
const NEWEST_IR_VERSION: i64 = 14;

/// Reads an ONNX file as `onnx` is configured, with external data resolved beside it (as
/// `model_for_path` does), refusing operator sets and IR versions from the future.
fn read_onnx(onnx: &tract_onnx::Onnx, model: &Path) -> Result<InferenceModel> {
    parse_onnx(onnx, model).map(|(_, inference)| inference)
}

/// [`read_onnx`], keeping the protobuf it parsed.
fn parse_onnx(
    onnx: &tract_onnx::Onnx,
    model: &Path,
) -> Result<(tract_onnx::pb::ModelProto, InferenceModel)> {
    let unreadable = |e: TractError| {
        Error::CompileFailed(format!(
            "cannot read ONNX model {}: {}",
            model.display(),
            chain(&e)
        ))
    };
    let proto = onnx.proto_model_for_path(model).map_err(unreadable)?;
    if proto.ir_version > NEWEST_IR_VERSION {
        return Err(unreadable(format_err!(
            "IR version {} is newer than any ONNX release ({NEWEST_IR_VERSION} is the newest)",
            proto.ir_version
        )));
    }
    if let Some(opset) = proto
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        && opset > NEWEST_OPSET
    {
        return Err(Error::UnsupportedOperator {
            backend: "tract".into(),
            operators: vec![format!(
                "operator set ai.onnx {opset} (no ONNX release defines it; {NEWEST_OPSET} is the newest)"
            )],
        });
    }
    let dir = model.parent().and_then(Path::to_str);
    let parsed = onnx.parse(&proto, dir).map_err(unreadable)?;
    if !parsed.unresolved_inputs.is_empty() {
        return Err(unreadable(format_err!(
            "Could not resolve inputs at top-level: {:?}",
            parsed.unresolved_inputs
        )));
    }
    Ok((proto, parsed.model))
}

/// What an inference fact states: dtype if concrete, dims if the rank is known.
fn tensor_info(name: String, fact: &InferenceFact) -> super::TensorInfo {
    let dtype = fact
        .datum_type
        .concretize()
        .and_then(crate::backend::tensor::safetensors_dtype);
    let dims = (!fact.shape.is_open()).then(|| {
        fact.shape
            .dims()
            .map(|d| d.concretize().and_then(|d| d.to_usize().ok()))
            .collect()
    });
    super::TensorInfo { name, dtype, dims }
}

/// Parses the ONNX file, binds the input shapes and types it; for an `artifact`, also refuses
/// what an artifact cannot hold and declutters.
fn typed_for(
    model: &Path,
    profile: &str,
    shapes: &Shapes,
    artifact: bool,
    log: &mut Vec<String>,
) -> Result<(TypedModel, ProfileEntry)> {
    // Every profile binds every input dim, so the graph is typed from those concrete dims alone.
    // The file's own intermediate and output shapes are left out: exporters write them with
    // their symbols (`batch,16,(height+1)/2,…`), which cannot unify with the profile's numbers.
    let onnx = tract_onnx::onnx()
        .with_ignore_value_info(true)
        .with_ignore_output_shapes(true);
    let (proto, mut inference) = parse_onnx(&onnx, model)?;
    let mut refused = unsupported::unimplemented(&inference);
    if artifact && let Some(graph) = &proto.graph {
        // The reference execution runs an `If` by evaluating its condition; only an artifact
        // needs the branch chosen at compile time.
        refused.extend(unsupported::runtime_conditions(graph));
    }
    unsupported::refuse(refused)?;
    let inputs = bind_inputs(&mut inference, shapes)?;
    let typed = inference.into_typed().map_err(|e| {
        Error::CompileFailed(format!(
            "profile {profile}: shapes {shapes:?} do not fit the graph: {}",
            chain(&e)
        ))
    })?;
    let mut typed = if artifact {
        let typed = typed
            .into_decluttered()
            .map_err(|e| Error::CompileFailed(format!("profile {profile}: {}", chain(&e))))?;
        unsupported::refuse(unsupported::undecided(&typed))?;
        typed
    } else {
        typed
    };
    // Metadata strings holding a single quote break NNEF reload; they carry no semantics.
    let before = typed.properties.len();
    typed.properties.retain(|_, v| {
        v.to_plain_array_view::<String>()
            .map(|a| !a.iter().any(|s| s.contains('\'')))
            .unwrap_or(true)
    });
    if typed.properties.len() != before {
        log.push(format!(
            "profile {profile}: dropped {} metadata string(s) containing a quote",
            before - typed.properties.len()
        ));
    }
    let outputs = typed
        .output_outlets()
        .map_err(|e| Error::CompileFailed(chain(&e)))?
        .iter()
        .map(|o| {
            typed
                .outlet_label(*o)
                .map(str::to_string)
                .unwrap_or_else(|| typed.node(o.node).name.clone())
        })
        .collect();
    let file = format!("profiles/{profile}.nnef.tar");
    Ok((
        typed,
        ProfileEntry {
            name: profile.to_string(),
            file,
            inputs,
            outputs,
        },
    ))
}

/// Binds every graph input to its profile shape (the dtype the graph declares, else f32),
/// refusing a profile that names other inputs than the graph has. Returns them in graph order.
fn bind_inputs(
    inference: &mut InferenceModel,
    shapes: &Shapes,
) -> Result<Vec<(String, Vec<usize>)>> {
    let model_inputs: Vec<String> = inference
        .input_outlets()
        .map_err(|e| Error::CompileFailed(chain(&e)))?
        .iter()
        .map(|o| inference.node(o.node).name.clone())
        .collect();
    let declared: Vec<&String> = shapes.keys().collect();
    let mut sorted_model = model_inputs.clone();
    sorted_model.sort();
    if sorted_model.iter().collect::<Vec<_>>() != declared {
        return Err(Error::InvalidSpec(format!(
            "the model's inputs are {model_inputs:?} but the spec declares {declared:?}; make spec.inputs name exactly the graph inputs"
        )));
    }
    let mut inputs = Vec::new();
    for (ix, name) in model_inputs.iter().enumerate() {
        let shape = &shapes[name];
        let fact = inference
            .input_fact(ix)
            .map_err(|e| Error::CompileFailed(chain(&e)))?
            .clone();
        let dt = fact.datum_type.concretize().unwrap_or(f32::datum_type());
        inference
            .set_input_fact(ix, InferenceFact::dt_shape(dt, shape.clone()))
            .map_err(|e| Error::CompileFailed(chain(&e)))?;
        inputs.push((name.clone(), shape.clone()));
    }
    Ok(inputs)
}

struct TractEngine {
    profiles: Vec<(ProfileEntry, Plan)>,
}

impl Engine for TractEngine {
    fn run(&self, inputs: &BTreeMap<String, HostTensor>) -> Result<BTreeMap<String, HostTensor>> {
        let matches = |entry: &ProfileEntry| {
            entry.inputs.len() == inputs.len()
                && entry
                    .inputs
                    .iter()
                    .all(|(n, s)| inputs.get(n).is_some_and(|t| &t.shape == s))
        };
        let Some((entry, plan)) = self.profiles.iter().find(|(e, _)| matches(e)) else {
            let got: BTreeMap<&String, &Vec<usize>> =
                inputs.iter().map(|(n, t)| (n, &t.shape)).collect();
            let want: Vec<_> = self
                .profiles
                .iter()
                .map(|(e, _)| (&e.name, &e.inputs))
                .collect();
            return Err(Error::InvalidSpec(format!(
                "inputs {got:?} match no compiled profile {want:?}; fixture inputs must have a profile's names and shapes"
            )));
        };
        let mut values = TVec::new();
        for (name, _) in &entry.inputs {
            values.push(inputs[name].to_tract()?.into_tvalue());
        }
        let outputs = plan
            .run(values)
            .map_err(|e| Error::WarmupFailed(chain(&e)))?;
        entry
            .outputs
            .iter()
            .zip(outputs.iter())
            .map(|(name, value)| {
                Ok((
                    name.clone(),
                    HostTensor::from_tract(&value.clone().into_tensor())?,
                ))
            })
            .collect()
    }

    fn shareable(&self) -> bool {
        true
    }

    fn profiles(&self) -> Vec<(String, Shapes)> {
        self.profiles
            .iter()
            .map(|(e, _)| (e.name.clone(), e.inputs.iter().cloned().collect()))
            .collect()
    }

    fn input_dtypes(&self) -> BTreeMap<String, safetensors::Dtype> {
        let Some((entry, plan)) = self.profiles.first() else {
            return BTreeMap::new();
        };
        entry
            .inputs
            .iter()
            .enumerate()
            .filter_map(|(ix, (name, _))| {
                let fact = plan.model().input_fact(ix).ok()?;
                let dtype = crate::backend::tensor::safetensors_dtype(fact.datum_type)?;
                Some((name.clone(), dtype))
            })
            .collect()
    }

    /// tract runs every node of its plan itself: one partition, no fallback (the largest
    /// profile's node count).
    fn placement(&self) -> Option<kiln_crds::placement::Placement> {
        let nodes = self
            .profiles
            .iter()
            .map(|(_, plan)| plan.model().nodes().len())
            .max()?;
        Some(kiln_crds::placement::Placement::single(
            "tract",
            nodes as i64,
        ))
    }
}
