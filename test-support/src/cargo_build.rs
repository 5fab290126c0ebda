//! Builds the workspace targets a test runs when the `cargo test` running it did not (`cargo test -p X`
//! builds only X's binaries; `--all-targets` builds examples only as test harnesses).

use std::path::Path;
use std::process::Command;

/// Runs `cargo build ARGS` for the profile and target directory of `dir` (`target/<profile>`).
pub fn cargo_build(dir: &Path, args: &[&str]) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build").args(args);
    if dir.file_name().and_then(|s| s.to_str()) == Some("release") {
        cmd.arg("--release");
    }
    if let Some(target) = dir.parent() {
        cmd.env("CARGO_TARGET_DIR", target);
    }
    let st = cmd.status().expect("cargo");
    assert!(st.success(), "cargo build {args:?} failed");
}
