//! The IREE backend with the real compiler (PyPI `iree-base-compiler` 3.13.0,
//! `scripts/ensure/iree.sh`) and IREE's runtime built into kiln-agent: a model compiled for a
//! class runs like its source (tract's reading) on several threads; the class's CPU level is the
//! target the module records, the same class gives the same artifact bytes and another level
//! other code; a module for a CPU feature this machine lacks is refused before load with that
//! feature named (IREE's runtime would load it and die of SIGILL); the operators the compiler
//! cannot lower are named in an `UnsupportedOperator` refusal.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::signing::ensured;
use kiln_crds::compiled_target::{ExecutionProvider, Precision};
use kiln_crds::labels::{ARCH, CPU_LEVEL};
use kiln_engines::backend::iree::Iree;
use kiln_engines::backend::iree::target::{
    RecordedTarget, host_has, missing_features, recorded_targets, target_cpu,
};
use kiln_engines::backend::iree::terms::unsupported_operators;
use kiln_engines::backend::tensor::HostTensor;
use kiln_engines::backend::{Backend, CompileRequest, Compiled, MemoryFit, Shapes};

/// Half-precision arithmetic: for a CPU with AVX512-FP16 the compiler emits its instructions.
const F16: &str = r#"module @m {
  func.func @main(%a: tensor<1024xf16>, %b: tensor<1024xf16>) -> tensor<1024xf16> {
    %0 = arith.mulf %a, %b : tensor<1024xf16>
    %1 = arith.addf %0, %a : tensor<1024xf16>
    return %1 : tensor<1024xf16>
  }
}
"#;

/// `iree-compile` on `source` written as `model.mlir` in a fresh directory (the compiler records
/// the input's name, so a fixed relative one keeps builds comparable), for CPU `cpu`.
fn compile(bin: &Path, source: &str, cpu: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("model.mlir"), source).expect("write");
    let out = iree_compile(bin, dir.path(), cpu);
    assert!(out.status.success(), "iree-compile for {cpu}: {out:?}");
    std::fs::read(dir.path().join("model.vmfb")).expect("read module")
}

/// `iree-compile` of `dir`/model.mlir into `dir`/model.vmfb for the CPU `cpu`, as it ended.
fn iree_compile(bin: &Path, dir: &Path, cpu: &str) -> std::process::Output {
    Command::new(bin.join("iree-compile"))
        .args([
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            &format!("--iree-llvmcpu-target-cpu={cpu}"),
            "model.mlir",
            "-o",
            "model.vmfb",
        ])
        .current_dir(dir)
        .output()
        .expect("run iree-compile")
}

fn only_target(module: &[u8]) -> RecordedTarget {
    let targets = recorded_targets(module);
    assert_eq!(targets.len(), 1, "one CPU target: {targets:?}");
    targets.into_iter().next().expect("one")
}

#[test]
fn a_module_for_a_cpu_feature_this_machine_lacks_is_refused_by_name() {
    let Some(bin) = ensured("iree") else {
        return;
    };
    let module = compile(&bin, F16, "sapphirerapids");
    let target = only_target(&module);
    assert_eq!(
        (target.backend.as_str(), target.cpu.as_str()),
        ("llvm-cpu", "sapphirerapids")
    );
    assert!(
        target.features.iter().any(|f| f == "avx512fp16"),
        "{target:?}"
    );
    let missing = missing_features(&target, host_has);
    let has_fp16 = std::arch::is_x86_feature_detected!("avx512fp16");
    assert_eq!(
        missing.iter().any(|f| f == "avx512fp16"),
        !has_fp16,
        "missing {missing:?} on a CPU {} AVX512-FP16",
        if has_fp16 { "with" } else { "without" }
    );
    for f in &missing {
        assert_ne!(
            host_has(f),
            Some(true),
            "{f} is reported missing but present"
        );
    }
}

