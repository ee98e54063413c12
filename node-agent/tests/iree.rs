//! IREE modules compiled by the real compiler (PyPI `iree-base-compiler` 3.13.0,
//! `scripts/ensure/iree.sh`), read by kiln's check that runs before any IREE load
//! (`kiln_engines::backend::iree::target`): the class's CPU level is the target the module
//! records, a module for a CPU feature this machine lacks is refused with that feature named
//! (IREE's runtime would load it and die of SIGILL), the same source compiled for the same
//! class gives the same bytes while another level gives other code, and the operators the
//! compiler cannot lower are read out of its errors by name
//! (`kiln_engines::backend::iree::terms`).

mod common;

use std::path::Path;
use std::process::Command;

use common::signing::ensured;
use kiln_engines::backend::iree::target::{
    RecordedTarget, host_has, missing_features, recorded_targets, target_cpu,
};
use kiln_engines::backend::iree::terms::unsupported_operators;

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
    let imported = run("iree-import-onnx", &["model.onnx", "-o", "model.mlir"]);
    assert!(imported.status.success(), "{imported:?}");
    let compiled = iree_compile(&bin, dir.path(), "x86-64-v3");
    assert!(
        !compiled.status.success(),
        "DFT and LpPool compiled: {compiled:?}"
    );
    let stderr = String::from_utf8_lossy(&compiled.stderr);
    assert_eq!(unsupported_operators(&stderr), ["DFT"], "{stderr}");
}
