//! The binary as a user meets it, without a cluster: help for every subcommand, and a clear
//! error with exit status 2 when the kubeconfig cannot be read. (Against a cluster:
//! e2e/tests/plugin.sh.)

use std::process::Command;

fn kiln(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kubectl-kiln"))
        .args(args)
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("run kubectl-kiln")
}

#[test]
fn every_subcommand_has_help_with_the_kubectl_flags() {
    for sub in ["status", "history", "rollback", "unpin", "why"] {
        let out = kiln(&[sub, "--help"]);
        assert!(out.status.success(), "{sub} --help: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        for flag in ["--namespace", "--kubeconfig", "--context", "--output"] {
            assert!(text.contains(flag), "{sub} --help lacks {flag}: {text}");
        }
        assert!(text.contains("Usage: kubectl kiln"), "{text}");
    }
    let text = String::from_utf8_lossy(&kiln(&["rollback", "--help"]).stdout).to_string();
    for flag in ["--to", "--wait", "--force", "--timeout"] {
        assert!(text.contains(flag), "rollback --help lacks {flag}: {text}");
    }
}

#[test]
fn an_unreadable_kubeconfig_is_an_error_naming_it() {
    let out = kiln(&["--kubeconfig", "/nonexistent/other", "status", "t"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/other"), "{err}");
    let out = kiln(&["status"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a missing TARGET is a usage error: {out:?}"
    );
}
