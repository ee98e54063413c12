//! Settings of `backend.kind: llamacpp` (GGUF language models on llama.cpp) and which model
//! formats each backend kind takes.

use std::collections::BTreeMap;

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Kind `llamacpp`: how the GGUF source is quantised and how the engine runs it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LlamacppSettings {
    /// The weight type of the compiled GGUF, made by llama.cpp's own quantiser: `F32`, `F16`,
    /// `Q8_0`, `Q6_K`, `Q5_K_M`, `Q4_K_M`, `Q4_0`, or `auto`, the largest of these whose
    /// weights and KV cache for `contextLength` fit the smallest of `warmup.memoryBudget` and,
    /// when `classLabelKeys` lists `kiln.dev/memory-gib`, 80% of the class's host memory, so
    /// each node size gets its own type (`auto` needs one of the two); from an already
    /// quantised source `auto` keeps the source's own types when they fit, else a smaller type.
    /// Unset: the source's own types, copied unchanged. Part of the compile key (with `auto`,
    /// the budget too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization: Option<Quantization>,
    /// Lets `quantization` name a type with as many or more bits per weight than an already
    /// quantised source's (its most common non-float tensor type, e.g. `Q4_K` in a `Q4_K_M`
    /// file). Off by default: requantising cannot recover what the source's quantiser dropped,
    /// so such a compile is refused naming both types; `auto` never picks above the source's
    /// own types either way. Not part of the compile key (it allows, it does not change bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_requantization: Option<bool>,
    /// Tokens the engine's context holds (prompt plus continuation); sizes the KV cache.
    /// Default 512. Part of the compile key (it decides what `auto` picks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 16, max = 1048576))]
    pub context_length: Option<u32>,
    /// CPU threads of the engine. Unset: the cores the agent may use. Not part of the compile
    /// key (it changes speed, not results).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub threads: Option<u32>,
}

/// What a language model's warmup measured: the prompt's forward pass (time to first token)
/// and the decode rate after it, each the median over the warmup iterations (the steady state),
/// and the first request after Ready apart.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Generation {
    /// Tokens of the fixture's prompt.
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub generated_tokens: u32,
    /// Time to first token: the prompt's forward pass, in seconds.
    pub prefill_seconds: f64,
    /// Tokens per second after the first.
    pub decode_tokens_per_second: f64,
    /// Warmup runs the two figures above are the median of (each on its own); 0: one run.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub runs: u32,
    /// The first request after Ready (the run after warmup): its time to first token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_request_prefill_seconds: Option<f64>,
    /// The first request after Ready: its decode rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_request_decode_tokens_per_second: Option<f64>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Generation {
    /// The steady state of `runs` (one per warmup iteration): prefill time and decode rate each
    /// their median (of an even count, the mean of the middle two), with `first_request`, the
    /// run after warmup, apart. `None` without runs.
    pub fn steady(runs: &[Generation], first_request: Option<Generation>) -> Option<Generation> {
        let last = runs.last()?;
        let median = |f: fn(&Generation) -> f64| {
            let mut v: Vec<f64> = runs.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            let mid = v.len() / 2;
            if v.len().is_multiple_of(2) {
                (v[mid - 1] + v[mid]) / 2.0
            } else {
                v[mid]
            }
        };
        Some(Generation {
            prompt_tokens: last.prompt_tokens,
            generated_tokens: last.generated_tokens,
            prefill_seconds: median(|g| g.prefill_seconds),
            decode_tokens_per_second: median(|g| g.decode_tokens_per_second),
            runs: u32::try_from(runs.len()).unwrap_or(u32::MAX),
            first_request_prefill_seconds: first_request.map(|g| g.prefill_seconds),
            first_request_decode_tokens_per_second: first_request
                .map(|g| g.decode_tokens_per_second),
        })
    }
}

/// The default `contextLength`.
pub const DEFAULT_CONTEXT_LENGTH: u32 = 512;

impl LlamacppSettings {
    /// The context length with its default filled in.
    pub fn context_length(&self) -> u32 {
        self.context_length.unwrap_or(DEFAULT_CONTEXT_LENGTH)
    }

    /// The settings [`LlamacppSettings::options`] wrote, read back (`source`: unset).
    pub fn from_options(options: &BTreeMap<String, String>) -> Self {
        let quantization = options
            .get("llamacpp.quantization")
            .filter(|q| q.as_str() != "source")
            .and_then(|q| serde_json::from_value(serde_json::Value::String(q.clone())).ok());
        let context_length = options
            .get("llamacpp.contextLength")
            .and_then(|n| n.parse().ok());
        Self {
            quantization,
            context_length,
            ..Self::default()
        }
    }