#[test]
fn the_class_level_is_the_target_and_the_same_class_gives_the_same_bytes() {
    let Some(bin) = ensured("iree") else {
        return;
    };
    let (_, level) = kiln_engines::host::probe::cpu_identity();
    let v3 = compile(&bin, F16, target_cpu("x86-64-v3").expect("v3"));
    assert_eq!(
        v3,
        compile(&bin, F16, "x86-64-v3"),
        "two compiles, one class"
    );
    let v4 = compile(&bin, F16, target_cpu("x86-64-v4").expect("v4"));
    assert_ne!(v3, v4, "v3 and v4 get other code");
    let (t3, t4) = (only_target(&v3), only_target(&v4));
    assert_eq!(
        (t3.cpu.as_str(), t4.cpu.as_str()),
        ("x86-64-v3", "x86-64-v4")
    );
    assert!(t3.features.iter().any(|f| f == "avx2"));
    assert!(
        !t3.features.iter().any(|f| f.starts_with("avx512")),
        "{t3:?}"
    );
    assert!(t4.features.iter().any(|f| f == "avx512f"), "{t4:?}");
    // What this machine's probe calls its level, it can run; the level above it, it cannot.
    let runs = |t: &RecordedTarget| missing_features(t, host_has).is_empty();
    match level.as_str() {
        "x86-64-v4" => assert!(runs(&t3) && runs(&t4)),
        "x86-64-v3" => assert!(runs(&t3) && !runs(&t4)),
        _ => assert!(!runs(&t3) && !runs(&t4)),
    }
}

/// An ONNX graph of a supported operator (Relu) and two the compiler cannot lower (DFT, then
/// LpPool), made by the venv's `onnx`, imported by `iree-import-onnx` and compiled: the compiler
/// stops at the first it cannot lower, and the refusal names that one.
#[test]
fn the_operators_the_compiler_refuses_are_named() {
    let Some(bin) = ensured("iree") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let make = r#"
import onnx
from onnx import helper, TensorProto as T
x = helper.make_tensor_value_info("x", T.FLOAT, [1, 8, 1])
y = helper.make_tensor_value_info("y", T.FLOAT, [1, 1, 3, 3])
nodes = [
    helper.make_node("Relu", ["x"], ["r"]),
    helper.make_node("DFT", ["r"], ["f"]),
    helper.make_node("Reshape", ["f", "shape"], ["g"]),
    helper.make_node("LpPool", ["g"], ["y"], kernel_shape=[2, 2]),
]
shape = helper.make_tensor("shape", T.INT64, [4], [1, 1, 4, 4])
graph = helper.make_graph(nodes, "main", [x], [y], [shape])
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "model.onnx")
"#;
    let run = |program: &str, args: &[&str]| {
        Command::new(bin.join(program))
            .args(args)
            .current_dir(dir.path())
            .output()
            .expect("run")
    };
    let made = run("python", &["-c", make]);
    assert!(made.status.success(), "{made:?}");
    // The compiler itself, as a compile Job's step would see it…
    let imported = run("iree-import-onnx", &["model.onnx", "-o", "model.mlir"]);
    assert!(imported.status.success(), "{imported:?}");
    let compiled = iree_compile(&bin, dir.path(), "x86-64-v3");
    assert!(
        !compiled.status.success(),
        "DFT and LpPool compiled: {compiled:?}"
    );
    let stderr = String::from_utf8_lossy(&compiled.stderr);
    assert_eq!(unsupported_operators(&stderr), ["DFT"], "{stderr}");
    // …and the backend's compile: the refusal classified, with the operator named.
    let model = dir.path().join("model.onnx");
    let shapes = profiles(&[("x", &[1, 8, 1])]);
    let err =
        compile_with_backend(&bin, &model, &shapes, "x86-64-v3", dir.path()).expect_err("refused");
    assert_eq!(
        err.reason(),
        kiln_crds::FailureReason::UnsupportedOperator,
        "{err}"
    );
    assert!(err.to_string().contains("DFT"), "{err}");
}

/// One profile `batch1` binding each named input to its shape.
fn profiles(inputs: &[(&str, &[usize])]) -> BTreeMap<String, Shapes> {
    let shapes = inputs
        .iter()
        .map(|(n, s)| (n.to_string(), s.to_vec()))
        .collect();
    BTreeMap::from([("batch1".to_string(), shapes)])
}

