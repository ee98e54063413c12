//! IREE's compiler, run as a child process ([`subprocess`]): `iree-import-onnx` turns the
//! verified ONNX source into MLIR, `iree-compile` lowers that to a module of machine code for one
//! target CPU. Both come from the pinned PyPI wheel (`iree-base-compiler`), found in
//! `$KILN_IREE_BIN` (what `scripts/ensure/iree.sh` prints; the compile Job image sets it) or on
//! `PATH`, and are refused unless `iree-compile --version` names the pinned version.
//!
//! The same source and target give the same bytes on any machine: the compiler embeds the
//! input's path as written, so both tools run in a fresh directory on fixed relative names.
//! May touch: a scratch directory of its own and the processes it starts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::backend::{Shapes, subprocess};
use kiln_node_core::error::{Error, Result};

/// The IREE release kiln's compiler and runtime are (eerie-sys vendors the same commit).
pub const VERSION: &str = "3.13.0";

/// The revision of the flags [`flags`] gives, part of the backend's identity and so of the compile
/// key: bump it with any change to them (a unit test holds them to it).
pub const FLAGS_REVISION: &str = "llvm-cpu.1";

/// ONNX operator set the importer upgrades older models to (it only upgrades): IREE's ONNX
/// lowering covers opsets 17 and up, and older models (SqueezeNet's 9) fail without it.
const OPSET: &str = "17";

/// How long `iree-compile --version` may take.
const VERSION_TIMEOUT: Duration = Duration::from_secs(30);

/// Python that fixes an ONNX model's input dims to a profile's shape (argv: source, output,
/// `{"input": [dims]}`), with the `onnx` package beside the importer; external data stays where
/// it is (the importer reads it from the source's directory).
const FIX_SHAPES: &str = r#"
import json, sys, onnx
src, dst, shapes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
m = onnx.load(src, load_external_data=False)
for i in m.graph.input:
    if i.name not in shapes:
        continue
    dims, want = i.type.tensor_type.shape.dim, shapes[i.name]
    if len(dims) != len(want):
        sys.exit(f"input {i.name} has {len(dims)} dims, the profile binds {len(want)}")
    for d, v in zip(dims, want):
        d.dim_value = v
onnx.save(m, dst)
"#;

/// Python that prints the public functions of an MLIR module (argv: the file, text or bytecode),
/// one JSON object a line, `{"name", "visibility", "inputs", "results", "module"}` with the
/// types as MLIR prints them and the module's own name (which IREE names the compiled module
/// by), parsed by the compiler's own MLIR (`iree.compiler.ir`, every input dialect registered). A
/// StableHLO portable artifact holds `vhlo.func_v1`, whose type is one attribute to split.
const SIGNATURE: &str = r##"
import json, re, sys
from iree.compiler import ir
def split(s):
    out, depth, cur = [], 0, ""
    for c in s:
        if c in "<([": depth += 1
        if c in ">)]": depth -= 1
        if c == "," and depth == 0:
            out.append(cur.strip()); cur = ""
        else:
            cur += c
    return out + ([cur.strip()] if cur.strip() else [])
def vhlo_string(a):
    m = re.fullmatch(r'#vhlo\.string_v1<"(.*)">', str(a))
    return m.group(1) if m else str(a)
