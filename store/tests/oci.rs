//! The OCI store against a real distribution registry (Debian's docker-registry 2.8): push,
//! lookup by compile-key tag, pull by manifest digest with streaming verification, corruption in
//! the registry's own storage, truncation and oversize, credentials, and a registry that is down.

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod common;
mod registry;

use kiln_crds::FailureReason;
use kiln_store::{
    ARTIFACT_TYPE, BUILD_MANIFEST_MEDIA_TYPE, ENGINE_MEDIA_TYPE, RegistryOptions, open,
};
use registry::Registry;
use sha2::{Digest, Sha256};

fn insecure() -> RegistryOptions {
    RegistryOptions {
        insecure: true,
        ..Default::default()
    }
}

/// GET a path of the registry (plain HTTP/1.0, so no client library is between us and it).
fn http_get(addr: std::net::SocketAddr, path: &str, accept: &str) -> (String, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: {accept}\r\n\r\n"
    )
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    (
        String::from_utf8_lossy(&buf[..split]).into_owned(),
        buf[split + 4..].to_vec(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_lookup_pull_round_trip_with_the_agreed_layout() {
    let Some(reg) = Registry::start() else { return };
    let store = open(&reg.url("kiln/artifacts"), &insecure()).unwrap();
    store.check_writable().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (path, manifest) = common::artifact(tmp.path(), "artifact", 3 << 20, 7);
    let bytes = std::fs::read(&path).unwrap();
    let key = manifest.compile_key.clone();
    assert!(
        store.lookup(&key).await.unwrap().is_none(),
        "empty registry"
    );

    let entry = store.put(&path, &manifest, false).await.unwrap();
    assert_eq!(entry.manifest, manifest);
    let found = store.lookup(&key).await.expect("lookup").expect("stored");
    assert_eq!(found, entry, "lookup by tag finds what was pushed");

    // The layout, read straight from the registry's HTTP API: tag == key, manifest digest ==
    // sha256 of the served manifest bytes, media types, layer digest == artifact sha256.
    let (head, body) = http_get(
        reg.addr,
        &format!("/v2/kiln/artifacts/manifests/{key}"),
        "application/vnd.oci.image.manifest.v1+json",
    );
    assert!(head.starts_with("HTTP/1.0 200"), "{head}");
    assert_eq!(
        entry.manifest_digest,
        format!("sha256:{}", hex::encode(Sha256::digest(&body)))
    );
    let m: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(m["artifactType"], ARTIFACT_TYPE);
    assert_eq!(m["config"]["mediaType"], BUILD_MANIFEST_MEDIA_TYPE);
    assert_eq!(m["layers"].as_array().unwrap().len(), 1);
    assert_eq!(m["layers"][0]["mediaType"], ENGINE_MEDIA_TYPE);
    assert_eq!(
        m["layers"][0]["digest"],
        format!("sha256:{}", hex::encode(Sha256::digest(&bytes)))
    );
    assert_eq!(m["layers"][0]["size"], bytes.len() as u64);
    let config_digest = m["config"]["digest"].as_str().unwrap();
    let (_, config) = http_get(
        reg.addr,
        &format!("/v2/kiln/artifacts/blobs/{config_digest}"),
        "*/*",
    );
    let stored: kiln_crds::BuildManifest = serde_json::from_slice(&config).unwrap();
    assert_eq!(stored, manifest, "the config blob is the build manifest");
    let (_, tags) = http_get(reg.addr, "/v2/kiln/artifacts/tags/list", "*/*");
    let tags: serde_json::Value = serde_json::from_slice(&tags).unwrap();
    assert_eq!(tags["tags"], serde_json::json!([key]));

    // Pull by digest into a cache dir.
    let cache = tmp.path().join("cache");
    let dest = cache.join(&manifest.artifact_digest);
    let pulled = store.pull(&entry.artifact_ref(), &dest).await.unwrap();
    assert_eq!(pulled, manifest);
    assert_eq!(std::fs::read(&dest).unwrap(), bytes);
    assert_eq!(
        common::names(&cache),
        vec![manifest.artifact_digest.clone()]
    );

    // Pushing the same key again (another Job, a retry) is harmless: same entry, one tag.
    let (again, _) = common::artifact(tmp.path(), "again", 3 << 20, 7);
    assert_eq!(store.put(&again, &manifest, false).await.unwrap(), entry);
    assert_eq!(store.lookup(&key).await.unwrap(), Some(entry.clone()));

    // A reference whose manifest digest the registry does not hold is refused, nothing written.
    let mut missing = entry.artifact_ref();
    missing.manifest_digest = format!("sha256:{}", "1".repeat(64));
    let err = store
        .pull(&missing, &cache.join("missing"))
        .await
        .unwrap_err();
    assert_eq!(err.reason(), FailureReason::StoreUnavailable, "{err}");
    assert!(err.to_string().contains("no such manifest"), "{err}");
    // A reference naming other artifact bytes than the manifest is refused.
    let mut other = entry.artifact_ref();
    other.artifact_digest = "2".repeat(64);
    let err = store.pull(&other, &cache.join("other")).await.unwrap_err();
    assert_eq!(err.reason(), FailureReason::HashMismatch, "{err}");
    assert_eq!(
        common::names(&cache),
        vec![manifest.artifact_digest.clone()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_truncation_or_extra_bytes_in_the_registry_never_reach_dest() {
    let Some(reg) = Registry::start() else { return };
    let store = open(&reg.url("kiln"), &insecure()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (path, manifest) = common::artifact(tmp.path(), "artifact", 2 << 20, 9);
    let bytes = std::fs::read(&path).unwrap();
    let entry = store.put(&path, &manifest, false).await.unwrap();
    let r = entry.artifact_ref();
    let blob = reg.blob_path(&manifest.artifact_digest);
    assert_eq!(
        std::fs::read(&blob).unwrap(),
        bytes,
        "blob stored as pushed"
    );
    let cache = tmp.path().join("cache");
    let dest = cache.join("artifact");

    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 0x01;
    std::fs::write(&blob, &flipped).unwrap();
    let err = store.pull(&r, &dest).await.unwrap_err();
    assert_eq!(err.reason(), FailureReason::HashMismatch, "{err}");
    let got = hex::encode(Sha256::digest(&flipped));
    let msg = err.to_string();
    assert!(
        msg.contains(&manifest.artifact_digest) && msg.contains(&got),
        "names expected and got: {msg}"
    );
    assert!(
        common::names(&cache).is_empty(),
        "no partial file: {:?}",
        common::names(&cache)
    );

    std::fs::write(&blob, &bytes[..bytes.len() - 4096]).unwrap();
    let err = store.pull(&r, &dest).await.unwrap_err();
    assert_eq!(err.reason(), FailureReason::HashMismatch, "{err}");
    assert!(common::names(&cache).is_empty());

    let mut longer = bytes.clone();
    longer.extend_from_slice(&[0u8; 4096]);
    std::fs::write(&blob, &longer).unwrap();
    let err = store.pull(&r, &dest).await.unwrap_err();
    assert_eq!(err.reason(), FailureReason::HashMismatch, "{err}");
    assert!(common::names(&cache).is_empty());

    // Restored, the same reference pulls fine: the failures left nothing behind to trip over.
    std::fs::write(&blob, &bytes).unwrap();
    store.pull(&r, &dest).await.unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), bytes);

    // The size limit is applied to the verified manifest before any byte is fetched.
    let small = open(
        &reg.url("kiln"),
        &RegistryOptions {
            max_artifact_bytes: 1 << 20,
            ..insecure()
        },
    )
    .unwrap();
    let err = small.pull(&r, &cache.join("too-big")).await.unwrap_err();
    assert!(err.to_string().contains("limit"), "{err}");
    assert_eq!(common::names(&cache), vec!["artifact".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_used_and_wrong_ones_are_a_clear_error() {
    let Some(reg) = Registry::start_with_auth("kiln", "s3cret") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (path, manifest) = common::artifact(tmp.path(), "artifact", 100_000, 3);
    let good = open(
        &reg.url("kiln"),
        &RegistryOptions {
            username: Some("kiln".into()),
            password: Some("s3cret".into()),
            ..insecure()
        },
    )
    .unwrap();
    good.check_writable().await.unwrap();
    let entry = good.put(&path, &manifest, false).await.unwrap();
    good.pull(&entry.artifact_ref(), &tmp.path().join("pulled"))
        .await
        .unwrap();

    let wrong = open(
        &reg.url("kiln"),
        &RegistryOptions {
            username: Some("kiln".into()),
            password: Some("wrong".into()),
            ..insecure()
        },
    )
    .unwrap();
    let err = wrong.lookup(&manifest.compile_key).await.unwrap_err();
    assert_eq!(err.reason(), FailureReason::StoreUnavailable, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("refused user \"kiln\"") && msg.contains("KILN_REGISTRY_PASSWORD"),
        "{msg}"
    );
    let err = wrong.check_writable().await.unwrap_err();
    assert!(err.to_string().contains("refused user"), "{err}");

    let anonymous = open(&reg.url("kiln"), &insecure()).unwrap();
    let err = anonymous
        .pull(&entry.artifact_ref(), &tmp.path().join("anon"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("requires credentials"), "{err}");
    assert!(!tmp.path().join("anon").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_is_down_is_store_unavailable_naming_it() {
    let Some(mut reg) = Registry::start() else {
        return;
    };
    let url = reg.url("kiln");
    let store = open(&url, &insecure()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (path, manifest) = common::artifact(tmp.path(), "artifact", 10_000, 4);
    let entry = store.put(&path, &manifest, false).await.unwrap();
    reg.stop();
    let addr = reg.addr.to_string();
    for err in [
        store.lookup(&manifest.compile_key).await.unwrap_err(),
        store.check_writable().await.unwrap_err(),
        store
            .pull(&entry.artifact_ref(), &tmp.path().join("x"))
            .await
            .unwrap_err(),
        store.put(&path, &manifest, false).await.unwrap_err(),
    ] {
        assert_eq!(err.reason(), FailureReason::StoreUnavailable, "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains(&addr) && msg.contains("cannot reach registry"),
            "{msg}"
        );
    }
    assert!(!tmp.path().join("x").exists());
}

#[test]
fn bad_oci_urls_and_half_credentials_are_invalid() {
    for url in [
        "oci://",
        "oci://host:5000",
        "oci://host:5000/",
        "oci://Host/UPPER",
    ] {
        let err = open(url, &RegistryOptions::default()).err().unwrap();
        assert_eq!(err.reason(), FailureReason::InvalidSpec, "{url}: {err}");
    }
    let err = open(
        "oci://r:5000/kiln",
        &RegistryOptions {
            username: Some("u".into()),
            ..Default::default()
        },
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("set together"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retagged_entry_is_refused_by_its_attestation() {
    let Some(reg) = Registry::start() else { return };
    let store = open(&reg.url("kiln/attested"), &insecure()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    common::poisoning_is_refused_and_replaced(store.as_ref(), tmp.path()).await;
    // Attestations are tagged the way cosign tags them.
    let key = common::artifact(tmp.path(), "k", 10, 41).1.compile_key;
    let entry = store.lookup(&key).await.unwrap().unwrap();
    let tag = entry.manifest_digest.replace("sha256:", "sha256-") + ".att";
    let (head, _) = http_get(
        reg.addr,
        &format!("/v2/kiln/attested/manifests/{tag}"),
        "application/vnd.oci.image.manifest.v1+json",
    );
    assert!(head.contains(" 200 "), "{head}");
}

/// A TCP proxy in front of the real registry that cuts the first `cuts` responses to a GET of
/// the blob `digest` after `keep` body bytes (a connection that breaks off mid-download, which
/// the registry cannot be made to do on demand), and records the Range header of every such
/// GET.
struct CuttingProxy {
    addr: std::net::SocketAddr,
    ranges: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl CuttingProxy {
    async fn start(upstream: std::net::SocketAddr, digest: String, cuts: usize, keep: u64) -> Self {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let ranges = Arc::new(std::sync::Mutex::new(Vec::new()));
        let cut = Arc::new(AtomicUsize::new(cuts));
        let seen = ranges.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = tokio::net::TcpStream::connect(upstream).await.unwrap();
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                // Body bytes to let through once this connection asks for the blob; MAX: all.
                let budget = Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
                let (budget_up, seen, cut, digest) =
                    (budget.clone(), seen.clone(), cut.clone(), digest.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 << 10];
                    while let Ok(n) = cr.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let text = String::from_utf8_lossy(&buf[..n]).to_string();
                        if text.starts_with("GET ")
                            && text.contains(&format!("/blobs/sha256:{digest}"))
                        {
                            let range = text
                                .lines()
                                .find(|l| l.to_ascii_lowercase().starts_with("range:"))
                                .unwrap_or("no range")
                                .to_string();
                            seen.lock().unwrap().push(range);
                            if cut.load(Ordering::SeqCst) > 0 {
                                cut.fetch_sub(1, Ordering::SeqCst);
                                // Header (well under 4 KiB) plus `keep` body bytes.
                                budget_up.store(keep + 4096, Ordering::SeqCst);
                            }
                        }
                        if sw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 << 10];
                    while let Ok(n) = sr.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let left = budget.load(Ordering::SeqCst);
                        let n = n.min(usize::try_from(left).unwrap_or(usize::MAX));
                        if cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        if left != u64::MAX {
                            budget.store(left - n as u64, Ordering::SeqCst);
                            if left == n as u64 {
                                let _ = cw.shutdown().await;
                                break; // the connection breaks off mid-body
                            }
                        }
                    }
                });
            }
        });
        Self { addr, ranges }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_that_breaks_off_resumes_by_range_and_is_verified_whole() {
    let Some(reg) = Registry::start() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (path, manifest) = common::artifact(tmp.path(), "artifact", 8 << 20, 9);
    let direct = open(&reg.url("kiln/resume"), &insecure()).unwrap();
    let entry = direct.put(&path, &manifest, false).await.unwrap();

    // Two breaks, each after 1 MiB of body: resumed twice, from where each one stopped.
    let proxy = CuttingProxy::start(reg.addr, manifest.artifact_digest.clone(), 2, 1 << 20).await;
    let store = open(&format!("oci://{}/kiln/resume", proxy.addr), &insecure()).unwrap();
    let dest = tmp.path().join("cache").join(&manifest.artifact_digest);
    store.pull(&entry.artifact_ref(), &dest).await.unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), std::fs::read(&path).unwrap());
    let ranges = proxy.ranges.lock().unwrap().clone();
    assert_eq!(ranges.len(), 3, "one GET and two resumptions: {ranges:?}");
    let offsets: Vec<u64> = ranges
        .iter()
        .map(|r| {
            let from = r
                .split('=')
                .nth(1)
                .and_then(|v| v.split('-').next())
                .unwrap_or("x");
            from.trim()
                .parse()
                .unwrap_or_else(|_| panic!("no byte range in {r:?}"))
        })
        .collect();
    assert_eq!(offsets[0], 0, "{ranges:?}");
    assert!(
        offsets[1] > 0 && offsets[2] > offsets[1],
        "each resumption starts where the last broke off, not from zero: {ranges:?}"
    );

    // A connection that breaks every time: given up after the resumptions, nothing written.
    let proxy = CuttingProxy::start(reg.addr, manifest.artifact_digest.clone(), 100, 1 << 20).await;
    let store = open(&format!("oci://{}/kiln/resume", proxy.addr), &insecure()).unwrap();
    let dest = tmp.path().join("cache2").join(&manifest.artifact_digest);
    let err = store.pull(&entry.artifact_ref(), &dest).await.unwrap_err();
    assert_eq!(err.reason(), FailureReason::StoreUnavailable, "{err}");
    assert!(err.to_string().contains("broke off after"), "{err}");
    assert!(err.to_string().contains("resumed attempts"), "{err}");
    assert_eq!(
        proxy.ranges.lock().unwrap().len(),
        1 + kiln_store::staged::MAX_RESUMES as usize
    );
    assert!(!dest.exists());
    // What did arrive is kept beside dest under the digest's name, for the next pull.
    let kept = tmp.path().join("cache2").join(format!(
        "{}{}",
        kiln_store::staged::PARTIAL_PREFIX,
        manifest.artifact_digest
    ));
    assert_eq!(
        common::names(&tmp.path().join("cache2")),
        [kept.file_name().unwrap().to_string_lossy().to_string()]
    );
    let have = std::fs::metadata(&kept).unwrap().len();
    assert!(have >= 1 << 20, "kept {have} bytes");

    // The next pull (a restarted agent) starts after the kept bytes and verifies the whole.
    let proxy = CuttingProxy::start(reg.addr, manifest.artifact_digest.clone(), 0, 0).await;
    let store = open(&format!("oci://{}/kiln/resume", proxy.addr), &insecure()).unwrap();
    store.pull(&entry.artifact_ref(), &dest).await.unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), std::fs::read(&path).unwrap());
    let lower = |v: Vec<String>| -> Vec<String> { v.iter().map(|r| r.to_lowercase()).collect() };
    assert_eq!(
        lower(proxy.ranges.lock().unwrap().clone()),
        [format!("range: bytes={have}-")],
        "one GET, from the first byte not kept"
    );
    assert!(!kept.exists(), "the kept bytes became dest");

    // Kept bytes that are not the object's (corrupted on disk, or planted) are hashed with the
    // rest, refused, thrown away, and the object is pulled again from byte 0.
    std::fs::remove_file(&dest).unwrap();
    std::fs::write(&kept, vec![0u8; 1 << 20]).unwrap();
    let proxy = CuttingProxy::start(reg.addr, manifest.artifact_digest.clone(), 0, 0).await;
    let store = open(&format!("oci://{}/kiln/resume", proxy.addr), &insecure()).unwrap();
    store.pull(&entry.artifact_ref(), &dest).await.unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), std::fs::read(&path).unwrap());
    let ranges = lower(proxy.ranges.lock().unwrap().clone());
    assert_eq!(ranges.len(), 2, "{ranges:?}");
    assert_eq!(
        ranges[0],
        format!("range: bytes={}-", 1 << 20),
        "{ranges:?}"
    );
    assert!(ranges[1].starts_with("range: bytes=0-"), "{ranges:?}");
    assert!(!kept.exists());
}

/// Publishers of different classes push at the same moment, and their blobs overlap: the same
/// engine bytes under two compile keys, and every attestation's empty config. Each publish
/// succeeds and each entry reads back with its attestation.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_publishers_of_shared_blobs_all_succeed() {
    let Some(reg) = Registry::start() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (path, first) = common::artifact(tmp.path(), "engine", 4096, 7);
    let bytes = std::fs::read(&path).unwrap();
    let mut tasks = Vec::new();
    for i in 0..8u8 {
        let store = open(&reg.url("kiln/concurrent"), &insecure()).unwrap();
        let path = path.clone();
        // The same artifact, as two classes that built the engine alike would store it.
        let mut manifest = common::manifest(&hex::encode(Sha256::digest([i, b'c'])), &bytes);
        manifest.class.insert("pool".into(), format!("p{i}"));
        tasks.push(tokio::spawn(async move {
            let entry = store.put(&path, &manifest, false).await?;
            let envelope = format!("{{\"payload\":\"{i}\"}}").into_bytes();
            store
                .put_attestation(&manifest.compile_key, &entry.manifest_digest, &envelope)
                .await?;
            Ok::<_, kiln_store::Error>((manifest.compile_key.clone(), entry.manifest_digest))
        }));
    }
    let store = open(&reg.url("kiln/concurrent"), &insecure()).unwrap();
    for task in tasks {
        let (key, digest) = task.await.unwrap().unwrap();
        let entry = store.lookup(&key).await.unwrap().expect("stored");
        assert_eq!(entry.manifest_digest, digest);
        assert_eq!(entry.manifest.artifact_digest, first.artifact_digest);
        assert!(store.attestation(&key, &digest).await.unwrap().is_some());
    }
}

/// The publish order against the real registry: the manifest is pushed by digest (no tag), the
/// attestation next, the compile-key tag last.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lookup_between_publish_steps_sees_nothing_or_a_verified_entry() {
    let Some(reg) = Registry::start() else { return };
    let store = open(&reg.url("kiln/order"), &insecure()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    common::publish::every_step_shows_nothing_or_a_verified_entry(store.clone(), tmp.path()).await;
    common::publish::a_racing_reader_never_sees_an_unattested_entry(store, tmp.path()).await;
}

/// `cosign verify-attestation --key --type slsaprovenance1` on an entry as the publisher stores
/// it: passes; after the envelope's statement is changed under its signature, fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cosign_verifies_the_attestation_kiln_publishes_and_refuses_a_changed_one() {
    use base64::Engine as _;
    use kiln_store::attest::{Signer, Trust};
    let Some(cosign) = registry::ensured("cosign") else {
        return;
    };
    let Some(reg) = Registry::start() else { return };
    let store = open(&reg.url("kiln/cosign"), &insecure()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (private, public) = Signer::generate().unwrap();
    std::fs::write(tmp.path().join("signing.pub"), &public).unwrap();
    let publisher = Trust {
        signer: Some(std::sync::Arc::new(
            Signer::from_pem(private.as_bytes()).unwrap(),
        )),
        ..Trust::default()
    };
    let (path, manifest) = common::artifact(tmp.path(), "a", 50_000, 7);
    let entry = publisher
        .publish(
            store.as_ref(),
            &path,
            &manifest,
            false,
            Some("agent@sha256:1234"),
        )
        .await
        .unwrap();
    let verify = || {
        std::process::Command::new(&cosign)
            .args([
                "verify-attestation",
                "--key",
                "signing.pub",
                "--type",
                "slsaprovenance1",
            ])
            .arg("--insecure-ignore-tlog=true")
            .arg(format!(
                "{}/kiln/cosign@{}",
                reg.addr, entry.manifest_digest
            ))
            .current_dir(tmp.path())
            .env("HOME", tmp.path())
            .output()
            .unwrap()
    };
    let out = verify();
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "cosign refused kiln's attestation: {said}"
    );
    assert!(said.contains("The cosign claims were validated"), "{said}");
    // It prints the envelopes it verified: kiln's statement, naming the artifact.
    let b64 = base64::engine::general_purpose::STANDARD;
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let statement = b64.decode(printed["payload"].as_str().unwrap()).unwrap();
    let statement = String::from_utf8(statement).unwrap();
    assert!(statement.contains(&manifest.artifact_digest), "{statement}");

    // The statement changed (another artifact digest), the signature kept.
    let envelope = store
        .attestation(&manifest.compile_key, &entry.manifest_digest)
        .await
        .unwrap()
        .unwrap();
    let mut json: serde_json::Value = serde_json::from_slice(&envelope).unwrap();
    let payload = b64.decode(json["payload"].as_str().unwrap()).unwrap();
    let changed = String::from_utf8(payload)
        .unwrap()
        .replace(&manifest.artifact_digest, &"0".repeat(64));
    json["payload"] = b64.encode(changed).into();
    store
        .put_attestation(
            &manifest.compile_key,
            &entry.manifest_digest,
            &serde_json::to_vec(&json).unwrap(),
        )
        .await
        .unwrap();
    let out = verify();
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "cosign accepted a changed statement: {said}"
    );
    assert!(
        said.contains("accepted signatures do not match threshold"),
        "{said}"
    );
}

/// Pulls through registry mirrors as containerd's hosts.toml orders them. A mirror that is down
/// and one that serves other bytes for the digest are passed over, each with its reason, and the
/// next serves; behind them a real pull-through cache (Distribution 3 in proxy mode), preheated
/// by the publisher, serves 100 pulls in waves of 10 while the origin serves each blob once, to
/// the cache: the origin bytes for N = 1, 10 and 100 pulls are printed beside N times the
/// artifact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulls_go_through_mirrors_in_order_and_fall_back_past_bad_ones() {
    let Some(origin) = Registry::start_logged() else {
        return;
    };
    let Some(cache) = Registry::start_proxy(origin.addr) else {
        return;
    };
    let Some(liar) = Registry::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (path, manifest) = common::artifact(tmp.path(), "a", 4 << 20, 9);
    let entry = open(&origin.url("kiln/m"), &insecure())
        .unwrap()
        .put(&path, &manifest, false)
        .await
        .unwrap();
    // The liar holds the same entry, its layer's bytes flipped in its storage.
    open(&liar.url("kiln/m"), &insecure())
        .unwrap()
        .put(&path, &manifest, false)
        .await
        .unwrap();
    let blob = liar.blob_path(&manifest.artifact_digest);
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[1000] ^= 1;
    std::fs::write(&blob, bytes).unwrap();
    let down = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let node = |mirrors: &[std::net::SocketAddr]| {
        let list: Vec<String> = mirrors
            .iter()
            .map(|m| format!(r#"{{"host": "http://{m}", "capabilities": ["pull"]}}"#))
            .collect();
        let options = RegistryOptions {
            mirrors: Some(format!("[{}]", list.join(","))),
            ..insecure()
        };
        open(&origin.url("kiln/m"), &options).unwrap()
    };
    let r = kiln_store::ArtifactRef {
        compile_key: manifest.compile_key.clone(),
        manifest_digest: entry.manifest_digest.clone(),
        artifact_digest: manifest.artifact_digest.clone(),
        size: Some(manifest.artifact_size),
    };
    let want = std::fs::read(&path).unwrap();
    let pull = |store: std::sync::Arc<dyn kiln_store::Store>, n: usize| {
        let (r, dest) = (r.clone(), tmp.path().join(format!("pulled-{n}")));
        async move {
            store.pull(&r, &dest).await.unwrap();
            dest
        }
    };
    // Through the cache alone. The publisher preheats it (as a compile Job does after a publish),
    // then N nodes pull at once, in waves of 10: the origin serves each blob once, to the cache.
    let through = node(&[cache.addr]);
    assert_eq!(through.preheat(&r).await, [], "preheat");
    wait_for_cached(&origin, &cache, "kiln/m");
    let preheated = origin.blob_gets();
    let size = manifest.artifact_size;
    let mut figures = Vec::new();
    let mut pulled = 0;
    for wave in [1, 9, 10, 10, 10, 10, 10, 10, 10, 10, 10] {
        let pulls = (pulled..pulled + wave).map(|n| pull(through.clone(), n));
        for dest in futures_util::future::join_all(pulls).await {
            assert_eq!(std::fs::metadata(&dest).unwrap().len(), size);
            std::fs::remove_file(dest).unwrap();
        }
        pulled += wave;
        if [1, 10, 100].contains(&pulled) {
            figures.push((pulled, origin.blob_bytes_served()));
        }
    }
    assert!(through.take_mirror_skips().is_empty());
    for (n, (bytes, gets)) in &figures {
        eprintln!(
            "N = {n:>3}: origin served {bytes} blob bytes in {gets} GETs through the cache; {} without it ({:.3}x)",
            *n as u64 * size,
            *bytes as f64 / (*n as u64 * size) as f64
        );
    }
    // The layer and the build manifest (config), each fetched once, by the preheat.
    let gets = origin.blob_gets();
    assert_eq!(gets, preheated, "the origin served blobs after the preheat");
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert!(gets.values().all(|&n| n == 1), "{gets:?}");
    assert_eq!(gets[&format!("sha256:{}", manifest.artifact_digest)], 1);
    // Past a mirror that is down and one serving other bytes, to the cache.
    let guarded = node(&[down, liar.addr, cache.addr]);
    for n in 0..3 {
        let dest = pull(guarded.clone(), n).await;
        assert!(
            std::fs::read(&dest).unwrap() == want,
            "pull {n} got other bytes"
        );
    }
    let skips = guarded.take_mirror_skips();
    let reasons: Vec<(&str, bool)> = skips
        .iter()
        .map(|s| {
            (
                s.reason,
                s.mirror == down.to_string() || s.mirror == liar.addr.to_string(),
            )
        })
        .collect();
    assert_eq!(
        reasons,
        [("unavailable", true), ("hash_mismatch", true)].repeat(3),
        "{skips:?}"
    );
    assert!(guarded.take_mirror_skips().is_empty(), "taken once");
    // A preheat says which mirrors it could not fill, and why; it fills the others.
    let unfilled: Vec<(String, &str)> = guarded
        .preheat(&r)
        .await
        .into_iter()
        .map(|s| (s.mirror, s.reason))
        .collect();
    assert_eq!(
        unfilled,
        [
            (down.to_string(), "unavailable"),
            (liar.addr.to_string(), "hash_mismatch")
        ]
    );
}

/// Waits up to 60 s for `cache` to hold every blob of `repo` the origin holds: the cache answers
/// a pull before it has committed the blob (and goes to the origin again for a pull in between).
fn wait_for_cached(origin: &Registry, cache: &Registry, repo: &str) {
    let layers = format!("data/docker/registry/v2/repositories/{repo}/_layers/sha256");
    let held = std::fs::read_dir(origin.storage().join(&layers)).unwrap();
    for blob in held {
        wait_for_file(
            &cache
                .storage()
                .join(&layers)
                .join(blob.unwrap().file_name())
                .join("link"),
        );
    }
}

/// Waits up to 60 s for `path` to exist.
fn wait_for_file(path: &std::path::Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} did not appear in 60 s",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
