//! The filesystem store through the `Store` trait: put, lookup with manifest digest, and pulls
//! that verify the manifest by digest and the bytes by size and sha256, never leaving a partial
//! file at the destination.

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod common;

use kiln_crds::FailureReason;
use kiln_store::{RegistryOptions, open};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_lookup_pull_round_trip_and_corruption_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("file://{}", tmp.path().join("store").display());
    let store = open(&url, &RegistryOptions::default()).unwrap();
    store.check_writable().await.unwrap();
    let (path, manifest) = common::artifact(tmp.path(), "a", 300_000, 1);
    let bytes = std::fs::read(&path).unwrap();
    assert!(store.lookup(&manifest.compile_key).await.unwrap().is_none());

    let entry = store.put(&path, &manifest, false).await.unwrap();
    assert_eq!(entry.manifest, manifest);
    let stored_json = tmp
        .path()
        .join("store/artifacts")
        .join(&manifest.compile_key)
        .join("manifest.json");
    let json = std::fs::read(&stored_json).unwrap();
    assert_eq!(
        entry.manifest_digest,
        format!(
            "sha256:{}",
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&json))
        )
    );
    let found = store.lookup(&manifest.compile_key).await.unwrap().unwrap();
    assert_eq!(found, entry);
    // A second put of the same key keeps the first entry.
    let (again, _) = common::artifact(tmp.path(), "b", 300_000, 1);
    assert_eq!(store.put(&again, &manifest, false).await.unwrap(), entry);

    let cache = tmp.path().join("cache");
    let dest = cache.join("pulled");
    let r = entry.artifact_ref();
    assert_eq!(store.pull(&r, &dest).await.unwrap(), manifest);
    assert_eq!(std::fs::read(&dest).unwrap(), bytes);

    // Wrong manifest digest: nothing pulled.
    let mut wrong = r.clone();
    wrong.manifest_digest = format!("sha256:{}", "0".repeat(64));
    let other = cache.join("other");
    let err = store.pull(&wrong, &other).await.unwrap_err();
    assert_eq!(err.reason(), FailureReason::HashMismatch, "{err}");
    // One flipped byte in the stored artifact: HashMismatch naming both digests, nothing at dest.
    let stored = stored_json.with_file_name("artifact");
    let mut corrupt = bytes.clone();
    corrupt[1234] ^= 0x20;
    std::fs::write(&stored, &corrupt).unwrap();
    let err = store.pull(&r, &other).await.unwrap_err();
    assert_eq!(err.reason(), FailureReason::HashMismatch, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&manifest.artifact_digest) && msg.contains("got"),
        "{msg}"
    );
    // Truncated: refused by size.
    std::fs::write(&stored, &bytes[..1000]).unwrap();
    let err = store.pull(&r, &other).await.unwrap_err();
    assert!(err.to_string().contains("got 1000 bytes"), "{err}");
    assert_eq!(common::names(&cache), vec!["pulled".to_string()]);
    assert_eq!(
        std::fs::read(&dest).unwrap(),
        bytes,
        "earlier pull untouched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn size_limit_is_enforced_before_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("store");
    let small = RegistryOptions {
        max_artifact_bytes: 1000,
        ..Default::default()
    };
    let store = open(root.to_str().unwrap(), &small).unwrap();
    let (path, manifest) = common::artifact(tmp.path(), "a", 5000, 2);
    let entry = store.put(&path, &manifest, false).await.unwrap();
    let err = store
        .pull(&entry.artifact_ref(), &tmp.path().join("c/x"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("1000-byte limit"), "{err}");
    assert!(common::names(&tmp.path().join("c")).is_empty());
}

#[tokio::test]
async fn unwritable_store_is_unavailable_and_reads_need_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("file"), b"x").unwrap();
    let store = open(
        tmp.path().join("file/store").to_str().unwrap(),
        &RegistryOptions::default(),
    )
    .unwrap();
    let err = store.check_writable().await.unwrap_err();
    assert_eq!(err.reason(), FailureReason::StoreUnavailable);
    assert!(err.to_string().contains("writable --store"), "{err}");
    let absent = open(
        tmp.path().join("absent").to_str().unwrap(),
        &RegistryOptions::default(),
    )
    .unwrap();
    assert!(absent.lookup(&"a".repeat(64)).await.unwrap().is_none());
    assert!(
        !tmp.path().join("absent").exists(),
        "a read creates nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewritten_entry_is_refused_by_its_attestation() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(
        &tmp.path().join("store").display().to_string(),
        &RegistryOptions::default(),
    )
    .unwrap();
    store.check_writable().await.unwrap();
    common::poisoning_is_refused_and_replaced(store.as_ref(), tmp.path()).await;
    // A digest that is not sha256:<hex> never becomes a file name.
    let key = "a".repeat(64);
    let err = store.attestation(&key, "sha256:../../x").await.unwrap_err();
    assert_eq!(err.reason(), FailureReason::HashMismatch, "{err}");
}

/// What a killed process left in a store (scratch directories, staged models, partial blobs)
/// goes when the store is next opened, once nobody has touched it for a day; fresh leftovers
/// (another process sharing the store may be using them) and the store's own data stay.
#[test]
fn stale_leftovers_are_swept_when_the_store_opens() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("store");
    kiln_store::FsStore::open(&root).unwrap();
    let old = std::time::SystemTime::now() - kiln_store::STALE_AFTER * 2;
    let age = |p: &std::path::Path| {
        std::fs::File::open(p).unwrap().set_modified(old).unwrap();
    };
    let scratch = root.join("tmp/.tmpKILLED");
    std::fs::create_dir_all(scratch.join("inner")).unwrap();
    std::fs::write(scratch.join("inner/half"), b"x").unwrap();
    age(&scratch);
    let staged = root.join("blobs/.model-KILLED");
    std::fs::create_dir_all(&staged).unwrap();
    age(&staged);
    let partial = root.join("blobs/.kiln-partial-KILLED");
    std::fs::write(&partial, b"half").unwrap();
    age(&partial);
    let blob = root.join("blobs").join("a".repeat(64));
    std::fs::write(&blob, b"verified").unwrap();
    age(&blob);
    let fresh = root.join("tmp/.tmpLIVE");
    std::fs::create_dir_all(&fresh).unwrap();

    kiln_store::FsStore::open(&root).unwrap();
    for gone in [&scratch, &staged, &partial] {
        assert!(!gone.exists(), "{} survived", gone.display());
    }
    assert!(blob.exists(), "a verified blob is data, not a leftover");
    assert!(
        fresh.exists(),
        "a fresh scratch directory may be another process's"
    );
}

/// The publish order on a filesystem: staged entries are invisible, the attestation lands
/// inside the staged entry, and the tag (a rename of the whole directory) brings it along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_between_publish_steps_sees_nothing_or_a_verified_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let url = tmp.path().join("store").display().to_string();
    let store = open(&url, &RegistryOptions::default()).unwrap();
    common::publish::every_step_shows_nothing_or_a_verified_entry(store.clone(), tmp.path()).await;
    common::publish::a_racing_reader_never_sees_an_unattested_entry(store, tmp.path()).await;
    // Nothing staged is left behind once every entry is tagged.
    assert!(common::names(&tmp.path().join("store/staged")).is_empty());
}
