//! Model sources kept in OCI registries: `oci://HOST[:PORT]/REPOSITORY@sha256:<manifest>[#FILE]`,
//! a CNCF ModelPack artifact or any OCI artifact whose layers are the files themselves (what
//! `oras push FILE…` makes). The manifest is pulled by its digest and checked against it; the
//! file is the layer annotated with its name (`org.cncf.model.filepath`, ModelPack's, or
//! `org.opencontainers.image.title`, oras's), or the only layer; that layer's digest must be the
//! sha256 the spec declares, so only the file's own bytes (a raw layer, never a tar or a
//! compressed one) can pass, and they are hashed while they stream in. Parsing and choosing are
//! pure; [`OciStore::pull_file`] touches the registry and `dest`.

use std::path::Path;

use oci_client::Reference;
use oci_client::manifest::{OciDescriptor, OciImageManifest};

use super::OciStore;
use crate::staged::{Expected, oci_digest};
use crate::{Error, Result};

/// ModelPack's annotation of a layer's path in the model directory.
pub const MODELPACK_FILEPATH: &str = "org.cncf.model.filepath";
/// The OCI annotation oras gives each file it pushes.
pub const IMAGE_TITLE: &str = "org.opencontainers.image.title";
/// `artifactType` of a ModelPack manifest.
pub const MODELPACK_ARTIFACT_TYPE: &str = "application/vnd.cncf.model.manifest.v1+json";

/// A parsed `oci://` source URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceRef {
    /// `HOST[:PORT]`.
    pub registry: String,
    /// The repository path.
    pub repository: String,
    /// `sha256:<hex>` of the artifact's manifest.
    pub manifest_digest: String,
    /// The file's annotated name, when the URI names one (`#FILE`).
    pub file: Option<String>,
}

impl SourceRef {
    /// Parses `oci://HOST[:PORT]/REPOSITORY@sha256:<64 hex>[#FILE]`; a tag is refused (it can
    /// move), as is a file name that is not a relative path of plain components.
    pub fn parse(uri: &str) -> std::result::Result<Self, String> {
        let form = "expected oci://HOST[:PORT]/REPOSITORY@sha256:<manifest digest>[#FILE]";
        let rest = uri
            .strip_prefix("oci://")
            .ok_or_else(|| format!("not an oci:// URI; {form}"))?;
        let (rest, file) = match rest.split_once('#') {
            Some((rest, file)) => (rest, Some(check_file(file)?)),
            None => (rest, None),
        };
        let (name, digest) = rest.split_once('@').ok_or_else(|| {
            format!("no manifest digest: pin the artifact by digest, not by tag; {form}")
        })?;
        let hex = digest
            .strip_prefix("sha256:")
            .filter(|h| crate::staged::is_sha256_hex(h))
            .ok_or_else(|| format!("digest {digest:?} is not sha256:<64 lowercase hex>; {form}"))?;
        let (registry, repository) = name
            .split_once('/')
            .filter(|(r, p)| !r.is_empty() && !p.is_empty())
            .ok_or_else(|| format!("no repository in {name:?}; {form}"))?;
        if repository.contains(':') {
            return Err(format!(
                "{name:?} carries a tag beside the digest; name the artifact by digest only; {form}"
            ));
        }
        let manifest_digest = format!("sha256:{hex}");
        Reference::try_from(format!("{registry}/{repository}@{manifest_digest}"))
            .map_err(|e| format!("{name:?} is not a valid repository ({e}); {form}"))?;
        Ok(Self {
            registry: registry.into(),
            repository: repository.into(),
            manifest_digest,
            file,
        })
    }

    /// The registry's repository, as a store URL (credentials and TLS are the registry's).
    pub fn repository_url(&self) -> String {
        format!("oci://{}/{}", self.registry, self.repository)
    }
}

