//! The node cache (a hostPath): verified artifacts by digest, each beside its build manifest, and
//! an index of which revisions passed on this node. Nothing is used without re-hashing it first,
//! a partial file never sits under a final name, and eviction keeps the last K known-good
//! artifacts per target and whatever is in use. Touches only the cache directory.
//!
//! The node daemon (`kiln-agent run`) is its only writer ([`Cache`]); the CSI node plugin reads it
//! through a [`View`], which creates, sweeps and deletes nothing of the daemon's, and keeps its
//! own volumes in `published/` (hard links to cached files, so eviction never pulls bytes from
//! under a running pod).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use kiln_crds::BuildManifest;
use kiln_store::staged::{install_dir, is_sha256_hex, sha256_file, sync_dir, write_synced};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

const ARTIFACT: &str = "artifact";
const MANIFEST: &str = "manifest.json";
const INDEX: &str = "index.json";
/// Prefix of a pull's staging directory in `tmp/`, before the digest.
const PULL_PREFIX: &str = "pull-";
/// How long the bytes of a pull that did not finish are kept for one that resumes it.
pub const RESUME_WINDOW: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Where one artifact's pull is staged: `tmp/pull-<digest>/`, the same directory each time, so
/// that the bytes a broken-off or killed pull kept there are where the next pull looks
/// ([`kiln_store::staged::VerifiedWrite::resumable`]).
pub struct PullDir(PathBuf);

impl PullDir {
    /// Where the store must put the artifact.
    pub fn artifact(&self) -> PathBuf {
        self.0.join(ARTIFACT)
    }