/// The IREE backend's compile of `model` for a class of x86-64 level `level`, into
/// `dir`/`level`.tar.
fn compile_with_backend(
    bin: &Path,
    model: &Path,
    profiles: &BTreeMap<String, Shapes>,
    level: &str,
    dir: &Path,
) -> kiln_node_core::error::Result<(PathBuf, Compiled)> {
    let out = dir.join(format!("{level}.tar"));
    let class = BTreeMap::from([
        (ARCH.to_string(), "amd64".to_string()),
        (CPU_LEVEL.to_string(), level.to_string()),
    ]);
    let compiled = Iree {
        compiler: Some(bin.to_path_buf()),
    }
    .compile(&CompileRequest {
        model,
        profiles,
        precision: Precision::Fp32,
        provider: ExecutionProvider::Cpu,
        flags: &BTreeMap::new(),
        out: &out,
        timeout: Some(std::time::Duration::from_secs(600)),
        memory_budget: Some(MemoryFit {
            budget: None,
            class,
        }),
        chat_template: None,
        declared: None,
    })?;
    Ok((out, compiled))
}

fn example_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/squeezenet/model.onnx")
}

/// A deterministic input of `shape` whose values vary (so a wrong kernel shows).
fn input(shape: &[usize]) -> HostTensor {
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 1013) as f32 / 1013.0)
        .collect();
    HostTensor {
        dtype: safetensors::Dtype::F32,
        shape: shape.to_vec(),
        data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// A small convolutional classifier with seeded random weights (Conv, Relu, Gemm, Softmax: its
/// outputs differ from each other, so a wrong kernel shows), made by the venv's `onnx`.
const CLASSIFIER: &str = r#"
import numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto as T
r = np.random.default_rng(7)
w = numpy_helper.from_array(r.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
g = numpy_helper.from_array((r.standard_normal((8 * 14 * 14, 10)) / 40).astype(np.float32), "g")
nodes = [
    helper.make_node("Conv", ["x", "w"], ["c"]),
    helper.make_node("Relu", ["c"], ["r"]),
    helper.make_node("Flatten", ["r"], ["f"]),
    helper.make_node("Gemm", ["f", "g"], ["l"]),
    helper.make_node("Softmax", ["l"], ["y"], axis=1),
]
graph = helper.make_graph(nodes, "classifier",
    [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 16, 16])],
    [helper.make_tensor_value_info("y", T.FLOAT, [1, 10])], [w, g])
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "classifier.onnx")
"#;

/// The classifier compiled by the backend for an x86-64-v3 class, loaded and run by IREE's
/// runtime inside this process, agrees with tract's run of the source; the artifact records the
/// class's level as its target.
#[test]
fn the_backend_compiles_for_the_class_and_runs_it_like_the_source() {
    let Some(bin) = ensured("iree") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    common::signing::ran(dir.path(), &bin.join("python"), &["-c", CLASSIFIER]);
    let model = dir.path().join("classifier.onnx");
    let shape = [1, 3, 16, 16];
    let shapes = profiles(&[("x", &shape)]);
    let (artifact, compiled) =
        compile_with_backend(&bin, &model, &shapes, "x86-64-v3", dir.path()).expect("compiled");
    assert_eq!(compiled.outputs, ["y"]);
    assert_eq!(compiled.resolved["targetCpu"], "x86-64-v3");
    assert!(
        compiled.resolved["compilerFlags"].contains("--iree-llvmcpu-target-cpu=x86-64-v3"),
        "{:?}",
        compiled.resolved
    );
    let iree = Iree::default();
    let engine = iree
        .load(&artifact)
        .expect("loads on this x86-64-v3-or-better CPU");
    assert_eq!(engine.profiles()[0].1["x"], shape);
    let inputs = BTreeMap::from([("x".to_string(), input(&shape))]);
    let got = engine.run(&inputs).expect("runs")["y"]
        .to_f64()
        .expect("f64");
    let reference = iree.reference(&model, &shapes["batch1"]).expect("tract");
    let want = reference.run(&inputs).expect("tract runs")["y"]
        .to_f64()
        .expect("f64");
    assert_eq!(got.len(), 10);
    let spread = want.iter().copied().fold(f64::MIN, f64::max)
        - want.iter().copied().fold(f64::MAX, f64::min);
    assert!(
        spread > 0.01,
        "a reference that tells outputs apart: {want:?}"
    );
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(
        worst < 1e-5,
        "IREE and tract differ by {worst}: {got:?} {want:?}"
    );
    // A second engine on the same artifact, and runs from several threads at once: one answer.
    let again = iree.load(&artifact).expect("loads twice");
    std::thread::scope(|s| {
        for e in [&engine, &again] {
            s.spawn(|| {
                let y = e.run(&inputs).expect("runs")["y"].to_f64().expect("f64");
                assert_eq!(y, got);
            });
        }
    });
}

