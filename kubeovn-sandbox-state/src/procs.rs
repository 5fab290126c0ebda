//! The sandbox's background processes: started detached (own process group, output to a log file), recorded
//! in `DIR/pids.json` with their start time, stopped by pid.
//!
//! The start time (`/proc/PID/stat` field 22) guards against a recycled pid: a record whose pid now belongs
//! to another process is considered dead and never signalled.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::SandboxError;

/// One started process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcRecord {
    /// What it is (`kube-ovn-controller`, `ovn-northd`, ...).
    pub name: String,
    /// Its pid.
    pub pid: u32,
    /// Its start time in clock ticks since boot (`/proc/PID/stat` field 22), 0 if unknown.
    pub start_time: u64,
}

impl ProcRecord {
    /// A record of the running process `pid`.
    pub fn of(name: impl Into<String>, pid: u32) -> ProcRecord {
        ProcRecord {
            name: name.into(),
            pid,
            start_time: start_time(pid).unwrap_or(0),
        }
    }

    /// Whether the recorded process still runs (and is the same process, not a zombie).
    pub fn alive(&self) -> bool {
        let Some(stat) = proc_stat(self.pid) else {
            return false;
        };
        if stat.state == 'Z' || stat.state == 'X' {
            return false;
        }
        self.start_time == 0 || stat.start_time == self.start_time
    }

    /// SIGTERM, then SIGKILL after `grace`; waits until it is gone. A dead record is a no-op.
    pub fn stop(&self, grace: Duration) {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        if !self.alive() {
            return;
        }
        let Ok(raw) = i32::try_from(self.pid) else {
            return;
        };
        let pid = Pid::from_raw(raw);
        let _ = kill(pid, Signal::SIGTERM);
        let t0 = Instant::now();
        while self.alive() {
            if t0.elapsed() > grace {
                let _ = kill(pid, Signal::SIGKILL);
            }
            if t0.elapsed() > grace + Duration::from_secs(5) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The process named in `pidfile` if it runs as `comm`: a daemon run under OVS's `--monitor` (the recorded
/// pid is the monitor's; the pid file names the daemon, a new one after each restart).
pub fn from_pidfile(pidfile: &Path, comm: &str) -> Option<ProcRecord> {
    let pid: u32 = std::fs::read_to_string(pidfile).ok()?.trim().parse().ok()?;
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    (name.trim() == comm).then(|| ProcRecord::of(comm, pid))
}

impl ProcRecord {
    /// Stops the process group this process leads (a container's monitor and everything it started):
    /// SIGTERM to the group, SIGKILL after `grace`, until no member is left. The group is only signalled while
    /// it is ours: its leader is this record's process (a zombie included), or the leader is gone and its pid
    /// not reused.
    pub fn stop_group(&self, grace: Duration) {
        use nix::sys::signal::{killpg, Signal};
        use nix::unistd::Pid;
        // A pid that exists again with another start time was reused, which the kernel does not do while our group
        // has members: nothing of ours is left then.
        let ours = proc_stat(self.pid)
            .is_none_or(|st| self.start_time == 0 || st.start_time == self.start_time);
        let Ok(raw) = i32::try_from(self.pid) else {
            return;
        };
        if !ours || raw <= 1 {
            return;
        }
        let pgid = Pid::from_raw(raw);
        if group_members(self.pid) == 0 {
            return;
        }
        let _ = killpg(pgid, Signal::SIGTERM);
        let t0 = Instant::now();
        while group_members(self.pid) > 0 {
            if t0.elapsed() > grace {
                let _ = killpg(pgid, Signal::SIGKILL);
            }
            if t0.elapsed() > grace + Duration::from_secs(5) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Collects the exit of this process if it is a child of the caller that has ended (a no-op otherwise),
    /// so that a long-running parent does not keep zombies.
    pub fn reap(&self) {
        use nix::sys::wait::{waitpid, WaitPidFlag};
        if let Ok(raw) = i32::try_from(self.pid) {
            let _ = waitpid(nix::unistd::Pid::from_raw(raw), Some(WaitPidFlag::WNOHANG));
        }
    }
}

/// The live (not zombie) processes in process group `pgid`.
pub fn group_members(pgid: u32) -> usize {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return 0;
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter_map(proc_stat)
        .filter(|st| st.pgrp == pgid && st.state != 'Z' && st.state != 'X')
        .count()
}

impl ProcRecord {
    /// Waits (at most `timeout`) until the process is gone from `/proc`: a stopped child of an exited `up`
    /// stays a zombie until init reaps it, and still counts as running for tools that scan `/proc`.
    pub fn wait_reaped(&self, timeout: Duration) {
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            match proc_stat(self.pid) {
                Some(st) if self.start_time == 0 || st.start_time == self.start_time => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => return,
            }
        }
    }
}

struct Stat {
    state: char,
    pgrp: u32,
    start_time: u64,
}

fn proc_stat(pid: u32) -> Option<Stat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); field 22 is index 19.
    Some(Stat {
        state: fields.first()?.chars().next()?,
        pgrp: fields.get(2)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

fn start_time(pid: u32) -> Option<u64> {
    proc_stat(pid).map(|s| s.start_time)
}

/// Spawns `cmd` detached from the caller: its own process group (a Ctrl-C in the terminal that ran `up`
/// later does not reach it), stdin from /dev/null, stdout and stderr appended to `log`.
pub fn spawn_detached(
    name: &str,
    mut cmd: Command,
    log: &Path,
) -> Result<ProcRecord, SandboxError> {
    if let Some(p) = log.parent() {
        std::fs::create_dir_all(p).map_err(|e| SandboxError::io("create log directory", p, e))?;
    }
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| SandboxError::io("open log", log, e))?;
    let err = out
        .try_clone()
        .map_err(|e| SandboxError::io("open log", log, e))?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|e| SandboxError::io("spawn", Path::new(name), e))?;
    // The child is reaped by init once this process exits; until then a dead child shows as a zombie, which
    // `alive` treats as dead.
    Ok(ProcRecord::of(name, child.id()))
}

/// The last `n` lines of a log file.
pub fn log_tail(path: &Path, n: usize) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_and_stop_by_pid() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let rec = spawn_detached("sleep", cmd, &dir.path().join("sleep.log")).expect("spawn");
        assert!(rec.alive());
        assert!(rec.start_time > 0);
        rec.stop(Duration::from_secs(2));
        assert!(!rec.alive());
    }

    #[test]
    fn stop_group_takes_the_children() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cmd = Command::new("sh");
        // A child that ignores SIGTERM: the group still goes, after the grace period.
        cmd.args(["-c", "sh -c 'trap \"\" TERM; sleep 30' & sleep 30"]);
        let rec = spawn_detached("sh", cmd, &dir.path().join("sh.log")).expect("spawn");
        let t0 = Instant::now();
        while group_members(rec.pid) < 3 && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(group_members(rec.pid) >= 3);
        rec.stop_group(Duration::from_millis(200));
        assert_eq!(group_members(rec.pid), 0);
        rec.reap();
        assert!(
            std::fs::metadata(format!("/proc/{}", rec.pid)).is_err(),
            "reaped"
        );
    }

    #[test]
    fn recycled_pid_is_not_ours() {
        let me = ProcRecord::of("me", std::process::id());
        assert!(me.alive());
        let other = ProcRecord {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(!other.alive());
    }
}
