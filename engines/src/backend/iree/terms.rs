//! What IREE's compiler says when it cannot lower a model, read as the operators to name in
//! `UnsupportedOperator`. Pure: the compiler's stderr in, operator names out.
//!
//! `iree-import-onnx` accepts any ONNX operator and writes it as `torch.operator "onnx.X"`;
//! `iree-compile` then fails on the ones torch-mlir cannot lower, in one of two shapes:
//!
//! * the ONNX operator itself: `error: failed to legalize operation 'torch.operator' that was
//!   explicitly marked illegal: %1 = "torch.operator"(%arg0) <{name = "onnx.DFT"}> ...`;
//! * an op it was partly lowered to (`'torch.aten.max_pool2d'`), followed by the source line it
//!   came from, which names the ONNX operator (`torch.operator "onnx.MaxRoiPool"(...)`); the ONNX
//!   name is given when that line has one, else the inner op's.
//!
//! The 3.13 compiler stops at the first operator it cannot lower, so a model with several names
//! one; each is listed once, in the order given.

const ILLEGAL: &str = "failed to legalize operation '";

/// The operators the compiler refused, each once, in the order it reported them.
pub fn unsupported_operators(stderr: &str) -> Vec<String> {
    let lines: Vec<&str> = stderr.lines().collect();
    let mut found: Vec<String> = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(at) = line.find(ILLEGAL) else {
            continue;
        };
        let op = line[at + ILLEGAL.len()..]
            .split('\'')
            .next()
            .unwrap_or_default();
        let onnx = onnx_name(line).or_else(|| lines.get(i + 1).and_then(|next| onnx_name(next)));
        let name = match (op, onnx) {
            (_, Some(onnx)) => onnx.to_string(),
            ("", None) => continue,
            (op, None) => op.to_string(),
        };
        if !found.contains(&name) {
            found.push(name);
        }
    }
    found
}

/// The ONNX operator a line names: `<{name = "onnx.X"}>` or `torch.operator "onnx.X"`.
fn onnx_name(line: &str) -> Option<&str> {
    for key in ["name = \"onnx.", "torch.operator \"onnx."] {
        if let Some(at) = line.find(key) {
            let rest = &line[at + key.len()..];
            let name = &rest[..rest.find('"')?];
            if !name.is_empty() {
                return Some(name);
            }
        }
    }
    None
}

/// What a failed tool said, for a refusal that names no operator: its first `error:` lines (at
/// most three, the compiler's source positions kept), or that it crashed (a compiler that dies on
/// its input prints a backtrace and no error); `None` when it said neither.
pub fn refusal(log: &[String]) -> Option<String> {
    let errors: Vec<&str> = log
        .iter()
        .filter(|l| l.contains("error:"))
        .take(3)
        .map(String::as_str)
        .collect();
    if !errors.is_empty() {
        return Some(errors.join(" | "));
    }
    log.iter()
        .any(|l| l.contains("crash backtrace") || l.contains("Stack dump:"))
        .then(|| "it crashed on the model (an operation it cannot compile, such as one of a dialect it does not know) and printed no error".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_onnx_operator_the_compiler_refused_is_named() {
        let stderr = r#"model.mlir:4:10: error: failed to legalize operation 'torch.operator' that was explicitly marked illegal: %1 = "torch.operator"(%arg0) <{name = "onnx.DFT"}> : (!torch.vtensor<[1,8,1],f32>) -> !torch.vtensor<[1,8,2],f32>
    %0 = torch.operator "onnx.DFT"(%arg0) : (!torch.vtensor<[1,8,1],f32>) -> !torch.vtensor<[1,8,2],f32>
         ^
model.mlir:4:10: note: see current operation: %1 = "torch.operator"(%arg0) <{name = "onnx.DFT"}> : (!torch.vtensor<[1,8,1],f32>) -> !torch.vtensor<[1,8,2],f32>
model.mlir:9:10: error: failed to legalize operation 'torch.operator' that was explicitly marked illegal: %2 = "torch.operator"(%1) <{name = "onnx.LpPool"}> {torch.onnx.kernel_shape = [2 : si64, 2 : si64]} : (...) -> (...)
model.mlir:12:10: error: failed to legalize operation 'torch.operator' that was explicitly marked illegal: %3 = "torch.operator"(%2) <{name = "onnx.DFT"}> : (...) -> (...)
"#;
        assert_eq!(unsupported_operators(stderr), ["DFT", "LpPool"]);
    }

    #[test]
    fn a_partly_lowered_operator_is_named_by_its_source_line() {
        let stderr = r#"model.mlir:4:10: error: failed to legalize operation 'torch.aten.max_pool2d' that was explicitly marked illegal: %648 = "torch.aten.max_pool2d"(%595, %644) : (...) -> !torch.vtensor<[1,2,2],f32>
    %0 = torch.operator "onnx.MaxRoiPool"(%arg0, %arg1) {torch.onnx.pooled_shape = [2 : si64, 2 : si64]} : (...) -> (...)
         ^
"#;
        assert_eq!(unsupported_operators(stderr), ["MaxRoiPool"]);
        let bare = "<unknown>:0: error: failed to legalize operation 'torch.constant.bool': %0 = \"torch.constant.bool\"() <{value = true}> : () -> !torch.bool\n<unknown>:0: note: see current operation: %0 = \"torch.constant.bool\"() <{value = true}> : () -> !torch.bool\n";
        assert_eq!(unsupported_operators(bare), ["torch.constant.bool"]);
    }

    #[test]
    fn other_failures_name_no_operator() {
        assert!(unsupported_operators("").is_empty());
        let crash = "Please report issues to https://github.com/iree-org/iree/issues and include the crash backtrace.\nStack dump:\n";
        assert!(unsupported_operators(crash).is_empty());
        assert!(unsupported_operators("error: failed to legalize operation '").is_empty());
    }

    #[test]
    fn a_refusal_is_the_first_errors_or_a_crash() {
        let log = |lines: &[&str]| lines.iter().map(|l| l.to_string()).collect::<Vec<_>>();
        let said = refusal(&log(&[
            "model.mlir:2:3: error: failed to legalize unresolved target materialization",
            "  func.func @tf2onnx(...)",
            "model.mlir:2:3: note: see current operation",
        ]));
        assert_eq!(
            said.as_deref(),
            Some("model.mlir:2:3: error: failed to legalize unresolved target materialization")
        );
        let crash = refusal(&log(&[
            "Please report issues to https://github.com/iree-org/iree/issues and include the crash backtrace.",
            " #0 0x00007f llvm::sys::PrintStackTrace",
        ]))
        .expect("a crash");
        assert!(crash.contains("crashed"), "{crash}");
        assert_eq!(refusal(&log(&["compiling", "done"])), None);
    }
}
