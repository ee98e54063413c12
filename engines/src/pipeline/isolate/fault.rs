//! Faults on demand, for the tests only: compiled in with the cargo feature `fault-injection`
//! (the tests and the e2e fault image; never the product images or a release build without
//! it). A real segfault or abort cannot be had from ONNX Runtime on demand, so a model whose
//! bytes (the source for a compile, the artifact for a load) hold the marker
//! `kiln-fault-inject:<step>:<fault>` makes the engine's process do it, after its limits are
//! set, as a crashing engine library would: `<step>` is `compile`, `load` or `reference` (`kiln-agent fixtures`); `<fault>` is
//! `segfault` (SIGSEGV), `abort` (SIGABRT) or `spin` (burns CPU until killed).

use super::task::Task;

const MARKER: &[u8] = b"kiln-fault-inject:";
/// How much of a file is searched for the marker.
const SCAN: u64 = 64 << 20;

/// Does the fault the job's model asks for, if any.
pub fn maybe(job: &Task) {
    let (step, path) = match job {
        Task::Compile(c) => ("compile", &c.model_file),
        Task::LoadWarm(l) => ("load", &l.artifact),
        Task::Reference(r) => ("reference", &r.model),
    };
    let Some(fault) = wanted(path, step) else {
        return;
    };
    eprintln!("kiln-agent engine: fault injection: {step}:{fault}");
    match fault.as_str() {
        "segfault" => {
            // Rust's stack-overflow handler takes the first SIGSEGV, restores the default
            // action and returns (a real fault would re-fault); the second one ends the process
            // as a segfault in a native library does.
            for _ in 0..2 {
                let _ = rustix::process::kill_process(
                    rustix::process::getpid(),
                    rustix::process::Signal::SEGV,
                );
            }
        }
        "abort" => std::process::abort(),
        "spin" => {
            let mut x: u64 = 0;
            loop {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        _ => {}
    }
}

fn wanted(path: &std::path::Path, step: &str) -> Option<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(SCAN)
        .read_to_end(&mut bytes)
        .ok()?;
    let prefix = [MARKER, step.as_bytes(), b":"].concat();
    let at = bytes.windows(prefix.len()).position(|w| w == prefix)? + prefix.len();
    let fault: String = bytes[at..]
        .iter()
        .take_while(|b| b.is_ascii_lowercase())
        .map(|&b| char::from(b))
        .collect();
    Some(fault)
}
