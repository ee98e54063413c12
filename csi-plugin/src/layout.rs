//! The directory a serving pod gets, built in `<cache>/published/<volume_id>/` from what the
//! node cache holds, then re-verified; the contract with whatever serves it (`kiln-agent
//! serve`, or the user's own server):
//!
//! | file | what |
//! |---|---|
//! | `artifact` | the compiled artifact, a hard link to the cached file (same inode: eviction or a newer revision never changes it under a running pod), hashed against the row's digest before the mount unless the plugin's proof of that inode still holds ([`Check::Sealed`], `seals.rs`) |
//! | `manifest.json` | its build manifest (engine, provider settings, precision, profiles), a copy |
//! | `fixture.safetensors` | the fixture the node's warmup passed with, a hard link to its blob, re-hashed; absent when the pass recorded none |
//! | `chat-template.jinja` | a GGUF target's chat template given beside the model, as its verified artifact carries it (read after the re-hash); absent otherwise |
//! | `kiln.json` | `kiln_crds::mounted::MountedModel` (the contract with servers): target, namespace, revision, class, digest, engine, media type, fixture, node, pod, and the artifact's seal (inode, size, modification time as proved); written last |
//!
//! Files are mode 0444 (the artifact's inode too, which the cache shares: the pod's user, not
//! root, must read it), the directory 0555; the mount is read-only besides.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use kiln_crds::BuildManifest;
use kiln_crds::mounted::Seal;
use kiln_store::staged::{Stamp, sha256_file};

use super::admit::Serving;
use super::request::Publish;

pub use kiln_crds::mounted::{
    ARTIFACT, CHAT_TEMPLATE, FIXTURE, KILN_JSON as INFO, MANIFEST, MountedModel,
};

/// `kiln.json` for a volume (pure): the row's revision, class, digest and engine (the manifest's
/// when the row names none), the pod it is mounted for.
pub fn info(
    p: &Publish,
    s: &Serving,
    manifest: &BuildManifest,
    fixture: Option<&str>,
    node: &str,
) -> MountedModel {
    MountedModel {
        namespace: p.namespace.clone(),
        target: p.target.clone(),
        revision: s.revision,
        class: s.class.clone(),
        digest: s.digest.clone(),
        engine: Some(s.engine.clone().unwrap_or_else(|| manifest.engine())),
        media_type: manifest.media_type.clone(),
        fixture: fixture.map(str::to_string),
        chat_template: None,
        node: node.to_string(),
        pod: format!("{}/{}", p.namespace, p.pod),
        seal: None,
    }
}

/// How the linked artifact's bytes are proved.
#[derive(Clone, Copy, Debug)]
pub enum Check {
    /// Hash them.
    Hash,
    /// The plugin's proof vouched for the digest in the inode standing at this stamp before the
    /// link: no hash when the linked inode still has the same content (the link moves only its
    /// change time); a hash otherwise.
    Sealed(Stamp),
}

/// A built volume: the manifest, and the artifact's stamp as proved (after the link).
#[derive(Debug)]
pub struct Built {
    /// The artifact's build manifest.
    pub manifest: BuildManifest,
    /// The artifact inode's stamp once linked, read-only and proved.
    pub stamp: Stamp,
    /// Whether its bytes were hashed for this volume (false: taken on the proof).
    pub hashed: bool,
}

/// Where the volume's files come from, in the node cache.
#[derive(Clone, Debug)]
pub struct Sources {
    /// `artifacts/<digest>/artifact`.
    pub artifact: PathBuf,
    /// `artifacts/<digest>/manifest.json`.
    pub manifest: PathBuf,
    /// `blobs/<sha256>` of the fixture and its sha256, when the pass recorded one.
    pub fixture: Option<(PathBuf, String)>,
}

/// Why a volume could not be built; its directory is gone.
#[derive(Debug)]
pub enum BuildError {
    /// The node cache no longer holds the artifact (or its manifest).
    NotCached(String),
    /// A file did not hash to its digest, or the manifest names other bytes.
    HashMismatch(String),
    /// Anything else the filesystem said.
    Io(String),
}

/// Builds the volume in `dir` (removing what an interrupted build left there), proves it as
/// `check` says, and returns what was built; on any failure removes `dir`.
pub fn build(
    dir: &Path,
    src: &Sources,
    p: &Publish,
    s: &Serving,
    node: &str,
    check: Check,
) -> Result<Built, BuildError> {
    let result = build_in(
        dir,
        src,
        |manifest, fixture| info(p, s, manifest, fixture, node),
        s,
        check,
    );
    if result.is_err() {
        let _ = remove(dir);
    }
    result
}

