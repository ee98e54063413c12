//! A loaded IREE module, run by IREE's runtime (crates.io `eerie`, built from the sources of the
//! same IREE release as the compiler). The runtime's objects may not leave the thread that made
//! them, so each engine owns one thread: it loads the module, then runs what the channel brings,
//! one call at a time, with IREE's task executor using the cores. The engine's handle is the
//! channel's sending end; dropping it ends the thread.

use std::collections::BTreeMap;
use std::sync::mpsc;

use eerie::runtime::{BufferView, DeviceSpec, Runtime, Value};
use safetensors::Dtype;

use super::artifact::ArtifactConfig;
use crate::backend::tensor::{HostTensor, le_vec};
use crate::backend::{Engine, Shapes};
use kiln_node_core::error::{Error, Result};

type Tensors = BTreeMap<String, HostTensor>;
type Call = (Tensors, mpsc::Sender<Result<Tensors>>);

/// An engine whose module runs on its own thread.
pub(super) struct IreeEngine {
    calls: Option<mpsc::Sender<Call>>,
    thread: Option<std::thread::JoinHandle<()>>,
    config: ArtifactConfig,
}

impl IreeEngine {
    /// Starts the engine's thread and loads `module` there; `LoadFailed` when the runtime refuses it.
    pub(super) fn start(module: Vec<u8>, config: ArtifactConfig) -> Result<Self> {
        let (calls, inbox) = mpsc::channel::<Call>();
        let (loaded, ready) = mpsc::channel::<Result<()>>();
        let cfg = config.clone();
        let thread = std::thread::Builder::new()
            .name("kiln-iree".into())
            .spawn(move || serve(module, &cfg, &loaded, &inbox))
            .map_err(|e| {
                Error::LoadFailed(format!("cannot start the IREE engine's thread: {e}"))
            })?;
        ready.recv().map_err(|_| {
            Error::LoadFailed("the IREE engine's thread ended while loading".into())
        })??;
        Ok(Self {
            calls: Some(calls),
            thread: Some(thread),
            config,
        })
    }
}