with ir.Context() as ctx:
    ctx.allow_unregistered_dialects = True
    with open(sys.argv[1], "rb") as f:
        m = ir.Module.parse(f.read())
    attrs = m.operation.attributes
    module = ir.StringAttr(attrs["sym_name"]).value if "sym_name" in attrs else None
    for op in m.body.operations:
        name, a = op.operation.name, op.operation.attributes
        if name == "func.func":
            t = ir.FunctionType(ir.TypeAttr(a["function_type"]).value)
            f = {"name": ir.StringAttr(a["sym_name"]).value,
                 "visibility": ir.StringAttr(a["sym_visibility"]).value if "sym_visibility" in a else "public",
                 "inputs": [str(x) for x in t.inputs], "results": [str(x) for x in t.results]}
        elif name == "vhlo.func_v1":
            m2 = re.fullmatch(r"#vhlo\.type_v1<!vhlo\.func_v1<\((.*)\) -> (.*)>>", str(a["function_type"]))
            if not m2:
                sys.exit("cannot read the type of a vhlo.func_v1: " + str(a["function_type"])[:200])
            res = m2.group(2)
            res = res[1:-1] if res.startswith("(") and res.endswith(")") else res
            f = {"name": vhlo_string(a["sym_name"]),
                 "visibility": vhlo_string(a["sym_visibility"]) if "sym_visibility" in a else "public",
                 "inputs": split(m2.group(1)), "results": split(res)}
        else:
            continue
        f["module"] = module
        if f["visibility"] == "public":
            print(json.dumps(f), flush=True)
"##;

/// Where the compiler's tools are.
pub struct Tools {
    import: PathBuf,
    compile: PathBuf,
    python: PathBuf,
}

impl Tools {
    /// The tools in `dir`, else in `$KILN_IREE_BIN`, else on `PATH`, checked to be the pinned
    /// version.
    pub fn find(dir: Option<&Path>) -> Result<Self> {
        let find = |name: &str| -> Option<PathBuf> {
            let dirs = dir
                .map(|d| d.as_os_str().to_owned())
                .or_else(|| std::env::var_os("KILN_IREE_BIN"))
                .map(|d| vec![PathBuf::from(d)])
                .unwrap_or_else(|| {
                    std::env::var_os("PATH")
                        .map(|p| std::env::split_paths(&p).collect())
                        .unwrap_or_default()
                });
            dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
        };
        // The python that runs the importer (its venv's, beside it) has the importer's onnx.
        let beside = |tool: &Option<PathBuf>| {
            let python = tool.as_ref()?.parent()?.join("python3");
            python.is_file().then_some(python)
        };
        let import = find("iree-import-onnx");
        let python = beside(&import).or_else(|| find("python3"));
        let (Some(import), Some(compile), Some(python)) = (import, find("iree-compile"), python)
        else {
            return Err(Error::IncompatibleRuntime(format!(
                "IREE's compiler {VERSION} (iree-import-onnx, iree-compile, and the python3 with onnx beside them) is not here: it runs in the compile Job's image; for local mode set KILN_IREE_BIN to what scripts/ensure/iree.sh prints"
            )));
        };
        let tools = Self {
            import,
            compile,
            python,
        };
        tools.check_version()?;
        Ok(tools)
    }

    fn check_version(&self) -> Result<()> {
        let mut cmd = subprocess::command(&self.compile);
        cmd.arg("--version");
        let ran = subprocess::run(&mut cmd, Some(VERSION_TIMEOUT), subprocess::Orphans::Leave)
            .map_err(|e| {
                Error::IncompatibleRuntime(format!("cannot start {}: {e}", self.compile.display()))
            })?;
        subprocess::check_exit(
            "iree-compile --version",
            ran.status,
            Some(VERSION_TIMEOUT),
            &ran.log,
        )?;
        let said = ran.log.join(" ");
        if said.contains(&format!("IREE compiler version {VERSION}")) {
            Ok(())
        } else {
            Err(Error::IncompatibleRuntime(format!(
                "{} is not IREE's compiler {VERSION}: it says {said:?}",
                self.compile.display()
            )))
        }
    }
}

/// The flags `iree-compile` gets for `cpu`: local execution of x86-64 code for that CPU.
pub fn flags(cpu: &str) -> Vec<String> {
    vec![
        "--iree-hal-target-device=local".into(),
        "--iree-hal-local-target-device-backends=llvm-cpu".into(),
        format!("--iree-llvmcpu-target-cpu={cpu}"),
    ]
}

/// What a compile made.
pub(super) struct Built {
    pub(super) module: Vec<u8>,
    pub(super) function: String,
    pub(super) log: Vec<String>,
}

