//! Which weight type a class gets for `quantization: auto`: the largest that fits the memory
//! the class's engine may use ([`auto_budget`]: the smallest of `warmup.memoryBudget` and the
//! class's memory facts) with the context length declared. Pure.

use kiln_crds::labels::{GPU_MEMORY, MEMORY_GIB};
use kiln_crds::llamacpp::Quantization;

use super::gguf::Header;
use crate::backend::MemoryFit;

/// The share of a class's memory `auto` fills; the rest is the system's, the agent's and the
/// serving pods' own (and the few percent the memory step may round up, see
/// `kiln_crds::class::memory_gib`).
pub const HEADROOM: f64 = 0.8;

/// The memory `auto` fits, and the figure it comes from (for messages and the manifest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Bytes.
    pub bytes: u64,
    /// Where the figure comes from, in words.
    pub from: String,
}

/// The smallest of `warmup.memoryBudget`, [`HEADROOM`] of the class's host memory
/// (`kiln.dev/memory-gib`) and, for an engine on the GPU (`on_gpu`), [`HEADROOM`] of one GPU's
/// memory (`nvidia.com/gpu.memory`, MiB; the CUDA provider's every layer is on one GPU). With
/// none of them, or a class fact that is no whole number (a hand-set label), why not.
pub fn auto_budget(fit: &MemoryFit, on_gpu: bool) -> Result<Budget, String> {
    let class_share = |key: &str, unit_shift: u32, unit: &str| -> Result<Option<Budget>, String> {
        let Some(value) = fit.class.get(key) else {
            return Ok(None);
        };
        let whole: u64 = value.parse().map_err(|_| {
            format!("the class's {key} is {value:?}, not a whole number of {unit}; fix the node label or set warmup.memoryBudget")
        })?;
        let bytes = whole
            .checked_shl(unit_shift)
            .filter(|b| b >> unit_shift == whole);
        Ok(Some(Budget {
            bytes: (bytes.unwrap_or(u64::MAX) as f64 * HEADROOM) as u64,
            from: format!("{HEADROOM} of the class's {key} {value} {unit}"),
        }))
    };
    let mut figures: Vec<Budget> = fit
        .budget
        .map(|bytes| Budget {
            bytes,
            from: "warmup.memoryBudget".into(),
        })
        .into_iter()
        .collect();
    figures.extend(class_share(MEMORY_GIB, 30, "GiB")?);
    if on_gpu {
        figures.extend(class_share(GPU_MEMORY, 20, "MiB")?);
    }
    figures.into_iter().min_by_key(|b| b.bytes).ok_or_else(|| {
        format!("quantization auto fits the memory the engine may use, and neither warmup.memoryBudget nor the class's {MEMORY_GIB} gives it: set warmup.memoryBudget, or add {MEMORY_GIB} to classLabelKeys (each node's agent reports it from the node's memory)")
    })
}

/// Bytes beyond weights and KV cache that llama.cpp's CPU engine holds (compute buffers,
/// logits, the vocabulary): a fixed floor plus a share of the weights, measured on the test
/// model and rounded up.
const OVERHEAD_FIXED: u64 = 64 << 20;
const OVERHEAD_SHARE: f64 = 0.10;

/// Memory a model of `header` takes in `quantization` with `context` tokens of KV cache (F16
/// keys and values, llama.cpp's default).
pub fn estimate(header: &Header, quantization: Quantization, context: u32) -> u64 {
    let weights = header.parameters as f64 * quantization.bits_per_weight() / 8.0;
    engine_bytes(header, weights as u64, context)
}

/// Memory an engine takes whose weights are `weight_bytes` (of a GGUF file: its size).
pub fn engine_bytes(header: &Header, weight_bytes: u64, context: u32) -> u64 {
    let head = header.embedding.checked_div(header.heads).unwrap_or(0);
    let kv = 2u64
        .saturating_mul(header.layers)
        .saturating_mul(u64::from(context))
        .saturating_mul(head)
        .saturating_mul(header.kv_heads)
        .saturating_mul(2);
    ((weight_bytes as f64 * (1.0 + OVERHEAD_SHARE)) as u64)
        .saturating_add(kv)
        .saturating_add(OVERHEAD_FIXED)
}

