//! What the sandbox's kubelet records about each pod sandbox it made (`DIR/pods/<uid>.json`): the network
//! namespace, the interface, the addresses CNI returned and the containers' monitor processes; read back by
//! `down`, `exec`, `logs`, kubectl-ko and the pinger.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::procs::ProcRecord;
use crate::state::{read_json, write_json, Settings, StateDir};
use crate::SandboxError;

/// One pod sandbox the kubelet made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRecord {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's uid.
    pub uid: String,
    /// The sandbox's container id (`CNI_CONTAINERID`).
    pub container_id: String,
    /// The network namespace's name.
    pub netns_name: String,
    /// Its path (`CNI_NETNS`).
    pub netns: PathBuf,
    /// The interface in it.
    pub ifname: String,
    /// The addresses CNI `ADD` returned (empty until it succeeded).
    pub ips: Vec<String>,
    /// The pod's containers as run so far.
    #[serde(default)]
    pub containers: Vec<ContainerRecord>,
}

impl PodRecord {
    /// The record of a new sandbox for a pod.
    pub fn new(settings: &Settings, namespace: &str, name: &str, uid: &str) -> PodRecord {
        let short: String = uid.chars().filter(|c| *c != '-').take(8).collect();
        let netns_name = format!("{}-{namespace}-{name}-{short}", settings.netns_prefix);
        // Kube-OVN derives the host veth's name from the container id's first characters: keep them unique.
        let hex: String = uid.chars().filter(char::is_ascii_hexdigit).collect();
        let container_id = format!("{hex:0<32}{hex:0<32}");
        PodRecord {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid: uid.to_owned(),
            container_id,
            netns: settings.netns_dir.join(&netns_name),
            netns_name,
            ifname: "eth0".into(),
            ips: Vec::new(),
            containers: Vec::new(),
        }
    }

    /// The pod's addresses without their prefix lengths.
    pub fn addresses(&self) -> Vec<String> {
        self.ips
            .iter()
            .map(|c| c.split('/').next().unwrap_or(c).to_owned())
            .collect()
    }

    /// The log of container `container`: `DIR/pods/<uid>/<container>.log`.
    pub fn log_path(&self, dir: &StateDir, container: &str) -> PathBuf {
        pod_dir(&dir.pods_dir(), &self.uid).join(format!("{container}.log"))
    }

    /// Where the monitor of container `container` writes how it exited.
    pub fn exit_path(&self, dir: &StateDir, container: &str) -> PathBuf {
        pod_dir(&dir.pods_dir(), &self.uid).join(format!("{container}.exit"))
    }

    /// Where the record of pod `uid` is: `DIR/pods/<uid>.json`.
    pub fn path(dir: &StateDir, uid: &str) -> PathBuf {
        dir.pods_dir().join(format!("{uid}.json"))
    }

    /// Writes the record.
    pub fn save(&self, dir: &StateDir) -> Result<(), SandboxError> {
        write_json(&Self::path(dir, &self.uid), self)
    }

    /// Removes the record.
    pub fn remove(dir: &StateDir, uid: &str) {
        let _ = std::fs::remove_file(Self::path(dir, uid));
    }
}

/// Every record in `DIR/pods`.
pub fn records(dir: &StateDir) -> Vec<PodRecord> {
    let Ok(rd) = std::fs::read_dir(dir.pods_dir()) else {
        return Vec::new();
    };
    let mut out: Vec<PodRecord> = rd
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| read_json(&e.path()).ok())
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

/// The records of every node's pods: `dir`'s and those of the nodes beyond the first.
pub fn all_records(dir: &StateDir) -> Vec<PodRecord> {
    let mut out = records(dir);
    for d in dir.node_dirs() {
        out.extend(records(&d));
    }
    out
}

/// The record of pod `namespace/name`, on whichever node.
pub fn find_record(dir: &StateDir, namespace: &str, name: &str) -> Option<PodRecord> {
    all_records(dir)
        .into_iter()
        .find(|r| r.namespace == namespace && r.name == name)
}

/// One container as the kubelet runs it (kept in the pod record, so a restarted kubelet takes it over).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRecord {
    /// The container's name.
    pub name: String,
    /// Its monitor process, which leads the container's process group; `None` when not running.
    #[serde(default)]
    pub proc: Option<ProcRecord>,
    /// When the current run started (Unix ms); for a container with nothing to run, when it was set up.
    #[serde(default)]
    pub started_ms: Option<u64>,
    /// Restarts so far.
    #[serde(default)]
    pub restart_count: u32,
    /// How the current run ended, while it waits for a restart or for good.
    #[serde(default)]
    pub terminated: Option<Exit>,
    /// How the previous run ended (`lastState`).
    #[serde(default)]
    pub last: Option<Exit>,
}

/// How a container's process ended (written by [`shim`], kept in the pod record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exit {
    /// The exit code (128 + signal for a process killed by a signal).
    pub exit_code: i32,
    /// The signal that killed it.
    #[serde(default)]
    pub signal: Option<i32>,
    /// `Completed`, `Error`, `StartError` or `ContainerStatusUnknown`.
    pub reason: String,
    /// Why it could not start.
    #[serde(default)]
    pub message: Option<String>,
    /// When it started (Unix ms).
    #[serde(default)]
    pub started_ms: u64,
    /// When it ended (Unix ms).
    pub finished_ms: u64,
}

impl Exit {
    /// The exit of a process with `status` (a code, or the signal that killed it).
    pub fn of(code: Option<i32>, signal: Option<i32>, started_ms: u64) -> Exit {
        let exit_code = code.unwrap_or_else(|| 128 + signal.unwrap_or(0));
        Exit {
            exit_code,
            signal,
            reason: if exit_code == 0 { "Completed" } else { "Error" }.into(),
            message: None,
            started_ms,
            finished_ms: now_ms(),
        }
    }

    /// A command that could not be started (Kubernetes' `StartError`, exit code 128).
    pub fn start_error(message: String) -> Exit {
        let t = now_ms();
        Exit {
            exit_code: 128,
            signal: None,
            reason: "StartError".into(),
            message: Some(message),
            started_ms: t,
            finished_ms: t,
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Where a pod's container logs and exit files are: `DIR/pods/<uid>/`.
pub fn pod_dir(pods_dir: &Path, uid: &str) -> PathBuf {
    pods_dir.join(uid)
}

/// Splits `NAMESPACE/POD` (a bare `POD` is in `default`).
pub fn parse_pod(target: &str) -> Result<(String, String), SandboxError> {
    let (ns, name) = target.split_once('/').unwrap_or(("default", target));
    if ns.is_empty() || name.is_empty() || name.contains('/') {
        return Err(SandboxError::Failed {
            what: "exec",
            detail: format!("{target:?} is not NAMESPACE/POD"),
        });
    }
    Ok((ns.to_owned(), name.to_owned()))
}
