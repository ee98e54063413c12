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
    let head = header.embedding.checked_div(header.heads).unwrap_or(0);
    let kv = 2 * header.layers * u64::from(context) * head * header.kv_heads * 2;
    (weights * (1.0 + OVERHEAD_SHARE)) as u64 + kv + OVERHEAD_FIXED
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
    fn a_longer_context_takes_a_smaller_type() {
        let h = seven_b();
        let budget = 9 * (1u64 << 30);
        assert_eq!(choose(&h, 2048, budget), Ok(Quantization::Q8_0));
        // 128k tokens of KV cache: 16 GiB on their own.
        assert!(choose(&h, 131_072, budget).is_err());
        assert!(estimate(&h, Quantization::Q8_0, 4096) > estimate(&h, Quantization::Q8_0, 512));
    }
}
