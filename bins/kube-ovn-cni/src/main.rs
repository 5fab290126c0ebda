//! `kube-ovn`: the CNI shim kubelet's runtime execs (`/opt/cni/bin/kube-ovn`).
//!
//! It does no networking: it reads the `CNI_*` environment and the network configuration on stdin,
//! validates them, forwards the operation to the node daemon over its unix socket
//! ([`kubeovn_cni::daemon`]) and prints the answer.
//!
//! - `VERSION` is answered here, without the daemon.
//! - `ADD` prints the daemon's result converted to the configuration's `cniVersion`; `DEL`, `CHECK`,
//!   `STATUS` and `GC` print nothing on success.
//! - Failures print the spec's error object on stdout and exit with status 1: code 4 for a missing or
//!   invalid environment (including `CNI_NETNS` that does not exist for `ADD`/`CHECK`, and `CNI_ARGS`
//!   without `K8S_POD_NAME`/`K8S_POD_NAMESPACE` for `ADD`/`CHECK`), 6 for a configuration that is not
//!   JSON, 1 for an unknown version or a command the version does not have, 7 for an invalid
//!   configuration, 11 (try again later) for a daemon that is down, resets or does not answer in time,
//!   and the daemon's own code (50/51 from `STATUS`, ...) passed through.
//!
//! Configuration fields read besides the spec's: `server_socket` (default
//! `/run/openvswitch/kube-ovn-daemon.sock`), `provider`, `vf_driver`, `deviceID`, `connect_timeout` and
//! `request_timeout` (seconds; defaults 2 s and, per command, 60 s for `ADD`, 20 s for `DEL`/`CHECK`,
//! 30 s for `GC`, 5 s for `STATUS`), `debug` (`true`: log to stderr). `KUBE_OVN_CNI_DEBUG=1` also turns
//! the log on.

use std::io::{Read, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use kubeovn_cni::daemon::{DaemonClient, Request};
use kubeovn_cni::spec::{Command, Env, NetConf, Version, VersionInfo};
use kubeovn_cni::Error;

/// The stderr log, on only when asked for.
struct Log {
    on: bool,
    start: Instant,
}

impl Log {
    fn line(&self, msg: std::fmt::Arguments<'_>) {
        if self.on {
            let _ = writeln!(
                std::io::stderr(),
                "kube-ovn[{}] +{:.3}ms {msg}",
                std::process::id(),
                self.start.elapsed().as_secs_f64() * 1e3
            );
        }
    }
}

/// The `cniVersion` of the input, when it is one we know (for errors and `VERSION`).
fn input_version(stdin: &[u8]) -> Option<&'static str> {
    let v: serde_json::Value = serde_json::from_slice(stdin).ok()?;
    Version::parse(v.get("cniVersion")?.as_str()?)
        .ok()
        .map(Version::as_str)
}

fn run(stdin: &[u8], log: &mut Log) -> Result<Option<String>, Error> {
    let env = Env::from_process()?;
    log.line(format_args!(
        "{} container={:?} netns={:?} ifname={:?}",
        env.command, env.container_id, env.netns, env.ifname
    ));
    if env.command == Command::Version {
        let info = VersionInfo::all(input_version(stdin).unwrap_or(""));
        return Ok(Some(serde_json::to_string(&info).unwrap_or_default()));
    }
    let conf = NetConf::from_slice(stdin)?;
    if conf.extra.get("debug").and_then(serde_json::Value::as_bool) == Some(true) {
        log.on = true;
    }
    let version = conf.version()?;
    env.command.check_version(version)?;
    if matches!(env.command, Command::Add | Command::Check) {
        let netns = env.netns.as_deref().unwrap_or_default();
        if !Path::new(netns).exists() {
            return Err(Error::InvalidEnv {
                var: "CNI_NETNS",
                value: netns.to_owned(),
                reason: "the network namespace does not exist",
            });
        }
    }
    let req = Request::from_cni(&env, &conf)?;
    let client = DaemonClient::from_netconf(&conf)?;
    log.line(format_args!(
        "-> {} {} (timeout {:?})",
        client.socket().display(),
        req.path(),
        client.timeout_for(env.command)
    ));
    let resp = client.call(&req);
    log.line(format_args!("<- {resp:?}"));
    match resp?.into_outcome() {
        Err(e) => Err(Error::Plugin(e)),
        Ok(result) if env.command == Command::Add => {
            let result = result.ok_or_else(|| Error::DaemonResponse {
                reason: "ADD succeeded without a result".into(),
            })?;
            Ok(Some(result.convert_to(version).to_json()))
        }
        Ok(_) => Ok(None),
    }
}

fn main() -> ExitCode {
    let mut log = Log {
        on: std::env::var("KUBE_OVN_CNI_DEBUG").is_ok_and(|v| !v.is_empty() && v != "0"),
        start: Instant::now(),
    };
    let mut stdin = Vec::new();
    let outcome = match std::io::stdin().lock().read_to_end(&mut stdin) {
        Ok(_) => run(&stdin, &mut log),
        Err(source) => Err(Error::Io {
            what: "reading stdin",
            source,
        }),
    };
    let mut out = std::io::stdout().lock();
    match outcome {
        Ok(text) => {
            if let Some(text) = text {
                // A runtime that closed its pipe gets nothing either way.
                let _ = writeln!(out, "{text}");
            }
            log.line(format_args!("done"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            let cni = e.to_cni(input_version(&stdin).unwrap_or(Version::LATEST.as_str()));
            let _ = writeln!(out, "{}", cni.to_json());
            let _ = writeln!(
                std::io::stderr(),
                "kube-ovn: error {}: {} ({})",
                cni.code,
                cni.msg,
                cni.details
            );
            ExitCode::FAILURE
        }
    }
}
