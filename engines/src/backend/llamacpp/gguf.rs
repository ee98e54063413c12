//! Reads and checks a GGUF file's header in Rust before llama.cpp sees the file: the magic, the
//! version, every count bounded by the bytes that remain (so a hostile count allocates nothing),
//! the metadata kiln needs (architecture, vocabulary, layers, widths, context), and every
//! tensor's data inside the file for the types whose size is known. A file that is not GGUF, or
//! is truncated, is refused here with a message, never handed to C.

use std::collections::BTreeMap;
use std::io::{BufReader, Read};
use std::path::Path;

/// What kiln reads from a GGUF header.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Header {
    /// `general.architecture` (`llama`, `qwen2`, …).
    pub architecture: String,
    /// Entries of `tokenizer.ggml.tokens` (the vocabulary inside the file).
    pub vocab_size: u64,
    /// `<arch>.block_count`.
    pub layers: u64,
    /// `<arch>.embedding_length`.
    pub embedding: u64,
    /// `<arch>.attention.head_count`.
    pub heads: u64,
    /// `<arch>.attention.head_count_kv` (the head count when absent).
    pub kv_heads: u64,
    /// `<arch>.context_length`, the context the model was trained for.
    pub trained_context: u64,
    /// Elements of every tensor, summed.
    pub parameters: u64,
    /// Tensors per ggml type name (`F32`, `Q8_0`, …).
    pub tensor_types: BTreeMap<String, u64>,
}

/// Refuses what is not a well-formed GGUF file; `Err` carries the reason.
pub fn read(path: &Path) -> Result<Header, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    let mut r = Reader {
        inner: BufReader::new(file),
        pos: 0,
        len,
    };
    let magic = r.bytes(4)?;
    if magic != b"GGUF" {
        return Err(format!(
            "not a GGUF file (it starts with {:02x?}, GGUF files with \"GGUF\")",
            magic
        ));
    }
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(format!("GGUF version {version}; llama.cpp reads 2 and 3"));
    }
    let tensors = r.count(24)?;
    let kvs = r.count(13)?;
    let mut meta = BTreeMap::new();
    for _ in 0..kvs {
        let key = r.string()?;
        let value = r.value()?;
        meta.insert(key, value);
    }
    let mut header = header_from(&meta)?;
    let mut extents = Vec::new();
    for _ in 0..tensors {
        let name = r.string()?;
        let dims = r.u32()?;
        if dims == 0 || dims > 4 {
            return Err(format!("tensor {name:?} has {dims} dims (1 to 4 allowed)"));
        }
        let mut elements: u64 = 1;
        for _ in 0..dims {
            elements = elements
                .checked_mul(r.u64()?)
                .ok_or_else(|| format!("tensor {name:?}: element count overflows"))?;
        }
        let kind = r.u32()?;
        let offset = r.u64()?;
        let (type_name, size) = ggml_type(kind, elements);
        header.parameters = header.parameters.saturating_add(elements);
        *header.tensor_types.entry(type_name).or_default() += 1;
        extents.push((name, offset, size));
    }
    let alignment = match meta.get("general.alignment") {
        Some(Value::Uint(a)) if a.is_power_of_two() => *a,
        None => 32,
        Some(other) => return Err(format!("general.alignment is {other:?}")),
    };
    let data = r.pos.div_ceil(alignment).saturating_mul(alignment);
    for (name, offset, size) in extents {
        let end = data
            .saturating_add(offset)
            .saturating_add(size.unwrap_or(0));
        if end > len {
            return Err(format!(
                "tensor {name:?} ends at byte {end}, past the end of the file ({len} bytes): truncated"
            ));
        }
    }
    Ok(header)
}

