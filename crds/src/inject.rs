//! The contract between the operator and `kiln-agent install` for compile Jobs that run in a
//! foreign compiler image (`backend.kind: exec`): where the injected agent lives and how a
//! container starts it with its own loader and libraries.

/// Mount path of the emptyDir the init container fills.
pub const TOOLS_DIR: &str = "/kiln/tools";

/// argv that starts the agent installed in `dir` with `args`:
/// `DIR/ld.so --library-path DIR/lib DIR/kiln-agent ARGS…`.
pub fn agent_command(dir: &str, args: &[&str]) -> Vec<String> {
    let dir = dir.trim_end_matches('/');
    let mut argv = vec![
        format!("{dir}/ld.so"),
        "--library-path".to_string(),
        format!("{dir}/lib"),
        format!("{dir}/kiln-agent"),
    ];
    argv.extend(args.iter().map(|a| a.to_string()));
    argv
}