/// The same class twice gives the same artifact bytes (nothing of the build machine or the
/// scratch directory leaks in); another level gives another module.
#[test]
fn the_same_class_compiles_to_the_same_artifact_bytes() {
    let Some(bin) = ensured("iree") else {
        return;
    };
    let shapes = profiles(&[("data_0", &[1, 3, 224, 224])]);
    let build = |level: &str| {
        let dir = tempfile::tempdir().expect("tempdir");
        let (artifact, _) =
            compile_with_backend(&bin, &example_model(), &shapes, level, dir.path())
                .expect("compiled");
        std::fs::read(artifact).expect("read")
    };
    let v3 = build("x86-64-v3");
    assert_eq!(v3, build("x86-64-v3"), "two compiles of one class");
    assert_ne!(v3, build("x86-64-v4"), "v3 and v4 get other code");
}

/// An artifact whose module was compiled for a CPU feature this machine lacks is refused by the
/// backend's load, naming it, before IREE's runtime sees it (which would die of SIGILL).
#[test]
fn the_backend_refuses_an_artifact_for_a_cpu_this_machine_is_not() {
    let Some(bin) = ensured("iree") else {
        return;
    };
    if std::arch::is_x86_feature_detected!("avx512fp16") {
        kiln_endpoints::test_support::skip("this CPU has AVX512-FP16: no feature to lack");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let shapes = profiles(&[("data_0", &[1, 3, 224, 224])]);
    let (artifact, _) =
        compile_with_backend(&bin, &example_model(), &shapes, "x86-64-v3", dir.path())
            .expect("compiled");
    // The same artifact with its module swapped for one compiled for Sapphire Rapids.
    let entries = {
        let mut a = tar::Archive::new(std::fs::File::open(&artifact).expect("open"));
        let mut files = Vec::new();
        for e in a.entries().expect("entries") {
            let mut e = e.expect("entry");
            let name = e.path().expect("path").to_string_lossy().into_owned();
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut bytes).expect("read");
            files.push((name, bytes));
        }
        files
    };
    let foreign = compile(&bin, F16, "sapphirerapids");
    let mut tar = tar::Builder::new(Vec::new());
    for (name, bytes) in entries {
        let bytes = if name == "module.vmfb" {
            foreign.clone()
        } else {
            bytes
        };
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(&mut h, name, bytes.as_slice())
            .expect("append");
    }
    let swapped = dir.path().join("swapped.tar");
    std::fs::write(&swapped, tar.into_inner().expect("tar")).expect("write");
    let err = Iree::default().load(&swapped).err().expect("refused");
    assert_eq!(
        err.reason(),
        kiln_crds::FailureReason::IncompatibleHardware,
        "{err}"
    );
    assert!(err.to_string().contains("avx512fp16"), "{err}");
}

