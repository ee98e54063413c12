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
        "x86-64-v2" => Ok("x86-64-v2"),
        "x86-64-v3" => Ok("x86-64-v3"),
        "x86-64-v4" => Ok("x86-64-v4"),
        other => Err(format!(
            "IREE compiles CPU classes of x86-64 levels v2 to v4; this class's CPU level is {other:?}"
        )),
    }
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
}
