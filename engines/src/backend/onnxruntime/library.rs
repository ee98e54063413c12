//! Loading the ONNX Runtime shared library at run time: one per process, its version read from
//! what `ort` reports, its bytes hashed for the compile key.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use kiln_node_core::error::{Error, Result};

/// The oldest ONNX Runtime release that serves the C API version the binding is built against
/// (`ort` 2.0.0-rc.15, API 31). The C API is versioned and backward compatible, so any later
/// 1.x release serves it too; the exact version and the library's sha256 stay in the compile key.
pub const MIN_RELEASE: &str = "1.31";
const INSTALL: &str = "fetch the library with scripts/ensure-onnxruntime.sh (the PyPI onnxruntime \
    1.31.1 wheel's onnxruntime/capi/libonnxruntime.so.1.31.1) and pass --onnxruntime-lib or set \
    ORT_DYLIB_PATH";

/// The library this process loaded: ONNX Runtime is one per process.
pub struct Runtime {
    pub(super) env: ort::environment::Environment,
    /// Release, as the library reports it (`1.31.1`).
    pub version: String,
    /// sha256 of the library file.
    pub sha256: String,
    /// Where it was loaded from.
    pub path: PathBuf,
}

static CONFIGURED: OnceLock<PathBuf> = OnceLock::new();
static RUNTIME: OnceLock<std::result::Result<Runtime, String>> = OnceLock::new();

/// Sets where the library is (`--onnxruntime-lib`), before first use; later calls are ignored.
pub fn configure(path: Option<PathBuf>) {
    if let Some(path) = path {
        let _ = CONFIGURED.set(path);
    }
}

/// The configured library path: `--onnxruntime-lib`, else `ORT_DYLIB_PATH`.
pub fn library_path() -> Option<PathBuf> {
    CONFIGURED.get().cloned().or_else(|| {
        std::env::var_os("ORT_DYLIB_PATH")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
}

/// The loaded runtime, loading it on first use; a missing, unloadable or wrong-version library
/// is `IncompatibleRuntime` saying what to install.
pub fn runtime() -> Result<&'static Runtime> {
    RUNTIME
        .get_or_init(load_library)
        .as_ref()
        .map_err(|m| Error::IncompatibleRuntime(m.clone()))
}

fn load_library() -> std::result::Result<Runtime, String> {
    let Some(path) = library_path() else {
        return Err(format!(
            "backend onnxruntime needs the ONNX Runtime shared library ({MIN_RELEASE} or newer) and none is configured; {INSTALL}"
        ));
    };
    let shown = path.display();
    let meta = std::fs::metadata(&path)
        .map_err(|e| format!("ONNX Runtime library {shown}: {e}; {INSTALL}"))?;
    if !meta.is_file() {
        return Err(format!(
            "ONNX Runtime library {shown} is not a regular file; {INSTALL}"
        ));
    }
    let (sha256, _) = kiln_store::staged::sha256_file(&path)
        .map_err(|e| format!("ONNX Runtime library {shown}: {e}"))?;
    // `ort` reports the version it found only through its log; listen for it while loading.
    let heard = Arc::new(Mutex::new(Vec::new()));
    let listener = {
        use tracing_subscriber::layer::SubscriberExt;
        tracing_subscriber::registry().with(Heard(heard.clone()))
    };
    let built = tracing::subscriber::with_default(listener, || {
        ort::init_from(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| {
                b.with_name("kiln")
                    .with_telemetry(false)
                    .build()
                    .map_err(|e| e.to_string())
            })
    });
    let env =
        built.map_err(|e| format!("cannot load ONNX Runtime from {shown}: {e}; {INSTALL}"))?;
    // ONNX Runtime's own log goes through `ort` into ours; its informational lines (arena
    // growth, unused initialisers) would drown the agent's.
    env.set_log_level(ort::logging::LogLevel::Warning);
    let version = heard
        .lock()
        .map_err(|_| "poisoned".to_string())?
        .iter()
        .find_map(|m| reported_version(m))
        .ok_or_else(|| format!("{shown} loaded but did not report its version; {INSTALL}"))?;
    if !serves_api(&version) {
        return Err(format!(
            "{shown} is ONNX Runtime {version}, which does not serve C API version {}; kiln-agent needs ONNX Runtime {MIN_RELEASE} or newer; {INSTALL}",
            ort::MINOR_VERSION
        ));
    }
    tracing::info!(path = %shown, version, sha256, "ONNX Runtime loaded");
    Ok(Runtime {
        env,
        version,
        sha256,
        path,
    })
}

/// Whether a release (`1.32.0`) serves the C API version kiln-agent is built against: ONNX
/// Runtime's API version is its minor release number, and every 1.x release serves all earlier
/// API versions.
fn serves_api(version: &str) -> bool {
    let mut parts = version.split('.').map(str::parse::<u32>);
    matches!((parts.next(), parts.next()), (Some(Ok(1)), Some(Ok(minor))) if minor >= ort::MINOR_VERSION)
}

/// The version in `ort`'s "Loaded ONNX Runtime dylib from …; version '1.31.1'".
fn reported_version(message: &str) -> Option<String> {
    let rest = message.strip_prefix("Loaded ONNX Runtime dylib from ")?;
    let (_, tail) = rest.rsplit_once("; version '")?;
    let version = tail.strip_suffix('\'')?;
    version
        .chars()
        .all(|c| c.is_ascii_digit() || c == '.')
        .then(|| version.to_string())
}

/// A tracing layer keeping event messages.
struct Heard(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Heard {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message<'a>(&'a mut String);
        impl tracing::field::Visit for Message<'_> {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    *self.0 = format!("{v:?}");
                }
            }
        }
        let mut message = String::new();
        event.record(&mut Message(&mut message));
        if let Ok(mut heard) = self.0.lock() {
            heard.push(message);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_release_serving_the_api_is_accepted_and_older_ones_are_not() {
        assert_eq!(ort::MINOR_VERSION, 31);
        for ok in ["1.31.0", "1.31.1", "1.32.0", "1.40.2"] {
            assert!(serves_api(ok), "{ok}");
        }
        for refused in ["1.30.9", "1.20.1", "2.0.0", "0.31.0", "1", "x.y", ""] {
            assert!(!serves_api(refused), "{refused}");
        }
    }

    #[test]
    fn reads_the_version_ort_reports() {
        assert_eq!(
            reported_version("Loaded ONNX Runtime dylib from \"/x/lib.so\"; version '1.31.1'"),
            Some("1.31.1".into())
        );
        assert_eq!(reported_version("something else"), None);
        assert_eq!(
            reported_version("Loaded ONNX Runtime dylib from \"/x\"; version '1.31.1; rm -rf'"),
            None
        );
    }
}