impl Drop for IreeEngine {
    fn drop(&mut self) {
        self.calls.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The engine thread: loads, reports, then answers calls until the handle is dropped.
fn serve(
    module: Vec<u8>,
    config: &ArtifactConfig,
    loaded: &mpsc::Sender<Result<()>>,
    inbox: &mpsc::Receiver<Call>,
) {
    let failed = |e: eerie::runtime::RuntimeError| Error::LoadFailed(format!("IREE runtime: {e}"));
    let runtime = match Runtime::new(DeviceSpec::local_task()) {
        Ok(r) => r,
        Err(e) => return drop(loaded.send(Err(failed(e)))),
    };
    let program = match runtime.load_vmfb(&module) {
        Ok(p) => p,
        Err(e) => return drop(loaded.send(Err(failed(e)))),
    };
    drop(module);
    let function = match program.function(&format!(
        "{}.{}",
        config.module.as_deref().unwrap_or("module"),
        config.function
    )) {
        Ok(f) => f,
        Err(e) => return drop(loaded.send(Err(failed(e)))),
    };
    if loaded.send(Ok(())).is_err() {
        return;
    }
    for (inputs, reply) in inbox {
        let out = call(&runtime, &function, config, &inputs);
        let _ = reply.send(out);
    }
}

/// One call: the inputs in the module's order, converted; the outputs named.
fn call(
    runtime: &Runtime,
    function: &eerie::runtime::Function,
    config: &ArtifactConfig,
    inputs: &Tensors,
) -> Result<Tensors> {
    let mut args = Vec::with_capacity(config.inputs.len());
    for (name, _) in &config.inputs {
        let t = inputs
            .get(name)
            .ok_or_else(|| Error::WarmupFailed(format!("input {name:?} missing")))?;
        args.push(to_value(runtime, name, t)?);
    }
    let outs = function
        .invoke(args)
        .map_err(|e| Error::WarmupFailed(format!("IREE runtime: {e}")))?;
    if outs.len() != config.outputs.len() {
        return Err(Error::WarmupFailed(format!(
            "the module returned {} outputs, the graph names {}",
            outs.len(),
            config.outputs.len()
        )));
    }
    config
        .outputs
        .iter()
        .zip(outs)
        .map(|(name, v)| Ok((name.clone(), from_value(name, v)?)))
        .collect()
}

/// A host tensor as a runtime buffer of its element type.
fn to_value(runtime: &Runtime, name: &str, t: &HostTensor) -> Result<Value> {
    let failed =
        |e: eerie::runtime::RuntimeError| Error::WarmupFailed(format!("input {name:?}: {e}"));
    macro_rules! view {
        ($t:ty, $variant:ident) => {{
            let data = le_vec!(&t.data, $t);
            let bv: BufferView<$t> = runtime.buffer_view(&t.shape, &data).map_err(failed)?;
            Value::$variant(bv)
        }};
    }
    Ok(match t.dtype {
        Dtype::F32 => view!(f32, F32),
        Dtype::F64 => view!(f64, F64),
        Dtype::I64 => view!(i64, I64),
        Dtype::I32 => view!(i32, I32),
        Dtype::I16 => view!(i16, I16),
        Dtype::I8 => view!(i8, I8),
        Dtype::U8 => view!(u8, U8),
        Dtype::BOOL => {
            let data: Vec<bool> = t.data.iter().map(|b| *b != 0).collect();
            let bv: BufferView<bool> = runtime.buffer_view(&t.shape, &data).map_err(failed)?;
            Value::Bool(bv)
        }
        other => {
            return Err(Error::WarmupFailed(format!(
                "input {name:?}: the IREE engine takes no {other:?} tensors"
            )));
        }
    })
}

/// A runtime result as a host tensor.
fn from_value(name: &str, v: Value) -> Result<HostTensor> {
    let failed =
        |e: eerie::runtime::RuntimeError| Error::WarmupFailed(format!("output {name:?}: {e}"));
    macro_rules! host {
        ($bv:expr, $dtype:expr) => {{
            let shape = $bv.shape();
            let data = $bv.read().map_err(failed)?;
            HostTensor {
                dtype: $dtype,
                shape,
                data: data.iter().flat_map(|x| x.to_le_bytes()).collect(),
            }
        }};
    }
    Ok(match v {
        Value::F32(bv) => host!(bv, Dtype::F32),
        Value::F64(bv) => host!(bv, Dtype::F64),
        Value::I64(bv) => host!(bv, Dtype::I64),
        Value::I32(bv) => host!(bv, Dtype::I32),
        Value::I16(bv) => host!(bv, Dtype::I16),
        Value::I8(bv) => host!(bv, Dtype::I8),
        Value::U8(bv) => host!(bv, Dtype::U8),
        Value::Bool(bv) => {
            let shape = bv.shape();
            let data = bv.read().map_err(failed)?;
            HostTensor {
                dtype: Dtype::BOOL,
                shape,
                data: data.into_iter().map(u8::from).collect(),
            }
        }
        _ => {
            return Err(Error::WarmupFailed(format!(
                "output {name:?}: an element type kiln's tensors do not hold"
            )));
        }
    })
}

impl Engine for IreeEngine {
    fn run(&self, inputs: &Tensors) -> Result<Tensors> {
        let gone = || Error::EngineCrashed("the IREE engine's thread has ended".into());
        let (reply, answer) = mpsc::channel();
        self.calls
            .as_ref()
            .ok_or_else(gone)?
            .send((inputs.clone(), reply))
            .map_err(|_| gone())?;
        answer.recv().map_err(|_| gone())?
    }

    fn profiles(&self) -> Vec<(String, Shapes)> {
        self.config
            .profiles
            .iter()
            .map(|p| (p.name.clone(), p.inputs.iter().cloned().collect()))
            .collect()
    }

    fn input_dtypes(&self) -> BTreeMap<String, Dtype> {
        self.config
            .inputs
            .iter()
            .map(|(name, dtype)| (name.clone(), *dtype))
            .collect()
    }
}
