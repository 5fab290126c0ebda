//! The containers of a sandbox pod. The sandbox has no images and no runtime: the kubelet runs each
//! container's `command` and `args` with the host's binaries, as a process inside the pod's network
//! namespace, so that `kubectl run web --image=any -- python3 -m http.server 8080` serves on the pod's address.
//!
//! - The command line follows Kubernetes: `command` replaces the image's entrypoint and `args` are its
//!   arguments; with the image ignored the entrypoint is empty, so the process is `command ++ args` (either may
//!   be empty), with `$(VAR)` references expanded from the container's environment. A container with neither
//!   (a `pause` or `nginx` image used as is) runs nothing and counts as running, like `sleep infinity`.
//! - Environment: `PATH`, `HOME`, `HOSTNAME`, then the container's `env` entries with a `value` or a `fieldRef`
//!   to the pod's name, namespace, uid, node, service account or addresses; other sources (secrets, config
//!   maps, `envFrom`) are not read. `workingDir` if set (it must exist on the host), else `/`.
//! - Each container runs under a monitor, this binary's `container-run` ([`shim`]): it enters the namespace,
//!   runs the command, waits and writes how it ended to a file, so that an exit is known even when the
//!   kubelet was restarted meanwhile. The monitor leads a process group of its own that holds the command and
//!   whatever it starts; stopping a container signals that group (see [`ProcRecord::stop_group`]).
//! - Output (stdout and stderr) is appended to `DIR/pods/<uid>/<container>.log` across restarts;
//!   `kube-ovn-sandbox logs NS/POD [-c CONTAINER]` prints it.
//! - A process that ends is restarted per `restartPolicy` (`Always`, `OnFailure`) after a short backoff
//!   ([`backoff`]: 0.5 s doubling to 10 s, shorter than Kubernetes' 10 s to 5 min so tests stay fast),
//!   counting `restartCount`; with `Never` it stays terminated.
//! - Init and ephemeral containers are not run; pods on the host network run nothing.
//! - Readiness probes: `tcpSocket`, `httpGet` (plain HTTP) and `exec`, run from inside the pod's namespace,
//!   with Kubernetes' defaults (initial delay 0, period 10 s, timeout 1 s, success 1, failure 3); tests set
//!   `periodSeconds: 1`. `grpc` and HTTPS probes are not supported and never pass. Liveness and startup
//!   probes are not run.
//!
//! The parts here are pure (command lines, probes, the pod status and its diff) or small process helpers;
//! the kubelet drives them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
    Probe as ProbeSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

pub use kubeovn_sandbox_state::records::{now_ms, pod_dir, ContainerRecord, Exit};
use kubeovn_sandbox_state::state::{read_json, write_json};

/// The `PATH` containers get: the host's usual one.
pub const CONTAINER_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The node's address reported in its status and the pods' `hostIP` (the sandbox stays on loopback).
pub const NODE_IP: &str = "127.0.0.1";

/// The subcommand of this binary that monitors one container ([`shim`]).
pub const SHIM_COMMAND: &str = "container-run";

/// A Kubernetes time (whole seconds, as the API serialises it) from Unix milliseconds.
pub fn time_of(ms: u64) -> Time {
    let secs = i64::try_from(ms / 1000).unwrap_or(0);
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or_default())
}

/// A container's Kubernetes state after `e`.
fn terminated(e: &Exit) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: e.exit_code,
            signal: e.signal,
            reason: Some(e.reason.clone()),
            message: e.message.clone(),
            started_at: (e.started_ms > 0).then(|| time_of(e.started_ms)),
            finished_at: Some(time_of(e.finished_ms)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// What the kubelet runs for one container of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerPlan {
    /// The container's name.
    pub name: String,
    /// Its image (reported in its status, never pulled).
    pub image: String,
    /// The process: program and arguments; empty when there is nothing to run.
    pub argv: Vec<String>,
    /// Its environment.
    pub env: Vec<(String, String)>,
    /// Its working directory.
    pub working_dir: PathBuf,
    /// Its readiness probe, or why it cannot be run.
    pub readiness: Option<Result<Probe, String>>,
}

