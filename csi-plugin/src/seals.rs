//! What the plugin has proved about each cached artifact: the digest it hashed and the stamp of
//! the inode ([`Stamp`]: inode, size, modification and change times) right after its own last
//! link or unlink of it. A publish whose artifact still stands exactly so, change time included
//! (which only the kernel sets, on every write, chmod, link and unlink), links it without
//! reading it again; any other publish hashes it. So a node hashes an artifact once per plugin
//! start and whenever anything but the plugin touched its inode, not once per pod.
//!
//! One lock per artifact: of ten pods mounting one target at once, the first hashes and the
//! other nine wait, then stat. The ledger lives in memory: a restarted plugin hashes again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use kiln_store::staged::Stamp;

/// The plugin's proof of one artifact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proof {
    /// The sha256 its bytes hashed to.
    pub digest: String,
    /// Its inode's stamp after the plugin's last link or unlink of it.
    pub stamp: Stamp,
}

/// Whether `proof` vouches for `digest` in an inode that stands at `now` (pure): the same
/// digest and every field of the stamp unchanged.
pub fn vouches(proof: Option<&Proof>, digest: &str, now: &Stamp) -> bool {
    proof.is_some_and(|p| p.digest == digest && p.stamp == *now)
}

/// A proof after the plugin itself unlinked one of the inode's names (pure): kept, with the
/// change time that unlink set, when nothing else changed; dropped otherwise.
pub fn after_unlink(proof: Proof, now: &Stamp) -> Option<Proof> {
    proof.stamp.same_content(now).then_some(Proof {
        digest: proof.digest,
        stamp: *now,
    })
}

type Slot = Arc<Mutex<Option<Proof>>>;

/// Every artifact's proof, by its path in the node cache.
#[derive(Default)]
pub struct Seals {
    slots: Mutex<HashMap<PathBuf, Slot>>,
}

impl Seals {
    /// The proof slot of the artifact at `artifact`, locked: hold it from the stat before the
    /// link to the record after the check.
    pub fn slot(&self, artifact: &Path) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.entry(artifact.to_path_buf()).or_default().clone()
    }

    /// After the plugin unlinked a volume's name of inode `ino` on `dev`: the proof of that
    /// inode, if any, takes the change time the unlink set (or is dropped when anything else
    /// moved). Slots of artifacts no longer in the cache go.
    pub fn unlinked(&self, dev: u64, ino: u64) {
        let slots: Vec<(PathBuf, Slot)> = {
            let mut all = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            all.retain(|path, _| path.exists());
            all.iter().map(|(p, s)| (p.clone(), s.clone())).collect()
        };
        for (path, slot) in slots {
            let mut proof = lock(&slot);
            if proof
                .as_ref()
                .is_some_and(|p| (p.stamp.dev, p.stamp.ino) == (dev, ino))
            {
                let now = Stamp::of(&path).ok();
                *proof = proof
                    .take()
                    .zip(now)
                    .and_then(|(p, now)| after_unlink(p, &now));
            }
        }
    }
}

/// `slot` locked (a panic while it was held leaves the proof as it was: still only a record of
/// what was hashed).
pub fn lock(slot: &Slot) -> MutexGuard<'_, Option<Proof>> {
    slot.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(ino: u64, mtime_ns: i64, ctime_ns: i64) -> Stamp {
        Stamp {
            dev: 1,
            ino,
            size: 10,
            mtime_ns,
            ctime_ns,
        }
    }

    #[test]
    fn a_proof_vouches_only_for_its_digest_in_an_inode_nothing_touched() {
        let p = Proof {
            digest: "d".into(),
            stamp: stamp(7, 100, 200),
        };
        assert!(vouches(Some(&p), "d", &stamp(7, 100, 200)));
        assert!(!vouches(None, "d", &stamp(7, 100, 200)), "never proved");
        assert!(
            !vouches(Some(&p), "e", &stamp(7, 100, 200)),
            "other bytes wanted"
        );
        assert!(
            !vouches(Some(&p), "d", &stamp(8, 100, 200)),
            "another inode"
        );
        assert!(!vouches(Some(&p), "d", &stamp(7, 101, 201)), "written");
        // A write whose modification time was set back still moved the change time.
        assert!(!vouches(Some(&p), "d", &stamp(7, 100, 300)), "touched");
        let size = Stamp {
            size: 11,
            ..p.stamp
        };
        assert!(!vouches(Some(&p), "d", &size), "grown");
    }

    #[test]
    fn the_plugins_own_unlink_keeps_a_proof_anything_else_drops_it() {
        let p = Proof {
            digest: "d".into(),
            stamp: stamp(7, 100, 200),
        };
        let kept = after_unlink(p.clone(), &stamp(7, 100, 250)).expect("only ctime moved");
        assert_eq!(kept.stamp.ctime_ns, 250);
        assert_eq!(
            after_unlink(p.clone(), &stamp(7, 101, 250)),
            None,
            "written"
        );
        assert_eq!(after_unlink(p, &stamp(9, 100, 250)), None, "replaced");
    }

    #[test]
    fn unlinking_a_volume_keeps_the_proof_of_its_artifact() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().expect("tmp");
        let artifact = tmp.path().join("artifact");
        std::fs::write(&artifact, b"engine").expect("write");
        let volume = tmp.path().join("volume-artifact");
        std::fs::hard_link(&artifact, &volume).expect("link");
        let seals = Seals::default();
        let slot = seals.slot(&artifact);
        let proved = Stamp::of(&artifact).expect("stat");
        *lock(&slot) = Some(Proof {
            digest: "d".into(),
            stamp: proved,
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        let meta = std::fs::metadata(&volume).expect("meta");
        std::fs::remove_file(&volume).expect("unlink");
        seals.unlinked(meta.dev(), meta.ino());
        let now = Stamp::of(&artifact).expect("stat");
        assert_ne!(now.ctime_ns, proved.ctime_ns, "the unlink moved it");
        assert!(vouches(lock(&seals.slot(&artifact)).as_ref(), "d", &now));
        // The artifact evicted: its slot goes at the next unlink.
        std::fs::remove_file(&artifact).expect("evict");
        seals.unlinked(meta.dev(), meta.ino());
        assert!(seals.slots.lock().expect("lock").is_empty());
    }
}
