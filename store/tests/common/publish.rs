//! The publish order, on any store: a lookup interleaved after every write step of a publish
//! (and one running concurrently with many) finds nothing or an entry whose attestation
//! verifies — never a tagged entry without one.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kiln_crds::BuildManifest;
use kiln_store::attest::{Signer, Trust, Verifier, subject};
use kiln_store::{ArtifactRef, Entry, Result, Store};

/// What a lookup between two steps saw.
#[derive(Clone, Debug, PartialEq)]
pub enum Seen {
    /// No entry under the key.
    Nothing,
    /// An entry whose attestation verified, by manifest digest.
    Verified(String),
    /// An entry without a valid attestation: the window the publish order closes.
    Unattested(String),
}

/// The reader's verdict on `key` now: a fresh verifier each time (no memo).
pub async fn look(store: &dyn Store, public: &str, key: &str) -> Seen {
    let reader = Trust::verifying(Verifier::from_pem(public.as_bytes()).unwrap());
    match store.lookup(key).await.unwrap() {
        None => Seen::Nothing,
        Some(e) => match reader.check(store, &subject(&e)).await {
            Ok(()) => Seen::Verified(e.manifest_digest),
            Err(_) => Seen::Unattested(e.manifest_digest),
        },
    }
}

/// A store that, after each write step, looks the key up through the store it wraps and
/// records what a reader would have seen at that moment.
pub struct Interleaved {
    pub inner: Arc<dyn Store>,
    pub public: String,
    pub key: String,
    pub seen: Mutex<Vec<(&'static str, Seen)>>,
}

impl Interleaved {
    async fn record(&self, step: &'static str) {
        let seen = look(self.inner.as_ref(), &self.public, &self.key).await;
        self.seen.lock().unwrap().push((step, seen));
    }
}

#[async_trait::async_trait]
impl Store for Interleaved {
    fn location(&self) -> String {
        self.inner.location()
    }
    async fn check_writable(&self) -> Result<()> {
        self.inner.check_writable().await
    }
    async fn lookup(&self, key: &str) -> Result<Option<Entry>> {
        self.inner.lookup(key).await
    }
    async fn stage(&self, artifact: &Path, manifest: &BuildManifest) -> Result<Entry> {
        let entry = self.inner.stage(artifact, manifest).await?;
        self.record("stage").await;
        Ok(entry)
    }
    async fn tag(&self, entry: &Entry, replace: bool) -> Result<Entry> {
        let entry = self.inner.tag(entry, replace).await?;
        self.record("tag").await;
        Ok(entry)
    }
    async fn put_attestation(&self, key: &str, digest: &str, envelope: &[u8]) -> Result<()> {
        self.inner.put_attestation(key, digest, envelope).await?;
        self.record("attestation").await;
        Ok(())
    }
    async fn attestation(&self, key: &str, digest: &str) -> Result<Option<Vec<u8>>> {
        self.inner.attestation(key, digest).await
    }
    async fn pull(&self, r: &ArtifactRef, dest: &Path) -> Result<BuildManifest> {
        self.inner.pull(r, dest).await
    }
    fn scratch(&self) -> Result<tempfile::TempDir> {
        self.inner.scratch()
    }
    fn blob_cache(&self) -> Option<PathBuf> {
        self.inner.blob_cache()
    }
}

/// A signing publisher and the PEM of its public key.
pub fn publisher() -> (Trust, String) {
    let (private, public) = Signer::generate().unwrap();
    let trust = Trust {
        signer: Some(Arc::new(Signer::from_pem(private.as_bytes()).unwrap())),
        ..Trust::default()
    };
    (trust, public)
}

/// A first publish and then a replacing one, each step followed by a lookup: before the tag
/// nothing (or the previous, verified entry) is seen, after it the new entry, verified.
pub async fn every_step_shows_nothing_or_a_verified_entry(store: Arc<dyn Store>, dir: &Path) {
    let (trust, public) = publisher();
    let (path, manifest) = super::artifact(dir, "publish-first", 200_000, 51);
    let key = manifest.compile_key.clone();
    let spy = Interleaved {
        inner: store.clone(),
        public: public.clone(),
        key: key.clone(),
        seen: Mutex::new(vec![]),
    };
    assert_eq!(look(store.as_ref(), &public, &key).await, Seen::Nothing);
    let first = trust
        .publish(&spy, &path, &manifest, false, None)
        .await
        .unwrap();
    let d1 = first.manifest_digest.clone();
    assert_eq!(
        std::mem::take(&mut *spy.seen.lock().unwrap()),
        vec![
            ("stage", Seen::Nothing),
            ("attestation", Seen::Nothing),
            ("tag", Seen::Verified(d1.clone())),
        ],
        "the first publish"
    );

    // A replacement under the same key (a rebuild after a refused entry).
    let (again, _) = super::artifact(dir, "publish-second", 200_000, 52);
    let mut second = super::manifest(&key, &std::fs::read(&again).unwrap());
    second.compile_seconds = 2.5;
    let replaced = trust
        .publish(&spy, &again, &second, true, None)
        .await
        .unwrap();
    let d2 = replaced.manifest_digest.clone();
    assert_ne!(d1, d2);
    assert_eq!(
        std::mem::take(&mut *spy.seen.lock().unwrap()),
        vec![
            ("stage", Seen::Verified(d1.clone())),
            ("attestation", Seen::Verified(d1)),
            ("tag", Seen::Verified(d2.clone())),
        ],
        "the replacing publish"
    );
    assert_eq!(
        look(store.as_ref(), &public, &key).await,
        Seen::Verified(d2)
    );
}

/// Publishes of many keys, each step raced by a reader polling every key as fast as it can:
/// whatever it catches is nothing or verified.
pub async fn a_racing_reader_never_sees_an_unattested_entry(store: Arc<dyn Store>, dir: &Path) {
    let (trust, public) = publisher();
    let items: Vec<_> = (0..6u8)
        .map(|i| super::artifact(dir, &format!("race-{i}"), 50_000, 60 + i))
        .collect();
    let keys: Vec<String> = items.iter().map(|(_, m)| m.compile_key.clone()).collect();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (store, done, keys, public) =
            (store.clone(), done.clone(), keys.clone(), public.clone());
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                for key in &keys {
                    seen.push(look(store.as_ref(), &public, key).await);
                }
            }
            seen
        })
    };
    for (path, manifest) in &items {
        trust
            .publish(store.as_ref(), path, manifest, false, None)
            .await
            .unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = reader.await.unwrap();
    let unattested: Vec<_> = seen
        .iter()
        .filter(|s| matches!(s, Seen::Unattested(_)))
        .collect();
    assert!(unattested.is_empty(), "{unattested:?}");
    for key in &keys {
        assert!(matches!(
            look(store.as_ref(), &public, key).await,
            Seen::Verified(_)
        ));
    }
}
