//! What a test does when it cannot run here (not root, a program missing). Under CI (`CI` set to a true
//! value, as `.ci/run` does) it fails with the reason: CI runs as root with the packages installed, so a
//! skip there hides a broken setup. Elsewhere it returns and says so on the terminal.

use std::io::Write;

/// Whether this run is CI: `CI` set and not empty, `0`, `false` or `no`.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| {
        let v = v.trim().to_ascii_lowercase();
        !(v.is_empty() || v == "0" || v == "false" || v == "no")
    })
}

/// The running test cannot run because of `why`: under CI this panics (the test fails with the reason);
/// elsewhere it writes `SKIPPED <test>: <why>` to the process's stderr and the caller returns.
///
/// The line is written to the stderr handle, not with `eprintln!`: cargo test captures the print macros of a
/// passing test, so a skip printed that way would never show.
pub fn skip(why: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("test");
    if in_ci() {
        panic!("{test} cannot run under CI (CI is set): {why}");
    }
    // One write: stderr is unbuffered, and a line written in pieces interleaves with the other tests'.
    let line = format!("SKIPPED {test}: {why}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Whether the effective user is root (from `/proc/self/status`: no libc call needed).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2))
                == Some("0")
        })
        .unwrap_or(false)
}

/// Whether program `prog` is installed: `prog --version` can be started (its exit status aside).
pub fn installed(prog: &str) -> bool {
    std::process::Command::new(prog)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok()
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    /// Skips when run by [`skip_passes_with_its_line_or_fails_under_ci`], passes at once otherwise.
    #[test]
    fn helper_that_skips() {
        if std::env::var_os("KUBEOVN_TEST_SUPPORT_HELPER").is_some() {
            super::skip("because of the test");
        }
    }

    /// The helper, run in a child test process with `CI` set to `value`: (passed, stdout + stderr).
    fn run_helper(ci: &str) -> (bool, String) {
        let exe = std::env::current_exe().expect("test binary");
        let out = Command::new(exe)
            .args(["--exact", "skip::tests::helper_that_skips", "--nocapture"])
            .env("KUBEOVN_TEST_SUPPORT_HELPER", "1")
            .env("CI", ci)
            .output()
            .expect("run the test binary");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    }

    #[test]
    fn skip_passes_with_its_line_or_fails_under_ci() {
        for ci in ["", "0", "false", "no"] {
            let (passed, text) = run_helper(ci);
            assert!(passed, "CI={ci:?}: {text}");
            assert!(
                text.contains("SKIPPED skip::tests::helper_that_skips: because of the test\n"),
                "CI={ci:?}: {text}"
            );
        }
        for ci in ["true", "1", "yes"] {
            let (passed, text) = run_helper(ci);
            assert!(!passed, "CI={ci:?}: {text}");
            assert!(
                text.contains("cannot run under CI (CI is set): because of the test"),
                "CI={ci:?}: {text}"
            );
        }
    }
}