fn header_from(meta: &BTreeMap<String, Value>) -> Result<Header, String> {
    let architecture = match meta.get("general.architecture") {
        Some(Value::Str(a)) => a.clone(),
        _ => return Err("no general.architecture: not a model GGUF".into()),
    };
    let uint = |key: &str| match meta.get(&format!("{architecture}.{key}")) {
        Some(Value::Uint(v)) => Some(*v),
        _ => None,
    };
    let vocab_size = match meta.get("tokenizer.ggml.tokens") {
        Some(Value::Array(n)) => *n,
        _ => return Err("no tokenizer.ggml.tokens: the file carries no tokenizer".into()),
    };
    let heads = uint("attention.head_count").unwrap_or(0);
    Ok(Header {
        vocab_size,
        layers: uint("block_count").unwrap_or(0),
        embedding: uint("embedding_length").unwrap_or(0),
        heads,
        kv_heads: uint("attention.head_count_kv").unwrap_or(heads),
        trained_context: uint("context_length").unwrap_or(0),
        architecture,
        ..Header::default()
    })
}

/// The name and data size of a ggml type (`None`: a type kiln does not size; llama.cpp checks
/// it when it loads).
fn ggml_type(kind: u32, elements: u64) -> (String, Option<u64>) {
    // (name, block elements, block bytes), from ggml.h's `ggml_type` numbering.
    let (name, block, bytes) = match kind {
        0 => ("F32", 1, 4),
        1 => ("F16", 1, 2),
        2 => ("Q4_0", 32, 18),
        3 => ("Q4_1", 32, 20),
        6 => ("Q5_0", 32, 22),
        7 => ("Q5_1", 32, 24),
        8 => ("Q8_0", 32, 34),
        10 => ("Q2_K", 256, 84),
        11 => ("Q3_K", 256, 110),
        12 => ("Q4_K", 256, 144),
        13 => ("Q5_K", 256, 176),
        14 => ("Q6_K", 256, 210),
        30 => ("BF16", 1, 2),
        other => return (format!("type{other}"), None),
    };
    let size = elements.div_ceil(block).saturating_mul(bytes);
    (name.to_string(), Some(size))
}

/// A metadata value, as far as kiln reads it.
#[derive(Debug)]
enum Value {
    Uint(u64),
    /// A signed, float or boolean value: kiln reads none.
    Other,
    Str(String),
    /// An array, by its length.
    Array(u64),
}

struct Reader {
    inner: BufReader<std::fs::File>,
    pos: u64,
    len: u64,
}

impl Reader {
    fn bytes(&mut self, n: u64) -> Result<Vec<u8>, String> {
        if n > self.len.saturating_sub(self.pos) {
            return Err(format!(
                "header wants {n} bytes at byte {}, past the end of the file ({} bytes): truncated",
                self.pos, self.len
            ));
        }
        let mut buf = vec![0; usize::try_from(n).map_err(|e| e.to_string())?];
        self.inner
            .read_exact(&mut buf)
            .map_err(|e| format!("reading the header: {e}"))?;
        self.pos += n;
        Ok(buf)
    }