impl ContainerPlan {
    /// The plan of container `c` of `pod` whose sandbox has addresses `ips`.
    pub fn new(pod: &Pod, c: &Container, ips: &[String]) -> ContainerPlan {
        let env = environment(pod, c, ips);
        let argv = command_line(
            c.command.as_deref().unwrap_or_default(),
            c.args.as_deref().unwrap_or_default(),
            &env,
        );
        let ports = c.ports.as_deref().unwrap_or_default();
        ContainerPlan {
            name: c.name.clone(),
            image: c.image.clone().unwrap_or_default(),
            argv,
            env,
            working_dir: c
                .working_dir
                .as_deref()
                .filter(|d| !d.is_empty())
                .map_or_else(|| PathBuf::from("/"), PathBuf::from),
            readiness: c.readiness_probe.as_ref().map(|p| parse_probe(p, ports)),
        }
    }
}

/// The process of a container: `command` then `args` (the image's entrypoint, which `command` would replace,
/// is empty here), each with `$(VAR)` expanded from `env`.
pub fn command_line(command: &[String], args: &[String], env: &[(String, String)]) -> Vec<String> {
    command.iter().chain(args).map(|a| expand(a, env)).collect()
}

/// Kubernetes' variable expansion: `$(NAME)` becomes the value of `NAME` when defined (left as is when not),
/// `$$` becomes `$`.
pub fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match env.iter().rev().find(|(k, _)| k == name) {
                        Some((_, v)) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push_str(&rest[i..]);
                    rest = "";
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The container's environment: the basics, then its `env` entries in order (later ones may refer to
/// earlier ones with `$(VAR)`).
pub fn environment(pod: &Pod, c: &Container, ips: &[String]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), CONTAINER_PATH.into()),
        ("HOME".into(), "/root".into()),
        (
            "HOSTNAME".into(),
            pod.metadata.name.clone().unwrap_or_default(),
        ),
    ];
    for e in c.env.as_deref().unwrap_or_default() {
        let value = if let Some(v) = &e.value {
            Some(expand(v, &env))
        } else {
            e.value_from
                .as_ref()
                .and_then(|f| f.field_ref.as_ref())
                .and_then(|f| field(pod, &f.field_path, ips))
        };
        if let Some(v) = value {
            env.retain(|(k, _)| *k != e.name);
            env.push((e.name.clone(), v));
        }
    }
    env
}

/// The value of a `fieldRef` the sandbox knows.
fn field(pod: &Pod, path: &str, ips: &[String]) -> Option<String> {
    let m = &pod.metadata;
    let spec = pod.spec.as_ref();
    match path {
        "metadata.name" => m.name.clone(),
        "metadata.namespace" => m.namespace.clone(),
        "metadata.uid" => m.uid.clone(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        "status.podIP" => ips.first().cloned(),
        "status.podIPs" => Some(ips.join(",")),
        "status.hostIP" | "status.hostIPs" => pod
            .status
            .as_ref()
            .and_then(|s| s.host_ip.clone())
            .or_else(|| Some(NODE_IP.into())),
        _ => None,
    }
}

/// What a probe does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAction {
    /// Connects to `host` (the pod's address when `None`) on `port`.
    Tcp {
        /// The address to connect to.
        host: Option<String>,
        /// The port.
        port: u16,
    },
    /// `GET path` over plain HTTP; a status from 200 to 399 passes.
    Http {
        /// The address (the pod's when `None`).
        host: Option<String>,
        /// The port.
        port: u16,
        /// The path.
        path: String,
    },
    /// Runs a command in the pod's namespace; exit status 0 passes.
    Exec {
        /// The command line.
        command: Vec<String>,
    },
}

