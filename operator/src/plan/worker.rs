//! Which kiln-agent image compiles a class, and so which backend versions the class's compile
//! key names: the GPU agent image on a class whose facts name an NVIDIA GPU, when the operator
//! has one (`--gpu-agent-image`); the agent image everywhere else. A worker computes the key
//! from the libraries it loads, so the key must name those of the image that runs the Job.
//! Also whether that Job claims a GPU. Reads the class facts, the target and the settings. Pure.

use std::collections::{BTreeMap, BTreeSet};

use kiln_crds::CompiledTarget;
use kiln_crds::class::ClassFacts;
use kiln_crds::compiled_target::{Backend, BackendKind, ExecutionProvider};

use super::bounds::CompileBounds;

/// One kiln-agent image compile Jobs run, and what it carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Worker {
    /// The image.
    pub image: String,
    /// Backend name → version this image carries (part of the compile key); a runtime loaded
    /// at run time names its library: `onnxruntime=1.31.1@sha256:<hex>`.
    pub backend_versions: BTreeMap<String, String>,
    /// RuntimeClass of its compile pods (the NVIDIA container runtime's, where that is not the
    /// node's default); none: the node's default runtime.
    pub runtime_class: Option<String>,
}

/// The images compile Jobs run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workers {
    /// The agent image: every class, unless `gpu` takes it.
    pub agent: Worker,
    /// The GPU agent image, for classes with an NVIDIA GPU; none: the agent image there too.
    pub gpu: Option<Worker>,
}

/// What runs one class's compile Job.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Runner {
    /// The kiln-agent image.
    pub image: String,
    /// The Job claims one `nvidia.com/gpu` (see [`claims_gpu`]).
    pub gpu: bool,
    /// RuntimeClass of the pod, if any.
    pub runtime_class: Option<String>,
}

/// A class whose facts name an NVIDIA GPU: the rule [`Backend::provider_for`] resolves CUDA
/// by, asked of it so that the two cannot drift apart.
pub fn has_gpu(facts: &ClassFacts) -> bool {
    Backend::of(BackendKind::Onnxruntime).provider_for(facts) == ExecutionProvider::Cuda
}

impl Workers {
    /// The worker of a class: the GPU image on a GPU class when there is one, else the agent's.
    pub fn for_class(&self, facts: &ClassFacts) -> &Worker {
        match &self.gpu {
            Some(gpu) if has_gpu(facts) => gpu,
            _ => &self.agent,
        }
    }

    /// Every runtime some worker carries: a class whose worker lacks it gets a Job that refuses
    /// it, as it refuses a version the worker does not carry.
    pub fn runtimes(&self) -> BTreeSet<&str> {
        std::iter::once(&self.agent)
            .chain(&self.gpu)
            .flat_map(|w| w.backend_versions.keys().map(String::as_str))
            .collect()
    }

    /// What runs `target`'s compile Job for a class with `facts`.
    pub fn runner(
        &self,
        target: &CompiledTarget,
        facts: &ClassFacts,
        bounds: &CompileBounds,
    ) -> Runner {
        let worker = self.for_class(facts);
        let on_gpu_image = self.gpu.is_some() && has_gpu(facts);
        Runner {
            image: worker.image.clone(),
            gpu: on_gpu_image && claims_gpu(target, facts, bounds),
            runtime_class: worker.runtime_class.clone(),
        }
    }
}

/// Whether a GPU class's Job claims one `nvidia.com/gpu` the target did not ask for: only when
/// its compile may run on the GPU (an engine, or an `auto` candidate, on a provider other than
/// the CPU), the target's `compile.resources` name no `nvidia.com/gpu` (what it names wins, `0`
/// included) and the operator's bound allows one. A tract or CPU-provider compile claims none:
/// it would only hold a GPU the serving pods need.
pub fn claims_gpu(target: &CompiledTarget, facts: &ClassFacts, bounds: &CompileBounds) -> bool {
    let backend = &target.spec.backend;
    let gpu_engine = std::iter::once(backend.clone())
        .chain(backend.candidates(facts))
        .any(|b| b.kind != BackendKind::Auto && b.provider_for(facts) != ExecutionProvider::Cpu);
    let asked = target.spec.compile.resources.as_ref().is_some_and(|r| {
        [&r.requests, &r.limits]
            .into_iter()
            .flatten()
            .any(|m| m.contains_key(GPU_RESOURCE))
    });
    gpu_engine && !asked && bounds.max_gpus >= 1
}

