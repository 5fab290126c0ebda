//! CPU cgroups that place processes as a Kubernetes node does: on a node, OVN central, the chassis daemons
//! (Kube-OVN's `ovs-ovn` pod) and the CNI daemon each run in a cgroup of their own, and the kernel shares the
//! CPU between those groups before it shares it between their threads. Started flat from one process, the
//! ten-odd threads of ovs-vswitchd, ovn-controller and the databases each weigh as much as the daemon's one.
//!
//! Works on cgroup v2 (`/sys/fs/cgroup` with the `cpu` controller) and on v1 (`/sys/fs/cgroup/cpu`); groups are
//! made at the root of the hierarchy with the default weight, and removed on drop.
//!
//! ```no_run
//! # fn demo() -> Result<(), kubeovn_ovn_stack::SandboxError> {
//! use kubeovn_ovn_stack::cgroup::CpuGroup;
//! let group = CpuGroup::create("kovn-demo")?;
//! group.add(std::process::id())?;
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::SandboxError;

const V2_ROOT: &str = "/sys/fs/cgroup";
const V1_CPU_ROOT: &str = "/sys/fs/cgroup/cpu";

/// A CPU cgroup this process made; dropping it moves what is left in it back to the root and removes it.
#[derive(Debug)]
pub struct CpuGroup {
    dir: PathBuf,
    root: PathBuf,
}

/// The root of the hierarchy that has the `cpu` controller, enabling it for children on v2.
fn cpu_root() -> Result<PathBuf, SandboxError> {
    let v2 = Path::new(V2_ROOT);
    let controllers = v2.join("cgroup.controllers");
    if let Ok(c) = std::fs::read_to_string(&controllers) {
        if !c.split_whitespace().any(|x| x == "cpu") {
            return Err(SandboxError::Failed {
                what: "cgroup v2",
                detail: format!("no cpu controller in {}", controllers.display()),
            });
        }
        let subtree = v2.join("cgroup.subtree_control");
        let on = std::fs::read_to_string(&subtree).unwrap_or_default();
        if !on.split_whitespace().any(|x| x == "cpu") {
            std::fs::write(&subtree, "+cpu")
                .map_err(|e| SandboxError::io("enable the cpu controller", &subtree, e))?;
        }
        return Ok(v2.to_owned());
    }
    let v1 = Path::new(V1_CPU_ROOT);
    if v1.join("cpu.shares").exists() {
        return Ok(v1.to_owned());
    }
    Err(SandboxError::Failed {
        what: "cgroup",
        detail: format!("no cpu controller mounted at {V2_ROOT} or {V1_CPU_ROOT}"),
    })
}

impl CpuGroup {
    /// Makes group `name` at the root of the cpu hierarchy (an existing group of that name is reused).
    pub fn create(name: &str) -> Result<CpuGroup, SandboxError> {
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(SandboxError::Failed {
                what: "cgroup",
                detail: format!("{name:?} is not a cgroup name"),
            });
        }
        let root = cpu_root()?;
        let dir = root.join(name);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(SandboxError::io("create cgroup", &dir, e)),
        }
        Ok(CpuGroup { dir, root })
    }

    /// The group's directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Moves process `pid` (all its threads) into the group.
    pub fn add(&self, pid: u32) -> Result<(), SandboxError> {
        let procs = self.dir.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .map_err(|e| SandboxError::io("move into cgroup", &procs, e))
    }

    /// The pids in the group.
    pub fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Drop for CpuGroup {
    fn drop(&mut self) {
        // Whatever is still in it (this process, a process another owner stops later) goes back to the root:
        // a group with members cannot be removed.
        let root_procs = self.root.join("cgroup.procs");
        for pid in self.pids() {
            let _ = std::fs::write(&root_procs, pid.to_string());
        }
        // A process that just exited leaves the group a moment later.
        let t0 = Instant::now();
        while std::fs::remove_dir(&self.dir).is_err() && t0.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_names_are_refused() {
        for name in ["", "a/b", "..", ".x"] {
            assert!(CpuGroup::create(name).is_err(), "{name:?}");
        }
    }

    #[test]
    fn root_group_takes_a_process_and_is_removed_on_drop() {
        if !nix::unistd::geteuid().is_root() || cpu_root().is_err() {
            kubeovn_test_support::skip::skip("needs root and a cpu cgroup controller");
            return;
        }
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let name = format!("kovn-test-{}", std::process::id());
        let group = CpuGroup::create(&name).unwrap();
        let dir = group.path().to_owned();
        group.add(child.id()).unwrap();
        assert_eq!(group.pids(), vec![child.id()]);
        // The kernel's own view of the process agrees.
        let cg = std::fs::read_to_string(format!("/proc/{}/cgroup", child.id())).unwrap();
        assert!(cg.contains(&name), "{cg}");
        // Dropped with the process still in it: it goes back to the root and the group is gone.
        drop(group);
        assert!(!dir.exists());
        let cg = std::fs::read_to_string(format!("/proc/{}/cgroup", child.id())).unwrap();
        assert!(!cg.contains(&name), "{cg}");
        let _ = child.kill();
        let _ = child.wait();
    }
}