/// A readiness probe with its timing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// What it checks.
    pub action: ProbeAction,
    /// Delay after the container started before the first probe.
    pub initial_delay: Duration,
    /// Time between probes.
    pub period: Duration,
    /// How long one probe may take.
    pub timeout: Duration,
    /// Consecutive passes that make the container ready.
    pub success_threshold: u32,
    /// Consecutive failures that make it unready.
    pub failure_threshold: u32,
}

fn secs(v: Option<i32>, default: u64, min: u64) -> Duration {
    let s = v.and_then(|v| u64::try_from(v).ok()).unwrap_or(default);
    Duration::from_secs(s.max(min))
}

fn count(v: Option<i32>, default: u32) -> u32 {
    v.and_then(|v| u32::try_from(v).ok())
        .filter(|v| *v > 0)
        .unwrap_or(default)
}

/// Resolves a probe's port: a number, or the name of one of the container's ports.
fn port(
    p: &IntOrString,
    ports: &[k8s_openapi::api::core::v1::ContainerPort],
) -> Result<u16, String> {
    let n = match p {
        IntOrString::Int(n) => *n,
        IntOrString::String(s) => match s.parse::<i32>() {
            Ok(n) => n,
            Err(_) => ports
                .iter()
                .find(|cp| cp.name.as_deref() == Some(s.as_str()))
                .map(|cp| cp.container_port)
                .ok_or_else(|| format!("no container port named {s:?}"))?,
        },
    };
    u16::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("port {n} out of range"))
}

/// A probe from its spec, named ports resolved against the container's `ports`.
pub fn parse_probe(
    p: &ProbeSpec,
    ports: &[k8s_openapi::api::core::v1::ContainerPort],
) -> Result<Probe, String> {
    let action = if let Some(t) = &p.tcp_socket {
        ProbeAction::Tcp {
            host: t.host.clone().filter(|h| !h.is_empty()),
            port: port(&t.port, ports)?,
        }
    } else if let Some(h) = &p.http_get {
        if h.scheme
            .as_deref()
            .is_some_and(|s| s.eq_ignore_ascii_case("https"))
        {
            return Err("HTTPS probes are not supported by the sandbox".into());
        }
        ProbeAction::Http {
            host: h.host.clone().filter(|h| !h.is_empty()),
            port: port(&h.port, ports)?,
            path: h
                .path
                .clone()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "/".into()),
        }
    } else if let Some(e) = &p.exec {
        let command = e.command.clone().unwrap_or_default();
        if command.is_empty() {
            return Err("exec probe without a command".into());
        }
        ProbeAction::Exec { command }
    } else if p.grpc.is_some() {
        return Err("gRPC probes are not supported by the sandbox".into());
    } else {
        return Err("probe without a handler (tcpSocket, httpGet or exec)".into());
    };
    Ok(Probe {
        action,
        initial_delay: secs(p.initial_delay_seconds, 0, 0),
        period: secs(p.period_seconds, 10, 1),
        timeout: secs(p.timeout_seconds, 1, 1),
        success_threshold: count(p.success_threshold, 1),
        failure_threshold: count(p.failure_threshold, 3),
    })
}

/// A readiness probe's results so far: unready until `successThreshold` passes in a row, unready again
/// after `failureThreshold` failures in a row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeState {
    /// Whether the container counts as ready.
    pub ready: bool,
    successes: u32,
    failures: u32,
}

impl ProbeState {
    /// A state that starts ready (or not), as if the probe had passed its threshold.
    pub fn seeded(ready: bool) -> ProbeState {
        ProbeState {
            ready,
            ..ProbeState::default()
        }
    }

    /// Counts one result; returns whether readiness changed.
    pub fn observe(&mut self, pass: bool, p: &Probe) -> bool {
        let before = self.ready;
        if pass {
            self.failures = 0;
            self.successes = self.successes.saturating_add(1);
            if self.successes >= p.success_threshold {
                self.ready = true;
            }
        } else {
            self.successes = 0;
            self.failures = self.failures.saturating_add(1);
            if self.failures >= p.failure_threshold {
                self.ready = false;
            }
        }
        before != self.ready
    }
}

