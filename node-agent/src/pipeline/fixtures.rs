//! Versioned warmup fixtures: one safetensors file with named inputs (`input/<name>`) and golden
//! outputs (`output/<name>`), the version and the tolerances it was made for in its metadata.
//! Reads a fixture file where asked; otherwise pure.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use kiln_crds::compiled_target::Tolerance;
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use crate::error::{Error, Result};
use crate::pipeline::tensor::HostTensor;

const INPUT: &str = "input/";
const OUTPUT: &str = "output/";
/// The one metadata key; its value is a JSON map of the `kiln.fixture.*` fields.
const META_KEY: &str = "kiln.fixture";
const META_VERSION: &str = "kiln.fixture.version";
const META_MODEL: &str = "kiln.fixture.model_sha256";
const META_ATOL: &str = "kiln.fixture.atol";
const META_RTOL: &str = "kiln.fixture.rtol";
const META_PRODUCER: &str = "kiln.fixture.producer";

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
}

impl FixtureFile {
    /// Reads and checks a fixture file.
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::SourceUnavailable {
            uri: path.display().to_string(),
            message: e.to_string(),
        })?;
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
        };
        for (name, view) in tensors.tensors() {
            let tensor = HostTensor {
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                data: view.data().to_vec(),
            };
            if let Some(n) = name.strip_prefix(INPUT) {
                file.inputs.insert(n.to_string(), tensor);
            } else if let Some(n) = name.strip_prefix(OUTPUT) {
                file.outputs.insert(n.to_string(), tensor);
            } else {
                return Err(format!(
                    "tensor {name:?} is neither input/<name> nor output/<name>"
                ));
            }
        }
        if file.inputs.is_empty() || file.outputs.is_empty() {
            return Err("a fixture needs at least one input/ and one output/ tensor".into());
        }
        Ok(file)
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
        let json = serde_json::to_string(&meta)
            .map_err(|e| Error::InvalidSpec(format!("fixture metadata: {e}")))?;
        let info = HashMap::from([(META_KEY.to_string(), json)]);
        let views = self
            .inputs
            .iter()
            .map(|(n, t)| (format!("{INPUT}{n}"), t))
            .chain(
                self.outputs
                    .iter()
                    .map(|(n, t)| (format!("{OUTPUT}{n}"), t)),
            )
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
}
