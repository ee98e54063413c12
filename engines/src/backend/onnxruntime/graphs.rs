//! Runs of a session whose CUDA provider captures CUDA graphs (`backend.cuda.cudaGraphs`). A
//! captured graph replays the kernels with the device addresses they had at capture, so every
//! input and output is bound (IoBinding) to a device tensor allocated once per shape profile,
//! and a run copies its inputs into those tensors, replays, and copies the outputs back. Each
//! profile has its own graph (ONNX Runtime's `gpu_graph_id` run option, 1, 2, …).
//!
//! The first run of a profile is an ordinary run (`gpu_graph_id` -1: no capture) whose outputs
//! ONNX Runtime returns to the host: it gives the output shapes the fixed output tensors are
//! made with, and it is the run the placement profile reads. The second captures, later ones
//! replay. Nothing here can run without an NVIDIA GPU; what proves a replay reads the new inputs
//! is the warmup's alternation of fixture samples (`pipeline::warmup`), on a GPU
//! (`e2e/gpu/prove.sh`).

use std::collections::BTreeMap;

use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{IoBinding, RunOptions, Session};
use ort::value::{DynTensor, DynTensorValueType, Shape, ValueType};

use super::terms::classify;
use super::values::{from_value, to_value};
use crate::backend::tensor::HostTensor;
use kiln_node_core::error::{Error, Result};

/// ONNX Runtime's run option naming the CUDA graph of a run; -1 runs without capture or replay.
const GRAPH_ID: &str = "gpu_graph_id";

/// The bound tensors and graph of every profile run so far.
pub(super) struct Graphs {
    /// By profile (input names and shapes); dropped before the allocator they came from.
    bound: BTreeMap<Vec<(String, Vec<usize>)>, Bound>,
    allocator: Allocator,
    outputs: Vec<String>,
}

/// One profile's graph: its binding and the device tensors at fixed addresses.
struct Bound {
    binding: IoBinding,
    inputs: BTreeMap<String, DynTensor>,
    outputs: BTreeMap<String, DynTensor>,
    options: RunOptions,
}

fn failed(what: &str) -> impl Fn(ort::Error) -> Error + '_ {
    move |e| classify(e, what, Error::WarmupFailed)
}

impl Graphs {
    /// Device tensors come from the session's CUDA allocator (device 0, the provider's).
    pub(super) fn new(session: &Session) -> Result<Self> {
        let device = MemoryInfo::new(
            AllocationDevice::CUDA,
            0,
            AllocatorType::Device,
            MemoryType::Default,
        )
        .map_err(|e| Error::LoadFailed(format!("CUDA memory info: {e}")))?;
        let allocator = Allocator::new(session, device)
            .map_err(|e| classify(e, "the CUDA allocator", Error::LoadFailed))?;
        Ok(Self {
            bound: BTreeMap::new(),
            allocator,
            outputs: session
                .outputs()
                .iter()
                .map(|o| o.name().to_string())
                .collect(),
        })
    }

    /// One run: the first of a profile without a graph (binding its tensors for the next), the
    /// others copying the inputs into the bound tensors and capturing or replaying the graph.
    pub(super) fn run(
        &mut self,
        session: &mut Session,
        inputs: &BTreeMap<String, HostTensor>,
    ) -> Result<BTreeMap<String, HostTensor>> {
        let key: Vec<(String, Vec<usize>)> = inputs
            .iter()
            .map(|(n, t)| (n.clone(), t.shape.clone()))
            .collect();
        if let Some(bound) = self.bound.get_mut(&key) {
            return bound.replay(session, inputs);
        }
        let id = self.bound.len() + 1;
        let (bound, first) = self.bind(session, inputs, id)?;
        self.bound.insert(key, bound);
        Ok(first)
    }

