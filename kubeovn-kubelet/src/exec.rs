//! `exec NAMESPACE/POD -- COMMAND...`: runs a command inside a pod's network namespace, as `kubectl exec`
//! would inside its container (the sandbox has no container images: the command comes from the host).
//!
//! The process enters the namespace (`setns`) and replaces itself with the command (`execvp`), so the
//! command's exit status is the caller's. Call it before any other thread is started.

use std::ffi::CString;

use nix::sched::{setns, CloneFlags};

use kubeovn_sandbox_state::records::find_record;
pub use kubeovn_sandbox_state::records::parse_pod;
use kubeovn_sandbox_state::state::StateDir;
use kubeovn_sandbox_state::SandboxError;

/// Enters the pod's network namespace and execs `argv`; returns only on failure.
pub fn exec(dir: &StateDir, target: &str, argv: &[String]) -> SandboxError {
    let err = |detail: String| SandboxError::Failed {
        what: "exec",
        detail,
    };
    let (ns, name) = match parse_pod(target) {
        Ok(x) => x,
        Err(e) => return e,
    };
    let Some(rec) = find_record(dir, &ns, &name) else {
        return err(format!(
            "no sandbox for pod {ns}/{name} in {} (kube-ovn-sandbox status lists them)",
            dir.root().display()
        ));
    };
    if argv.is_empty() {
        return err("no command given (exec NAMESPACE/POD -- COMMAND...)".into());
    }
    let f = match std::fs::File::open(&rec.netns) {
        Ok(f) => f,
        Err(e) => return SandboxError::io("open netns", &rec.netns, e),
    };
    if let Err(e) = setns(&f, CloneFlags::CLONE_NEWNET) {
        return err(format!("setns {}: {e}", rec.netns.display()));
    }
    drop(f);
    let args: Result<Vec<CString>, _> = argv.iter().map(|a| CString::new(a.as_bytes())).collect();
    let Ok(args) = args else {
        return err("an argument holds a NUL byte".into());
    };
    match nix::unistd::execvp(&args[0], &args) {
        Ok(never) => match never {},
        Err(e) => err(format!("{}: {e}", argv[0])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_targets() {
        assert_eq!(
            parse_pod("demo/app-1").expect("ok"),
            ("demo".to_owned(), "app-1".to_owned())
        );
        assert_eq!(parse_pod("web-1").expect("ok").0, "default");
        assert!(parse_pod("/x").is_err());
        assert!(parse_pod("a/").is_err());
        assert!(parse_pod("a/b/c").is_err());
    }

    #[test]
    fn unknown_pod() {
        let d = tempfile::tempdir().expect("tempdir");
        let e = exec(&StateDir::new(d.path()), "default/nope", &["true".into()]);
        assert!(e.to_string().contains("no sandbox"), "{e}");
    }
}