/// [`build`]'s steps; `describe` makes `kiln.json` from the manifest and the fixture's sha256.
fn build_in(
    dir: &Path,
    src: &Sources,
    describe: impl FnOnce(&BuildManifest, Option<&str>) -> MountedModel,
    s: &Serving,
    check: Check,
) -> Result<Built, BuildError> {
    let fs_err = |what: &Path| {
        let what = what.display().to_string();
        move |e: io::Error| BuildError::Io(format!("{what}: {e}"))
    };
    remove(dir).map_err(fs_err(dir))?;
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(fs_err(parent))?;
    }
    std::fs::create_dir(dir).map_err(fs_err(dir))?;
    let not_cached = |path: &Path, e: io::Error| match e.kind() {
        io::ErrorKind::NotFound => BuildError::NotCached(format!(
            "artifact {} of revision {} is not in the node cache ({} is missing): not mounted \
             until kiln-agent has it verified again",
            s.digest,
            s.revision,
            path.display()
        )),
        _ => BuildError::Io(format!("{}: {e}", path.display())),
    };
    let bytes = std::fs::read(&src.manifest).map_err(|e| not_cached(&src.manifest, e))?;
    let manifest: BuildManifest = serde_json::from_slice(&bytes).map_err(|e| {
        BuildError::HashMismatch(format!(
            "HashMismatch: the cached build manifest {} does not parse ({e}); not mounted",
            src.manifest.display()
        ))
    })?;
    if manifest.artifact_digest != s.digest {
        return Err(BuildError::HashMismatch(format!(
            "HashMismatch: the cached build manifest names artifact {}, the node's row {}; not \
             mounted",
            manifest.artifact_digest, s.digest
        )));
    }
    let artifact = dir.join(ARTIFACT);
    std::fs::hard_link(&src.artifact, &artifact).map_err(|e| not_cached(&src.artifact, e))?;
    read_only(&artifact).map_err(fs_err(&artifact))?;
    write_read_only(&dir.join(MANIFEST), &bytes).map_err(fs_err(dir))?;
    let fixture = match &src.fixture {
        Some((blob, sha256)) => link_fixture(dir, blob, sha256)?,
        None => None,
    };
    let (stamp, hashed) = prove(&artifact, &s.digest, manifest.artifact_size, check)?;
    let mut info = describe(&manifest, fixture.as_deref());
    info.chat_template = write_chat_template(dir, &artifact, &manifest)?;
    info.seal = Some(Seal {
        inode: stamp.ino,
        size: stamp.size,
        mtime_ns: stamp.mtime_ns,
    });
    let json = serde_json::to_vec_pretty(&info).map_err(|e| BuildError::Io(e.to_string()))?;
    write_read_only(&dir.join(INFO), &json).map_err(fs_err(dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555)).map_err(fs_err(dir))?;
    Ok(Built {
        manifest,
        stamp,
        hashed,
    })
}

/// Proves the linked artifact as `check` says, and returns its stamp and whether it was
/// hashed. A hash is bracketed by two stamps: bytes written while they were read are refused.
fn prove(
    artifact: &Path,
    digest: &str,
    size: u64,
    check: Check,
) -> Result<(Stamp, bool), BuildError> {
    let stat = |p: &Path| Stamp::of(p).map_err(|e| BuildError::Io(format!("{}: {e}", p.display())));
    let before = stat(artifact)?;
    if let Check::Sealed(proved) = check
        && proved.same_content(&before)
        && before.size == size
    {
        return Ok((before, false));
    }
    verify(artifact, digest, size)?;
    let after = stat(artifact)?;
    if !before.same_content(&after) {
        return Err(BuildError::HashMismatch(format!(
            "HashMismatch: the node cache's artifact {} was written while it was hashed; not \
             mounted",
            artifact.display()
        )));
    }
    Ok((after, true))
}

/// Links the fixture blob in and re-hashes it; a blob that is gone is left out (the mount still
/// carries the verified artifact), one that does not hash right refuses the volume.
fn link_fixture(dir: &Path, blob: &Path, sha256: &str) -> Result<Option<String>, BuildError> {
    let dest = dir.join(FIXTURE);
    match std::fs::hard_link(blob, &dest) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            tracing::warn!(blob = %blob.display(), "the fixture blob of the pass is gone; mounting without it");
            return Ok(None);
        }
        Err(e) => return Err(BuildError::Io(format!("{}: {e}", blob.display()))),
    }
    read_only(&dest).map_err(|e| BuildError::Io(format!("{}: {e}", dest.display())))?;
    let (got, _) = sha256_file(&dest).map_err(|e| BuildError::Io(e.to_string()))?;
    if got != sha256 {
        return Err(BuildError::HashMismatch(format!(
            "HashMismatch: fixture blob {} hashes to {got}, the pass recorded {sha256}; not \
             mounted",
            blob.display()
        )));
    }
    Ok(Some(sha256.to_string()))
}