/// The extended resource of NVIDIA's device plugin.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(image: &str, ort: &str) -> Worker {
        Worker {
            image: image.into(),
            backend_versions: BTreeMap::from([
                ("tract".into(), "0.23.9".into()),
                ("onnxruntime".into(), ort.into()),
            ]),
            runtime_class: None,
        }
    }

    fn facts(gpu: Option<&str>) -> ClassFacts {
        let mut f = ClassFacts::from([("kubernetes.io/arch".into(), "amd64".into())]);
        if let Some(p) = gpu {
            f.insert(kiln_crds::labels::GPU_PRODUCT.into(), p.into());
        }
        f
    }

    fn target(backend: serde_json::Value, compile: serde_json::Value) -> CompiledTarget {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kiln.dev/v1alpha1", "kind": "CompiledTarget",
            "metadata": {"name": "t", "namespace": "ml"},
            "spec": {"modelRef": {"name": "m"}, "backend": backend, "compile": compile,
                     "profiles": [{"name": "p", "dims": {"batch": 1}}],
                     "warmup": {"fixtureVersion": "v1"}},
        }))
        .expect("target")
    }

    #[test]
    fn gpu_classes_get_the_gpu_worker_only_when_there_is_one() {
        let mut workers = Workers {
            agent: worker("kiln/agent", "1.31.1@sha256:cpu"),
            gpu: None,
        };
        let (cpu, gpu) = (facts(None), facts(Some("NVIDIA-L4")));
        assert_eq!(workers.for_class(&gpu).image, "kiln/agent");
        workers.gpu = Some(worker("kiln/agent-gpu", "1.31.1@sha256:gpu"));
        assert_eq!(workers.for_class(&gpu).image, "kiln/agent-gpu");
        assert_eq!(
            workers.for_class(&gpu).backend_versions["onnxruntime"],
            "1.31.1@sha256:gpu"
        );
        assert_eq!(workers.for_class(&cpu).image, "kiln/agent");
        // An empty product is no GPU (a label some tools write on GPU-less nodes).
        assert_eq!(workers.for_class(&facts(Some(""))).image, "kiln/agent");
    }

    #[test]
    fn runtimes_are_those_of_either_worker() {
        let mut gpu = worker("kiln/agent-gpu", "x");
        gpu.backend_versions.insert("tensorrt".into(), "10".into());
        let workers = Workers {
            agent: worker("kiln/agent", "y"),
            gpu: Some(gpu),
        };
        assert_eq!(
            workers.runtimes().into_iter().collect::<Vec<_>>(),
            ["onnxruntime", "tensorrt", "tract"]
        );
    }

    #[test]
    fn a_gpu_compile_claims_one_gpu_unless_the_target_or_the_bound_decides() {
        let bounds = CompileBounds::default();
        let gpu = facts(Some("NVIDIA-L4"));
        let none = serde_json::json!({});
        let claims = |backend, compile, facts: &ClassFacts, b: &CompileBounds| {
            claims_gpu(&target(backend, compile), facts, b)
        };
        let ort = serde_json::json!({"kind": "onnxruntime"});
        assert!(claims(ort.clone(), none.clone(), &gpu, &bounds));
        // llama.cpp: its compile checks parity on the engine it built, all layers on the GPU.
        let llama = serde_json::json!({"kind": "llamacpp"});
        assert!(claims(llama.clone(), none.clone(), &gpu, &bounds));
        assert!(!claims(llama, none.clone(), &facts(None), &bounds));
        assert!(claims(
            serde_json::json!({"kind": "auto"}),
            none.clone(),
            &gpu,
            &bounds
        ));
        // Engines that run on the CPU, or a CPU class: no claim.
        for cpu_engine in [
            serde_json::json!({"kind": "tract"}),
            serde_json::json!({"kind": "onnxruntime", "executionProvider": "cpu"}),
            serde_json::json!({"kind": "llamacpp", "executionProvider": "cpu"}),
        ] {
            assert!(!claims(cpu_engine, none.clone(), &gpu, &bounds));
        }
        assert!(!claims(ort.clone(), none.clone(), &facts(None), &bounds));
        assert!(!claims(
            serde_json::json!({"kind": "auto"}),
            none.clone(),
            &facts(None),
            &bounds
        ));
        // The target's own nvidia.com/gpu, even 0, wins; a bound of 0 allows none.
        let zero = serde_json::json!({"resources": {"limits": {"nvidia.com/gpu": "0"}}});
        assert!(!claims(ort.clone(), zero, &gpu, &bounds));
        let no_gpus = CompileBounds {
            max_gpus: 0,
            ..CompileBounds::default()
        };
        assert!(!claims(ort, none, &gpu, &no_gpus));
    }

    #[test]
    fn only_the_gpu_worker_claims_a_gpu() {
        let t = target(
            serde_json::json!({"kind": "onnxruntime"}),
            serde_json::json!({}),
        );
        let gpu = facts(Some("NVIDIA-L4"));
        let mut workers = Workers {
            agent: worker("kiln/agent", "c"),
            gpu: None,
        };
        let b = CompileBounds::default();
        // Without a GPU image the Job keeps today's shape: the agent image, no claim.
        assert_eq!(
            workers.runner(&t, &gpu, &b),
            Runner {
                image: "kiln/agent".into(),
                gpu: false,
                runtime_class: None
            }
        );
        let mut g = worker("kiln/agent-gpu", "g");
        g.runtime_class = Some("nvidia".into());
        workers.gpu = Some(g);
        assert_eq!(
            workers.runner(&t, &gpu, &b),
            Runner {
                image: "kiln/agent-gpu".into(),
                gpu: true,
                runtime_class: Some("nvidia".into())
            }
        );
        assert_eq!(workers.runner(&t, &facts(None), &b).image, "kiln/agent");
    }
}