    /// After a failed pull: removes the directory when nothing was kept in it for the next
    /// pull (a refused download keeps nothing; one that broke off keeps its bytes).
    pub fn tidy(self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A revision that passed verify, load and warmup on this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KnownGood {
    /// Revision number.
    pub revision: i64,
    /// Class whose artifact passed.
    pub class: String,
    /// Compile key.
    pub compile_key: String,
    /// sha256 of the artifact.
    pub digest: String,
    /// Unix seconds of the pass.
    pub passed_at: i64,
    /// The target's generation (its warmup spec) the pass was under.
    #[serde(default)]
    pub generation: Option<i64>,
    /// sha256 of the fixture file the pass warmed with (`blobs/<digest>`): what the CSI plugin
    /// mounts beside the artifact. `None` in an index written before it was recorded, and for a
    /// re-verified entry that never recorded one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixture_digest: Option<String>,
}

/// A cached artifact that re-verified.
#[derive(Clone, Debug)]
pub struct Cached {
    /// The artifact file.
    pub path: PathBuf,
    /// Its build manifest.
    pub manifest: BuildManifest,
}

/// What survives an agent restart: per target (`namespace/name`), its known-good entries, oldest
/// first. Only a hint: every entry is re-verified before it is used.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Index {
    /// Target → known-good entries.
    pub targets: BTreeMap<String, Vec<KnownGood>>,
}

impl Index {
    /// The newest pass of `target` (`namespace/name`) with `revision` and artifact `digest`.
    pub fn pass(&self, target: &str, revision: i64, digest: &str) -> Option<&KnownGood> {
        self.targets
            .get(target)?
            .iter()
            .rev()
            .find(|k| k.revision == revision && k.digest == digest)
    }
}

/// The cache directory: `artifacts/<digest>/{artifact,manifest.json}`, `blobs/` (fixtures),
/// `tmp/` (pulls under way, and what unfinished ones kept for [`RESUME_WINDOW`]), `index.json`;
/// and `published/`, the CSI plugin's (only read here: which revision a pod's volume holds).
pub struct Cache {
    root: PathBuf,
    index: Index,
}

impl Cache {
    /// Opens (creating) the cache at `root`, discards what a previous run left in `tmp/` except
    /// recent pulls a new one can resume, and reads the index (an unreadable index is dropped:
    /// entries are hints, not truth).
    pub fn open(root: &Path) -> Result<Self> {
        for dir in ["artifacts", "blobs", "tmp"] {
            let d = root.join(dir);
            std::fs::create_dir_all(&d)
                .map_err(|e| Error::store_hint(&d, e, "pass a writable --cache"))?;
        }
        sweep_tmp(&root.join("tmp"), RESUME_WINDOW);
        let index = match std::fs::read(root.join(INDEX)) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "node cache index unreadable; starting with none");
                Index::default()
            }),
            Err(_) => Index::default(),
        };
        Ok(Self {
            root: root.to_path_buf(),
            index,
        })
    }

    /// Directory of verified fixture blobs.
    pub fn blobs(&self) -> PathBuf {
        self.root.join("blobs")
    }

    /// Pod (`namespace/name`) → the newest revision the CSI plugin's volumes for it hold
    /// (their `kiln.json` in `published/`, read only; one that does not parse is skipped).
    pub fn mounted_revisions(&self) -> BTreeMap<String, i64> {
        let mut by_pod = BTreeMap::new();
        let Ok(entries) = std::fs::read_dir(self.root.join("published")) else {
            return by_pod;
        };
        let volumes = entries
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join(kiln_crds::mounted::KILN_JSON)).ok())
            .filter_map(|bytes| kiln_crds::mounted::MountedModel::parse(&bytes).ok());
        for m in volumes {
            let newest = by_pod.entry(m.pod).or_insert(m.revision);
            *newest = (*newest).max(m.revision);
        }
        by_pod
    }

    fn dir(&self, digest: &str) -> Result<PathBuf> {
        artifact_dir(&self.root, digest)
    }

    /// The cached artifact with `digest`, re-hashed now; a copy that no longer matches is
    /// deleted and reported as `HashMismatch`. `Ok(None)` when it is not cached.
    pub fn verified(&self, digest: &str) -> Result<Option<Cached>> {
        let dir = self.dir(digest)?;
        let manifest = match std::fs::read(dir.join(MANIFEST)) {
            Ok(bytes) => match serde_json::from_slice::<BuildManifest>(&bytes) {
                Ok(m) => m,
                Err(_) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    return Ok(None);
                }
            },
            Err(_) => return Ok(None),
        };
        let path = dir.join(ARTIFACT);
        let (got, size) = sha256_file(&path).map_err(|e| Error::store(&path, e))?;
        if got != digest || size != manifest.artifact_size || manifest.artifact_digest != digest {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(Error::HashMismatch {
                what: format!("cached artifact {}", path.display()),
                message: format!(
                    "sha256 {got} ({size} bytes), expected {digest} ({} bytes); removed from the node cache",
                    manifest.artifact_size
                ),
                source: None,
            });
        }
        Ok(Some(Cached { path, manifest }))
    }

    /// The staging directory of the pull of `digest`: the store writes [`PullDir::artifact`]
    /// there (partial file, verify, rename), then [`Cache::install`] moves the directory into
    /// place. The same directory for every pull of the digest, so a pull resumes what an
    /// unfinished one kept.
    pub fn pull_dir(&self, digest: &str) -> Result<PullDir> {
        self.dir(digest)?;
        let dir = self
            .root
            .join("tmp")
            .join(format!("{PULL_PREFIX}{}", digest.to_ascii_lowercase()));
        std::fs::create_dir_all(&dir).map_err(|e| Error::store(&dir, e))?;
        Ok(PullDir(dir))
    }

    /// Moves a pull's directory whose artifact the store verified into place under
    /// `manifest.artifact_digest`, beside its manifest, everything fsynced before the rename.
    /// Returns the cached artifact's path.
    pub fn install(&self, staging: PullDir, manifest: &BuildManifest) -> Result<PathBuf> {
        let dest = self.dir(&manifest.artifact_digest)?;
        let staged = staging.artifact();
        let size = std::fs::metadata(&staged)
            .map_err(|e| Error::store(&staged, e))?
            .len();
        if size != manifest.artifact_size {
            let _ = std::fs::remove_dir_all(&staging.0);
            return Err(Error::HashMismatch {
                what: format!("pulled artifact {}", staged.display()),
                message: format!(
                    "{size} bytes, the build manifest says {}; nothing was cached",
                    manifest.artifact_size
                ),
                source: None,
            });
        }
        let json = serde_json::to_vec_pretty(manifest).map_err(|e| Error::store(&dest, e))?;
        let mpath = staging.0.join(MANIFEST);
        write_synced(&mpath, &json).map_err(|e| Error::store(&mpath, e))?;
        if dest.exists() {
            let _ = std::fs::remove_dir_all(&dest);
        }
        install_dir(staging.0, &dest).map_err(|e| Error::store(&dest, e))?;
        Ok(dest.join(ARTIFACT))
    }

    /// This target's known-good entries whose artifact is still cached.
    pub fn known_good(&self, target: &str) -> Vec<KnownGood> {
        self.index
            .targets
            .get(target)
            .into_iter()
            .flatten()
            .filter(|k| self.dir(&k.digest).is_ok_and(|d| d.join(MANIFEST).exists()))
            .cloned()
            .collect()
    }

    /// The fixture blob (`blobs/<sha256>`, and its sha256) the newest pass of `target`
    /// (`namespace/name`) with `revision` and artifact `digest` warmed with, as the index
    /// recorded it: what a serving pod of that revision is checked with, after an agent restart
    /// too. `None` when no such pass recorded a fixture. The caller re-hashes the blob before use.
    pub fn fixture_of(
        &self,
        target: &str,
        revision: i64,
        digest: &str,
    ) -> Option<(PathBuf, String)> {
        let entry = self.index.pass(target, revision, digest)?;
        let fixture = entry.fixture_digest.as_ref().filter(|d| is_sha256_hex(d))?;
        Some((self.blobs().join(fixture), fixture.clone()))
    }

    /// Records a pass and persists the index (temp file, fsync, rename).
    pub fn record_pass(&mut self, target: &str, entry: KnownGood) -> Result<()> {
        let list = self.index.targets.entry(target.to_string()).or_default();
        // One entry per artifact of a revision: the latest generation it passed under.
        list.retain(|k| !(k.revision == entry.revision && k.digest == entry.digest));
        list.push(entry);
        self.save()
    }

    fn save(&self) -> Result<()> {
        let path = self.root.join(INDEX);
        let tmp = self.root.join("tmp").join(INDEX);
        let json = serde_json::to_vec_pretty(&self.index).map_err(|e| Error::store(&path, e))?;
        write_synced(&tmp, &json)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| Error::store(&path, e))?;
        sync_dir(&self.root);
        Ok(())
    }

    /// Applies [`plan_eviction`]: keeps `keep[target]` entries per live target, drops the
    /// entries of targets that are gone, deletes unreferenced artifacts not in `protected`
    /// (what serves, and every artifact a target's history lists as known-good).
    /// Returns the digests deleted.
    pub fn evict(
        &mut self,
        keep: &BTreeMap<String, usize>,
        protected: &BTreeSet<String>,
    ) -> Result<Vec<String>> {
        let present: BTreeSet<String> = std::fs::read_dir(self.root.join("artifacts"))
            .map_err(|e| Error::store(self.root.join("artifacts"), e))?
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        // Pulls nobody resumed within the window (their target gone, say) go too.
        sweep_tmp(&self.root.join("tmp"), RESUME_WINDOW);
        let (index, delete) = plan_eviction(&self.index, keep, protected, &present);
        if index != self.index {
            self.index = index;
            self.save()?;
        }
        for digest in &delete {
            let dir = self.root.join("artifacts").join(digest);
            std::fs::remove_dir_all(&dir).map_err(|e| Error::store(&dir, e))?;
        }
        Ok(delete)
    }
}

