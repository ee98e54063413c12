//! `kiln-agent engine`, the child's side of [`kiln_engines::pipeline::isolate`]: read the job (bounded), set the limits on itself,
//! run the one step with the same pipeline functions as ever, answer on stdout, exit. It holds
//! no store, no client and no credentials; it reads the verified files it is pointed at and
//! writes only a compile's artifact path.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Instant;

use kiln_engines::backend;
use kiln_engines::pipeline::build::{Inputs, Target};
use kiln_engines::pipeline::fixtures::FixtureFile;
use kiln_engines::pipeline::isolate::task::{
    Answer, Compile, Compiled, FixtureRef, LoadWarm, MAX_TASK_BYTES, Outcome, Request, Task, Warmed,
};
use kiln_engines::pipeline::spec::Spec;
use kiln_node_core::error::{Error, Result};

/// `kiln-agent engine`: exit 0 with an answer on stdout, whatever the step's result; any other
/// exit is the parent's to classify.
pub fn main() -> ExitCode {
    let request = match read_request(std::io::stdin().lock()) {
        Ok(r) => r,
        Err(m) => {
            eprintln!("kiln-agent engine: refusing the job: {m}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = kiln_engines::pipeline::isolate::limits::apply(&request.limits) {
        eprintln!("kiln-agent engine: cannot set its limits ({e}); not running the engine");
        return ExitCode::from(3);
    }
    #[cfg(feature = "fault-injection")]
    kiln_engines::pipeline::isolate::fault::maybe(&request.job);
    let answer = execute(request.job);
    let written = serde_json::to_vec(&answer)
        .map_err(std::io::Error::other)
        .and_then(|bytes| {
            let mut out = std::io::stdout().lock();
            out.write_all(&bytes)?;
            out.flush()
        });
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kiln-agent engine: cannot write its answer: {e}");
            ExitCode::from(4)
        }
    }
}

/// Reads one [`Request`] of at most [`MAX_TASK_BYTES`].
fn read_request(r: impl Read) -> std::result::Result<Request, String> {
    let mut bytes = Vec::new();
    r.take(MAX_TASK_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_TASK_BYTES {
        return Err(format!("larger than {MAX_TASK_BYTES} bytes"));
    }
    serde_json::from_slice(&bytes).map_err(|e| e.to_string())
}

/// Runs one step and says how it went; the same in the child and (measuring) in process.
pub fn execute(job: Task) -> Answer {
    let outcome = match job {
        Task::LoadWarm(j) => load_warm(&j).map(|w| Outcome::Warmed(Box::new(w))),
        Task::Compile(j) => compile(*j).map(|c| Outcome::Compiled(Box::new(c))),
        Task::Reference(j) => {
            kiln_engines::golden::make_file(&j).map(|sha256| Outcome::Made { sha256 })
        }
    }
    .unwrap_or_else(|e| Outcome::Failed {
        reason: e.reason(),
        message: e.to_string(),
    });
    Answer {
        outcome,
        peak_rss_bytes: kiln_engines::host::memory::peak_rss(),
    }
}

/// The fixture the parent verified, checked again against its digest before it is used.
fn fixture(f: &FixtureRef) -> Result<FixtureFile> {
    let bytes = std::fs::read(&f.path)
        .map_err(|e| Error::source_unavailable(f.path.display().to_string(), e))?;
    let got = kiln_store::staged::sha256_bytes(&bytes);
    if got != f.sha256 {
        return Err(Error::HashMismatch {
            what: format!("fixture {}", f.path.display()),
            message: format!("sha256 is {got}, {} was verified", f.sha256),
            source: None,
        });
    }
    FixtureFile::parse(&bytes).map_err(|m| Error::InvalidSpec(format!("fixture: {m}")))
}

/// Loads and warms; measures load time, the process's own peak memory and GPU memory.
fn load_warm(j: &LoadWarm) -> Result<Warmed> {
    let fixture = fixture(&j.fixture)?;
    let backend = backend::for_artifact(&j.backend, &j.manifest)?;
    let window = kiln_engines::host::memory::PeakWindow::start();
    let started = Instant::now();
    let engine = backend.load(&j.artifact)?;
    let load_seconds = started.elapsed().as_secs_f64();
    // The parent shows the phase Warming from here (kiln_engines::pipeline::isolate::parent::LOADED).
    eprintln!("{}", kiln_engines::pipeline::isolate::parent::LOADED);
    let device_after_load = kiln_engines::host::device_memory::process_bytes();
    let mut report = kiln_engines::pipeline::warmup::warm(engine.as_ref(), &fixture, &j.warmup)?;
    // Read while the engine still holds its memory.
    report.peak_device_memory_bytes = kiln_engines::host::device_memory::process_bytes();
    drop(engine);
    report.peak_memory_bytes = window
        .as_ref()
        .and_then(kiln_engines::host::memory::PeakWindow::peak_bytes);
    Ok(Warmed {
        load_seconds,
        device_after_load,
        report,
    })
}

/// Compiles with the target's (concrete) backend and checks parity; measures when asked.
fn compile(j: Compile) -> Result<Compiled> {
    let fixture = fixture(&j.fixture)?;
    let spec = Spec {
        model: j.model,
        target: j.target,
    };
    let backend = backend::for_target(&spec.target.spec.backend)?;
    let inputs = Inputs::verified(j.model_file, fixture, j.fixture);
    let target = Target {
        class: &j.class,
        host: &j.host,
        out: &j.out,
        key: &j.key,
    };
    let manifest =
        kiln_engines::pipeline::build::compile(&spec, &inputs, backend.as_ref(), &target)?;
    let measured = j
        .measure
        .then(|| kiln_engines::pipeline::compile::measure(&spec, &inputs, backend.as_ref(), &j.out))
        .transpose()?;
    Ok(Compiled { manifest, measured })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_or_malformed_job_is_refused() {
        let big = vec![b' '; MAX_TASK_BYTES as usize + 1];
        assert!(
            read_request(&big[..])
                .expect_err("big")
                .contains("larger than")
        );
        assert!(read_request(&b"{\"limits\":1}"[..]).is_err());
    }
}