/// Whether an engine needing `need` bytes may be loaded where the process may use `available`
/// (unknown: yes): refused before llama.cpp allocates, since its memory is not under the agent's
/// heap ceiling and an allocation past the cgroup's limit would kill the agent, not fail.
pub fn fits_machine(need: u64, available: Option<u64>, context: u32) -> Result<(), String> {
    match available {
        Some(a) if need > a => Err(format!(
            "the engine needs about {need} bytes (weights, and the KV cache of contextLength {context}), this agent may use {a}; lower backend.llamacpp.contextLength or quantise smaller"
        )),
        _ => Ok(()),
    }
}

/// Bits per weight of a ggml tensor type (by `gguf.rs`'s names), `None` for one kiln does
/// not size.
pub fn type_bits(name: &str) -> Option<f64> {
    Some(match name {
        "F32" => 32.0,
        "F16" | "BF16" => 16.0,
        "Q8_0" => 8.5,
        "Q6_K" => 6.5625,
        "Q5_1" => 6.0,
        "Q5_0" | "Q5_K" => 5.5,
        "Q4_1" => 5.0,
        "Q4_0" | "Q4_K" => 4.5,
        "Q3_K" => 3.4375,
        "Q2_K" => 2.625,
        _ => return None,
    })
}

/// The type an already quantised source's weights are in, with its bits per weight: the most
/// common tensor type that is not a float one (norms, and in some files embeddings, stay F32
/// or F16; a `Q4_K_M` file keeps a few matrices at `Q6_K`, its most common type is `Q4_K`).
/// Gemma 3 270M's `Q4_K_M` file is mostly `Q5_0`: k-quants' blocks of 256 do not divide its
/// 640-wide matrices. `None` for a float source. A type kiln does not size counts as quantised
/// at 0 bits, so nothing is taken for larger than it without `allowRequantization`.
pub fn source_quantization(header: &Header) -> Option<(String, f64)> {
    dominant(header, false).map(|name| (name.to_string(), type_bits(name).unwrap_or(0.0)))
}

/// The tensor type most of the source's tensors have among the float types (`float`) or among
/// the others.
fn dominant(header: &Header, float: bool) -> Option<&str> {
    header
        .tensor_types
        .iter()
        .filter(|(name, _)| matches!(name.as_str(), "F32" | "F16" | "BF16") == float)
        .max_by_key(|(_, count)| **count)
        .map(|(name, _)| name.as_str())
}

/// How far up from its source `auto` may go.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Ceiling {
    /// Below a quantised source's dominant type, in bits: its own types, tried first, are the
    /// largest it may serve.
    Below(f64),
    /// Up to a float source's own width, in bits: an F16 source is never widened to F32, whose
    /// extra bits were never there.
    AtMost(f64),
}

impl Ceiling {
    /// Whether a type of `bits` per weight is under this ceiling.
    pub fn admits(self, bits: f64) -> bool {
        match self {
            Self::Below(c) => bits < c,
            Self::AtMost(c) => bits <= c,
        }
    }

    /// The ceiling of a source whose tensors `header` describes.
    pub fn of(header: &Header) -> Option<Self> {
        if let Some((_, bits)) = source_quantization(header) {
            return Some(Self::Below(bits));
        }
        dominant(header, true).and_then(type_bits).map(Self::AtMost)
    }
}

/// Refuses a weight type with at least as many bits per weight as an already quantised
/// source's: requantising cannot recover what the source's quantiser dropped, so the larger
/// type would only cost memory and time while its name promised precision.
pub fn refuse_requantization(source: &(String, f64), q: Quantization) -> Result<(), String> {
    let (name, bits) = source;
    if q.bits_per_weight() >= *bits {
        return Err(format!(
            "the source is already quantised to {name} ({bits} bits per weight); {} ({} bits) cannot recover what {name} dropped: leave backend.llamacpp.quantization unset to serve the source's own types, name a smaller type, or set backend.llamacpp.allowRequantization: true",
            q.as_str(),
            q.bits_per_weight()
        ));
    }
    Ok(())
}

