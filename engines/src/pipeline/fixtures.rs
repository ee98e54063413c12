//! Versioned warmup fixtures: one safetensors file with named inputs (`input/<name>`) and golden
//! outputs (`output/<name>`), the version and the tolerances it was made for in its metadata.
//! Reads a fixture file where asked; otherwise pure.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use kiln_crds::compiled_target::Tolerance;
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use crate::backend::tensor::HostTensor;
use kiln_node_core::error::{Error, Result};

const INPUT: &str = "input/";
const OUTPUT: &str = "output/";
/// The one metadata key; its value is a JSON map of the `kiln.fixture.*` fields.
const META_KEY: &str = "kiln.fixture";
const META_VERSION: &str = "kiln.fixture.version";
const META_MODEL: &str = "kiln.fixture.model_sha256";
const META_ATOL: &str = "kiln.fixture.atol";
const META_RTOL: &str = "kiln.fixture.rtol";
const META_PRODUCER: &str = "kiln.fixture.producer";
const META_PROMPT_TEXT: &str = "kiln.fixture.prompt_text";
const META_CHAT: &str = "kiln.fixture.chat";
const META_CHAT_TEMPLATE: &str = "kiln.fixture.chat_template_sha256";
const META_CONTINUATION: &str = "kiln.fixture.continuation_text";

/// A fixture file in memory.
#[derive(Clone, Debug, PartialEq)]
pub struct FixtureFile {
    /// Fixture version.
    pub version: String,
    /// sha256 of the model it was made from.
    pub model_sha256: Option<String>,
    /// Suggested tolerance.
    pub tolerance: Option<Tolerance>,
    /// Inputs by name.
    pub inputs: BTreeMap<String, HostTensor>,
    /// Golden outputs by name.
    pub outputs: BTreeMap<String, HostTensor>,
    /// Further samples after this first one (`sample<k>/input/<name>` and
    /// `sample<k>/output/<name>`, k = 1, 2, …): the same names, dtypes and shapes, other values.
    /// Warmup alternates every sample; an engine that replays captured work (CUDA graphs) needs
    /// at least two that parity tells apart.
    pub more: Vec<Sample>,
    /// A language model's first sample as text (metadata); empty for other models.
    pub text: TextFixture,
}

/// What a language-model fixture says as text beside its token tensors, for the first sample:
/// the prompt the reference tokenizer turned into `input/prompt`, the chat messages and the
/// digest of the template that rendered them into that prompt, and the detokenized greedy
/// continuation (`output/tokens`). Warmup checks each with the artifact's own tokenizer and
/// template (`pipeline::text`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TextFixture {
    /// The prompt as text (with chat messages: as the template rendered them).
    pub prompt: Option<String>,
    /// Chat messages, a JSON list of `{role, content}`.
    pub chat: Option<String>,
    /// sha256 (hex) of the chat template that rendered `chat`.
    pub chat_template_sha256: Option<String>,
    /// The golden continuation, detokenized.
    pub continuation: Option<String>,
}

impl TextFixture {
    /// Whether the fixture says anything as text.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    fn fields(&self) -> [(&'static str, &Option<String>); 4] {
        [
            (META_PROMPT_TEXT, &self.prompt),
            (META_CHAT, &self.chat),
            (META_CHAT_TEMPLATE, &self.chat_template_sha256),
            (META_CONTINUATION, &self.continuation),
        ]
    }

    fn from_meta(info: &BTreeMap<String, String>) -> Self {
        let get = |k: &str| info.get(k).cloned();
        Self {
            prompt: get(META_PROMPT_TEXT),
            chat: get(META_CHAT),
            chat_template_sha256: get(META_CHAT_TEMPLATE),
            continuation: get(META_CONTINUATION),
        }
    }
}

/// One more input set of a fixture and its golden outputs.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Inputs by name.
    pub inputs: BTreeMap<String, HostTensor>,
    /// Golden outputs by name.
    pub outputs: BTreeMap<String, HostTensor>,
}

/// The most samples a fixture may hold.
pub const MAX_SAMPLES: usize = 64;