/// Whether a container that ended with `exit_code` is started again under `restart_policy`.
pub fn restarts(restart_policy: &str, exit_code: i32) -> bool {
    match restart_policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

/// The wait before restart number `restarts + 1`: 0.5 s doubling up to 10 s.
pub fn backoff(restarts: u32) -> Duration {
    Duration::from_millis(500u64.saturating_mul(1u64 << restarts.min(5)))
        .min(Duration::from_secs(10))
}

/// One container as the status reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerView {
    /// The container's name.
    pub name: String,
    /// Its image.
    pub image: String,
    /// Its record.
    pub record: ContainerRecord,
    /// Whether it runs (its process is alive, or it has nothing to run).
    pub running: bool,
    /// Whether it is ready (running and its readiness probe, if any, passed).
    pub ready: bool,
    /// Whether it is terminated for good (not restarted under the pod's policy).
    pub done: bool,
}

impl ContainerView {
    fn status(&self) -> ContainerStatus {
        let r = &self.record;
        let state = if self.running {
            ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: r.started_ms.map(time_of),
                }),
                ..Default::default()
            }
        } else if let Some(t) = &r.terminated {
            terminated(t)
        } else {
            ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ContainerCreating".into()),
                    message: None,
                }),
                ..Default::default()
            }
        };
        ContainerStatus {
            name: self.name.clone(),
            image: self.image.clone(),
            image_id: String::new(),
            container_id: r.proc.as_ref().map(|p| format!("sandbox://{}", p.pid)),
            ready: self.ready,
            started: Some(self.running),
            restart_count: i32::try_from(r.restart_count).unwrap_or(i32::MAX),
            state: Some(state),
            last_state: r.last.as_ref().map(terminated),
            ..Default::default()
        }
    }
}

/// The fields of a pod's status the kubelet owns (what [`pod_status`] sets and [`status_patch`] compares).
fn owned(s: &PodStatus) -> PodStatus {
    PodStatus {
        phase: s.phase.clone(),
        host_ip: s.host_ip.clone(),
        host_ips: s.host_ips.clone(),
        pod_ip: s.pod_ip.clone(),
        pod_ips: s.pod_ips.clone(),
        start_time: s.start_time.clone(),
        conditions: s.conditions.clone(),
        container_statuses: s.container_statuses.clone(),
        ..Default::default()
    }
}

/// The pod's status from its containers: phase (`Running`; `Succeeded` or `Failed` once every container is
/// terminated for good), addresses, conditions (`Ready` and `ContainersReady` when every container is
/// ready) and container statuses. Times of what did not change are taken from `current`, so an unchanged
/// pod gives an equal status.
pub fn pod_status(
    current: Option<&PodStatus>,
    host_ip: &str,
    ips: &[String],
    containers: &[ContainerView],
    now: Time,
) -> PodStatus {
    let all_done = !containers.is_empty() && containers.iter().all(|c| c.done);
    let phase = if all_done {
        if containers.iter().all(|c| {
            c.record
                .terminated
                .as_ref()
                .is_some_and(|t| t.exit_code == 0)
        }) {
            "Succeeded"
        } else {
            "Failed"
        }
    } else {
        "Running"
    };
    let unready: Vec<&str> = containers
        .iter()
        .filter(|c| !c.ready)
        .map(|c| c.name.as_str())
        .collect();
    let old = |t: &str| {
        current
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == t))
    };
    let cond = |t: &str, ok: bool| {
        let status = if ok { "True" } else { "False" };
        let prev = old(t).filter(|c| c.status == status);
        let (reason, message) = if ok {
            (None, None)
        } else if all_done {
            (Some("PodCompleted".to_owned()), None)
        } else {
            (
                Some("ContainersNotReady".to_owned()),
                Some(format!(
                    "containers with unready status: [{}]",
                    unready.join(" ")
                )),
            )
        };
        PodCondition {
            type_: t.into(),
            status: status.into(),
            last_transition_time: Some(
                prev.and_then(|c| c.last_transition_time.clone())
                    .unwrap_or_else(|| now.clone()),
            ),
            reason,
            message,
            ..Default::default()
        }
    };
    let ready = unready.is_empty();
    PodStatus {
        phase: Some(phase.into()),
        host_ip: Some(host_ip.into()),
        host_ips: Some(vec![HostIP { ip: host_ip.into() }]),
        pod_ip: ips.first().cloned(),
        pod_ips: Some(ips.iter().map(|i| PodIP { ip: i.clone() }).collect()),
        start_time: Some(
            current
                .and_then(|s| s.start_time.clone())
                .unwrap_or_else(|| now.clone()),
        ),
        conditions: Some(vec![
            cond("PodScheduled", true),
            cond("Initialized", true),
            cond("ContainersReady", ready),
            cond("Ready", ready),
        ]),
        container_statuses: Some(containers.iter().map(ContainerView::status).collect()),
        ..Default::default()
    }
}