/// Writes `chat-template.jinja` from a llamacpp artifact's index, when it carries a template
/// given beside the model, and returns its sha256. The artifact has just been re-hashed, so what
/// is read is what the node verified.
fn write_chat_template(
    dir: &Path,
    artifact: &Path,
    manifest: &BuildManifest,
) -> Result<Option<String>, BuildError> {
    if manifest.media_type != kiln_node_core::gguf_index::MEDIA_TYPE {
        return Ok(None);
    }
    let template = kiln_node_core::gguf_index::chat_template(artifact).map_err(|e| {
        BuildError::HashMismatch(format!(
            "HashMismatch: the verified llamacpp artifact's index does not read ({e}); not mounted"
        ))
    })?;
    let Some(template) = template else {
        return Ok(None);
    };
    let path = dir.join(CHAT_TEMPLATE);
    write_read_only(&path, template.as_bytes())
        .map_err(|e| BuildError::Io(format!("{}: {e}", path.display())))?;
    Ok(Some(kiln_store::staged::sha256_bytes(template.as_bytes())))
}

/// Re-hashes the linked artifact: the digest and the manifest's size, or `HashMismatch`.
fn verify(artifact: &Path, digest: &str, size: u64) -> Result<(), BuildError> {
    let (got, got_size) = sha256_file(artifact)
        .map_err(|e| BuildError::Io(format!("{}: {e}", artifact.display())))?;
    if got != digest || got_size != size {
        return Err(BuildError::HashMismatch(format!(
            "HashMismatch: the node cache's artifact hashes to {got} ({got_size} bytes), the \
             node's row says {digest} ({size} bytes); not mounted"
        )));
    }
    Ok(())
}

/// Mode 0444, left alone when it is already (a chmod would move the change time of the inode
/// the cache shares, and with it the plugin's proof).
fn read_only(path: &Path) -> io::Result<()> {
    if std::fs::metadata(path)?.permissions().mode() & 0o7777 == 0o444 {
        return Ok(());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o444))
}

fn write_read_only(path: &Path, bytes: &[u8]) -> io::Result<()> {
    std::fs::write(path, bytes)?;
    read_only(path)
}

