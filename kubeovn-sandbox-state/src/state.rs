//! The state directory: where every process of a sandbox keeps its sockets, logs and pid, and what `down`,
//! `status`, `exec` and kubectl-ko read back.
//!
//! ```text
//! DIR/sandbox.json        the settings `up` used (Settings)
//! DIR/pids.json           the processes started, with their start times (procs::ProcRecord)
//! DIR/kubeconfig          for kubectl and our binaries
//! DIR/ovn/                NB, SB, OVS databases, sockets, logs (kubeovn-ovn-stack's OvnStack; the socket
//!                         names: [`remotes`])
//! DIR/run/                the daemon's socket
//! DIR/cni/bin, cni/net.d  the shim and the conflist, where a runtime looks
//! DIR/pods/<uid>.json     one record per pod sandbox the kubelet made (records::PodRecord)
//! DIR/logs/               the logs of our binaries
//! DIR/nodes/NAME/         the same for each node beyond the first (its ovn/ holds only Open_vSwitch)
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::SandboxError;

/// The default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/kube-ovn-sandbox";

/// Where named network namespaces live (`ip netns`'s directory; kubeovn-netdev's `NETNS_RUN_DIR`).
pub const NETNS_RUN_DIR: &str = "/var/run/netns";

/// The environment variable naming the state directory (`--state-dir`'s default, also for kubectl-ko and the
/// pinger).
pub const STATE_DIR_ENV: &str = "KUBE_OVN_SANDBOX_DIR";

/// The settings of one sandbox (`DIR/sandbox.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// The node's name (the Node object and the chassis).
    pub node_name: String,
    /// The integration bridge.
    pub bridge: String,
    /// The node's join interface.
    pub node_nic: String,
    /// The default subnet's CIDR.
    pub default_cidr: String,
    /// The join subnet's CIDR.
    pub join_cidr: String,
    /// The second subnet `up` creates, bound to [`Settings::demo_namespace`].
    pub demo_cidr: String,
    /// The namespace bound to the second subnet.
    pub demo_namespace: String,
    /// The test API server's address (`127.0.0.1:PORT`).
    pub api_addr: String,
    /// Prefix of the network namespaces the kubelet makes (under `/var/run/netns`).
    pub netns_prefix: String,
    /// The directory holding the named namespaces.
    pub netns_dir: PathBuf,
    /// Pods `up` creates in `default` and in the demo namespace.
    pub demo_pods: usize,
    /// The daemon's metrics endpoint.
    #[serde(default)]
    pub daemon_metrics_addr: String,
    /// The service CIDR(s) Services' ClusterIPs come from (`CIDR[,CIDR]`), given to the API
    /// server and to the controller as `--service-cluster-ip-range`.
    #[serde(default = "default_service_cidr")]
    pub service_cidr: String,
    /// The nodes of the cluster (`up --nodes N`): the first is this machine's own network namespace, the
    /// others each have one of their own (kubeovn-sandbox's `cluster`).
    #[serde(default = "one")]
    pub nodes: usize,
    /// The underlay segment the nodes' tunnels run over (the nodes take its 1st, 2nd, ... addresses).
    #[serde(default = "default_underlay_cidr")]
    pub underlay_cidr: String,
    /// This node's InternalIP (its underlay address in a cluster of several nodes).
    #[serde(default = "default_node_ip")]
    pub node_ip: String,
    /// This node's own network namespace (a name under `netns_dir`); `None`: the machine's.
    #[serde(default)]
    pub node_netns: Option<String>,
    /// The southbound database, when it is not this directory's (a node beyond the first).
    #[serde(default)]
    pub sb_remote: Option<String>,
    /// Whether this node's kubelet schedules the pods that name no node (the first node's does).
    #[serde(default = "yes")]
    pub schedules: bool,
    /// The world beyond the cluster (a cluster of several nodes): a network namespace holding the first
    /// address of this range, reached from the nodes over the underlay and from pods only through a gateway.
    #[serde(default = "default_external_cidr")]
    pub external_cidr: String,
    /// NB and SB as raft clusters of three members each (`up --raft`).
    #[serde(default)]
    pub raft: bool,
    /// The first node's `net.ipv4.ip_forward` before `up` (its daemon turns forwarding on; `down` restores it).
    #[serde(default)]
    pub host_ip_forward: Option<String>,
}