/// The merge patch that makes `current` the `desired` status, or `None` when the fields the kubelet owns
/// are already so (a pod's status is patched only on change).
pub fn status_patch(current: Option<&PodStatus>, desired: &PodStatus) -> Option<serde_json::Value> {
    let have = current.map(owned).unwrap_or_default();
    let want = owned(desired);
    let (Ok(h), Ok(w)) = (serde_json::to_value(&have), serde_json::to_value(&want)) else {
        return None;
    };
    (h != w).then(|| serde_json::json!({ "status": w }))
}

/// Reads the exit a monitor wrote, or, when there is none (the monitor was killed), Kubernetes'
/// `ContainerStatusUnknown` with exit code 137.
pub fn read_exit(path: &Path, started_ms: u64) -> Exit {
    read_json(path).unwrap_or_else(|_| Exit {
        exit_code: 137,
        signal: None,
        reason: "ContainerStatusUnknown".into(),
        message: Some("the container's monitor ended without recording how it exited".into()),
        started_ms,
        finished_ms: now_ms(),
    })
}

/// `container-run --netns PATH [--exit-file FILE] -- ARGV...`: the monitor of one container (or one exec
/// probe). Enters the network namespace, runs `ARGV` (inheriting stdio, environment, working directory and
/// process group), waits for it, writes its [`Exit`] to `FILE`, and exits with its code. Call it before any
/// other thread exists (`setns` acts on the calling thread only).
pub fn shim(args: &[String]) -> i32 {
    let mut netns = None;
    let mut exit_file = None;
    let mut it = args.iter();
    let mut argv: Vec<String> = Vec::new();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--netns" => netns = it.next().map(PathBuf::from),
            "--exit-file" => exit_file = it.next().map(PathBuf::from),
            "--" => {
                argv = it.by_ref().cloned().collect();
            }
            other => {
                tracing::error!("{SHIM_COMMAND}: unknown argument {other:?}");
                return 2;
            }
        }
    }
    let started = now_ms();
    let exit = match run_in(netns.as_deref(), &argv) {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt;
            Exit::of(status.code(), status.signal(), started)
        }
        Err(e) => {
            // The container's log is this process's stderr (where the CLI's subscriber writes): say why it
            // never ran.
            tracing::error!("{SHIM_COMMAND}: {e}");
            Exit::start_error(e)
        }
    };
    if let Some(f) = exit_file {
        if let Err(e) = write_json(&f, &exit) {
            tracing::error!("{SHIM_COMMAND}: {e}");
        }
    }
    exit.exit_code
}