/// A file name inside an artifact: relative, `/`-separated, no empty, `.` or `..` component.
fn check_file(file: &str) -> std::result::Result<String, String> {
    let plain = |c: &str| !c.is_empty() && c != "." && c != ".." && !c.contains('\\');
    if file.len() > 1024 || !file.split('/').all(plain) || file.chars().any(char::is_control) {
        return Err(format!(
            "#{file:?} is not a file name inside the artifact (a relative path of plain components)"
        ));
    }
    Ok(file.into())
}

/// A layer's file name, as ModelPack or oras annotates it.
pub fn layer_name(layer: &OciDescriptor) -> Option<&str> {
    let annotations = layer.annotations.as_ref()?;
    annotations
        .get(MODELPACK_FILEPATH)
        .or_else(|| annotations.get(IMAGE_TITLE))
        .map(String::as_str)
}

/// The layer that holds the wanted file: the one named `file`, else the only layer, else the one
/// whose digest is `sha256`; then its digest must be `sha256` and its size `size` (when known).
pub fn pick_layer<'a>(
    image: &'a OciImageManifest,
    file: Option<&str>,
    sha256: &str,
    size: Option<u64>,
) -> std::result::Result<&'a OciDescriptor, String> {
    let want = format!("sha256:{sha256}");
    let names = || {
        let names: Vec<&str> = image
            .layers
            .iter()
            .map(|l| layer_name(l).unwrap_or("(unnamed)"))
            .collect();
        names.join(", ")
    };
    let layer = match (file, image.layers.as_slice()) {
        (_, []) => return Err("the artifact has no layers".into()),
        (Some(file), layers) => {
            let mut named = layers.iter().filter(|l| layer_name(l) == Some(file));
            match (named.next(), named.next()) {
                (Some(layer), None) => layer,
                (None, _) => return Err(format!("no layer is named {file:?}; it has {}", names())),
                (Some(_), Some(_)) => {
                    return Err(format!("two or more layers are named {file:?}"));
                }
            }
        }
        (None, [only]) => only,
        (None, layers) => layers
            .iter()
            .find(|l| l.digest == want)
            .ok_or_else(|| {
                format!(
                    "the artifact has {} layers ({}) and none has the declared digest; name the file: …@sha256:…#FILE",
                    layers.len(),
                    names()
                )
            })?,
    };
    let name = layer_name(layer).unwrap_or("(unnamed)");
    if layer.digest != want {
        return Err(format!(
            "layer {name} has digest {} ({}), but the spec declares sha256 {sha256}: kiln reads a file from its own raw layer only (not a tar or compressed one); push the file as it is (oras push FILE:MEDIATYPE) or fix the declared digest",
            layer.digest, layer.media_type
        ));
    }
    if let Some(size) = size
        && u64::try_from(layer.size).ok() != Some(size)
    {
        return Err(format!(
            "layer {name} is {} bytes, but the spec declares {size}",
            layer.size
        ));
    }
    Ok(layer)
}

impl OciStore {
    /// [`OciStore::pull_file_here`] from the first pull mirror that serves the file verified,
    /// else from this registry; a mirror passed over is logged with its reason.
    pub async fn pull_file(
        &self,
        source: &SourceRef,
        dest: &Path,
        expected: Expected,
        max_bytes: u64,
    ) -> Result<u64> {
        for m in self.mirrors.iter().filter(|m| m.endpoint.pull) {
            match m
                .store
                .pull_file_here(source, dest, expected.clone(), max_bytes)
                .await
            {
                Ok(written) => return Ok(written),
                Err(e) => self.skip(m, super::mirror::reason(&e), e.to_string()),
            }
        }
        self.pull_file_here(source, dest, expected, max_bytes).await
    }