fn default_service_cidr() -> String {
    "10.96.0.0/12".into()
}

fn one() -> usize {
    1
}

fn yes() -> bool {
    true
}

fn default_underlay_cidr() -> String {
    "198.18.0.0/24".into()
}

fn default_external_cidr() -> String {
    "198.51.100.0/24".into()
}

fn default_node_ip() -> String {
    "127.0.0.1".into()
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            node_name: "sandbox".into(),
            // Not br-int: the ovn-host package may run a system ovn-controller that owns a br-int.
            bridge: "br-sbx".into(),
            node_nic: "ovn0".into(),
            default_cidr: "10.16.0.0/16".into(),
            join_cidr: "100.64.0.0/16".into(),
            demo_cidr: "10.66.0.0/24".into(),
            demo_namespace: "demo".into(),
            api_addr: "127.0.0.1:16443".into(),
            netns_prefix: "sbx".into(),
            netns_dir: PathBuf::from(NETNS_RUN_DIR),
            demo_pods: 3,
            daemon_metrics_addr: "127.0.0.1:10665".into(),
            service_cidr: default_service_cidr(),
            nodes: 1,
            underlay_cidr: default_underlay_cidr(),
            node_ip: default_node_ip(),
            node_netns: None,
            sb_remote: None,
            schedules: true,
            external_cidr: default_external_cidr(),
            host_ip_forward: None,
            raft: false,
        }
    }
}

/// Paths inside a state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    /// The state directory at `root` (absolute: processes started from it keep working from any cwd).
    pub fn new(root: impl AsRef<Path>) -> StateDir {
        let root = root.as_ref();
        let root = if root.is_absolute() {
            root.to_owned()
        } else {
            std::env::current_dir()
                .map(|d| d.join(root))
                .unwrap_or_else(|_| root.to_owned())
        };
        StateDir { root }
    }

    /// The directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `DIR/sandbox.json`.
    pub fn settings_file(&self) -> PathBuf {
        self.root.join("sandbox.json")
    }

    /// `DIR/pids.json`.
    pub fn pids_file(&self) -> PathBuf {
        self.root.join("pids.json")
    }

    /// `DIR/kubeconfig`.
    pub fn kubeconfig(&self) -> PathBuf {
        self.root.join("kubeconfig")
    }

    /// `DIR/ovn`: the OVN/OVS databases, sockets and logs.
    pub fn ovn_dir(&self) -> PathBuf {
        self.root.join("ovn")
    }

    /// Whether the sandbox here runs NB and SB as raft clusters (its settings say so).
    fn raft(&self) -> bool {
        self.load_settings().is_ok_and(|s| s.raft)
    }

    /// `unix:DIR/ovn/nb.sock` (every member's socket with raft).
    pub fn nb_remote(&self) -> String {
        remotes(&self.ovn_dir(), "nb", self.raft())
    }

    /// `DIR/nodes/NAME`: the state of the cluster's node `name` beyond the first (its settings, Open_vSwitch
    /// database, daemon, kubelet and pods), laid out as this directory is.
    pub fn node_dir(&self, name: &str) -> StateDir {
        StateDir::new(self.root.join("nodes").join(name))
    }

    /// The state directories of the nodes beyond the first.
    pub fn node_dirs(&self) -> Vec<StateDir> {
        let mut v: Vec<StateDir> = std::fs::read_dir(self.root.join("nodes"))
            .map(|rd| rd.flatten().map(|e| StateDir::new(e.path())).collect())
            .unwrap_or_default();
        v.sort_by(|a, b| a.root.cmp(&b.root));
        v
    }

    /// `unix:DIR/ovn/sb.sock` (every member's socket with raft).
    pub fn sb_remote(&self) -> String {
        remotes(&self.ovn_dir(), "sb", self.raft())
    }

    /// `unix:DIR/ovn/ovs.sock`.
    pub fn ovs_remote(&self) -> String {
        format!("unix:{}", self.ovn_dir().join("ovs.sock").display())
    }

    /// The daemon's unix socket.
    pub fn daemon_socket(&self) -> PathBuf {
        self.root.join("run").join("kube-ovn-daemon.sock")
    }

    /// `DIR/cni/bin`: the shim.
    pub fn cni_bin_dir(&self) -> PathBuf {
        self.root.join("cni").join("bin")
    }

    /// `DIR/cni/net.d`: the conflist.
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.root.join("cni").join("net.d")
    }

    /// The conflist file.
    pub fn conflist(&self) -> PathBuf {
        self.cni_conf_dir().join("01-kube-ovn.conflist")
    }

    /// `DIR/pods`: the kubelet's pod records.
    pub fn pods_dir(&self) -> PathBuf {
        self.root.join("pods")
    }

    /// `DIR/logs`.
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }

    /// The log of process `name`.
    pub fn log(&self, name: &str) -> PathBuf {
        self.logs_dir().join(format!("{name}.log"))
    }

    /// Reads `DIR/sandbox.json`.
    pub fn load_settings(&self) -> Result<Settings, SandboxError> {
        read_json(&self.settings_file())
    }

    /// Writes `DIR/sandbox.json`.
    pub fn save_settings(&self, s: &Settings) -> Result<(), SandboxError> {
        write_json(&self.settings_file(), s)
    }
}

