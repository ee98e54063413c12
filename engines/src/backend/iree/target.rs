//! What an IREE module was compiled for, read from its own bytes, and whether this machine can
//! run it. IREE's runtime does not check: a module compiled for a CPU feature the node lacks loads
//! and then dies of SIGILL in its first dispatch. So kiln reads the targets the module records
//! and refuses one that asks for a feature this CPU lacks before anything is loaded.
//!
//! `iree-compile` 3.13 writes each device's targets into the module's flatbuffer as the text of
//! the `hal.device.target` attribute (part of the message `__init` fails with when the device is
//! missing), e.g. `#hal.executable.target<"llvm-cpu", "embedded-elf-x86_64", {cpu = "x86-64-v3",
//! cpu_features = "+avx,+avx2,...", ...}>`, and `<"cuda", "cuda-nvptx-fb", {... arch = "sm_80"
//! ...}>` for CUDA. That text is not a documented format, so the build manifest records the target
//! kiln asked for as well, and a module whose targets cannot be read is refused.
//!
//! Pure, except [`host_has`], which asks this CPU.

/// One executable target a module records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedTarget {
    /// The compiler backend: `llvm-cpu`, `cuda`, `vulkan-spirv`…
    pub backend: String,
    /// The executable format (`embedded-elf-x86_64`, `cuda-nvptx-fb`).
    pub format: String,
    /// The target CPU (`x86-64-v3`; empty for a generic CPU) or GPU architecture (`sm_80`).
    pub cpu: String,
    /// The features the code may use, LLVM's names without their `+` (`avx2`, `avx512f`).
    pub features: Vec<String>,
}

const OPEN: &[u8] = b"#hal.executable.target<\"";

/// Every distinct executable target the module's bytes record, in order of first appearance.
pub fn recorded_targets(module: &[u8]) -> Vec<RecordedTarget> {
    let mut found: Vec<RecordedTarget> = Vec::new();
    let mut at = 0;
    while let Some(start) = find(&module[at..], OPEN) {
        let body = &module[at + start + OPEN.len()..];
        at += start + OPEN.len();
        if let Some(target) = parse_target(body)
            && !found.contains(&target)
        {
            found.push(target);
        }
    }
    found
}