impl Cache {
    /// Makes room for `needed` bytes on the cache's filesystem by deleting cached artifacts, the
    /// least recently passed first (the newest `passedAt` of any target's entry for it; never
    /// passed: first of all), never one in `serving` nor one a pod's volume links (deleting it
    /// would free nothing and it serves). Deletes nothing when even all of them would not make
    /// the room. Returns the digests deleted.
    pub fn make_room(&mut self, needed: u64, serving: &BTreeSet<String>) -> Result<Vec<String>> {
        let free =
            kiln_store::staged::free_bytes(&self.root).map_err(|e| Error::store(&self.root, e))?;
        self.evict_for(needed, free, serving)
    }

    /// [`Cache::make_room`] with `free` bytes free now.
    fn evict_for(
        &mut self,
        needed: u64,
        free: u64,
        serving: &BTreeSet<String>,
    ) -> Result<Vec<String>> {
        use std::os::unix::fs::MetadataExt;
        let dir = self.root.join("artifacts");
        let entries = std::fs::read_dir(&dir).map_err(|e| Error::store(&dir, e))?;
        let mut candidates = Vec::new();
        for entry in entries.flatten() {
            let Ok(digest) = entry.file_name().into_string() else {
                continue;
            };
            let Ok(meta) = std::fs::metadata(entry.path().join(ARTIFACT)) else {
                continue;
            };
            if serving.contains(&digest) || meta.nlink() > 1 {
                continue;
            }
            let last = last_passed(&self.index, &digest);
            candidates.push(Candidate {
                digest,
                bytes: meta.len(),
                last_passed: last,
            });
        }
        let delete = plan_room(candidates, needed, free);
        for digest in &delete {
            let d = dir.join(digest);
            std::fs::remove_dir_all(&d).map_err(|e| Error::store(&d, e))?;
        }
        if !delete.is_empty() {
            for list in self.index.targets.values_mut() {
                list.retain(|k| !delete.contains(&k.digest));
            }
            self.save()?;
        }
        Ok(delete)
    }
}