/// Members of each raft database (`--raft`).
pub const RAFT_MEMBERS: usize = 3;

/// The file stems of database `db`'s members (`nb`, `nb1`, `nb2`): the first is the stem of the
/// standalone database too.
pub fn member_stems(db: &str) -> [&'static str; RAFT_MEMBERS] {
    match db {
        "nb" => ["nb", "nb1", "nb2"],
        _ => ["sb", "sb1", "sb2"],
    }
}

/// The process name of the ovsdb-server of `stem`.
pub fn server_name(stem: &str) -> &'static str {
    match stem {
        "nb" => "ovsdb-server-nb",
        "nb1" => "ovsdb-server-nb1",
        "nb2" => "ovsdb-server-nb2",
        "sb" => "ovsdb-server-sb",
        "sb1" => "ovsdb-server-sb1",
        "sb2" => "ovsdb-server-sb2",
        _ => "ovsdb-server-ovs",
    }
}

/// Database `db`'s (`nb` or `sb`) remotes in `dir`: one socket, or every member's with raft.
pub fn remotes(dir: &Path, db: &str, raft: bool) -> String {
    let n = if raft { RAFT_MEMBERS } else { 1 };
    member_stems(db)[..n]
        .iter()
        .map(|s| format!("unix:{}", dir.join(format!("{s}.sock")).display()))
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads a JSON file.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, SandboxError> {
    let bytes = std::fs::read(path).map_err(|e| SandboxError::io("read", path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| SandboxError::Failed {
        what: "parse state file",
        detail: format!("{}: {e}", path.display()),
    })
}

/// Writes a JSON file atomically (temporary file, then rename).
pub fn write_json<T: Serialize>(path: &Path, v: &T) -> Result<(), SandboxError> {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).map_err(|e| SandboxError::io("create directory", p, e))?;
    }
    let tmp = path.with_extension("tmp");
    let text = serde_json::to_vec_pretty(v).map_err(|e| SandboxError::Failed {
        what: "serialise state file",
        detail: e.to_string(),
    })?;
    std::fs::write(&tmp, text).map_err(|e| SandboxError::io("write", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| SandboxError::io("rename", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_dirs_become_absolute() {
        let d = StateDir::new("x/y");
        assert!(d.root().is_absolute());
        assert!(d.nb_remote().starts_with("unix:/"));
    }

    #[test]
    fn settings_round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = StateDir::new(dir.path());
        let s = Settings {
            demo_pods: 5,
            ..Settings::default()
        };
        d.save_settings(&s).expect("save");
        assert_eq!(d.load_settings().expect("load"), s);
    }
}