/// `kiln-agent local` on the IREE example, as a node of x86-64-v3 would run it (`--cpu-level`):
/// Ready through the engine's own process, the class and the build manifest that level's, the
/// compiler's version and flags recorded; a level above this CPU's is refused before anything.
#[test]
fn local_runs_the_example_as_a_node_of_a_lower_level_would() {
    let Some(bin) = ensured("iree") else {
        return;
    };
    let store = tempfile::tempdir().expect("tempdir");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/squeezenet/iree.yaml");
    let local = |level: &str| {
        let out = Command::new(common::AGENT)
            .args(["local", "--output", "json", "--cpu-level", level, "--store"])
            .arg(store.path())
            .arg(&example)
            .env("KILN_IREE_BIN", &bin)
            .output()
            .expect("run kiln-agent");
        let last = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .to_string();
        serde_json::from_str::<serde_json::Value>(&last).expect("json outcome")
    };
    let run = local("x86-64-v3");
    assert_eq!(run["ready"], true, "{run}");
    assert_eq!(run["engine"], "iree", "{run}");
    assert!(
        run["class"]
            .as_str()
            .is_some_and(|c| c.contains("x86-64-v3")),
        "{run}"
    );
    let key = run["compileKey"].as_str().expect("key");
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            store
                .path()
                .join("artifacts")
                .join(key)
                .join("manifest.json"),
        )
        .expect("manifest"),
    )
    .expect("manifest json");
    let options = &manifest["backendOptions"];
    assert_eq!(options["targetCpu"], "x86-64-v3", "{manifest}");
    assert_eq!(options["compilerVersion"], "3.13.0", "{manifest}");
    assert!(
        options["compilerFlags"]
            .as_str()
            .is_some_and(|f| f.contains("--iree-llvmcpu-target-cpu=x86-64-v3")),
        "{manifest}"
    );
    let above = local("x86-64-v5");
    assert_eq!(above["reason"], "InvalidSpec", "{above}");
    assert!(
        above["message"]
            .as_str()
            .is_some_and(|m| m.contains("--cpu-level")),
        "{above}"
    );
}

/// The example of `examples/magika-stablehlo`, its model exported by JAX into `dir` beside its
/// spec and fixture: the spec's text. Asserts the export gives the bytes the spec pins.
fn magika_stablehlo(dir: &Path, jax: &Path, models: &Path) -> String {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/magika-stablehlo");
    for file in ["kiln.yaml", "fixture-v1.safetensors"] {
        std::fs::copy(example.join(file), dir.join(file)).expect("copy the example");
    }
    let export = Command::new(jax.join("python"))
        .arg(example.join("make.py"))
        .arg("--onnx")
        .arg(models.join("magika.onnx"))
        .arg("--out")
        .arg(dir)
        .arg("--text")
        .output()
        .expect("run make.py");
    assert!(export.status.success(), "make.py: {export:?}");
    let yaml = std::fs::read_to_string(dir.join("kiln.yaml")).expect("spec");
    let (digest, _) = file_pin(&dir.join("model.mlirbc"));
    assert!(
        yaml.contains(&digest),
        "the export is not the bytes kiln.yaml pins ({digest}): JAX, onnx or numpy changed"
    );
    yaml
}

/// sha256 and size of `path`.
fn file_pin(path: &Path) -> (String, u64) {
    let bytes = std::fs::read(path).expect("read");
    (kiln_store::staged::sha256_bytes(&bytes), bytes.len() as u64)
}

/// `yaml` with its source `file://model.mlirbc` replaced by `file`, pinned, of `format`.
fn with_source(yaml: &str, dir: &Path, file: &str, format: &str) -> String {
    let (old_digest, old_size) = file_pin(&dir.join("model.mlirbc"));
    let (digest, size) = file_pin(&dir.join(file));
    yaml.replace("file://model.mlirbc", &format!("file://{file}"))
        .replace(&old_digest, &digest)
        .replace(&format!("size: {old_size}"), &format!("size: {size}"))
        .replace("format: stablehlo", &format!("format: {format}"))
}

