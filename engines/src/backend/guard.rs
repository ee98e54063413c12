//! Panics inside an engine library become classified failures. tract (like any native runtime)
//! can panic on hostile models — an out-of-bounds index in a Gather, an arithmetic overflow on
//! an absurd shape — and a panic must not take down `local` or the node agent, which serves
//! other targets: compile and inspection panics are `CompileFailed`, load panics `LoadFailed`,
//! run panics `WarmupFailed`, each with the panic's message. Every backend [`super::for_target`]
//! returns is wrapped in [`Guarded`], and every engine it loads in [`GuardedEngine`].
//! Pure: wraps calls; touches nothing.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use super::{Backend, CompileRequest, Compiled, Engine, GraphInterface, InputInfo, Shapes};
use crate::backend::tensor::HostTensor;
use kiln_node_core::error::{Error, Result};

/// Runs `f`; a panic becomes `classify("<what> panicked: <message>")`.
pub fn guard<T>(
    what: &str,
    classify: fn(String) -> Error,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        tracing::error!(what, panic = %message, "engine library panicked; contained");
        if let Some(refused) = crate::host::memory::explain(&message) {
            return Err(classify(format!("{what} panicked: {message}; {refused}")));
        }
        Err(classify(format!(
            "{what} panicked: {message}; the model is malformed or hostile, or the runtime has a bug"
        )))
    })
}

/// A backend whose panics are classified failures.
pub struct Guarded(pub Box<dyn Backend>);

impl Backend for Guarded {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn version(&self) -> String {
        self.0.version()
    }

    fn identity(&self) -> String {
        self.0.identity()
    }

    fn runtime_digest(&self) -> Option<String> {
        self.0.runtime_digest()
    }

    fn media_type(&self) -> &'static str {
        self.0.media_type()
    }

    fn compile(&self, req: &CompileRequest<'_>) -> Result<Compiled> {
        guard("compiling", Error::CompileFailed, || self.0.compile(req))
    }

    fn load(&self, artifact: &Path) -> Result<Box<dyn Engine>> {
        let engine = guard("loading", Error::LoadFailed, || self.0.load(artifact))?;
        Ok(Box::new(GuardedEngine(engine)))
    }

    fn reference(&self, model: &Path, shapes: &Shapes) -> Result<Box<dyn Engine>> {
        let engine = guard("building the reference", Error::CompileFailed, || {
            self.0.reference(model, shapes)
        })?;
        Ok(Box::new(GuardedEngine(engine)))
    }

    fn inputs(&self, model: &Path) -> Result<Vec<InputInfo>> {
        guard("reading the model's inputs", Error::CompileFailed, || {
            self.0.inputs(model)
        })
    }

    fn interface(&self, model: &Path) -> Result<GraphInterface> {
        guard(
            "reading the model's interface",
            Error::CompileFailed,
            || self.0.interface(model),
        )
    }
}

/// An engine whose panics are `WarmupFailed`.
pub struct GuardedEngine(pub Box<dyn Engine>);

impl Engine for GuardedEngine {
    fn run(&self, inputs: &BTreeMap<String, HostTensor>) -> Result<BTreeMap<String, HostTensor>> {
        guard("running the engine", Error::WarmupFailed, || {
            self.0.run(inputs)
        })
    }

    fn profiles(&self) -> Vec<(String, Shapes)> {
        self.0.profiles()
    }

    fn input_dtypes(&self) -> BTreeMap<String, safetensors::Dtype> {
        self.0.input_dtypes()
    }

    fn placement(&self) -> Option<kiln_crds::placement::Placement> {
        self.0.placement()
    }

    fn replays_captured_work(&self) -> bool {
        self.0.replays_captured_work()
    }

    fn generation(&self) -> Option<super::api::Generation> {
        self.0.generation()
    }

    fn tokenizer(&self) -> Option<&dyn super::api::Tokenizer> {
        self.0.tokenizer()
    }

    fn shareable(&self) -> bool {
        self.0.shareable()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_a_classified_failure_with_its_message() {
        let err = guard::<u8>("compiling", Error::CompileFailed, || {
            let v: Vec<u8> = Vec::new();
            let i = v.len() + 3;
            Ok(std::hint::black_box(v)[i])
        })
        .unwrap_err();
        assert_eq!(err.reason(), kiln_crds::FailureReason::CompileFailed);
        assert!(
            err.to_string()
                .contains("compiling panicked: index out of bounds"),
            "{err}"
        );
        let err = guard::<()>("running the engine", Error::WarmupFailed, || {
            panic!("boom {}", 7)
        })
        .unwrap_err();
        assert_eq!(err.reason(), kiln_crds::FailureReason::WarmupFailed);
        assert!(err.to_string().contains("boom 7"), "{err}");
        assert_eq!(guard("x", Error::LoadFailed, || Ok(5)).ok(), Some(5));
    }

    #[test]
    fn the_guarded_engine_says_what_the_engine_says_about_replays() {
        struct Replays(bool);
        impl Engine for Replays {
            fn run(
                &self,
                _: &BTreeMap<String, HostTensor>,
            ) -> Result<BTreeMap<String, HostTensor>> {
                Ok(BTreeMap::new())
            }
            fn profiles(&self) -> Vec<(String, Shapes)> {
                Vec::new()
            }
            fn input_dtypes(&self) -> BTreeMap<String, safetensors::Dtype> {
                BTreeMap::new()
            }
            fn replays_captured_work(&self) -> bool {
                self.0
            }
        }
        // Warmup holds a replaying engine to more samples: the wrapper must not hide it.
        assert!(GuardedEngine(Box::new(Replays(true))).replays_captured_work());
        assert!(!GuardedEngine(Box::new(Replays(false))).replays_captured_work());
    }
}