    /// The settings as they enter the compile key and the build manifest's backend options.
    pub fn options(&self) -> BTreeMap<String, String> {
        let quantization = self.quantization.map_or("source", Quantization::as_str);
        BTreeMap::from([
            ("llamacpp.quantization".into(), quantization.into()),
            (
                "llamacpp.contextLength".into(),
                self.context_length().to_string(),
            ),
        ])
    }
}

/// Weight types of a compiled GGUF, largest first (llama.cpp's names).
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord,
)]
pub enum Quantization {
    /// The largest type that fits `warmup.memoryBudget` and the class's host memory.
    #[serde(rename = "auto")]
    Auto,
    /// 32-bit floats.
    F32,
    /// 16-bit floats.
    F16,
    /// 8-bit blocks of 32 with one scale.
    #[serde(rename = "Q8_0")]
    Q8_0,
    /// 6-bit k-quant.
    #[serde(rename = "Q6_K")]
    Q6K,
    /// 5-bit k-quant, medium mix.
    #[serde(rename = "Q5_K_M")]
    Q5KM,
    /// 4-bit k-quant, medium mix.
    #[serde(rename = "Q4_K_M")]
    Q4KM,
    /// 4-bit blocks of 32 with one scale.
    #[serde(rename = "Q4_0")]
    Q4_0,
}

impl Quantization {
    /// Every concrete type, largest first: the order `auto` tries them in.
    pub const CONCRETE: [Quantization; 7] = [
        Self::F32,
        Self::F16,
        Self::Q8_0,
        Self::Q6K,
        Self::Q5KM,
        Self::Q4KM,
        Self::Q4_0,
    ];

    /// The name in specs, manifests and llama.cpp.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Q8_0 => "Q8_0",
            Self::Q6K => "Q6_K",
            Self::Q5KM => "Q5_K_M",
            Self::Q4KM => "Q4_K_M",
            Self::Q4_0 => "Q4_0",
        }
    }

    /// A concrete type by its name (as a manifest records it).
    pub fn parse(name: &str) -> Option<Self> {
        Self::CONCRETE.into_iter().find(|q| q.as_str() == name)
    }

    /// Average bits per weight of the type's large matrices (llama.cpp's figures; the norms
    /// stay F32, which this ignores as they are a tiny share).
    pub fn bits_per_weight(self) -> f64 {
        match self {
            Self::Auto | Self::F32 => 32.0,
            Self::F16 => 16.0,
            Self::Q8_0 => 8.5,
            Self::Q6K => 6.5625,
            Self::Q5KM => 5.69,
            Self::Q4KM => 4.89,
            Self::Q4_0 => 4.5,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantization_names_round_trip_and_order_largest_first() {
        for q in Quantization::CONCRETE {
            assert_eq!(Quantization::parse(q.as_str()), Some(q));
            let json = serde_json::to_value(q).expect("serialise");
            assert_eq!(json, serde_json::json!(q.as_str()));
        }
        assert_eq!(
            Quantization::parse("auto"),
            None,
            "auto is not a concrete type"
        );
        let bits: Vec<f64> = Quantization::CONCRETE
            .iter()
            .map(|q| q.bits_per_weight())
            .collect();
        assert!(bits.windows(2).all(|w| w[0] > w[1]), "{bits:?}");
    }

    #[test]
    fn the_steady_state_is_the_median_and_the_first_request_stands_apart() {
        let run = |prefill: f64, decode: f64| Generation {
            prompt_tokens: 8,
            generated_tokens: 4,
            prefill_seconds: prefill,
            decode_tokens_per_second: decode,
            ..Generation::default()
        };
        // One slow outlier (a loaded machine) does not move the median.
        let runs = [run(0.9, 0.6), run(0.02, 21.0), run(0.03, 19.0)];
        let g = Generation::steady(&runs, Some(run(0.5, 1.5))).expect("runs");
        assert_eq!(
            (g.prefill_seconds, g.decode_tokens_per_second),
            (0.03, 19.0)
        );
        assert_eq!(g.runs, 3);
        assert_eq!(g.first_request_prefill_seconds, Some(0.5));
        assert_eq!(g.first_request_decode_tokens_per_second, Some(1.5));
        let even = Generation::steady(&runs[1..], None).expect("two");
        assert_eq!(even.decode_tokens_per_second, 20.0);
        assert_eq!(even.first_request_prefill_seconds, None);
        assert_eq!(Generation::steady(&[], None), None);
    }

    #[test]
    fn spelling_out_the_defaults_gives_the_same_options() {
        let explicit = LlamacppSettings {
            context_length: Some(DEFAULT_CONTEXT_LENGTH),
            ..LlamacppSettings::default()
        };
        assert_eq!(explicit.options(), LlamacppSettings::default().options());
        let threads = LlamacppSettings {
            threads: Some(3),
            ..LlamacppSettings::default()
        };
        assert_eq!(threads.options(), LlamacppSettings::default().options());
    }
}
