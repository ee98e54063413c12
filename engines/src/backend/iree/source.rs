//! What an IREE compile starts from: ONNX, which IREE's importer turns into MLIR, or MLIR given
//! as the source (`format: stablehlo` or `mlir`, text or bytecode), which goes to the compiler as
//! it is. The staged file's name says which (`pipeline/build.rs` stages it so). An MLIR function
//! names neither its arguments nor its results, so the ModelArtifact's declared inputs and
//! outputs are bound to them in order, each checked against the type the function states
//! (element type, rank, static dims) and against every profile's shapes. Pure.

use std::collections::BTreeMap;
use std::path::Path;

use kiln_crds::model_artifact::TensorSpec;
use safetensors::Dtype;
use serde::Deserialize;

use super::super::Shapes;
use super::super::tensor::host_dtype;

/// The staged name of a `format: mlir` source.
pub const MLIR: &str = "model.mlir";
/// The staged name of a `format: stablehlo` source.
pub const STABLEHLO: &str = "model.stablehlo";

/// The kind of source a compile starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// ONNX: imported by `iree-import-onnx` first.
    Onnx,
    /// MLIR in any input dialect the compiler detects.
    Mlir,
    /// StableHLO (a portable artifact too).
    Stablehlo,
}

impl Source {
    /// The kind of the staged file `model`, by its name.
    pub fn of(model: &Path) -> Self {
        match model.file_name().and_then(|n| n.to_str()) {
            Some(MLIR) => Self::Mlir,
            Some(STABLEHLO) => Self::Stablehlo,
            _ => Self::Onnx,
        }
    }

    /// `iree-compile`'s `--iree-input-type` for an MLIR source; `None` for ONNX, which the
    /// importer lowers to the torch dialect the compiler detects.
    pub fn input_type(self) -> Option<&'static str> {
        match self {
            Self::Onnx => None,
            Self::Mlir => Some("auto"),
            Self::Stablehlo => Some("stablehlo"),
        }
    }
}

/// One function of an MLIR module, as the signature reader (`compile::SIGNATURE`) prints it.
#[derive(Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Func {
    /// Its symbol name.
    pub name: String,
    /// `public`, `private` or `nested`.
    pub visibility: String,
    /// Argument types as MLIR prints them.
    pub inputs: Vec<String>,
    /// Result types as MLIR prints them.
    pub results: Vec<String>,
    /// The name of the module that holds it (`@jit__lambda` for a JAX export), which IREE names
    /// the compiled module by; `None`: unnamed, compiled as `module`.
    #[serde(default)]
    pub module: Option<String>,
}

/// The function a module is called by: its one public function, or `main` among several.
pub fn entry(funcs: &[Func]) -> Result<&Func, String> {
    let public: Vec<&Func> = funcs.iter().filter(|f| f.visibility == "public").collect();
    match public[..] {
        [one] => Ok(one),
        [] => Err(
            "the MLIR module has no public function to call; export the model's entry point as a public func (jax.export names it main)"
                .into(),
        ),
        _ => public
            .iter()
            .find(|f| f.name == "main")
            .copied()
            .ok_or_else(|| {
                let names: Vec<&str> = public.iter().map(|f| f.name.as_str()).collect();
                format!(
                    "the MLIR module has several public functions ({}) and none is main; keep one public entry point",
                    names.join(", ")
                )
            }),
    }
}

/// Whether `func`'s types are those of the declared source: a StableHLO module passes builtin
/// tensors (`tensor<…>`, or `!vhlo.tensor_v1<…>` in a portable artifact); one in the torch
/// dialect (what IREE's ONNX importer writes) is declared `format: mlir`.
pub fn check_dialect(source: Source, func: &Func) -> Result<(), String> {
    let foreign = func
        .inputs
        .iter()
        .chain(&func.results)
        .find(|t| !(t.starts_with("tensor<") || t.starts_with("!vhlo.tensor_v1<")));
    match (source, foreign) {
        (Source::Stablehlo, Some(t)) => Err(format!(
            "spec.format is stablehlo, and @{} passes {t}, which is not a StableHLO tensor; declare the dialect it is in as format: mlir",
            func.name
        )),
        _ => Ok(()),
    }
}

/// An element type and dims (`None`: dynamic), as a function's type states them.
pub type TensorType = (Dtype, Vec<Option<usize>>);

/// The declaration bound to a function: the inputs' names with their element types in call
/// order, the outputs' names in return order.
pub type Bound = (Vec<(String, Dtype)>, Vec<String>);