fn run_in(netns: Option<&Path>, argv: &[String]) -> Result<std::process::ExitStatus, String> {
    let Some((prog, rest)) = argv.split_first() else {
        return Err("no command".into());
    };
    if let Some(ns) = netns {
        let f = std::fs::File::open(ns).map_err(|e| format!("open {}: {e}", ns.display()))?;
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("setns {}: {e}", ns.display()))?;
    }
    std::process::Command::new(prog)
        .args(rest)
        .status()
        .map_err(|e| format!("{prog}: {e}"))
}

/// The monitor command for `argv` in `netns` (the kubelet adds stdio, environment and directory).
pub fn shim_command(
    shim: &Path,
    netns: &Path,
    exit_file: Option<&Path>,
    argv: &[String],
) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(shim);
    cmd.arg0("kube-ovn-sandbox")
        .arg(SHIM_COMMAND)
        .arg("--netns")
        .arg(netns);
    if let Some(f) = exit_file {
        cmd.arg("--exit-file").arg(f);
    }
    cmd.arg("--").args(argv);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("pod")
    }

    #[test]
    fn command_and_args() {
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        let env = vec![("PORT".to_owned(), "8080".to_owned())];
        // kubectl run web -- python3 -m http.server 8080: args only.
        assert_eq!(
            command_line(&[], &s(&["python3", "-m", "http.server", "8080"]), &env),
            s(&["python3", "-m", "http.server", "8080"])
        );
        // command replaces the entrypoint, args follow it.
        assert_eq!(
            command_line(
                &s(&["sh", "-c"]),
                &s(&["echo $(PORT) $$(PORT) $(NOPE) $x"]),
                &env
            ),
            s(&["sh", "-c", "echo 8080 $(PORT) $(NOPE) $x"])
        );
        assert!(command_line(&[], &[], &env).is_empty());
        assert_eq!(expand("a$(b", &env), "a$(b");
        assert_eq!(expand("$", &env), "$");
    }

    #[test]
    fn environment_and_plan() {
        let p = pod(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
            "spec": {"nodeName": "n1", "containers": [{
                "name": "c", "image": "any", "args": ["echo", "$(GREETING)"], "workingDir": "/tmp",
                "env": [
                    {"name": "NAME", "value": "x"},
                    {"name": "GREETING", "value": "hi $(NAME)"},
                    {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
                ],
                "ports": [{"name": "http", "containerPort": 8080}],
                "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 1}
            }]}
        }));
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let plan = ContainerPlan::new(&p, c, &["10.16.0.5".into()]);
        assert_eq!(plan.argv, vec!["echo".to_owned(), "hi x".to_owned()]);
        assert_eq!(plan.working_dir, PathBuf::from("/tmp"));
        let get = |k: &str| {
            plan.env
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("IP"), Some("10.16.0.5"));
        assert_eq!(get("NODE"), Some("n1"));
        assert_eq!(get("HOSTNAME"), Some("web"));
        assert_eq!(get("PATH"), Some(CONTAINER_PATH));
        assert_eq!(get("SECRET"), None);
        let probe = plan.readiness.expect("probe").expect("valid");
        assert_eq!(
            probe.action,
            ProbeAction::Tcp {
                host: None,
                port: 8080
            }
        );
        assert_eq!(probe.period, Duration::from_secs(1));
        assert_eq!(probe.timeout, Duration::from_secs(1));
        assert_eq!((probe.success_threshold, probe.failure_threshold), (1, 3));
    }

    #[test]
    fn probes() {
        let parse = |v: serde_json::Value| {
            let p: ProbeSpec = serde_json::from_value(v).expect("probe");
            let ports: Vec<k8s_openapi::api::core::v1::ContainerPort> =
                serde_json::from_value(json!([{"name": "web", "containerPort": 80}]))
                    .expect("ports");
            parse_probe(&p, &ports)
        };
        let p = parse(
            json!({"httpGet": {"port": "web", "path": "/healthz"}, "initialDelaySeconds": 2,
                             "periodSeconds": 0, "successThreshold": 2, "failureThreshold": 1}),
        )
        .expect("http");
        assert_eq!(
            p.action,
            ProbeAction::Http {
                host: None,
                port: 80,
                path: "/healthz".into()
            }
        );
        assert_eq!(p.initial_delay, Duration::from_secs(2));
        assert_eq!(
            p.period,
            Duration::from_secs(1),
            "a period under 1 s is 1 s"
        );
        assert_eq!((p.success_threshold, p.failure_threshold), (2, 1));
        let p = parse(json!({"exec": {"command": ["test", "-e", "/x"]}})).expect("exec");
        assert_eq!(
            p.period,
            Duration::from_secs(10),
            "Kubernetes' default period"
        );
        assert!(matches!(p.action, ProbeAction::Exec { .. }));
        assert_eq!(
            parse(json!({"tcpSocket": {"port": 9000}}))
                .expect("tcp")
                .action,
            ProbeAction::Tcp {
                host: None,
                port: 9000
            }
        );
        for bad in [
            json!({"tcpSocket": {"port": "nope"}}),
            json!({"tcpSocket": {"port": 70000}}),
            json!({"httpGet": {"port": 80, "scheme": "HTTPS"}}),
            json!({"grpc": {"port": 80}}),
            json!({"exec": {"command": []}}),
            json!({"periodSeconds": 1}),
        ] {
            assert!(parse(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn probe_thresholds() {
        let p = Probe {
            action: ProbeAction::Exec {
                command: vec!["true".into()],
            },
            initial_delay: Duration::ZERO,
            period: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            success_threshold: 2,
            failure_threshold: 2,
        };
        let mut s = ProbeState::default();
        assert!(!s.observe(true, &p));
        assert!(!s.ready);
        assert!(s.observe(true, &p), "two passes in a row");
        assert!(!s.observe(false, &p), "one failure is not enough");
        assert!(!s.observe(true, &p), "a pass resets the failures");
        assert!(!s.observe(false, &p));
        assert!(s.observe(false, &p), "two failures in a row");
        assert!(!s.ready);
    }

    #[test]
    fn restart_policy_and_backoff() {
        assert!(restarts("Always", 0));
        assert!(restarts("", 0), "Always is the default");
        assert!(restarts("OnFailure", 1));
        assert!(!restarts("OnFailure", 0));
        assert!(!restarts("Never", 1));
        assert_eq!(backoff(0), Duration::from_millis(500));
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(40), Duration::from_secs(10));
    }

    fn view(name: &str, running: bool, ready: bool, done: Option<i32>) -> ContainerView {
        ContainerView {
            name: name.into(),
            image: "any".into(),
            record: ContainerRecord {
                name: name.into(),
                started_ms: Some(1_700_000_000_000),
                terminated: done.map(|code| Exit::of(Some(code), None, 1_700_000_000_000)),
                ..Default::default()
            },
            running,
            ready,
            done: done.is_some(),
        }
    }

    #[test]
    fn status_changes_only_on_change() {
        let ips = vec!["10.16.0.5".to_owned()];
        let t0 = time_of(1_700_000_000_000);
        let t1 = time_of(1_700_000_100_000);
        let a = pod_status(
            None,
            "127.0.0.1",
            &ips,
            &[view("c", true, false, None)],
            t0.clone(),
        );
        assert_eq!(a.phase.as_deref(), Some("Running"));
        let ready = a
            .conditions
            .as_ref()
            .expect("conds")
            .iter()
            .find(|c| c.type_ == "Ready");
        assert_eq!(ready.map(|c| c.status.as_str()), Some("False"));
        assert!(status_patch(None, &a).is_some());
        // Recomputed later with nothing changed: same status, no patch.
        let b = pod_status(
            Some(&a),
            "127.0.0.1",
            &ips,
            &[view("c", true, false, None)],
            t1.clone(),
        );
        assert_eq!(status_patch(Some(&a), &b), None);
        // Ready flips: a patch, with the Ready condition's transition time moved and startTime kept.
        let c = pod_status(
            Some(&b),
            "127.0.0.1",
            &ips,
            &[view("c", true, true, None)],
            t1.clone(),
        );
        let patch = status_patch(Some(&b), &c).expect("patch");
        assert_eq!(patch["status"]["containerStatuses"][0]["ready"], true);
        assert_eq!(
            patch["status"]["startTime"],
            serde_json::to_value(&t0).expect("t")
        );
        let conds = patch["status"]["conditions"].as_array().expect("conds");
        let ready = conds.iter().find(|c| c["type"] == "Ready").expect("ready");
        assert_eq!(ready["status"], "True");
        assert_eq!(
            ready["lastTransitionTime"],
            serde_json::to_value(&t1).expect("t")
        );
        let sched = conds
            .iter()
            .find(|c| c["type"] == "PodScheduled")
            .expect("sched");
        assert_eq!(
            sched["lastTransitionTime"],
            serde_json::to_value(&t0).expect("t")
        );
        // Fields the kubelet does not own are not compared.
        let mut other = c.clone();
        other.qos_class = Some("BestEffort".into());
        assert_eq!(status_patch(Some(&other), &c), None);
    }

    #[test]
    fn phases() {
        let ips = vec![];
        let t = time_of(0);
        let phase = |cs: &[ContainerView]| pod_status(None, "h", &ips, cs, t.clone()).phase;
        assert_eq!(
            phase(&[view("a", false, false, Some(0))]).as_deref(),
            Some("Succeeded")
        );
        assert_eq!(
            phase(&[
                view("a", false, false, Some(0)),
                view("b", false, false, Some(3))
            ])
            .as_deref(),
            Some("Failed")
        );
        assert_eq!(
            phase(&[
                view("a", false, false, Some(0)),
                view("b", true, true, None)
            ])
            .as_deref(),
            Some("Running")
        );
        let s = pod_status(
            None,
            "h",
            &ips,
            &[view("a", false, false, Some(3))],
            t.clone(),
        );
        let cs = &s.container_statuses.expect("cs")[0];
        let term = cs
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .expect("terminated");
        assert_eq!((term.exit_code, term.reason.as_deref()), (3, Some("Error")));
    }

    #[test]
    fn monitor_records_the_exit() {
        let d = tempfile::tempdir().expect("tempdir");
        let f = d.path().join("c.exit");
        let args = |argv: &[&str]| {
            let mut a = vec![
                "--exit-file".to_owned(),
                f.display().to_string(),
                "--".into(),
            ];
            a.extend(argv.iter().map(|x| (*x).to_owned()));
            a
        };
        assert_eq!(shim(&args(&["sh", "-c", "exit 7"])), 7);
        let e = read_exit(&f, 0);
        assert_eq!((e.exit_code, e.reason.as_str()), (7, "Error"));
        assert!(e.started_ms > 0 && e.finished_ms >= e.started_ms);
        assert_eq!(shim(&args(&["sh", "-c", "kill -9 $$"])), 137);
        assert_eq!(read_exit(&f, 0).signal, Some(9));
        assert_eq!(shim(&args(&["/nonexistent/program"])), 128);
        let e = read_exit(&f, 0);
        assert_eq!(e.reason, "StartError");
        assert!(e
            .message
            .unwrap_or_default()
            .contains("/nonexistent/program"));
        assert_eq!(shim(&["--bogus".to_owned()]), 2);
    }

    #[test]
    fn exits() {
        let e = Exit::of(None, Some(9), 5);
        assert_eq!((e.exit_code, e.reason.as_str()), (137, "Error"));
        assert_eq!(Exit::of(Some(0), None, 5).reason, "Completed");
        let d = tempfile::tempdir().expect("tempdir");
        let missing = read_exit(&d.path().join("none.exit"), 5);
        assert_eq!(missing.reason, "ContainerStatusUnknown");
        write_json(&d.path().join("c.exit"), &e).expect("write");
        assert_eq!(read_exit(&d.path().join("c.exit"), 0), e);
    }
}