/// The newest pass of any target with `digest` (Unix seconds), 0 when none.
fn last_passed(index: &Index, digest: &str) -> i64 {
    index
        .targets
        .values()
        .flatten()
        .filter(|k| k.digest == digest)
        .map(|k| k.passed_at)
        .max()
        .unwrap_or(0)
}

/// A cached artifact that may go to make room.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Its digest.
    pub digest: String,
    /// Bytes it holds.
    pub bytes: u64,
    /// When it last passed on this node (Unix seconds; 0: never).
    pub last_passed: i64,
}

/// Which candidates to delete so that `free` grows to `needed` (pure): the least recently
/// passed first, as few as that takes; none when all of them would not be enough.
pub fn plan_room(mut candidates: Vec<Candidate>, needed: u64, free: u64) -> Vec<String> {
    if free >= needed {
        return Vec::new();
    }
    candidates.sort_by(|a, b| (a.last_passed, &a.digest).cmp(&(b.last_passed, &b.digest)));
    let mut freed = free;
    let mut delete = Vec::new();
    for c in candidates {
        if freed >= needed {
            break;
        }
        freed = freed.saturating_add(c.bytes);
        delete.push(c.digest);
    }
    if freed < needed {
        return Vec::new();
    }
    delete
}

/// A read-only look at the cache the daemon writes, for the CSI plugin: nothing is created,
/// swept or deleted, and the index is read afresh at each call (the daemon records a pass before
/// its row says Ready).
#[derive(Clone, Debug)]
pub struct View {
    root: PathBuf,
}

impl View {
    /// The cache at `root` (the daemon's `--cache`).
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }

    /// The cache's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The index as the daemon last wrote it; `None` when there is none or it does not parse.
    pub fn index(&self) -> Option<Index> {
        let bytes = std::fs::read(self.root.join(INDEX)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// The entry of `target` (`namespace/name`) that passed with `revision` and `digest`.
    pub fn known_good(&self, target: &str, revision: i64, digest: &str) -> Option<KnownGood> {
        self.index()?.pass(target, revision, digest).cloned()
    }

    /// `artifacts/<digest>/artifact` and its `manifest.json`; a digest that is not 64 hex
    /// characters names no file.
    pub fn artifact(&self, digest: &str) -> Result<(PathBuf, PathBuf)> {
        let dir = artifact_dir(&self.root, digest)?;
        Ok((dir.join(ARTIFACT), dir.join(MANIFEST)))
    }

    /// `blobs/<digest>` (a fixture, by its sha256).
    pub fn blob(&self, digest: &str) -> Result<PathBuf> {
        if !is_sha256_hex(digest) {
            return Err(Error::InvalidSpec(format!(
                "blob digest {digest:?} is not 64 hex characters"
            )));
        }
        Ok(self.root.join("blobs").join(digest))
    }
}

fn artifact_dir(root: &Path, digest: &str) -> Result<PathBuf> {
    if !is_sha256_hex(digest) {
        return Err(Error::InvalidSpec(format!(
            "artifact digest {digest:?} is not 64 hex characters"
        )));
    }
    Ok(root.join("artifacts").join(digest))
}

/// Removes from `tmp` everything but the pull directories ([`Cache::pull_dir`]) something was
/// written in within `window`.
fn sweep_tmp(tmp: &Path, window: std::time::Duration) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    let recent = |path: &Path| {
        let age = |p: &Path| {
            std::fs::metadata(p)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
        };
        let inside = std::fs::read_dir(path)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| age(&e.path()));
        age(path).into_iter().chain(inside).any(|a| a < window)
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let digest = name.strip_prefix(PULL_PREFIX).unwrap_or_default();
        let resumable = is_sha256_hex(digest) && e.file_type().is_ok_and(|t| t.is_dir());
        if resumable && recent(&e.path()) {
            continue;
        }
        let _ = std::fs::remove_dir_all(e.path()).or_else(|_| std::fs::remove_file(e.path()));
    }
}