/// Imports `model` (its inputs fixed to `shapes` when given: code for one shape is IREE's fast
/// case, a symbolic dim costs it several times) and compiles it with `flags`, each step within
/// `timeout`.
pub(super) fn build(
    tools: &Tools,
    model: &Path,
    shapes: Option<&Shapes>,
    flags: &[String],
    timeout: Option<Duration>,
) -> Result<Built> {
    let work = scratch()?;
    let onnx = work.path().join("model.onnx");
    let mut log = match shapes {
        Some(shapes) => {
            let json = serde_json::to_string(shapes).unwrap_or_default();
            let mut fix = subprocess::command(&tools.python);
            fix.current_dir(work.path())
                .args(["-c", FIX_SHAPES])
                .arg(model)
                .args(["model.onnx", &json]);
            step(&mut fix, "fixing the profile's shapes", timeout)?
        }
        // A link, not a copy, where it can be: the source may be gigabytes.
        None => {
            std::fs::hard_link(model, &onnx)
                .or_else(|_| std::fs::copy(model, &onnx).map(|_| ()))
                .map_err(|e| Error::store(&onnx, e))?;
            Vec::new()
        }
    };
    // External data is read from the source's own (verified) directory.
    let data_dir = model.parent().unwrap_or(Path::new("."));
    let mut import = subprocess::command(&tools.import);
    import
        .current_dir(work.path())
        .args([
            "model.onnx",
            "-o",
            "model.mlir",
            "--opset-version",
            OPSET,
            "--data-dir",
        ])
        .arg(data_dir);
    log.extend(step(&mut import, "iree-import-onnx", timeout)?);
    let function = function_name(&work.path().join("model.mlir"))?;
    let (module, compiled) =
        compile_module(tools, work.path(), Path::new("model.mlir"), flags, timeout)?;
    log.extend(compiled);
    Ok(Built {
        module,
        function,
        log,
    })
}

/// A private scratch directory for one compile's files, removed when dropped.
fn scratch() -> Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("kiln-iree-")
        .tempdir()
        .map_err(|e| Error::store(std::env::temp_dir(), e))
}

/// `iree-compile` of `mlir` (relative to `work`, or absolute) into `work`/model.vmfb with
/// `flags`, within `timeout`: the module's bytes and the compiler's output.
fn compile_module(
    tools: &Tools,
    work: &Path,
    mlir: &Path,
    flags: &[String],
    timeout: Option<Duration>,
) -> Result<(Vec<u8>, Vec<String>)> {
    let mut compile = subprocess::command(&tools.compile);
    compile
        .current_dir(work)
        .args(flags)
        .arg(mlir)
        .args(["-o", "model.vmfb"]);
    let log = step(&mut compile, "iree-compile", timeout)?;
    let path = work.join("model.vmfb");
    let module = std::fs::read(&path).map_err(|e| Error::store(&path, e))?;
    Ok((module, log))
}

/// The public functions of the MLIR module `model` (text or bytecode), read by the compiler's own
/// parser within `timeout`: a file it cannot parse is `CompileFailed` with its words.
pub(super) fn signature(
    tools: &Tools,
    model: &Path,
    timeout: Option<Duration>,
) -> Result<Vec<super::source::Func>> {
    let mut read = subprocess::command(&tools.python);
    read.args(["-c", SIGNATURE]).arg(model);
    let log = step(&mut read, "reading the MLIR module's functions", timeout)?;
    log.iter()
        .filter(|l| l.starts_with("{\"name\""))
        .map(|l| {
            serde_json::from_str(l).map_err(|e| {
                Error::CompileFailed(format!(
                    "the MLIR module's public functions could not be read ({e}): {l}"
                ))
            })
        })
        .collect()
}

/// Compiles the MLIR source `model` as it is (no import: StableHLO or another input dialect)
/// with `flags`, within `timeout`; its function is `function`.
pub(super) fn build_mlir(
    tools: &Tools,
    model: &Path,
    flags: &[String],
    function: String,
    timeout: Option<Duration>,
) -> Result<Built> {
    let work = scratch()?;
    let (module, log) = compile_module(tools, work.path(), model, flags, timeout)?;
    Ok(Built {
        module,
        function,
        log,
    })
}