impl FixtureFile {
    /// Reads and checks a fixture file.
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path)
            .map_err(|e| Error::source_unavailable(path.display().to_string(), e))?;
        Self::parse(&bytes)
            .map_err(|m| Error::InvalidSpec(format!("fixture file {}: {m}", path.display())))
    }

    /// Parses safetensors bytes.
    pub fn parse(bytes: &[u8]) -> std::result::Result<Self, String> {
        let (_, meta) = SafeTensors::read_metadata(bytes)
            .map_err(|e| format!("not a safetensors file: {e}"))?;
        let info: BTreeMap<String, String> = meta
            .metadata()
            .as_ref()
            .and_then(|m| m.get(META_KEY))
            .map(|json| {
                serde_json::from_str(json)
                    .map_err(|e| format!("metadata {META_KEY} is not a JSON map: {e}"))
            })
            .transpose()?
            .ok_or(format!(
                "metadata has no {META_KEY}: not a kiln fixture file"
            ))?;
        let tensors =
            SafeTensors::deserialize(bytes).map_err(|e| format!("not a safetensors file: {e}"))?;
        let mut file = FixtureFile {
            version: info
                .get(META_VERSION)
                .cloned()
                .ok_or("metadata has no kiln.fixture.version")?,
            model_sha256: info.get(META_MODEL).cloned(),
            tolerance: match (info.get(META_ATOL), info.get(META_RTOL)) {
                (Some(a), Some(r)) => Some(Tolerance {
                    atol: a.parse().map_err(|_| "bad atol")?,
                    rtol: r.parse().map_err(|_| "bad rtol")?,
                }),
                _ => None,
            },
            inputs: BTreeMap::new(),
            outputs: BTreeMap::new(),
            more: Vec::new(),
            text: TextFixture::from_meta(&info),
        };
        let mut more: BTreeMap<usize, Sample> = BTreeMap::new();
        for (name, view) in tensors.tensors() {
            let tensor = HostTensor {
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                data: view.data().to_vec(),
            };
            let (index, rest) = split_sample(&name)?;
            let (inputs, outputs) = match index {
                0 => (&mut file.inputs, &mut file.outputs),
                k => {
                    let s = more.entry(k).or_insert_with(|| Sample {
                        inputs: BTreeMap::new(),
                        outputs: BTreeMap::new(),
                    });
                    (&mut s.inputs, &mut s.outputs)
                }
            };
            if let Some(n) = rest.strip_prefix(INPUT) {
                inputs.insert(n.to_string(), tensor);
            } else if let Some(n) = rest.strip_prefix(OUTPUT) {
                outputs.insert(n.to_string(), tensor);
            } else {
                return Err(format!(
                    "tensor {name:?} is neither input/<name> nor output/<name> (optionally under sample<k>/)"
                ));
            }
        }
        if file.inputs.is_empty() || file.outputs.is_empty() {
            return Err("a fixture needs at least one input/ and one output/ tensor".into());
        }
        for (position, (k, sample)) in more.into_iter().enumerate() {
            if k != position + 1 {
                return Err(format!(
                    "sample{k}/ follows sample{position}/: samples are numbered 1, 2, … without gaps"
                ));
            }
            same_layout(&file.inputs, &sample.inputs, "input", k)?;
            same_layout(&file.outputs, &sample.outputs, "output", k)?;
            file.more.push(sample);
        }
        Ok(file)
    }

    /// Every sample as a fixture of its own (the first, then `more`), for running and checking
    /// one at a time.
    pub fn samples(&self) -> Vec<FixtureFile> {
        let first = (self.inputs.clone(), self.outputs.clone());
        let rest = self
            .more
            .iter()
            .map(|s| (s.inputs.clone(), s.outputs.clone()));
        std::iter::once(first)
            .chain(rest)
            .enumerate()
            .map(|(i, (inputs, outputs))| FixtureFile {
                version: self.version.clone(),
                model_sha256: self.model_sha256.clone(),
                tolerance: self.tolerance,
                inputs,
                outputs,
                more: Vec::new(),
                text: if i == 0 {
                    self.text.clone()
                } else {
                    TextFixture::default()
                },
            })
            .collect()
    }

    /// Serialises to safetensors bytes. Same contents, same bytes: the metadata is one key whose
    /// value is JSON with sorted keys, because safetensors writes its metadata map in hash order.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut meta = BTreeMap::from([
            (META_VERSION, self.version.clone()),
            (
                META_PRODUCER,
                concat!("kiln-agent ", env!("CARGO_PKG_VERSION")).to_string(),
            ),
        ]);
        if let Some(m) = &self.model_sha256 {
            meta.insert(META_MODEL, m.clone());
        }
        if let Some(t) = &self.tolerance {
            meta.insert(META_ATOL, t.atol.to_string());
            meta.insert(META_RTOL, t.rtol.to_string());
        }
        for (key, value) in self.text.fields() {
            if let Some(v) = value {
                meta.insert(key, v.clone());
            }
        }
        let json = serde_json::to_string(&meta)
            .map_err(|e| Error::InvalidSpec(format!("fixture metadata: {e}")))?;
        let info = HashMap::from([(META_KEY.to_string(), json)]);
        let samples = std::iter::once((String::new(), &self.inputs, &self.outputs)).chain(
            self.more
                .iter()
                .enumerate()
                .map(|(i, s)| (format!("sample{}/", i + 1), &s.inputs, &s.outputs)),
        );
        let named: Vec<(String, &HostTensor)> = samples
            .flat_map(|(prefix, inputs, outputs)| {
                let ins = inputs.iter().map({
                    let p = prefix.clone();
                    move |(n, t)| (format!("{p}{INPUT}{n}"), t)
                });
                let outs = outputs
                    .iter()
                    .map(move |(n, t)| (format!("{prefix}{OUTPUT}{n}"), t));
                ins.chain(outs)
            })
            .collect();
        let views = named
            .into_iter()
            .map(|(n, t)| {
                TensorView::new(t.dtype, t.shape.clone(), &t.data)
                    .map(|v| (n.clone(), v))
                    .map_err(|e| Error::InvalidSpec(format!("fixture tensor {n}: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        safetensors::serialize(views, Some(info))
            .map_err(|e| Error::InvalidSpec(format!("fixture: {e}")))
    }
}

/// A tensor name's sample (0 without a `sample<k>/` prefix, else k ≥ 1) and the rest of it.
fn split_sample(name: &str) -> std::result::Result<(usize, &str), String> {
    let Some(rest) = name.strip_prefix("sample") else {
        return Ok((0, name));
    };
    let (digits, rest) = rest
        .split_once('/')
        .ok_or_else(|| format!("tensor {name:?}: sample<k>/ without a k"))?;
    match digits.parse::<usize>() {
        // One spelling per sample: no leading zeros, no sign.
        Ok(k) if (1..MAX_SAMPLES).contains(&k) && k.to_string() == digits => Ok((k, rest)),
        _ => Err(format!(
            "tensor {name:?}: sample<k>/ takes k from 1 to {} without leading zeros",
            MAX_SAMPLES - 1
        )),
    }
}

/// Whether a further sample has exactly the first one's tensors (names, dtypes, shapes).
fn same_layout(
    first: &BTreeMap<String, HostTensor>,
    other: &BTreeMap<String, HostTensor>,
    what: &str,
    k: usize,
) -> std::result::Result<(), String> {
    let layout = |m: &BTreeMap<String, HostTensor>| -> Vec<(String, Dtype, Vec<usize>)> {
        m.iter()
            .map(|(n, t)| (n.clone(), t.dtype, t.shape.clone()))
            .collect()
    };
    if layout(first) != layout(other) {
        return Err(format!(
            "sample{k}/ has {what}s {:?}, the first sample {:?}: every sample has the same {what} names, dtypes and shapes",
            layout(other),
            layout(first)
        ));
    }
    Ok(())
}

/// A seeded generator for fixture inputs (SplitMix64): the same seed gives the same fixtures on
/// every machine.
pub struct Seeded(u64);

impl Seeded {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A tensor of `dtype` and `shape`: floats uniform in [-1, 1), integers in [0, 100).
    pub fn tensor(&mut self, dtype: Dtype, shape: &[usize]) -> Result<HostTensor> {
        let n: usize = shape.iter().product();
        let data: Vec<u8> = match dtype {
            Dtype::F32 => (0..n)
                .flat_map(|_| (self.unit() as f32).to_le_bytes())
                .collect(),
            Dtype::F64 => (0..n).flat_map(|_| self.unit().to_le_bytes()).collect(),
            Dtype::I64 => (0..n)
                .flat_map(|_| ((self.next() % 100) as i64).to_le_bytes())
                .collect(),
            Dtype::I32 => (0..n)
                .flat_map(|_| ((self.next() % 100) as i32).to_le_bytes())
                .collect(),
            Dtype::U8 | Dtype::I8 => (0..n).map(|_| (self.next() % 100) as u8).collect(),
            Dtype::BOOL => (0..n).map(|_| (self.next() % 2) as u8).collect(),
            other => {
                return Err(Error::InvalidSpec(format!(
                    "cannot generate {other:?} inputs; pass --inputs"
                )));
            }
        };
        Ok(HostTensor {
            dtype,
            shape: shape.to_vec(),
            data,
        })
    }

    /// One pseudo-random byte.
    pub fn byte(&mut self) -> u8 {
        (self.next() >> 56) as u8
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_determinism() {
        let mut a = Seeded::new(7);
        let mut b = Seeded::new(7);
        let x = a.tensor(Dtype::F32, &[2, 3]).expect("gen");
        assert_eq!(x, b.tensor(Dtype::F32, &[2, 3]).expect("gen"));
        assert!(
            x.to_f64()
                .expect("f64")
                .iter()
                .all(|v| (-1.0..1.0).contains(v))
        );
        let file = FixtureFile {
            version: "v1".into(),
            model_sha256: Some("a".repeat(64)),
            tolerance: Some(Tolerance {
                atol: 1e-4,
                rtol: 1e-3,
            }),
            inputs: BTreeMap::from([("x".into(), x.clone())]),
            outputs: BTreeMap::from([("y".into(), x)]),
            more: Vec::new(),
            text: TextFixture {
                prompt: Some("Kiln warms \"models\"\n".into()),
                chat: None,
                chat_template_sha256: Some("b".repeat(64)),
                continuation: Some(" on every node ✓".into()),
            },
        };
        assert_eq!(
            FixtureFile::parse(&file.to_bytes().expect("bytes")).expect("parse"),
            file
        );
    }

    #[test]
    fn garbage_is_a_clear_error() {
        let err = FixtureFile::parse(b"definitely not safetensors").expect_err("garbage");
        assert!(err.contains("not a safetensors file"), "{err}");
    }

    fn sample(seed: u64) -> Sample {
        let mut g = Seeded::new(seed);
        Sample {
            inputs: BTreeMap::from([("x".into(), g.tensor(Dtype::F32, &[2]).expect("x"))]),
            outputs: BTreeMap::from([("y".into(), g.tensor(Dtype::F32, &[2]).expect("y"))]),
        }
    }

    fn with_more(more: Vec<Sample>) -> FixtureFile {
        let first = sample(1);
        FixtureFile {
            version: "v1".into(),
            model_sha256: None,
            tolerance: None,
            inputs: first.inputs,
            outputs: first.outputs,
            more,
            text: TextFixture::default(),
        }
    }

    #[test]
    fn further_samples_round_trip_and_split() {
        let file = with_more(vec![sample(2), sample(3)]);
        let parsed = FixtureFile::parse(&file.to_bytes().expect("bytes")).expect("parse");
        assert_eq!(parsed, file);
        let samples = parsed.samples();
        assert_eq!(samples.len(), 3);
        assert_eq!(samples[2].inputs, sample(3).inputs);
        assert_eq!(samples[2].outputs, sample(3).outputs);
        assert!(
            samples
                .iter()
                .all(|s| s.more.is_empty() && s.version == "v1")
        );
        // A fixture of one sample is what it always was.
        assert_eq!(with_more(vec![]).samples().len(), 1);
    }

    /// Safetensors bytes of a fixture whose tensors are named as given.
    fn raw(names: &[&str], shape: &[usize]) -> Vec<u8> {
        let data = vec![0u8; 4 * shape.iter().product::<usize>()];
        let views: Vec<(String, TensorView<'_>)> = names
            .iter()
            .map(|n| {
                let v = TensorView::new(Dtype::F32, shape.to_vec(), &data).expect("view");
                (n.to_string(), v)
            })
            .collect();
        let meta = HashMap::from([(
            META_KEY.to_string(),
            r#"{"kiln.fixture.version":"v1"}"#.to_string(),
        )]);
        safetensors::serialize(views, Some(meta)).expect("serialize")
    }

    #[test]
    fn malformed_samples_are_refused_naming_the_problem() {
        let ok = ["input/x", "output/y", "sample1/input/x", "sample1/output/y"];
        FixtureFile::parse(&raw(&ok, &[2])).expect("well-formed");
        for (names, says) in [
            (
                &["input/x", "output/y", "sample2/input/x", "sample2/output/y"][..],
                "without gaps",
            ),
            (
                &[
                    "input/x",
                    "output/y",
                    "sample01/input/x",
                    "sample01/output/y",
                ][..],
                "without leading zeros",
            ),
            (&["input/x", "output/y", "sample0/input/x"][..], "from 1 to"),
            (
                &["input/x", "output/y", "sample1/input/x"][..],
                "same output names",
            ),
            (
                &["input/x", "output/y", "sample1/input/z", "sample1/output/y"][..],
                "same input names",
            ),
            (&["input/x", "output/y", "samplex"][..], "without a k"),
            (
                &["input/x", "output/y", "sample1/other/x"][..],
                "neither input/",
            ),
        ] {
            let err = FixtureFile::parse(&raw(names, &[2])).expect_err(says);
            assert!(err.contains(says), "{names:?}: {err}");
        }
    }
}