/// One target from the text after `#hal.executable.target<"`: `BACKEND", "FORMAT", {ATTRS}>`.
fn parse_target(body: &[u8]) -> Option<RecordedTarget> {
    // The attribute is one line of text; stop at the first byte that cannot be in it.
    let end = body
        .iter()
        .position(|&b| b == 0 || b == b'\n')
        .unwrap_or(body.len());
    let text = std::str::from_utf8(&body[..end.min(64 << 10)]).ok()?;
    let (backend, rest) = text.split_once('"')?;
    let rest = rest.strip_prefix(", \"")?;
    let (format, attrs) = rest.split_once('"')?;
    let cpu = quoted_after(attrs, "cpu = \"")
        .or_else(|| quoted_after(attrs, "arch = \""))
        .unwrap_or_default();
    let features = quoted_after(attrs, "cpu_features = \"")
        .map(|list| {
            list.split(',')
                .filter_map(|f| f.trim().strip_prefix('+'))
                .filter(|f| !f.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    Some(RecordedTarget {
        backend: backend.to_string(),
        format: format.to_string(),
        cpu: cpu.to_string(),
        features,
    })
}

/// The text between `key` and the next `"`.
fn quoted_after<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let start = text.find(key)? + key.len();
    let len = text[start..].find('"')?;
    Some(&text[start..start + len])
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The features `target` asks for that `has` says this CPU lacks, or does not know (an unknown
/// name is refused: kiln cannot say the CPU has it).
pub fn missing_features(
    target: &RecordedTarget,
    has: impl Fn(&str) -> Option<bool>,
) -> Vec<String> {
    target
        .features
        .iter()
        .filter(|f| has(f) != Some(true))
        .cloned()
        .collect()
}

/// The `--iree-llvmcpu-target-cpu` for a class's CPU level (`kiln.dev/cpu-level`): the level
/// itself, never `host`, so every node of the class gets the same code and the same bytes.
pub fn target_cpu(cpu_level: &str) -> Result<&'static str, String> {
    match cpu_level {
        "x86-64" => Ok("x86-64"),
        "x86-64-v2" => Ok("x86-64-v2"),
        "x86-64-v3" => Ok("x86-64-v3"),
        "x86-64-v4" => Ok("x86-64-v4"),
        other => Err(format!(
            "IREE compiles CPU classes of x86-64 levels 1 to 4 (x86-64, x86-64-v2 to -v4); this class's CPU level is {other:?}"
        )),
    }
}

/// The CUDA architectures IREE 3.13's code generator has a target for (`iree-compile
/// --iree-cuda-target=sm_90` fails "missing GPU target" for Hopper and `sm_100` for Blackwell
/// datacenter parts).
pub const CUDA_ARCHES: &[&str] = &[
    "sm_60", "sm_61", "sm_70", "sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_120", "sm_121",
];

/// What a class's module is compiled for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClassTarget {
    /// x86-64 code for this `--iree-llvmcpu-target-cpu`.
    Cpu(&'static str),
    /// CUDA code for this architecture (`sm_80`).
    Cuda(String),
}

/// Why a class gets no IREE code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoTarget {
    /// The hardware has no IREE code generator (`IncompatibleHardware`).
    Hardware(String),
    /// The class does not say what its hardware is (`InvalidSpec`).
    Unstated(String),
}

/// The target a class's facts name: for a GPU class (`gpu`) its compute capability, for a CPU
/// class its x86-64 level (`x86-64`, the baseline every x86-64 node runs, when the class does not
/// key on the level). Never the build machine's own CPU.
pub fn class_target(
    class: &std::collections::BTreeMap<String, String>,
    gpu: bool,
) -> Result<ClassTarget, NoTarget> {
    use kiln_crds::labels::{ARCH, CPU_LEVEL, GPU_COMPUTE_MAJOR, GPU_COMPUTE_MINOR};
    if gpu {
        let (Some(major), Some(minor)) =
            (class.get(GPU_COMPUTE_MAJOR), class.get(GPU_COMPUTE_MINOR))
        else {
            return Err(NoTarget::Unstated(format!(
                "a GPU class for IREE must key on {GPU_COMPUTE_MAJOR} and {GPU_COMPUTE_MINOR}: add them to the target's classKeys"
            )));
        };
        let arch = format!("sm_{major}{minor}");
        if !CUDA_ARCHES.contains(&arch.as_str()) {
            return Err(NoTarget::Hardware(format!(
                "IREE 3.13 generates no code for compute capability {major}.{minor} ({arch}); it targets {}; use backend.kind onnxruntime for this class",
                CUDA_ARCHES.join(", ")
            )));
        }
        return Ok(ClassTarget::Cuda(arch));
    }
    if let Some(arch) = class.get(ARCH).filter(|a| *a != "amd64") {
        return Err(NoTarget::Hardware(format!(
            "kiln compiles IREE code for amd64 CPU classes; this class's {ARCH} is {arch:?}"
        )));
    }
    let level = class.get(CPU_LEVEL).map_or("x86-64", String::as_str);
    target_cpu(level)
        .map(ClassTarget::Cpu)
        .map_err(NoTarget::Hardware)
}

/// Whether this CPU has the LLVM feature `name`: `None` for a name kiln does not know.
#[cfg(target_arch = "x86_64")]
pub fn host_has(name: &str) -> Option<bool> {
    use std::arch::is_x86_feature_detected as has;
    Some(match name {
        // x86-64's baseline: every CPU that runs this binary has them.
        "cmov" | "cx8" | "mmx" | "x87" | "fxsr" | "sse" | "sse2" => true,
        "sahf" => lahf_sahf(),
        "crc32" | "sse4.2" => has!("sse4.2"),
        "sse3" => has!("sse3"),
        "ssse3" => has!("ssse3"),
        "sse4.1" => has!("sse4.1"),
        "cx16" => has!("cmpxchg16b"),
        "popcnt" => has!("popcnt"),
        "avx" => has!("avx"),
        "avx2" => has!("avx2"),
        "bmi" => has!("bmi1"),
        "bmi2" => has!("bmi2"),
        "f16c" => has!("f16c"),
        "fma" => has!("fma"),
        "lzcnt" => has!("lzcnt"),
        "movbe" => has!("movbe"),
        "xsave" => has!("xsave"),
        "avx512f" => has!("avx512f"),
        "avx512bw" => has!("avx512bw"),
        "avx512cd" => has!("avx512cd"),
        "avx512dq" => has!("avx512dq"),
        "avx512vl" => has!("avx512vl"),
        "avx512vnni" => has!("avx512vnni"),
        "avx512bf16" => has!("avx512bf16"),
        "avx512fp16" => has!("avx512fp16"),
        "avx512ifma" => has!("avx512ifma"),
        "avx512vbmi" => has!("avx512vbmi"),
        "avx512vbmi2" => has!("avx512vbmi2"),
        "avx512bitalg" => has!("avx512bitalg"),
        "avx512vpopcntdq" => has!("avx512vpopcntdq"),
        "vpclmulqdq" => has!("vpclmulqdq"),
        "gfni" => has!("gfni"),
        "vaes" => has!("vaes"),
        "pclmul" => has!("pclmulqdq"),
        "aes" => has!("aes"),
        "sha" => has!("sha"),
        "adx" => has!("adx"),
        "rdrnd" => has!("rdrand"),
        "rdseed" => has!("rdseed"),
        "xsaveopt" => has!("xsaveopt"),
        "xsavec" => has!("xsavec"),
        "xsaves" => has!("xsaves"),
        _ => return None,
    })
}

/// LAHF/SAHF in 64-bit mode, which std cannot detect: part of x86-64-v2, judged as kiln's probe
/// judges that level (`host/probe.rs`), by the rest of it.
#[cfg(target_arch = "x86_64")]
fn lahf_sahf() -> bool {
    use std::arch::is_x86_feature_detected as has;
    has!("cmpxchg16b")
        && has!("popcnt")
        && has!("sse3")
        && has!("sse4.1")
        && has!("sse4.2")
        && has!("ssse3")
}

/// Whether this CPU has the LLVM feature `name`: kiln knows no feature names on this
/// architecture yet, so every one is refused.
#[cfg(not(target_arch = "x86_64"))]
pub fn host_has(_name: &str) -> Option<bool> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const V3: &str = r#"HAL device `__device_0` not found or unavailable: #hal.device.target<"local", [#hal.executable.target<"llvm-cpu", "embedded-elf-x86_64", {cpu = "x86-64-v3", cpu_features = "+avx,+avx2,+bmi,+bmi2,+cmov,+crc32,+cx16,+cx8,+f16c,+fma,+fxsr,+lzcnt,+mmx,+movbe,+popcnt,+sahf,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3,+x87,+xsave", data_layout = "e-m:e-p270:32:32-p271:32:32-p272:64:64-i64:64-i128:128-f80:128-n8:16:32:64-S128", native_vector_size = 32 : i64, target_triple = "x86_64-unknown-unknown-eabi-elf"}>]>"#;

    fn module_bytes(texts: &[&str]) -> Vec<u8> {
        let mut bytes = b"IREE\0\0\x01\x02".to_vec();
        for t in texts {
            bytes.extend_from_slice(t.as_bytes());
            bytes.extend_from_slice(b"\0\xff\x00");
        }
        bytes
    }

    #[test]
    fn reads_the_cpu_and_its_features() {
        let targets = recorded_targets(&module_bytes(&[V3, V3]));
        assert_eq!(
            targets.len(),
            1,
            "the same target twice is one: {targets:?}"
        );
        let t = &targets[0];
        assert_eq!(
            (t.backend.as_str(), t.format.as_str(), t.cpu.as_str()),
            ("llvm-cpu", "embedded-elf-x86_64", "x86-64-v3")
        );
        assert_eq!(t.features.len(), 24);
        assert!(t.features.contains(&"avx2".to_string()));
        assert!(t.features.contains(&"sse4.1".to_string()));
    }

    #[test]
    fn reads_a_cuda_target() {
        let cuda = r#"#hal.executable.target<"cuda", "cuda-nvptx-fb", {iree_codegen.target_info = #iree_gpu.target<arch = "sm_80", features = "+ptx76", wgp = <compute = fp64|fp32>>}>"#;
        let t = &recorded_targets(&module_bytes(&[cuda]))[0];
        assert_eq!((t.backend.as_str(), t.cpu.as_str()), ("cuda", "sm_80"));
        assert!(t.features.is_empty());
    }

    #[test]
    fn nothing_recorded_is_nothing_read() {
        assert!(recorded_targets(b"").is_empty());
        assert!(recorded_targets(&module_bytes(&["no target here"])).is_empty());
        // Cut off inside the attribute: no backend/format pair, no target.
        assert!(recorded_targets(b"#hal.executable.target<\"llvm-cpu").is_empty());
    }

    #[test]
    fn a_missing_or_unknown_feature_is_missing() {
        let t = RecordedTarget {
            backend: "llvm-cpu".into(),
            format: "embedded-elf-x86_64".into(),
            cpu: "sapphirerapids".into(),
            features: vec!["avx2".into(), "avx512fp16".into(), "newthing".into()],
        };
        let has = |f: &str| match f {
            "avx2" => Some(true),
            "avx512fp16" => Some(false),
            _ => None,
        };
        assert_eq!(missing_features(&t, has), ["avx512fp16", "newthing"]);
    }

    #[test]
    fn the_class_level_names_the_target_cpu_never_host() {
        assert_eq!(target_cpu("x86-64-v4"), Ok("x86-64-v4"));
        assert_eq!(target_cpu("x86-64-v3"), Ok("x86-64-v3"));
        assert_eq!(target_cpu("x86-64"), Ok("x86-64"));
        let err = target_cpu("baseline").expect_err("baseline has no IREE CPU");
        assert!(err.contains("\"baseline\""), "{err}");
        assert!(target_cpu("host").is_err());
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn this_cpu_has_what_every_x86_64_has_and_knows_the_v3_names() {
        let t = &recorded_targets(&module_bytes(&[V3]))[0];
        for f in &t.features {
            assert!(host_has(f).is_some(), "{f} is a name kiln should know");
        }
        assert_eq!(host_has("sse2"), Some(true));
        assert_eq!(
            host_has("avx2"),
            Some(std::arch::is_x86_feature_detected!("avx2"))
        );
        assert_eq!(host_has("not-a-feature"), None);
    }

    fn class(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_class_gets_its_own_level_or_the_baseline_never_host() {
        use kiln_crds::labels::{ARCH, CPU_LEVEL};
        let v3 = class(&[(ARCH, "amd64"), (CPU_LEVEL, "x86-64-v3")]);
        assert_eq!(class_target(&v3, false), Ok(ClassTarget::Cpu("x86-64-v3")));
        // No level among the class's keys: nodes of it may be any x86-64, so the baseline.
        let any = class(&[(ARCH, "amd64")]);
        assert_eq!(class_target(&any, false), Ok(ClassTarget::Cpu("x86-64")));
        let arm = class(&[(ARCH, "arm64"), (CPU_LEVEL, "baseline")]);
        assert!(
            matches!(class_target(&arm, false), Err(NoTarget::Hardware(m)) if m.contains("arm64"))
        );
    }

    #[test]
    fn a_gpu_class_gets_its_compute_capability_where_iree_has_one() {
        use kiln_crds::labels::{GPU_COMPUTE_MAJOR, GPU_COMPUTE_MINOR};
        let a100 = class(&[(GPU_COMPUTE_MAJOR, "8"), (GPU_COMPUTE_MINOR, "0")]);
        assert_eq!(
            class_target(&a100, true),
            Ok(ClassTarget::Cuda("sm_80".into()))
        );
        let h200 = class(&[(GPU_COMPUTE_MAJOR, "9"), (GPU_COMPUTE_MINOR, "0")]);
        match class_target(&h200, true) {
            Err(NoTarget::Hardware(m)) => assert!(m.contains("9.0 (sm_90)"), "{m}"),
            other => panic!("sm_90 must be refused: {other:?}"),
        }
        assert!(matches!(
            class_target(&class(&[]), true),
            Err(NoTarget::Unstated(_))
        ));
    }
}
