//! The parts of `e2e/gpu/prove.sh` that need no GPU: the script parses, its usage names every
//! subcommand, and every document its `run` and `graphs` steps would hand to `kiln-agent local`
//! (`prove.sh specs`, for a stand-in model) is one the apiserver accepts — with CUDA graphs on
//! ResNet-50 and BERT-base only, at fp32 with cpuFallback Forbidden. What it measures on a GPU
//! is not checked here.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use kiln_engines::pipeline::spec::Spec;

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/gpu/prove.sh")
}

#[test]
fn the_script_parses_and_its_usage_names_every_subcommand() {
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(script())
        .output()
        .expect("bash");
    assert!(
        syntax.status.success(),
        "{}",
        String::from_utf8_lossy(&syntax.stderr)
    );
    let usage = Command::new("bash").arg(script()).output().expect("bash");
    assert_eq!(
        usage.status.code(),
        Some(2),
        "no subcommand is a usage error"
    );
    let text = String::from_utf8_lossy(&usage.stderr);
    for sub in ["pack", "stash", "run", "anchor", "graphs", "table", "specs"] {
        assert!(
            text.contains(&format!("e2e/gpu/prove.sh {sub}")),
            "usage lacks {sub}: {text}"
        );
    }
    assert!(text.contains("What it verifies"), "{text}");
}

#[test]
fn every_document_it_runs_is_valid_and_graphs_run_where_intended() {
    let out = tempfile::tempdir().expect("tempdir");
    let run = Command::new("bash")
        .arg(script())
        .arg("specs")
        .arg(out.path())
        .output()
        .expect("bash");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    let mut rows = BTreeSet::new();
    for line in stdout.lines() {
        let (row, file) = line.split_once(' ').expect("ROW FILE");
        let yaml = std::fs::read_to_string(file).expect("document");
        let spec = Spec::parse(&yaml).unwrap_or_else(|e| panic!("{row}: {e}"));
        let backend = &spec.target.spec.backend;
        let graphs = backend.cuda.as_ref().is_some_and(|c| c.graphs());
        assert_eq!(graphs, row.contains(".ort-cuda-graphs."), "{row}");
        if graphs {
            let policy = backend.cpu_fallback.clone().unwrap_or_default().policy;
            assert_eq!(
                policy,
                kiln_crds::compiled_target::CpuFallbackPolicy::Forbidden,
                "{row}"
            );
            assert!(
                spec.target.spec.warmup.iterations >= 4,
                "{row}: replays each sample"
            );
        }
        rows.insert(row.to_string());
    }
    let graphs: Vec<&String> = rows.iter().filter(|r| r.contains("graphs")).collect();
    assert_eq!(
        graphs,
        ["bert.ort-cuda-graphs.fp32", "resnet50.ort-cuda-graphs.fp32"],
        "CUDA graphs on the exported models, fp32 only"
    );
    for model in ["resnet50", "bert"] {
        for variant in [
            "tract.fp32",
            "ort-cpu.tf32",
            "ort-cuda.fp32",
            "ort-cuda.tf32",
            "ort-cuda-forbid.fp32",
            "ort-tensorrt.fp32",
            "auto.tf32",
        ] {
            assert!(
                rows.contains(&format!("{model}.{variant}")),
                "{model}.{variant}: {rows:?}"
            );
        }
    }
    assert!(
        !rows.iter().any(|r| r.ends_with("tract.tf32")),
        "tract at tf32 is refused at admission"
    );
}