/// A tensor type's element type and dims (`None`: dynamic), from MLIR's builtin
/// `tensor<1x?x3xf32>`, StableHLO's portable `!vhlo.tensor_v1<1x3x!vhlo.f32_v1>` or the torch
/// dialect's `!torch.vtensor<[1,?,3],f32>`; `None` for anything else.
pub fn tensor_type(text: &str) -> Option<TensorType> {
    let t = text.trim();
    if let Some(body) = t
        .strip_prefix("!torch.vtensor<[")
        .and_then(|b| b.strip_suffix('>'))
    {
        let (dims, element) = body.split_once("],")?;
        let dims = if dims.is_empty() {
            Vec::new()
        } else {
            dims.split(',').map(dim).collect::<Option<_>>()?
        };
        return Some((element_type(element)?, dims));
    }
    let body = t
        .strip_prefix("tensor<")
        .or_else(|| t.strip_prefix("!vhlo.tensor_v1<"))?
        .strip_suffix('>')?;
    let mut parts: Vec<&str> = body.split('x').collect();
    // The element type is the last part, except where it holds an `x` itself (none do here).
    let element = parts.pop()?;
    let dims = parts.into_iter().map(dim).collect::<Option<_>>()?;
    Some((element_type(element)?, dims))
}

fn dim(d: &str) -> Option<Option<usize>> {
    match d.trim() {
        "?" | "-1" => Some(None),
        n => n.parse().ok().map(Some),
    }
}

fn element_type(e: &str) -> Option<Dtype> {
    let e = e.trim();
    let e = e
        .strip_prefix("!vhlo.")
        .and_then(|v| v.strip_suffix("_v1"))
        .unwrap_or(e);
    Some(match e {
        "f32" => Dtype::F32,
        "f16" => Dtype::F16,
        "bf16" => Dtype::BF16,
        "f64" => Dtype::F64,
        "i64" | "si64" => Dtype::I64,
        "i32" | "si32" => Dtype::I32,
        "i16" | "si16" => Dtype::I16,
        "i8" | "si8" => Dtype::I8,
        "ui8" => Dtype::U8,
        "i1" | "bool" => Dtype::BOOL,
        _ => return None,
    })
}

/// The declared inputs and outputs bound to `func`'s arguments and results in order: the
/// inputs' names with their element types (in call order), the outputs' names (in return
/// order). Refuses, saying what to fix, a count, element type or rank that differs, a static dim
/// the declaration or a profile contradicts, and a type that is not a tensor.
pub fn bind(
    inputs: &[TensorSpec],
    outputs: &[TensorSpec],
    func: &Func,
    profiles: &BTreeMap<String, Shapes>,
) -> Result<Bound, String> {
    let f = &func.name;
    if outputs.is_empty() {
        return Err(format!(
            "an MLIR function names no results: declare spec.outputs, one per result of @{f} in order ({} results)",
            func.results.len()
        ));
    }
    let ins = bind_list("spec.inputs", "argument", inputs, &func.inputs, f)?;
    bind_list("spec.outputs", "result", outputs, &func.results, f)?;
    for (name, shapes) in profiles {
        for (declared, (_, dims)) in inputs.iter().zip(&ins) {
            let Some(shape) = shapes.get(&declared.name) else {
                continue;
            };
            let fits = shape.len() == dims.len()
                && shape
                    .iter()
                    .zip(dims)
                    .all(|(s, d)| d.is_none_or(|d| d == *s));
            if !fits {
                return Err(format!(
                    "profile {name} binds {} to {shape:?}, and @{f} takes {}; bind the shapes the function was exported with",
                    declared.name,
                    show(dims)
                ));
            }
        }
    }
    let inputs = inputs
        .iter()
        .map(|t| (t.name.clone(), host_dtype(t.dtype)))
        .collect();
    Ok((inputs, outputs.iter().map(|t| t.name.clone()).collect()))
}

/// Each declared tensor against the function's type at its position: element type, rank, and
/// every fixed size against a static dim. The parsed types, in order.
fn bind_list(
    field: &str,
    what: &str,
    declared: &[TensorSpec],
    types: &[String],
    f: &str,
) -> Result<Vec<TensorType>, String> {
    if declared.len() != types.len() {
        return Err(format!(
            "{field} declares {} tensors, and @{f} has {} {what}s ({}); declare one per {what}, in order",
            declared.len(),
            types.len(),
            types.join(", ")
        ));
    }
    let mut parsed = Vec::new();
    for (i, (d, raw)) in declared.iter().zip(types).enumerate() {
        let text = &readable(raw);
        let at = format!("{field}[{i}] ({})", d.name);
        let (dtype, dims) = tensor_type(raw).ok_or_else(|| {
            format!("{at}: @{f}'s {what} {i} is {text}, which kiln cannot pass as a tensor")
        })?;
        if host_dtype(d.dtype) != dtype {
            return Err(format!(
                "{at}.dtype is {:?}, and @{f}'s {what} {i} is {text}; set {field}[{i}].dtype to its element type",
                d.dtype
            ));
        }
        let sizes_fit = d.dims.len() == dims.len()
            && d.dims.iter().zip(&dims).all(|(dd, m)| match (dd.size, m) {
                (Some(size), Some(m)) => usize::try_from(size).ok() == Some(*m),
                _ => true,
            });
        if !sizes_fit {
            return Err(format!(
                "{at}.dims does not fit @{f}'s {what} {i}, {text}; declare its rank and its static sizes"
            ));
        }
        parsed.push((dtype, dims));
    }
    Ok(parsed)
}