/// Removes a volume's directory (made writable first: it is 0555 once built); gone already is
/// success.
pub fn remove(dir: &Path) -> io::Result<()> {
    match std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        _ => {}
    }
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_crds::kiln_node::NodePhase;

    fn publish() -> Publish {
        Publish {
            volume_id: "csi-1".into(),
            target_path: "/var/lib/kubelet/pods/u/mount".into(),
            namespace: "serving".into(),
            pod: "web-0".into(),
            pod_uid: "u".into(),
            target: "squeezenet".into(),
        }
    }

    fn serving(digest: &str) -> Serving {
        Serving {
            revision: 3,
            class: "cpu-x86".into(),
            digest: digest.into(),
            engine: Some("tract".into()),
            phase: NodePhase::Ready,
        }
    }

    /// A cache holding `bytes` as a tract artifact and `fixture` as a blob.
    fn cache(root: &Path, bytes: &[u8], fixture: &[u8]) -> (Sources, String) {
        cache_as(
            root,
            bytes,
            fixture,
            "application/vnd.kiln.tract.nnef.v1.tar",
        )
    }

    /// The same with the artifact's media type.
    fn cache_as(root: &Path, bytes: &[u8], fixture: &[u8], media: &str) -> (Sources, String) {
        let digest = kiln_store::staged::sha256_bytes(bytes);
        let manifest = kiln_node_core::test_support::manifest(serde_json::json!({
            "artifactDigest": digest, "artifactSize": bytes.len(), "mediaType": media
        }));
        let dir = root.join("artifacts").join(&digest);
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("artifact"), bytes).expect("artifact");
        std::fs::write(
            dir.join("manifest.json"),
            serde_json::to_vec(&manifest).expect("json"),
        )
        .expect("manifest");
        let fixture_digest = kiln_store::staged::sha256_bytes(fixture);
        let blob = root.join("blobs").join(&fixture_digest);
        std::fs::create_dir_all(root.join("blobs")).expect("blobs");
        std::fs::write(&blob, fixture).expect("blob");
        let src = Sources {
            artifact: dir.join("artifact"),
            manifest: dir.join("manifest.json"),
            fixture: Some((blob, fixture_digest)),
        };
        (src, digest)
    }

    #[test]
    fn kiln_json_names_what_is_mounted() {
        let m = kiln_node_core::test_support::manifest(serde_json::json!({
            "backend": "onnxruntime", "backendOptions": {"executionProvider": "cpu"},
            "mediaType": "application/vnd.kiln.ort"
        }));
        let mut s = serving(&"d".repeat(64));
        s.engine = None;
        let info = info(&publish(), &s, &m, Some(&"f".repeat(64)), "n1");
        assert_eq!(
            serde_json::to_value(&info).expect("json"),
            serde_json::json!({
                "namespace": "serving", "target": "squeezenet", "revision": 3,
                "class": "cpu-x86", "digest": "d".repeat(64), "engine": "onnxruntime/cpu",
                "mediaType": "application/vnd.kiln.ort", "fixture": "f".repeat(64),
                "node": "n1", "pod": "serving/web-0"
            })
        );
        let bytes = serde_json::to_vec(&info).expect("json");
        assert_eq!(
            MountedModel::parse(&bytes).expect("what servers read"),
            info
        );
    }

    /// A llamacpp artifact's bytes: a GGUF part and kiln's index, with `template`.
    fn gguf_artifact(template: Option<&str>) -> Vec<u8> {
        let tmp = tempfile::NamedTempFile::new().expect("tmp");
        std::fs::write(tmp.path(), b"GGUF-part").expect("write");
        let index = kiln_node_core::gguf_index::Index {
            profiles: Vec::new(),
            context_length: 512,
            quantization: "source".into(),
            gguf_bytes: 9,
            chat_template: template.map(str::to_string),
            provider: None,
        };
        kiln_node_core::gguf_index::append(tmp.path(), &index).expect("frame");
        std::fs::read(tmp.path()).expect("read")
    }

    #[test]
    fn a_chat_template_the_gguf_artifact_carries_is_a_file_of_the_volume() {
        let tmp = tempfile::tempdir().expect("tmp");
        let media = kiln_node_core::gguf_index::MEDIA_TYPE;
        let template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}";
        let (src, digest) = cache_as(tmp.path(), &gguf_artifact(Some(template)), b"fx", media);
        let dir = tmp.path().join("published").join("csi-1");
        build(&dir, &src, &publish(), &serving(&digest), "n1", Check::Hash).expect("built");
        let file = dir.join(CHAT_TEMPLATE);
        assert_eq!(std::fs::read_to_string(&file).expect("template"), template);
        let mode = std::fs::metadata(&file).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o444);
        let info = MountedModel::parse(&std::fs::read(dir.join(INFO)).expect("kiln.json"))
            .expect("parses");
        let sha = kiln_store::staged::sha256_bytes(template.as_bytes());
        assert_eq!(info.chat_template.as_deref(), Some(sha.as_str()));
        // Without a template beside the model (the GGUF's own is inside it): no file.
        let (src, digest) = cache_as(tmp.path(), &gguf_artifact(None), b"fx", media);
        let dir = tmp.path().join("published").join("csi-2");
        build(&dir, &src, &publish(), &serving(&digest), "n1", Check::Hash).expect("built");
        assert!(!dir.join(CHAT_TEMPLATE).exists());
        // An artifact whose index does not read is not mounted.
        let (src, digest) = cache_as(tmp.path(), b"GGUF, no index", b"fx", media);
        let dir = tmp.path().join("published").join("csi-3");
        match build(&dir, &src, &publish(), &serving(&digest), "n1", Check::Hash) {
            Err(BuildError::HashMismatch(m)) => assert!(m.contains("index"), "{m}"),
            other => panic!("an unreadable index was mounted: {other:?}"),
        }
        assert!(!dir.exists(), "nothing left of it");
    }

    #[test]
    fn a_volume_is_the_cached_inode_re_verified_and_read_only() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().expect("tmp");
        let (src, digest) = cache(tmp.path(), b"engine bytes", b"fixture bytes");
        let dir = tmp.path().join("published").join("csi-1");
        // What an interrupted build left is replaced.
        std::fs::create_dir_all(&dir).expect("leftover");
        std::fs::write(dir.join("artifact"), b"half").expect("leftover");
        build(&dir, &src, &publish(), &serving(&digest), "n1", Check::Hash).expect("built");
        let ino = |p: &Path| std::fs::metadata(p).expect("meta").ino();
        assert_eq!(ino(&dir.join(ARTIFACT)), ino(&src.artifact), "a hard link");
        assert_eq!(
            std::fs::read(dir.join(FIXTURE)).expect("fixture"),
            b"fixture bytes"
        );
        let info =
            MountedModel::parse(&std::fs::read(dir.join(INFO)).expect("kiln.json")).expect("parse");
        assert_eq!((info.digest.as_str(), info.revision), (digest.as_str(), 3));
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").mode() & 0o777;
        assert_eq!(mode(&dir), 0o555);
        assert_eq!(mode(&dir.join(ARTIFACT)), 0o444);
        // The cache evicts its copy: the volume's bytes stay.
        std::fs::remove_dir_all(src.artifact.parent().expect("dir")).expect("evict");
        assert_eq!(
            std::fs::read(dir.join(ARTIFACT)).expect("read"),
            b"engine bytes"
        );
        remove(&dir).expect("remove");
        assert!(!dir.exists());
        remove(&dir).expect("gone is success");
    }

    #[test]
    fn a_proved_inode_is_mounted_without_a_hash_a_written_one_is_hashed_and_refused() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (src, digest) = cache(tmp.path(), b"engine bytes", b"fixture bytes");
        let first = tmp.path().join("published").join("csi-1");
        let built = build(
            &first,
            &src,
            &publish(),
            &serving(&digest),
            "n1",
            Check::Hash,
        )
        .expect("built");
        assert!(built.hashed);
        let info = MountedModel::parse(&std::fs::read(first.join(INFO)).expect("kiln.json"))
            .expect("parses");
        let seal = info.seal.expect("sealed");
        let now = Stamp::of(&first.join(ARTIFACT)).expect("stat");
        assert_eq!(
            (seal.inode, seal.size, seal.mtime_ns),
            (now.ino, 12, now.mtime_ns)
        );
        // The second pod: the proof holds, no hash, the same seal.
        let proved = Stamp::of(&src.artifact).expect("stat");
        let second = tmp.path().join("published").join("csi-2");
        let again = build(
            &second,
            &src,
            &publish(),
            &serving(&digest),
            "n1",
            Check::Sealed(proved),
        )
        .expect("built");
        assert!(!again.hashed, "taken on the proof");
        // A byte flipped in the cache after the proof: hashed, refused, nothing left.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::set_permissions(&src.artifact, std::fs::Permissions::from_mode(0o644))
            .expect("chmod");
        std::fs::write(&src.artifact, b"engine bytez").expect("flip");
        let third = tmp.path().join("published").join("csi-3");
        let err = build(
            &third,
            &src,
            &publish(),
            &serving(&digest),
            "n1",
            Check::Sealed(proved),
        )
        .expect_err("refused");
        assert!(matches!(err, BuildError::HashMismatch(ref m) if m.starts_with("HashMismatch")));
        assert!(!third.exists());
    }

    #[test]
    fn what_does_not_re_verify_is_never_left_to_mount() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (src, digest) = cache(tmp.path(), b"engine bytes", b"fixture bytes");
        let dir = tmp.path().join("published").join("csi-1");
        // The row names other bytes than the cache's manifest.
        let other = "0".repeat(64);
        let err = build(&dir, &src, &publish(), &serving(&other), "n1", Check::Hash)
            .expect_err("refused");
        assert!(matches!(err, BuildError::HashMismatch(ref m) if m.contains("names artifact")));
        assert!(!dir.exists());
        // A flipped byte in the cached artifact.
        std::fs::write(&src.artifact, b"engine bytez").expect("flip");
        let err = build(&dir, &src, &publish(), &serving(&digest), "n1", Check::Hash)
            .expect_err("refused");
        assert!(matches!(err, BuildError::HashMismatch(ref m) if m.starts_with("HashMismatch")));
        assert!(!dir.exists());
        // A fixture blob that changed.
        std::fs::write(&src.artifact, b"engine bytes").expect("restore");
        let (blob, _) = src.fixture.clone().expect("fixture");
        std::fs::write(&blob, b"other").expect("flip");
        let err = build(&dir, &src, &publish(), &serving(&digest), "n1", Check::Hash)
            .expect_err("refused");
        assert!(matches!(err, BuildError::HashMismatch(ref m) if m.contains("fixture blob")));
        // A fixture that is gone: mounted without it.
        std::fs::remove_file(&blob).expect("rm");
        build(&dir, &src, &publish(), &serving(&digest), "n1", Check::Hash).expect("built");
        assert!(!dir.join(FIXTURE).exists());
        // Evicted: not cached.
        std::fs::remove_dir_all(src.artifact.parent().expect("dir")).expect("evict");
        let err = build(&dir, &src, &publish(), &serving(&digest), "n1", Check::Hash)
            .expect_err("refused");
        assert!(matches!(err, BuildError::NotCached(_)), "{err:?}");
        assert!(!dir.exists());
    }
}