#[test]
fn mlir_sources_compile_as_given_bound_to_the_declaration() {
    let (Some(bin), Some(jax), Some(models)) = (ensured("iree"), ensured("jax"), ensured("models"))
    else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = magika_stablehlo(dir.path(), &jax, &models);
    let local = |name: &str, spec: &str| {
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, spec).expect("write spec");
        common::run_local_env(
            &file,
            &dir.path().join(format!("store-{name}")),
            &dir.path().join(format!("{name}.prom")),
            &[("KILN_IREE_BIN", &bin)],
        )
    };
    let ready = |name: &str, spec: &str, input_type: &str| {
        let run = local(name, spec);
        assert!(
            run.success && run.outcome["ready"] == true,
            "{name}: {} {}",
            run.outcome,
            run.stderr
        );
        assert_eq!(run.outcome["engine"], "iree", "{name}");
        let parity = run.outcome["parityMaxAbsError"].as_f64().expect("parity");
        assert!(parity <= 1e-5, "{name}: parity {parity}");
        let key = run.outcome["compileKey"].as_str().expect("key");
        let manifest: serde_json::Value = serde_json::from_slice(
            &std::fs::read(
                dir.path()
                    .join(format!("store-{name}/artifacts/{key}/manifest.json")),
            )
            .expect("manifest"),
        )
        .expect("manifest json");
        let flags = manifest["backendOptions"]["compilerFlags"]
            .as_str()
            .unwrap_or_default();
        assert!(
            flags.contains(&format!("--iree-input-type={input_type}")),
            "{name}: {manifest}"
        );
        (key.to_string(), parity)
    };

    // The example: JAX's portable artifact, its text form, and the MLIR IREE's ONNX importer
    // writes for the same model (torch dialect, a dynamic batch), each against the ONNX model's
    // golden outputs.
    let (bytecode, _) = ready("bytecode", &yaml, "stablehlo");
    let text = with_source(&yaml, dir.path(), "model.mlir", "stablehlo");
    let (text_key, _) = ready("text", &text, "stablehlo");
    let import = Command::new(bin.join("iree-import-onnx"))
        .arg(models.join("magika.onnx"))
        .args(["-o", "torch.mlir", "--opset-version", "17"])
        .current_dir(dir.path())
        .output()
        .expect("run iree-import-onnx");
    assert!(import.status.success(), "iree-import-onnx: {import:?}");
    let torch = with_source(&yaml, dir.path(), "torch.mlir", "mlir");
    let (torch_key, _) = ready("torch", &torch, "auto");
    assert!(
        bytecode != text_key && text_key != torch_key,
        "sources share a key"
    );

    // What contradicts the declaration or the format is refused before a compile, saying what
    // to fix; another engine is refused the format.
    local(
        "torch-as-stablehlo",
        &torch.replace("format: mlir", "format: stablehlo"),
    )
    .fails_with(
        "InvalidSpec",
        &["!torch.vtensor<[?,2048],si32>", "format: mlir"],
    );
    local("f32-input", &yaml.replacen("dtype: i32", "dtype: f32", 1)).fails_with(
        "InvalidSpec",
        &["spec.inputs[0] (bytes).dtype is F32", "tensor<1x2048xi32>"],
    );
    let two_outputs = yaml.replace(
        "dims: [{size: 1}, {size: 214}]",
        "dims: [{size: 1}, {size: 214}]\n    - {name: extra, dtype: f32, dims: [{size: 1}]}",
    );
    local("two-outputs", &two_outputs).fails_with(
        "InvalidSpec",
        &["spec.outputs declares 2 tensors", "@main has 1 results"],
    );
    let batch_4 = yaml
        .replacen(
            "dims: [{size: 1}, {size: 2048}]",
            "dims: [{symbol: batch, min: 1, max: 8}, {size: 2048}]",
            1,
        )
        .replace("dims: {}", "dims: {batch: 4}");
    local("batch-4", &batch_4).fails_with(
        "InvalidSpec",
        &["profile batch1 binds bytes to [4, 2048]", "[1, 2048]"],
    );
    local("on-tract", &yaml.replace("kind: iree", "kind: tract"))
        .fails_with("InvalidSpec", &["set backend.kind: iree"]);
    // A module the compiler cannot compile (an op of a dialect it does not know): classified, in
    // its words or as its crash, never a hang.
    std::fs::write(
        dir.path().join("unknown.mlir"),
        "module {\n  func.func @main(%a: tensor<1x2048xi32>) -> tensor<1x214xf32> {\n    %0 = \"foo.bar\"(%a) : (tensor<1x2048xi32>) -> tensor<1x214xf32>\n    return %0 : tensor<1x214xf32>\n  }\n}\n",
    )
    .expect("write");
    local(
        "unknown-op",
        &with_source(&yaml, dir.path(), "unknown.mlir", "mlir"),
    )
    .fails_with("CompileFailed", &["iree-compile refused the model"]);
}