/// Eviction as a pure function: per live target the newest `keep[target]` entries (by
/// revision, then pass time) stay; entries of targets not in `keep` go; an artifact directory in
/// The eviction decision: per live target (`keep`: target → how many), the newest `keep`
/// entries by revision and pass time, and every entry whose artifact is `protected`; the
/// entries of targets not in `keep` go. Artifacts in `present` that no kept entry references
/// and that are not `protected` are deleted. `protected` holds what serves now and the
/// artifacts of every revision a target's history lists as known-good: kiln never evicts a
/// revision that history still offers for rollback.
pub fn plan_eviction(
    index: &Index,
    keep: &BTreeMap<String, usize>,
    protected: &BTreeSet<String>,
    present: &BTreeSet<String>,
) -> (Index, Vec<String>) {
    let mut kept = Index::default();
    for (target, entries) in &index.targets {
        let Some(&k) = keep.get(target) else { continue };
        let mut sorted = entries.clone();
        sorted.sort_by_key(|e| (e.revision, e.passed_at));
        let start = sorted.len().saturating_sub(k);
        let (older, newest) = sorted.split_at(start);
        let mut list: Vec<KnownGood> = older
            .iter()
            .filter(|e| protected.contains(&e.digest))
            .cloned()
            .collect();
        list.extend_from_slice(newest);
        kept.targets.insert(target.clone(), list);
    }
    let referenced: BTreeSet<&str> = kept
        .targets
        .values()
        .flatten()
        .map(|e| e.digest.as_str())
        .collect();
    let delete = present
        .iter()
        .filter(|d| !referenced.contains(d.as_str()) && !protected.contains(*d))
        .cloned()
        .collect();
    (kept, delete)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_made_from_the_least_recently_passed_and_only_when_it_suffices() {
        let c = |d: &str, bytes: u64, last: i64| Candidate {
            digest: d.into(),
            bytes,
            last_passed: last,
        };
        let all = vec![c("new", 5, 300), c("old", 3, 100), c("never", 2, 0)];
        assert!(
            plan_room(all.clone(), 4, 4).is_empty(),
            "room enough already"
        );
        assert_eq!(plan_room(all.clone(), 5, 1), vec!["never", "old"]);
        assert_eq!(plan_room(all.clone(), 3, 1), vec!["never"]);
        assert_eq!(plan_room(all.clone(), 11, 1), vec!["never", "old", "new"]);
        assert!(
            plan_room(all, 12, 1).is_empty(),
            "not enough even with all: keep them"
        );
    }

    #[test]
    fn making_room_spares_what_serves_and_what_a_pod_links() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut cache = Cache::open(dir.path()).expect("open");
        let (_, a) = insert(&cache, b"artifact a");
        let (linked, b) = insert(&cache, b"artifact b");
        let (_, c) = insert(&cache, b"artifact c");
        std::fs::hard_link(&linked, dir.path().join("volume-artifact")).expect("a pod's link");
        cache
            .record_pass("ns/t", entry(1, &a.artifact_digest, 10))
            .expect("pass");
        let serving = BTreeSet::from([c.artifact_digest.clone()]);
        // More than the filesystem could ever free: nothing deleted.
        let none = cache.make_room(u64::MAX, &serving).expect("room");
        assert!(none.is_empty());
        // Ten bytes short, none free: only the artifact nobody serves or links goes.
        let deleted = cache.evict_for(10, 0, &serving).expect("room");
        assert_eq!(deleted, vec![a.artifact_digest.clone()]);
        assert!(
            cache.known_good("ns/t").is_empty(),
            "its index entries go with it"
        );
        for kept in [&b, &c] {
            assert!(cache.verified(&kept.artifact_digest).expect("ok").is_some());
        }
    }

    #[test]
    fn the_revision_a_pods_volume_holds_is_read_from_its_kiln_json() {
        let dir = tempfile::tempdir().expect("tmp");
        let cache = Cache::open(dir.path()).expect("open");
        assert!(cache.mounted_revisions().is_empty(), "no published/ yet");
        let volume = |name: &str, pod: &str, revision: i64| {
            let d = dir.path().join("published").join(name);
            std::fs::create_dir_all(&d).expect("dir");
            let m = kiln_crds::mounted::MountedModel {
                namespace: "ns".into(),
                target: "sq".into(),
                revision,
                class: "c".into(),
                digest: "ab".repeat(32),
                engine: None,
                media_type: "x".into(),
                fixture: None,
                chat_template: None,
                node: "n".into(),
                pod: pod.into(),
                seal: None,
            };
            std::fs::write(d.join("kiln.json"), serde_json::to_vec(&m).expect("json"))
                .expect("write");
        };
        volume("csi-1", "ns/p", 1);
        volume("csi-2", "ns/other", 2);
        std::fs::create_dir_all(dir.path().join("published/csi-3")).expect("dir");
        std::fs::write(dir.path().join("published/csi-3/kiln.json"), b"{").expect("bad");
        assert_eq!(cache.mounted_revisions().get("ns/p"), Some(&1));
    }

    #[test]
    fn the_fixture_a_pass_warmed_with_survives_a_restart() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut cache = Cache::open(dir.path()).expect("open");
        let (_, a) = insert(&cache, b"artifact a");
        let fixture = "f".repeat(64);
        let with_fixture = |revision| KnownGood {
            fixture_digest: Some(fixture.clone()),
            ..entry(revision, &a.artifact_digest, revision)
        };
        cache.record_pass("ns/t", with_fixture(1)).expect("pass 1");
        cache.record_pass("ns/t", with_fixture(2)).expect("pass 2");
        drop(cache);
        // A new process opens the cache: the fixture of each pass is there, by revision.
        let cache = Cache::open(dir.path()).expect("reopen");
        let want = (dir.path().join("blobs").join(&fixture), fixture.clone());
        assert_eq!(
            cache.fixture_of("ns/t", 2, &a.artifact_digest),
            Some(want.clone())
        );
        assert_eq!(cache.fixture_of("ns/t", 1, &a.artifact_digest), Some(want));
        assert_eq!(cache.fixture_of("ns/t", 3, &a.artifact_digest), None);
        assert_eq!(cache.fixture_of("ns/t", 2, &"0".repeat(64)), None);
        assert_eq!(cache.fixture_of("ns/other", 2, &a.artifact_digest), None);
        // A pass that recorded none, or an index entry that names no digest, gives none.
        let mut cache = cache;
        cache
            .record_pass("ns/t", entry(4, &a.artifact_digest, 4))
            .expect("pass 4");
        let bad = KnownGood {
            fixture_digest: Some("../../etc/passwd".into()),
            ..entry(5, &a.artifact_digest, 5)
        };
        cache.record_pass("ns/t", bad).expect("pass 5");
        assert_eq!(cache.fixture_of("ns/t", 4, &a.artifact_digest), None);
        assert_eq!(cache.fixture_of("ns/t", 5, &a.artifact_digest), None);
    }

    fn entry(revision: i64, digest: &str, passed_at: i64) -> KnownGood {
        KnownGood {
            revision,
            class: "c".into(),
            compile_key: "k".into(),
            digest: digest.into(),
            passed_at,
            generation: Some(1),
            fixture_digest: None,
        }
    }

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn keeps_the_last_k_per_target_and_what_is_in_use() {
        let index = Index {
            targets: BTreeMap::from([
                (
                    "ns/a".to_string(),
                    vec![entry(3, "a3", 30), entry(1, "a1", 10), entry(2, "a2", 20)],
                ),
                ("ns/b".to_string(), vec![entry(1, "b1", 5)]),
                ("ns/gone".to_string(), vec![entry(1, "g1", 5)]),
            ]),
        };
        let keep = BTreeMap::from([("ns/a".to_string(), 2), ("ns/b".to_string(), 3)]);
        // a1 is still served (say the newer ones are being warmed): never deleted, and its
        // pass stays on record.
        let present = set(&["a1", "a2", "a3", "b1", "g1", "stray", "pulled-now"]);
        let (kept, delete) = plan_eviction(&index, &keep, &set(&["a1", "pulled-now"]), &present);
        assert_eq!(
            kept.targets["ns/a"],
            vec![entry(1, "a1", 10), entry(2, "a2", 20), entry(3, "a3", 30)]
        );
        let (kept, _) = plan_eviction(&index, &keep, &set(&[]), &present);
        assert_eq!(
            kept.targets["ns/a"],
            vec![entry(2, "a2", 20), entry(3, "a3", 30)],
            "nothing protected: the newest 2"
        );
        assert_eq!(kept.targets["ns/b"], vec![entry(1, "b1", 5)]);
        assert!(!kept.targets.contains_key("ns/gone"));
        assert_eq!(delete, vec!["g1".to_string(), "stray".to_string()]);
    }

    #[test]
    fn known_good_revisions_in_history_outlive_the_newest_k() {
        // knownGoodHistory 1, but history still lists revisions 1 and 2 as known-good: their
        // artifacts stay (a rollback to them needs no pull); revision 3's failed pull does not.
        let index = Index {
            targets: BTreeMap::from([(
                "ns/a".to_string(),
                vec![entry(1, "a1", 10), entry(2, "a2", 20), entry(4, "a4", 40)],
            )]),
        };
        let keep = BTreeMap::from([("ns/a".to_string(), 1)]);
        let present = set(&["a1", "a2", "a3", "a4"]);
        let (kept, delete) = plan_eviction(&index, &keep, &set(&["a1", "a2", "a4"]), &present);
        assert_eq!(kept.targets["ns/a"].len(), 3);
        assert_eq!(delete, vec!["a3".to_string()]);
        // Once history no longer lists revision 1 (trimmed), it goes.
        let (kept, delete) = plan_eviction(&index, &keep, &set(&["a2", "a4"]), &present);
        assert_eq!(
            kept.targets["ns/a"],
            vec![entry(2, "a2", 20), entry(4, "a4", 40)]
        );
        assert_eq!(delete, vec!["a1".to_string(), "a3".to_string()]);
    }

    #[test]
    fn a_digest_shared_by_two_targets_stays_while_either_keeps_it() {
        let index = Index {
            targets: BTreeMap::from([
                ("ns/a".to_string(), vec![entry(1, "x", 1), entry(2, "y", 2)]),
                ("ns/b".to_string(), vec![entry(1, "x", 1)]),
            ]),
        };
        let keep = BTreeMap::from([("ns/a".to_string(), 1), ("ns/b".to_string(), 1)]);
        let (_, delete) = plan_eviction(&index, &keep, &set(&[]), &set(&["x", "y"]));
        assert!(delete.is_empty(), "{delete:?}");
    }

    fn manifest_for(bytes: &[u8]) -> BuildManifest {
        let digest = kiln_store::staged::sha256_bytes(bytes);
        crate::test_support::manifest(serde_json::json!({
            "artifactDigest": digest, "artifactSize": bytes.len()
        }))
    }

    /// What a pull does: the artifact lands in a staging directory, then is installed.
    fn insert(cache: &Cache, bytes: &[u8]) -> (PathBuf, BuildManifest) {
        let m = manifest_for(bytes);
        let staging = cache.pull_dir(&m.artifact_digest).expect("staging");
        std::fs::write(staging.artifact(), bytes).expect("write");
        (cache.install(staging, &m).expect("install"), m)
    }

    #[test]
    fn install_restart_reverifies_and_corruption_is_removed() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path().join("cache");
        let mut cache = Cache::open(&root).expect("open");
        let (path, m) = insert(&cache, b"engine bytes");
        assert_eq!(std::fs::read(&path).expect("read"), b"engine bytes");
        cache
            .record_pass("ns/a", entry(1, &m.artifact_digest, 1))
            .expect("record");
        // A partial pull left by a crash is removed at start, and the index survives.
        std::fs::write(root.join("tmp").join("partial"), b"half").expect("partial");
        let cache = Cache::open(&root).expect("reopen");
        assert!(!root.join("tmp").join("partial").exists());
        assert_eq!(cache.known_good("ns/a").len(), 1);
        assert!(cache.verified(&m.artifact_digest).expect("ok").is_some());
        // A flipped byte: HashMismatch and the copy is gone.
        std::fs::write(&path, b"engine bytez").expect("corrupt");
        let err = cache.verified(&m.artifact_digest).expect_err("corrupt");
        assert_eq!(err.reason(), kiln_crds::FailureReason::HashMismatch);
        assert!(cache.verified(&m.artifact_digest).expect("gone").is_none());
        assert!(cache.known_good("ns/a").is_empty());
        // A pull whose size disagrees with its manifest is never installed.
        let staging = cache.pull_dir(&m.artifact_digest).expect("staging");
        std::fs::write(staging.artifact(), b"short").expect("write");
        let err = cache.install(staging, &m).expect_err("size");
        assert_eq!(err.reason(), kiln_crds::FailureReason::HashMismatch);
        assert!(cache.verified(&m.artifact_digest).expect("none").is_none());
    }

    #[test]
    fn what_an_unfinished_pull_kept_survives_a_restart_for_a_day() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path().join("cache");
        let cache = Cache::open(&root).expect("open");
        let digest = "ab".repeat(32);
        let pull = cache.pull_dir(&digest).expect("pull dir");
        // What the store keeps of a download that broke off (or whose agent was killed).
        let kept = pull
            .artifact()
            .with_file_name(format!("{}{digest}", kiln_store::staged::PARTIAL_PREFIX));
        std::fs::write(&kept, b"first half").expect("kept");
        std::fs::write(root.join("tmp").join("stray"), b"x").expect("stray");
        std::fs::create_dir_all(root.join("tmp").join("pull-not-a-digest")).expect("dir");
        drop(cache);
        let cache = Cache::open(&root).expect("reopen");
        assert_eq!(std::fs::read(&kept).expect("kept"), b"first half");
        assert_eq!(
            cache.pull_dir(&digest).expect("again").artifact(),
            pull.artifact(),
            "the next pull of the digest looks where the last one kept its bytes"
        );
        assert!(!root.join("tmp").join("stray").exists());
        assert!(!root.join("tmp").join("pull-not-a-digest").exists());
        // Not resumed within the window: gone at the next start (or eviction).
        let old = std::time::SystemTime::now() - RESUME_WINDOW - std::time::Duration::from_secs(60);
        for p in [&kept, &pull.0] {
            std::fs::File::open(p)
                .expect("open")
                .set_modified(old)
                .expect("mtime");
        }
        drop(cache);
        let cache = Cache::open(&root).expect("reopen");
        assert!(!pull.0.exists(), "a day-old unfinished pull is swept");
        // A failed pull that kept nothing leaves nothing; one that kept bytes stays.
        let empty = cache.pull_dir(&"cd".repeat(32)).expect("pull dir");
        let dir = empty.0.clone();
        empty.tidy();
        assert!(!dir.exists());
        let kept = cache.pull_dir(&digest).expect("pull dir");
        let dir = kept.0.clone();
        std::fs::write(dir.join("x"), b"kept").expect("write");
        kept.tidy();
        assert!(dir.exists());
        // A digest names the directory only when it is one.
        assert!(cache.pull_dir("../../etc").is_err());
        assert!(cache.pull_dir(&"g".repeat(64)).is_err());
    }

    #[test]
    fn evict_deletes_only_unreferenced_artifacts() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut cache = Cache::open(dir.path()).expect("open");
        let mut digests = Vec::new();
        for (i, body) in [b"one".as_slice(), b"two", b"three"].iter().enumerate() {
            let (_, m) = insert(&cache, body);
            cache
                .record_pass("ns/a", entry(i as i64 + 1, &m.artifact_digest, i as i64))
                .expect("record");
            digests.push(m.artifact_digest);
        }
        let keep = BTreeMap::from([("ns/a".to_string(), 1)]);
        let deleted = cache
            .evict(&keep, &BTreeSet::from([digests[0].clone()]))
            .expect("evict");
        assert_eq!(deleted, vec![digests[1].clone()]);
        assert!(cache.verified(&digests[0]).expect("in use").is_some());
        assert!(cache.verified(&digests[2]).expect("kept").is_some());
        assert_eq!(
            cache.known_good("ns/a"),
            vec![entry(1, &digests[0], 0), entry(3, &digests[2], 2)],
            "the pass of what serves stays on record"
        );
        let reopened = Cache::open(dir.path()).expect("reopen");
        assert_eq!(reopened.known_good("ns/a").len(), 2);
    }
}
