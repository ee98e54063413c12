//! Which weight type a class gets for `quantization: auto`: the largest that fits the memory
//! budget with the context length declared. Pure.

use kiln_crds::llamacpp::Quantization;

use super::gguf::Header;

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

/// The largest concrete type whose estimate fits `budget`, or why none does.
pub fn choose(header: &Header, context: u32, budget: u64) -> Result<Quantization, String> {
    Quantization::CONCRETE
        .into_iter()
        .find(|q| estimate(header, *q, context) <= budget)
        .ok_or_else(|| {
            let smallest = Quantization::CONCRETE[Quantization::CONCRETE.len() - 1];
            format!(
                "no weight type fits warmup.memoryBudget {budget} bytes with contextLength {context}: the smallest, {}, needs about {} bytes; raise the budget or lower the context length",
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

    #[test]
    fn auto_takes_the_largest_type_that_fits() {
        let h = seven_b();
        let gib = 1u64 << 30;
        assert_eq!(choose(&h, 4096, 64 * gib), Ok(Quantization::F32));
        assert_eq!(choose(&h, 4096, 16 * gib), Ok(Quantization::F16));
        assert_eq!(choose(&h, 4096, 9 * gib), Ok(Quantization::Q8_0));
        assert_eq!(choose(&h, 4096, 5 * gib), Ok(Quantization::Q4KM));
        let err = choose(&h, 4096, 2 * gib).expect_err("nothing fits 2 GiB");
        assert!(
            err.contains("Q4_0") && err.contains("memoryBudget"),
            "{err}"
        );
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
        let budget = 9 * (1u64 << 30);
        assert_eq!(choose(&h, 2048, budget), Ok(Quantization::Q8_0));
        // 128k tokens of KV cache: 16 GiB on their own.
        assert!(choose(&h, 131_072, budget).is_err());
        assert!(estimate(&h, Quantization::Q8_0, 4096) > estimate(&h, Quantization::Q8_0, 512));
    }
}