    /// Pulls the file `source` names, verified against `expected`, into `dest`, from this
    /// registry only: the manifest by its digest (checked), the layer [`pick_layer`] chooses,
    /// hashed while it streams. Without a declared size the layer's is taken, refused past
    /// `max_bytes`. Returns the bytes written.
    async fn pull_file_here(
        &self,
        source: &SourceRef,
        dest: &Path,
        mut expected: Expected,
        max_bytes: u64,
    ) -> Result<u64> {
        let what = format!("{} in {}", expected.what, source.repository_url());
        // The artifact does not hold the declared file: the spec and the registry disagree.
        let refuse = |message: String| Error::HashMismatch {
            what: what.clone(),
            message,
        };
        let reference = self.by_digest(&source.manifest_digest);
        let doing = format!("pulling manifest {}", source.manifest_digest);
        let bytes = self
            .manifest_bytes(&reference, &doing)
            .await?
            .ok_or_else(|| {
                let message = format!("{doing}: the registry has no such manifest");
                Error::unavailable(source.repository_url(), message)
            })?;
        if oci_digest(&bytes) != source.manifest_digest {
            return Err(Error::HashMismatch {
                what: format!("manifest {}", source.manifest_digest),
                message: format!(
                    "the registry served bytes with digest {}",
                    oci_digest(&bytes)
                ),
            });
        }
        let image: OciImageManifest = serde_json::from_slice(&bytes)
            .map_err(|e| refuse(format!("not an OCI image manifest: {e}")))?;
        let layer = pick_layer(
            &image,
            source.file.as_deref(),
            &expected.digest,
            expected.size,
        )
        .map_err(refuse)?;
        let size = u64::try_from(layer.size).unwrap_or(u64::MAX);
        if size > max_bytes {
            return Err(refuse(format!(
                "its layer is {size} bytes, more than the {max_bytes} fetched without a declared size (--fetch-max-bytes); declare its size"
            )));
        }
        expected.size = Some(size);
        self.pull_layer(&reference, layer, dest, expected).await?;
        Ok(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn a_source_is_named_by_digest_and_optionally_a_file() {
        let s = SourceRef::parse(&format!(
            "oci://r.example:5000/models/bert@sha256:{HEX}#onnx/model.onnx"
        ))
        .expect("parsed");
        assert_eq!(
            s,
            SourceRef {
                registry: "r.example:5000".into(),
                repository: "models/bert".into(),
                manifest_digest: format!("sha256:{HEX}"),
                file: Some("onnx/model.onnx".into()),
            }
        );
        assert_eq!(s.repository_url(), "oci://r.example:5000/models/bert");
        let plain = SourceRef::parse(&format!("oci://r/m@sha256:{HEX}")).expect("parsed");
        assert_eq!(plain.file, None);
    }

    #[test]
    fn tags_odd_digests_and_paths_out_of_the_artifact_are_refused() {
        for (uri, says) in [
            ("oci://r/m:v1".to_string(), "not by tag"),
            (
                format!("oci://r/m:v1@sha256:{HEX}"),
                "tag beside the digest",
            ),
            (format!("oci://r/m@sha512:{HEX}"), "sha256:<64"),
            ("oci://r/m@sha256:ABC".to_string(), "sha256:<64"),
            (format!("oci://r@sha256:{HEX}"), "no repository"),
            (format!("oci:///m@sha256:{HEX}"), "no repository"),
            (
                format!("oci://r/m@sha256:{HEX}#../etc/passwd"),
                "plain components",
            ),
            (format!("oci://r/m@sha256:{HEX}#/abs"), "plain components"),
            (format!("oci://r/m@sha256:{HEX}#a//b"), "plain components"),
            (format!("oci://r/m@sha256:{HEX}#"), "plain components"),
            (format!("oci://r/M@sha256:{HEX}"), "not a valid repository"),
            (format!("https://r/m@sha256:{HEX}"), "not an oci://"),
        ] {
            let e = SourceRef::parse(&uri).expect_err("refused");
            assert!(e.contains(says), "{uri}: {e}");
        }
    }

    fn layer(name: Option<(&str, &str)>, bytes: &[u8], media_type: &str) -> OciDescriptor {
        OciDescriptor {
            media_type: media_type.into(),
            digest: oci_digest(bytes),
            size: bytes.len() as i64,
            annotations: name.map(|(k, v)| [(k.to_string(), v.to_string())].into()),
            ..Default::default()
        }
    }

    fn image(layers: Vec<OciDescriptor>) -> OciImageManifest {
        OciImageManifest {
            layers,
            ..Default::default()
        }
    }

    /// The digest of the picked layer, to compare (descriptors have no `PartialEq`).
    fn picked(
        r: std::result::Result<&OciDescriptor, String>,
    ) -> std::result::Result<String, String> {
        r.map(|l| l.digest.clone())
    }

    fn hex(bytes: &[u8]) -> String {
        oci_digest(bytes).trim_start_matches("sha256:").to_string()
    }

    #[test]
    fn the_file_is_found_by_its_annotated_name_or_as_the_only_layer() {
        let weights = layer(
            Some((MODELPACK_FILEPATH, "model.onnx")),
            b"onnx",
            "application/vnd.cncf.model.weight.v1.raw",
        );
        let data = layer(
            Some((MODELPACK_FILEPATH, "model.onnx.data")),
            b"data",
            "application/vnd.cncf.model.weight.v1.raw",
        );
        let tokenizer = layer(
            Some((IMAGE_TITLE, "tokenizer.json")),
            b"{}",
            "application/vnd.oci.image.layer.v1.tar",
        );
        let pack = image(vec![weights.clone(), data.clone(), tokenizer.clone()]);
        assert_eq!(
            picked(pick_layer(
                &pack,
                Some("model.onnx.data"),
                &hex(b"data"),
                Some(4)
            )),
            Ok(data.digest.clone())
        );
        assert_eq!(
            picked(pick_layer(&pack, Some("tokenizer.json"), &hex(b"{}"), None)),
            Ok(tokenizer.digest.clone())
        );
        // Without a name, the declared digest finds it among several.
        assert_eq!(
            picked(pick_layer(&pack, None, &hex(b"onnx"), None)),
            Ok(weights.digest.clone())
        );
        let only = image(vec![tokenizer.clone()]);
        assert_eq!(
            picked(pick_layer(&only, None, &hex(b"{}"), Some(2))),
            Ok(tokenizer.digest.clone())
        );
    }

    #[test]
    fn a_layer_that_is_not_the_declared_file_is_refused_saying_why() {
        let tarred = layer(
            Some((MODELPACK_FILEPATH, "model.onnx")),
            b"tar of it",
            "application/vnd.cncf.model.weight.v1.tar",
        );
        let other = layer(Some((MODELPACK_FILEPATH, "b.bin")), b"b", "x");
        let pack = image(vec![tarred.clone(), other]);
        for (file, sha, size, says) in [
            (Some("model.onnx"), hex(b"onnx"), None, "raw layer only"),
            (
                Some("missing.onnx"),
                hex(b"onnx"),
                None,
                "no layer is named \"missing.onnx\"; it has model.onnx, b.bin",
            ),
            (None, hex(b"onnx"), None, "name the file"),
            (
                Some("b.bin"),
                hex(b"b"),
                Some(7),
                "is 1 bytes, but the spec declares 7",
            ),
        ] {
            let e = pick_layer(&pack, file, &sha, size).expect_err("refused");
            assert!(e.contains(says), "{file:?}: {e}");
        }
        assert!(
            pick_layer(&image(vec![]), None, &hex(b"b"), None)
                .expect_err("refused")
                .contains("no layers")
        );
        let twice = image(vec![tarred.clone(), tarred]);
        assert!(
            pick_layer(&twice, Some("model.onnx"), &hex(b"x"), None)
                .expect_err("refused")
                .contains("two or more")
        );
    }
}