/// A type as the builtin dialect writes it: a portable artifact's `!vhlo.tensor_v1<1x!vhlo.f32_v1>`
/// reads `tensor<1xf32>` in messages.
fn readable(text: &str) -> String {
    let mut out = text.replace("!vhlo.tensor_v1<", "tensor<");
    while let Some(at) = out.find("!vhlo.") {
        let rest = &out[at + "!vhlo.".len()..];
        let Some(end) = rest.find("_v1") else { break };
        out = format!("{}{}{}", &out[..at], &rest[..end], &rest[end + 3..]);
    }
    out
}

fn show(dims: &[Option<usize>]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| d.map_or("?".into(), |d| d.to_string()))
        .collect();
    format!("[{}]", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_crds::model_artifact::{DType, Dim};

    fn func(name: &str, visibility: &str, inputs: &[&str], results: &[&str]) -> Func {
        Func {
            name: name.into(),
            visibility: visibility.into(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            results: results.iter().map(|s| s.to_string()).collect(),
            module: None,
        }
    }

    fn tensor(name: &str, dtype: DType, dims: &[Result<i64, &str>]) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            dtype,
            dims: dims
                .iter()
                .map(|d| match d {
                    Ok(size) => Dim {
                        size: Some(*size),
                        symbol: None,
                        min: None,
                        max: None,
                    },
                    Err(symbol) => Dim {
                        size: None,
                        symbol: Some(symbol.to_string()),
                        min: Some(1),
                        max: Some(8),
                    },
                })
                .collect(),
        }
    }

    #[test]
    fn the_staged_name_says_the_source() {
        assert_eq!(
            Source::of(Path::new("/c/.model-x/model.onnx")),
            Source::Onnx
        );
        assert_eq!(
            Source::of(Path::new("/c/.model-x/model.mlir")),
            Source::Mlir
        );
        assert_eq!(
            Source::of(Path::new("/c/.model-x/model.stablehlo")),
            Source::Stablehlo
        );
        assert_eq!(Source::Stablehlo.input_type(), Some("stablehlo"));
        assert_eq!(Source::Mlir.input_type(), Some("auto"));
        assert_eq!(Source::Onnx.input_type(), None);
    }

    #[test]
    fn reads_builtin_portable_and_torch_tensor_types() {
        let i32_2 = Some((Dtype::I32, vec![Some(1), Some(2048)]));
        assert_eq!(tensor_type("tensor<1x2048xi32>"), i32_2);
        assert_eq!(tensor_type("!vhlo.tensor_v1<1x2048x!vhlo.i32_v1>"), i32_2);
        assert_eq!(tensor_type("!torch.vtensor<[1,2048],si32>"), i32_2);
        assert_eq!(
            tensor_type("tensor<?x3xbf16>"),
            Some((Dtype::BF16, vec![None, Some(3)]))
        );
        assert_eq!(
            tensor_type("!torch.vtensor<[?,3],f32>"),
            Some((Dtype::F32, vec![None, Some(3)]))
        );
        assert_eq!(tensor_type("tensor<f32>"), Some((Dtype::F32, vec![])));
        assert_eq!(
            tensor_type("!torch.vtensor<[],i1>"),
            Some((Dtype::BOOL, vec![]))
        );
        for bad in [
            "memref<1xf32>",
            "tensor<1xcomplex<f32>>",
            "tensor<1x!quant.uniform>",
            "!torch.list<int>",
            "tensor<1xf32",
            "tensor<-5xf32>",
            "",
        ] {
            assert_eq!(tensor_type(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_stablehlo_source_passes_stablehlo_tensors() {
        let torch = func(
            "tf2onnx",
            "public",
            &["!torch.vtensor<[?,2048],si32>"],
            &["!torch.vtensor<[?,214],f32>"],
        );
        let err = check_dialect(Source::Stablehlo, &torch).expect_err("torch as stablehlo");
        assert!(
            err.contains("declare the dialect it is in as format: mlir"),
            "{err}"
        );
        assert!(check_dialect(Source::Mlir, &torch).is_ok());
        let hlo = func(
            "main",
            "public",
            &["tensor<1x2048xi32>"],
            &["!vhlo.tensor_v1<1x214x!vhlo.f32_v1>"],
        );
        assert!(check_dialect(Source::Stablehlo, &hlo).is_ok());
    }

    #[test]
    fn messages_write_portable_types_as_builtin_ones() {
        assert_eq!(
            readable("!vhlo.tensor_v1<1x2048x!vhlo.i32_v1>"),
            "tensor<1x2048xi32>"
        );
        assert_eq!(
            readable("!torch.vtensor<[1],f32>"),
            "!torch.vtensor<[1],f32>"
        );
    }

    #[test]
    fn the_entry_is_the_one_public_function_or_main() {
        let main = func("main", "public", &[], &[]);
        let helper = func("_one_hot", "private", &[], &[]);
        let other = func("serve", "public", &[], &[]);
        assert_eq!(entry(&[helper.clone(), main.clone()]), Ok(&main));
        assert_eq!(entry(&[other.clone(), helper.clone()]), Ok(&other));
        assert_eq!(entry(&[other.clone(), main.clone()]), Ok(&main));
        let none = entry(std::slice::from_ref(&helper)).expect_err("no public function");
        assert!(none.contains("no public function"), "{none}");
        let two = func("score", "public", &[], &[]);
        let err = entry(&[other, two]).expect_err("two public, no main");
        assert!(err.contains("serve, score"), "{err}");
    }

    #[test]
    fn binds_the_declaration_in_order_and_refuses_what_contradicts_it() {
        let f = func(
            "main",
            "public",
            &["tensor<?x2048xi32>", "tensor<1xf32>"],
            &["tensor<?x214xf32>"],
        );
        let inputs = [
            tensor("bytes", DType::I32, &[Err("batch"), Ok(2048)]),
            tensor("scale", DType::F32, &[Ok(1)]),
        ];
        let outputs = [tensor("scores", DType::F32, &[Err("batch"), Ok(214)])];
        let profile = |b: usize| {
            BTreeMap::from([(
                "p".to_string(),
                Shapes::from([
                    ("bytes".to_string(), vec![b, 2048]),
                    ("scale".to_string(), vec![1]),
                ]),
            )])
        };
        let (ins, outs) = bind(&inputs, &outputs, &f, &profile(4)).expect("fits");
        assert_eq!(
            ins,
            vec![("bytes".into(), Dtype::I32), ("scale".into(), Dtype::F32)]
        );
        assert_eq!(outs, vec!["scores".to_string()]);

        let fixed = func(
            "main",
            "public",
            &["tensor<1x2048xi32>", "tensor<1xf32>"],
            &["tensor<1x214xf32>"],
        );
        let err =
            bind(&inputs, &outputs, &fixed, &profile(4)).expect_err("batch 4 on a batch-1 export");
        assert!(
            err.contains("profile p binds bytes to [4, 2048]") && err.contains("[1, 2048]"),
            "{err}"
        );

        let err = bind(&inputs, &[], &f, &profile(1)).expect_err("no outputs");
        assert!(err.contains("declare spec.outputs"), "{err}");
        let err = bind(&inputs[..1], &outputs, &f, &profile(1)).expect_err("one input short");
        assert!(
            err.contains("spec.inputs declares 1 tensors, and @main has 2 arguments"),
            "{err}"
        );
        let wrong = [inputs[0].clone(), tensor("scale", DType::I64, &[Ok(1)])];
        let err = bind(&wrong, &outputs, &f, &profile(1)).expect_err("dtype");
        assert!(
            err.contains("spec.inputs[1] (scale).dtype is I64") && err.contains("tensor<1xf32>"),
            "{err}"
        );
        let wrong = [inputs[0].clone(), tensor("scale", DType::F32, &[Ok(2)])];
        let err = bind(&wrong, &outputs, &f, &profile(1)).expect_err("size");
        assert!(
            err.contains("spec.inputs[1] (scale).dims does not fit"),
            "{err}"
        );
        let opaque = func(
            "main",
            "public",
            &["!torch.list<int>", "tensor<1xf32>"],
            &["tensor<?x214xf32>"],
        );
        let err = bind(&inputs, &outputs, &opaque, &profile(1)).expect_err("not a tensor");
        assert!(err.contains("cannot pass as a tensor"), "{err}");
    }
}