    /// The first run of a profile, and the binding of its fixed tensors for graph `id`.
    fn bind(
        &self,
        session: &mut Session,
        inputs: &BTreeMap<String, HostTensor>,
        id: usize,
    ) -> Result<(Bound, BTreeMap<String, HostTensor>)> {
        let mut binding = session.create_binding().map_err(failed("binding inputs"))?;
        let mut device_inputs = BTreeMap::new();
        for (name, t) in inputs {
            let host = host_tensor(t)?;
            let ValueType::Tensor { ty, .. } = host.dtype() else {
                return Err(Error::WarmupFailed(format!("input {name} is not a tensor")));
            };
            let shape = Shape::new(t.shape.iter().map(|d| *d as i64));
            let mut device = DynTensor::new(&self.allocator, *ty, shape)
                .map_err(failed("allocating a device input"))?;
            host.copy_into(&mut device)
                .map_err(failed("copying an input to the device"))?;
            binding
                .bind_input(name.as_str(), &device)
                .map_err(failed("binding an input"))?;
            device_inputs.insert(name.clone(), device);
        }
        // The first run's outputs come back to the host: only their shapes are needed on the
        // device.
        let host_memory = MemoryInfo::new(
            AllocationDevice::CPU,
            0,
            AllocatorType::Device,
            MemoryType::CPUOutput,
        )
        .map_err(failed("host memory info"))?;
        for name in &self.outputs {
            binding
                .bind_output_to_device(name.as_str(), &host_memory)
                .map_err(failed("binding an output"))?;
        }
        let mut plain = RunOptions::new().map_err(failed("run options"))?;
        plain.set(GRAPH_ID, "-1").map_err(failed("run options"))?;
        let mut first = BTreeMap::new();
        let mut shapes = BTreeMap::new();
        {
            let outputs = session
                .run_binding_with_options(&binding, &plain)
                .map_err(failed("running the engine"))?;
            for (name, value) in outputs.iter() {
                let ValueType::Tensor { ty, shape, .. } = value.dtype() else {
                    return Err(Error::WarmupFailed(format!(
                        "output {name} is not a tensor"
                    )));
                };
                shapes.insert(name.to_string(), (*ty, shape.clone()));
                first.insert(name.to_string(), from_value(name, &value)?);
            }
        }
        binding.clear_outputs();
        let mut device_outputs = BTreeMap::new();
        for (name, (ty, shape)) in shapes {
            let mut device = DynTensor::new(&self.allocator, ty, shape)
                .map_err(failed("allocating a device output"))?;
            binding
                .bind_output(name.as_str(), &mut device)
                .map_err(failed("binding an output"))?;
            device_outputs.insert(name, device);
        }
        let mut options = RunOptions::new().map_err(failed("run options"))?;
        options
            .set(GRAPH_ID, id.to_string())
            .map_err(failed("run options"))?;
        let bound = Bound {
            binding,
            inputs: device_inputs,
            outputs: device_outputs,
            options,
        };
        Ok((bound, first))
    }
}

impl Bound {
    /// Copies the inputs into the bound device tensors, runs the graph (captured on the first
    /// call, replayed after), and copies the outputs back.
    fn replay(
        &mut self,
        session: &mut Session,
        inputs: &BTreeMap<String, HostTensor>,
    ) -> Result<BTreeMap<String, HostTensor>> {
        for (name, t) in inputs {
            let device = self.inputs.get_mut(name).ok_or_else(|| {
                Error::WarmupFailed(format!("input {name} has no bound device tensor"))
            })?;
            host_tensor(t)?
                .copy_into(device)
                .map_err(failed("copying an input to the device"))?;
        }
        session
            .run_binding_with_options(&self.binding, &self.options)
            .map_err(failed("replaying the CUDA graph"))?;
        let mut host = BTreeMap::new();
        for (name, device) in &self.outputs {
            let copy = device
                .to(AllocationDevice::CPU, 0)
                .map_err(failed("copying an output"))?;
            host.insert(name.clone(), from_value(name, &copy.view().into_dyn())?);
        }
        Ok(host)
    }
}

/// A host tensor as ONNX Runtime's, on the CPU.
fn host_tensor(t: &HostTensor) -> Result<DynTensor> {
    to_value(t)?
        .downcast::<DynTensorValueType>()
        .map_err(|e| Error::WarmupFailed(format!("input tensor: {e}")))
}