    fn skip(&mut self, n: u64) -> Result<(), String> {
        if n > self.len.saturating_sub(self.pos) {
            return Err(format!(
                "header value past the end of the file at byte {}: truncated",
                self.pos
            ));
        }
        let delta = i64::try_from(n).map_err(|e| e.to_string())?;
        self.inner.seek_relative(delta).map_err(|e| e.to_string())?;
        self.pos += n;
        Ok(())
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let v = self.bytes(N as u64)?;
        v.try_into().map_err(|_| "short read".to_string())
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A count of items at least `min_bytes` each: more than the rest of the file holds is
    /// refused before anything is allocated for them.
    fn count(&mut self, min_bytes: u64) -> Result<u64, String> {
        let n = self.u64()?;
        if n.saturating_mul(min_bytes) > self.len.saturating_sub(self.pos) {
            return Err(format!(
                "header claims {n} entries at byte {}, more than the file holds: corrupt or truncated",
                self.pos
            ));
        }
        Ok(n)
    }

    fn string(&mut self) -> Result<String, String> {
        let n = self.u64()?;
        if n > 1 << 20 {
            return Err(format!("a header string of {n} bytes (at most 1 MiB)"));
        }
        String::from_utf8(self.bytes(n)?).map_err(|_| "a header string is not UTF-8".into())
    }

    fn value(&mut self) -> Result<Value, String> {
        let kind = self.u32()?;
        self.scalar(kind)
    }

    fn scalar(&mut self, kind: u32) -> Result<Value, String> {
        Ok(match kind {
            0 => Value::Uint(u64::from(self.array::<1>()?[0])),
            1 | 7 => self.array::<1>().map(|_| Value::Other)?,
            2 => Value::Uint(u64::from(u16::from_le_bytes(self.array()?))),
            3 => self.array::<2>().map(|_| Value::Other)?,
            4 => Value::Uint(u64::from(self.u32()?)),
            5 | 6 => self.array::<4>().map(|_| Value::Other)?,
            8 => Value::Str(self.string()?),
            9 => {
                let inner = self.u32()?;
                let n = self.count(1)?;
                self.skip_items(inner, n)?;
                Value::Array(n)
            }
            10 => Value::Uint(self.u64()?),
            11 | 12 => self.array::<8>().map(|_| Value::Other)?,
            other => return Err(format!("unknown metadata value type {other}")),
        })
    }

    fn skip_items(&mut self, kind: u32, n: u64) -> Result<(), String> {
        let width = match kind {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            10..=12 => 8,
            8 => {
                for _ in 0..n {
                    let len = self.u64()?;
                    self.skip(len)?;
                }
                return Ok(());
            }
            _ => {
                return Err(format!(
                    "metadata array of type {kind} (nested arrays are refused)"
                ));
            }
        };
        self.skip(n.saturating_mul(width))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/tiny-llama/model.gguf")
    }

    #[test]
    fn the_test_model_reads_as_written() {
        let h = read(&tiny()).expect("tiny model");
        assert_eq!(h.architecture, "llama");
        assert_eq!(h.vocab_size, 312);
        assert_eq!((h.layers, h.embedding, h.heads, h.kv_heads), (2, 128, 4, 2));
        assert_eq!(h.trained_context, 256);
        assert_eq!(h.tensor_types.keys().collect::<Vec<_>>(), ["F32"]);
        // 2 × 312 × 128 embeddings + 2 blocks of (128² q, 2 × 64 × 128 k/v, 128² out,
        // 3 × 256 × 128 feed-forward, 2 × 128 norms) + 128 output norm.
        let block = 2 * 128 * 128 + 2 * 64 * 128 + 3 * 256 * 128 + 2 * 128;
        assert_eq!(h.parameters, 2 * 312 * 128 + 2 * block + 128);
    }

    #[test]
    fn hostile_headers_are_refused_with_a_reason() {
        let dir = tempfile::tempdir().expect("tmp");
        let bytes = std::fs::read(tiny()).expect("tiny");
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("onnx", b"\x08\x07\x12\x04onnx".to_vec(), "not a GGUF file"),
            ("empty", Vec::new(), "truncated"),
            ("header only", bytes[..2000].to_vec(), "truncated"),
            (
                "data cut",
                bytes[..bytes.len() - 1000].to_vec(),
                "past the end of the file",
            ),
            (
                "huge count",
                [
                    b"GGUF".as_slice(),
                    &3u32.to_le_bytes(),
                    &u64::MAX.to_le_bytes(),
                    &[0; 8],
                ]
                .concat(),
                "more than the file holds",
            ),
            (
                "version 9",
                [b"GGUF".as_slice(), &9u32.to_le_bytes(), &[0; 16]].concat(),
                "version 9",
            ),
        ];
        for (name, data, want) in cases {
            let path = dir.path().join(name);
            std::fs::write(&path, data).expect("write");
            let err = read(&path).expect_err(name);
            assert!(err.contains(want), "{name}: {err}");
        }
    }
}