/// Runs one tool to its end; `UnsupportedOperator` naming what it refused, else `CompileFailed`
/// (or `Timeout`) with its last output.
fn step(
    cmd: &mut std::process::Command,
    what: &str,
    timeout: Option<Duration>,
) -> Result<Vec<String>> {
    tracing::info!(tool = what, "running IREE's compiler");
    let ran = subprocess::run(cmd, timeout, subprocess::Orphans::Leave)
        .map_err(|e| Error::IncompatibleRuntime(format!("cannot start {what}: {e}")))?;
    let failed = matches!(&ran.status, Ok(Some(s)) if !s.success());
    if failed {
        let operators = super::terms::unsupported_operators(&ran.log.join("\n"));
        if !operators.is_empty() {
            return Err(Error::UnsupportedOperator {
                backend: "iree".into(),
                operators,
            });
        }
        if let Some(said) = super::terms::refusal(&ran.log) {
            return Err(Error::CompileFailed(format!(
                "{what} refused the model: {said}"
            )));
        }
    }
    subprocess::check_exit(what, ran.status, timeout, &ran.log)?;
    Ok(ran.log)
}

/// The function the importer exported, from the first `func.func @name(` of its MLIR (the ONNX
/// graph's name, quoted when it is not a plain identifier), read from the file's head: the
/// weights follow the functions.
fn function_name(mlir: &Path) -> Result<String> {
    use std::io::Read;
    let mut head = Vec::new();
    std::fs::File::open(mlir)
        .and_then(|f| f.take(1 << 20).read_to_end(&mut head))
        .map_err(|e| Error::store(mlir, e))?;
    let text = String::from_utf8_lossy(&head);
    parse_function(&text).ok_or_else(|| {
        Error::CompileFailed(
            "iree-import-onnx wrote no function (func.func @…) into its MLIR".into(),
        )
    })
}

/// The name after the first `func.func @` of `text`: a bare identifier or a `"quoted"` one.
fn parse_function(text: &str) -> Option<String> {
    let rest = &text[text.find("func.func @")? + "func.func @".len()..];
    let name = if let Some(quoted) = rest.strip_prefix('"') {
        &quoted[..quoted.find('"')?]
    } else {
        &rest[..rest.find(|c: char| !(c.is_alphanumeric() || "_$.-".contains(c)))?]
    };
    (!name.is_empty()).then(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_exported_function_bare_or_quoted() {
        let bare = "module {\n  func.func @main_graph(%arg0: !torch.vtensor<[1,3],f32>) -> ...";
        assert_eq!(parse_function(bare).as_deref(), Some("main_graph"));
        let quoted = "module {\n  func.func @\"torch-jit export\"(%arg0: ...";
        assert_eq!(parse_function(quoted).as_deref(), Some("torch-jit export"));
        assert_eq!(parse_function("module {}"), None);
        assert_eq!(parse_function("func.func @\"unterminated"), None);
    }

    #[test]
    fn the_flags_are_the_revision_the_compile_key_names() {
        // Changing the flags changes every module: bump FLAGS_REVISION with them, and this line.
        assert_eq!(
            (FLAGS_REVISION, flags("CPU").join(" ").as_str()),
            (
                "llvm-cpu.1",
                "--iree-hal-target-device=local --iree-hal-local-target-device-backends=llvm-cpu --iree-llvmcpu-target-cpu=CPU"
            )
        );
    }

    #[test]
    fn the_flags_name_the_target_cpu_never_host() {
        let f = flags("x86-64-v3");
        assert!(
            f.contains(&"--iree-llvmcpu-target-cpu=x86-64-v3".to_string()),
            "{f:?}"
        );
        assert!(!f.iter().any(|f| f.contains("host")), "{f:?}");
    }
}