/// The largest concrete type below `ceiling` bits per weight (an already quantised source's;
/// `None`: any) whose estimate fits `budget`, or why none does.
pub fn choose(
    header: &Header,
    context: u32,
    budget: &Budget,
    ceiling: Option<Ceiling>,
) -> Result<Quantization, String> {
    Quantization::CONCRETE
        .into_iter()
        .filter(|q| ceiling.is_none_or(|c| c.admits(q.bits_per_weight())))
        .find(|q| estimate(header, *q, context) <= budget.bytes)
        .ok_or_else(|| {
            let smallest = Quantization::CONCRETE[Quantization::CONCRETE.len() - 1];
            format!(
                "no weight type fits {} bytes ({}) with contextLength {context}: the smallest, {}, needs about {} bytes; raise the budget, give the class more memory or lower the context length",
                budget.bytes,
                budget.from,
                smallest.as_str(),
                estimate(header, smallest, context)
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 7B llama: 32 layers, 4096 wide, 32 heads, 8 KV heads.
    fn seven_b() -> Header {
        Header {
            architecture: "llama".into(),
            layers: 32,
            embedding: 4096,
            heads: 32,
            kv_heads: 8,
            parameters: 7_000_000_000,
            ..Header::default()
        }
    }

    fn budget(bytes: u64) -> Budget {
        Budget {
            bytes,
            from: "warmup.memoryBudget".into(),
        }
    }

    /// What a compile for a class of `gib` GiB (and `gpu_mib` of GPU memory) with `budget` knows.
    fn class(budget: Option<u64>, gib: Option<&str>, gpu_mib: Option<&str>) -> MemoryFit {
        let mut fit = MemoryFit {
            budget,
            ..MemoryFit::default()
        };
        fit.class
            .insert("kubernetes.io/arch".into(), "amd64".into());
        if let Some(g) = gib {
            fit.class.insert(MEMORY_GIB.into(), g.into());
        }
        if let Some(m) = gpu_mib {
            fit.class.insert(GPU_MEMORY.into(), m.into());
        }
        fit
    }

    #[test]
    fn a_quantised_source_is_never_requantised_to_as_many_bits_or_more() {
        let mut h = seven_b();
        h.tensor_types = [
            ("F32".into(), 65),
            ("Q4_K".into(), 193),
            ("Q6_K".into(), 33),
        ]
        .into();
        let source = source_quantization(&h).expect("quantised");
        assert_eq!(source, ("Q4_K".to_string(), 4.5));
        for q in [Quantization::Q8_0, Quantization::Q4KM, Quantization::Q4_0] {
            let err = refuse_requantization(&source, q).expect_err("not smaller");
            assert!(err.contains("Q4_K") && err.contains(q.as_str()), "{err}");
            assert!(err.contains("allowRequantization"), "{err}");
        }
        h.tensor_types = [("F32".into(), 65), ("Q4_1".into(), 211)].into();
        let q4_1 = source_quantization(&h).expect("quantised");
        refuse_requantization(&q4_1, Quantization::Q4_0).expect("4.5 bits is below Q4_1's 5");
        // auto: only types below the source's, however much memory there is.
        let gib = 1u64 << 30;
        assert_eq!(
            choose(&h, 4096, &budget(64 * gib), Ceiling::of(&h)),
            Ok(Quantization::Q4KM)
        );
        h.tensor_types = [("F32".into(), 65), ("F16".into(), 226)].into();
        assert_eq!(source_quantization(&h), None, "a float source");
        // A float source: at most its own width, so F16 stays F16 where F32 would fit.
        assert_eq!(Ceiling::of(&h), Some(Ceiling::AtMost(16.0)));
        assert_eq!(
            choose(&h, 4096, &budget(64 * gib), Ceiling::of(&h)),
            Ok(Quantization::F16)
        );
        assert_eq!(
            choose(&h, 4096, &budget(64 * gib), None),
            Ok(Quantization::F32)
        );
        h.tensor_types = [("F32".into(), 291)].into();
        assert_eq!(
            choose(&h, 4096, &budget(64 * gib), Ceiling::of(&h)),
            Ok(Quantization::F32)
        );
    }

    #[test]
    fn auto_takes_the_largest_type_that_fits() {
        let h = seven_b();
        let gib = 1u64 << 30;
        assert_eq!(
            choose(&h, 4096, &budget(64 * gib), None),
            Ok(Quantization::F32)
        );
        assert_eq!(
            choose(&h, 4096, &budget(16 * gib), None),
            Ok(Quantization::F16)
        );
        assert_eq!(
            choose(&h, 4096, &budget(9 * gib), None),
            Ok(Quantization::Q8_0)
        );
        assert_eq!(
            choose(&h, 4096, &budget(5 * gib), None),
            Ok(Quantization::Q4KM)
        );
        let err = choose(&h, 4096, &budget(2 * gib), None).expect_err("nothing fits 2 GiB");
        assert!(
            err.contains("Q4_0") && err.contains("memoryBudget"),
            "{err}"
        );
    }

    #[test]
    fn auto_fits_the_smallest_of_the_budget_and_the_class_memory() {
        let gib = 1u64 << 30;
        let host = |g: u64| (g as f64 * gib as f64 * HEADROOM) as u64;
        // The class's host memory alone, at the headroom.
        let b = auto_budget(&class(None, Some("16"), None), false).expect("memory fact");
        assert_eq!(b.bytes, host(16));
        assert!(
            b.from.contains(MEMORY_GIB) && b.from.contains("16 GiB"),
            "{}",
            b.from
        );
        // A budget below it wins, and above it loses.
        let b = auto_budget(&class(Some(4 * gib), Some("16"), None), false).expect("both");
        assert_eq!((b.bytes, b.from.as_str()), (4 * gib, "warmup.memoryBudget"));
        let b = auto_budget(&class(Some(64 * gib), Some("16"), None), false).expect("both");
        assert_eq!(b.bytes, host(16));
        // GPU memory counts only for an engine on the GPU (none yet: llama.cpp is CPU-only here).
        let gpu = class(None, Some("64"), Some("24576"));
        assert_eq!(auto_budget(&gpu, false).expect("host").bytes, host(64));
        let b = auto_budget(&gpu, true).expect("gpu");
        assert_eq!(b.bytes, host(24));
        assert!(b.from.contains(GPU_MEMORY), "{}", b.from);
        // Neither: refused, saying what to set.
        let err = auto_budget(&class(None, None, Some("24576")), false).expect_err("none");
        assert!(
            err.contains("memoryBudget") && err.contains(MEMORY_GIB),
            "{err}"
        );
        // A hand-set label that is no number is named; a huge one saturates, never wraps.
        let err = auto_budget(&class(Some(gib), Some("lots"), None), false).expect_err("label");
        assert!(err.contains("\"lots\""), "{err}");
        let huge = auto_budget(&class(None, Some(&u64::MAX.to_string()), None), false);
        assert!(huge.expect("saturates").bytes > 1 << 62);
    }

    #[test]
    fn two_classes_apart_only_in_memory_get_their_own_types_and_one_class_one_type() {
        let h = seven_b();
        let pick = |gib: &str| {
            let budget = auto_budget(&class(None, Some(gib), None), false).expect("budget");
            choose(&h, 4096, &budget, None)
        };
        // A 7B model with 4096 tokens of context: F16 on a 32 GiB class (25.6 GiB usable),
        // Q8_0 on a 16 (12.8), Q5_K_M on an 8 (6.4); nothing on a 4.
        assert_eq!(pick("32"), Ok(Quantization::F16));
        assert_eq!(pick("16"), Ok(Quantization::Q8_0));
        assert_eq!(pick("8"), Ok(Quantization::Q5KM));
        assert_eq!(pick("16"), pick("16"));
        let err = pick("4").expect_err("4 GiB");
        assert!(err.contains(MEMORY_GIB), "{err}");
    }

    #[test]
    fn an_engine_larger_than_the_machine_is_refused_before_loading() {
        let h = seven_b();
        let need = engine_bytes(&h, 7_700_000_000, 4096);
        assert!(fits_machine(need, Some(16 << 30), 4096).is_ok());
        assert!(
            fits_machine(need, None, 4096).is_ok(),
            "unknown: not refused"
        );
        // A hostile context length: 2^20 tokens of KV cache are 128 GiB here.
        let huge = engine_bytes(&h, 7_700_000_000, 1 << 20);
        let err = fits_machine(huge, Some(64 << 30), 1 << 20).expect_err("too large");
        assert!(err.contains("contextLength 1048576"), "{err}");
    }

    #[test]
    fn a_longer_context_takes_a_smaller_type() {
        let h = seven_b();
        let nine = budget(9 * (1u64 << 30));
        assert_eq!(choose(&h, 2048, &nine, None), Ok(Quantization::Q8_0));
        // 128k tokens of KV cache: 16 GiB on their own.
        assert!(choose(&h, 131_072, &nine, None).is_err());
        assert!(estimate(&h, Quantization::Q8_0, 4096) > estimate(&h, Quantization::Q8_0, 512));
    }
}
