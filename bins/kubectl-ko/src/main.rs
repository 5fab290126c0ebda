//! `kubectl-ko`: the Kube-OVN kubectl plugin (`kubectl ko ...`).
//!
//! - `nbctl ARGS...`, `sbctl ARGS...`: `ovn-nbctl` / `ovn-sbctl` against the northbound / southbound database.
//! - `vsctl NODE ARGS...`: `ovs-vsctl` on a node.
//! - `trace NAMESPACE/POD TARGET_IP [icmp | tcp PORT | udp PORT]`: `ovn-trace` of a packet from the pod (its
//!   port, MAC and address from its annotations) to the target, through its logical switch and the router.
//! - `diagnose`: are the components alive, does every pod's port exist on the bridge with `ovn-installed`
//!   and is it bound to a chassis; in the sandbox, do TCP and UDP pass from every pod to every other one.
//!
//! `kubectl ko --help` and `kubectl ko COMMAND --help` list the arguments. Two targets. The sandbox
//! (`--sandbox DIR`, `KUBE_OVN_SANDBOX_DIR`, or a sandbox in `/var/lib/kube-ovn-sandbox`): the OVN tools
//! run here against the sandbox's sockets. A real cluster (otherwise): as Kube-OVN's plugin does,
//! `kubectl exec` into an `ovn-central` pod (label `app=ovn-central`) or the node's `ovs-ovn` pod (label
//! `app=ovs`) in `kube-system`.
//!
//! A passthrough by design: this CLI runs the OVN tools and kubectl; the libraries never do.

use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};

use clap::{Parser, Subcommand, ValueEnum};
use std::time::Duration;

use kubeovn_sandbox_state::procs::ProcRecord;
use kubeovn_sandbox_state::records::{all_records, records, PodRecord};
use kubeovn_sandbox_state::state::{read_json, Settings, StateDir, DEFAULT_STATE_DIR};
use kubeovn_sandbox_state::transport;
use serde_json::Value;

/// The plugin's command line (`kubectl ko ...`).
#[derive(Debug, Parser)]
#[command(
    name = "kubectl ko",
    bin_name = "kubectl ko",
    version,
    about = "Kube-OVN's kubectl plugin: the OVN tools against the sandbox or a cluster",
    after_help = "Target: the sandbox given by --sandbox, KUBE_OVN_SANDBOX_DIR or /var/lib/kube-ovn-sandbox if \
                  it runs; otherwise the cluster of the current kubeconfig (kubectl exec into ovn-central / \
                  ovs-ovn pods)."
)]
struct Cli {
    /// The sandbox's state directory (default: /var/lib/kube-ovn-sandbox)
    #[arg(long, value_name = "DIR", env = "KUBE_OVN_SANDBOX_DIR")]
    sandbox: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// ovn-nbctl against the northbound database
    Nbctl {
        /// ovn-nbctl's options and command
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "ARGS"
        )]
        args: Vec<String>,
    },
    /// ovn-sbctl against the southbound database
    Sbctl {
        /// ovn-sbctl's options and command
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "ARGS"
        )]
        args: Vec<String>,
    },
    /// ovs-vsctl on a node
    Vsctl {
        /// The node
        node: String,
        /// ovs-vsctl's options and command
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "ARGS"
        )]
        args: Vec<String>,
    },
    /// ovn-trace of a packet from the pod to the target
    Trace {
        /// The source pod (namespace default if omitted)
        #[arg(value_name = "NAMESPACE/POD")]
        pod: String,
        /// The destination address
        #[arg(value_name = "TARGET_IP")]
        target: IpAddr,
        /// The protocol
        #[arg(value_enum, default_value = "icmp")]
        protocol: Protocol,
        /// The destination port (tcp and udp)
        #[arg(value_name = "PORT", required_if_eq_any = [("protocol", "tcp"), ("protocol", "udp")])]
        port: Option<u16>,
    },
    /// Components alive, every pod's port installed and bound, TCP and UDP between the sandbox's pods
    Diagnose,
}

/// `trace`'s protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Protocol {
    /// An echo request
    Icmp,
    /// A TCP segment to PORT
    Tcp,
    /// A UDP datagram to PORT
    Udp,
}

/// Where the OVN tools run.
enum Target {
    Sandbox(StateDir, Box<Settings>),
    Cluster,
}

fn fail(msg: impl std::fmt::Display) -> String {
    msg.to_string()
}

/// Runs a command with inherited stdio; its exit code.
fn passthrough(mut cmd: Command) -> Result<ExitCode, String> {
    let st = cmd
        .status()
        .map_err(|e| fail(format!("{:?}: {e}", cmd.get_program())))?;
    Ok(ExitCode::from(st.code().unwrap_or(1).clamp(0, 255) as u8))
}

/// Runs a command; its stdout, or an error with its stderr.
fn output(mut cmd: Command) -> Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| fail(format!("{:?}: {e}", cmd.get_program())))?;
    if !out.status.success() {
        return Err(format!(
            "{:?} failed: {}",
            cmd.get_program(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Target {
    fn detect(explicit: Option<PathBuf>) -> Target {
        let dir = explicit
            .or_else(|| std::env::var_os("KUBE_OVN_SANDBOX_DIR").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
        let dir = StateDir::new(dir);
        match dir.load_settings() {
            Ok(s) if dir.pids_file().exists() => Target::Sandbox(dir, Box::new(s)),
            _ => Target::Cluster,
        }
    }

    /// `ovn-nbctl`, `ovn-sbctl` (central) or `ovs-vsctl` (a node) with `args`, ready to run.
    fn tool(&self, tool: &str, node: Option<&str>, args: &[String]) -> Result<Command, String> {
        match self {
            Target::Sandbox(dir, s) => {
                // A node of the cluster: the first is the sandbox's own directory, the others have theirs.
                let node_dir = match node {
                    Some(n) if n != s.node_name => {
                        let d = dir.node_dir(n);
                        if !d.settings_file().exists() {
                            let mut names = vec![s.node_name.clone()];
                            names.extend(
                                dir.node_dirs()
                                    .iter()
                                    .filter_map(|d| d.load_settings().ok())
                                    .map(|s| s.node_name),
                            );
                            return Err(format!(
                                "the sandbox has no node {n:?} (its nodes: {})",
                                names.join(", ")
                            ));
                        }
                        d
                    }
                    _ => dir.clone(),
                };
                let db = match tool {
                    "ovn-nbctl" => dir.nb_remote(),
                    "ovn-sbctl" | "ovn-trace" => dir.sb_remote(),
                    _ => node_dir.ovs_remote(),
                };
                let mut c = Command::new(tool);
                c.arg(format!("--db={db}")).args(args);
                Ok(c)
            }
            Target::Cluster => {
                let pod = match node {
                    None => cluster_pod("app=ovn-central", None)?,
                    Some(n) => cluster_pod("app=ovs", Some(n))?,
                };
                let mut c = Command::new("kubectl");
                c.args(["exec", "-n", "kube-system", &pod, "--", tool])
                    .args(args);
                Ok(c)
            }
        }
    }

    fn pod(&self, ns: &str, name: &str) -> Result<Value, String> {
        match self {
            Target::Sandbox(dir, s) => {
                let path = format!("/api/v1/namespaces/{ns}/pods/{name}");
                http_get(&s.api_addr, &path)
                    .map_err(|e| format!("{e} (API of the sandbox in {})", dir.root().display()))
            }
            Target::Cluster => {
                let mut c = Command::new("kubectl");
                c.args(["get", "pod", "-n", ns, name, "-o", "json"]);
                serde_json::from_str(&output(c)?).map_err(|e| e.to_string())
            }
        }
    }
}

/// The first running pod in kube-system with `selector` (on `node`).
fn cluster_pod(selector: &str, node: Option<&str>) -> Result<String, String> {
    let mut c = Command::new("kubectl");
    c.args([
        "get",
        "pods",
        "-n",
        "kube-system",
        "-l",
        selector,
        "-o",
        "json",
    ]);
    let v: Value = serde_json::from_str(&output(c)?).map_err(|e| e.to_string())?;
    v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["status"]["phase"] == "Running")
        .find(|p| node.is_none_or(|n| p["spec"]["nodeName"] == n))
        .and_then(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .ok_or_else(|| match node {
            Some(n) => format!("no running pod with {selector} on node {n} in kube-system"),
            None => format!("no running pod with {selector} in kube-system"),
        })
}

/// A JSON GET over plain HTTP/1.0 (the sandbox's API server is on loopback, without TLS).
fn http_get(addr: &str, path: &str) -> Result<Value, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: application/json\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("malformed HTTP answer")?;
    let v: Value = serde_json::from_str(body).map_err(|e| format!("{path}: {e}"))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(format!(
            "GET {path}: {}",
            v["message"]
                .as_str()
                .unwrap_or(head.lines().next().unwrap_or(""))
        ));
    }
    Ok(v)
}

fn ann<'a>(pod: &'a Value, key: &str) -> Option<&'a str> {
    pod["metadata"]["annotations"][format!("ovn.kubernetes.io/{key}")].as_str()
}

/// The MAC of the logical switch port or router port that owns `ip`, from `ovn-nbctl list`.
fn mac_of(target: &Target, ip: &str) -> Result<Option<String>, String> {
    for (table, col) in [
        ("Logical_Switch_Port", "addresses"),
        ("Logical_Router_Port", "mac,networks"),
    ] {
        let args: Vec<String> = [
            "--format=csv",
            "--data=bare",
            "--no-heading",
            &format!("--columns={col}"),
            "list",
            table,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let out = output(target.tool("ovn-nbctl", None, &args)?)?;
        for line in out.lines() {
            let words: Vec<&str> = line
                .split([' ', ','])
                .map(|w| w.split('/').next().unwrap_or(w))
                .collect();
            if words.contains(&ip) {
                if let Some(mac) = words
                    .iter()
                    .find(|w| w.len() == 17 && w.matches(':').count() == 5)
                {
                    return Ok(Some((*mac).to_owned()));
                }
            }
        }
    }
    Ok(None)
}

fn trace(
    target: &Target,
    pod: &str,
    dst: IpAddr,
    protocol: Protocol,
    port: Option<u16>,
) -> Result<ExitCode, String> {
    let dst = dst.to_string();
    let (ns, name) = pod.split_once('/').unwrap_or(("default", pod));
    let p = target.pod(ns, name)?;
    let ip = ann(&p, "ip_address").ok_or("the pod has no ovn.kubernetes.io/ip_address")?;
    let ip = ip.split(',').next().unwrap_or(ip);
    let mac = ann(&p, "mac_address").ok_or("the pod has no ovn.kubernetes.io/mac_address")?;
    let ls = ann(&p, "logical_switch").ok_or("the pod has no ovn.kubernetes.io/logical_switch")?;
    let gw = ann(&p, "gateway").unwrap_or("");
    let v6 = dst.contains(':');
    let cidr = ann(&p, "cidr").unwrap_or("");
    // Same subnet: the destination's own MAC; elsewhere: the router port's (the gateway's).
    let same = same_subnet(cidr, &dst);
    let dst_mac = if same {
        mac_of(target, &dst)?
    } else {
        mac_of(target, gw.split(',').next().unwrap_or(gw))?
    }
    .ok_or_else(|| format!("no port owns {}", if same { dst.as_str() } else { gw }))?;
    let (ipv, ttl) = if v6 {
        ("ip6", "ip.ttl")
    } else {
        ("ip4", "ip.ttl")
    };
    let l4 = match protocol {
        Protocol::Icmp if v6 => "icmp6.type == 128".to_owned(),
        Protocol::Icmp => "icmp4.type == 8".to_owned(),
        Protocol::Tcp | Protocol::Udp => {
            let proto = if protocol == Protocol::Tcp {
                "tcp"
            } else {
                "udp"
            };
            let port = port.ok_or_else(|| format!("{proto} needs a destination PORT"))?;
            format!("{proto}.src == 10000 && {proto}.dst == {port}")
        }
    };
    let flow = format!(
        "inport == \"{name}.{ns}\" && eth.src == {mac} && eth.dst == {dst_mac} && {ipv}.src == {ip} && \
         {ipv}.dst == {dst} && {ttl} == 64 && {l4}"
    );
    println!("ovn-trace {ls} '{flow}'");
    passthrough(target.tool("ovn-trace", None, &[ls.to_owned(), flow])?)
}

/// Whether `ip` is inside one of the comma-separated IPv4 `cidrs` (IPv6: compared as text prefix).
fn same_subnet(cidrs: &str, ip: &str) -> bool {
    cidrs.split(',').any(|c| {
        let Some((net, len)) = c.split_once('/') else {
            return false;
        };
        match (
            net.parse::<std::net::Ipv4Addr>(),
            ip.parse::<std::net::Ipv4Addr>(),
            len.parse::<u32>(),
        ) {
            (Ok(n), Ok(i), Ok(l)) if l <= 32 => {
                let mask = if l == 0 { 0 } else { u32::MAX << (32 - l) };
                u32::from(n) & mask == u32::from(i) & mask
            }
            _ => false,
        }
    })
}

struct Report {
    failures: usize,
}

impl Report {
    fn check(&mut self, what: &str, r: Result<String, String>) {
        match r {
            Ok(note) => println!(
                "PASS  {what}{}",
                if note.is_empty() {
                    String::new()
                } else {
                    format!(": {note}")
                }
            ),
            Err(e) => {
                self.failures += 1;
                println!("FAIL  {what}: {e}");
            }
        }
    }
}

fn diagnose(target: &Target) -> Result<ExitCode, String> {
    let mut r = Report { failures: 0 };
    let run = |tool: &str, node: Option<&str>, args: &[&str]| -> Result<String, String> {
        let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        output(target.tool(tool, node, &args)?)
    };
    // (namespace, name, the node whose OVS to look at: the sandbox's nodes only).
    let mut pods: Vec<(String, String, Option<String>)> = Vec::new();
    // The sandbox's pods with their namespaces, for the TCP and UDP checks.
    let mut sandboxes = Vec::new();
    match target {
        Target::Sandbox(dir, s) => {
            let mut pids: Vec<ProcRecord> = read_json(&dir.pids_file()).unwrap_or_default();
            for d in dir.node_dirs() {
                pids.extend(read_json::<Vec<ProcRecord>>(&d.pids_file()).unwrap_or_default());
            }
            for p in &pids {
                r.check(
                    &format!("process {}", p.name),
                    if p.alive() {
                        Ok(format!("pid {}", p.pid))
                    } else {
                        Err(format!("pid {} is not running", p.pid))
                    },
                );
            }
            sandboxes = all_records(dir);
            // Each pod on the node whose directory holds its record.
            let mut nodes = vec![(dir.clone(), s.node_name.clone())];
            nodes.extend(
                dir.node_dirs()
                    .into_iter()
                    .filter_map(|d| d.load_settings().ok().map(|s| (d, s.node_name))),
            );
            for (d, n) in nodes {
                pods.extend(
                    records(&d)
                        .into_iter()
                        .map(|p| (p.namespace, p.name, Some(n.clone()))),
                );
            }
        }
        Target::Cluster => {
            for app in ["ovn-central", "ovs", "kube-ovn-controller", "kube-ovn-cni"] {
                let mut c = Command::new("kubectl");
                c.args([
                    "get",
                    "pods",
                    "-n",
                    "kube-system",
                    "-l",
                    &format!("app={app}"),
                    "-o",
                    "json",
                ]);
                let res = output(c).and_then(|o| {
                    let v: Value = serde_json::from_str(&o).map_err(|e| e.to_string())?;
                    let items = v["items"].as_array().cloned().unwrap_or_default();
                    let running = items
                        .iter()
                        .filter(|p| p["status"]["phase"] == "Running")
                        .count();
                    if items.is_empty() || running < items.len() {
                        Err(format!("{running}/{} running", items.len()))
                    } else {
                        Ok(format!("{running} running"))
                    }
                });
                r.check(&format!("pods app={app}"), res);
            }
            let mut c = Command::new("kubectl");
            c.args(["get", "pods", "-A", "-o", "json"]);
            if let Ok(o) = output(c) {
                let v: Value = serde_json::from_str(&o).unwrap_or_default();
                for p in v["items"].as_array().into_iter().flatten() {
                    if p["spec"]["hostNetwork"] == true || ann(p, "allocated") != Some("true") {
                        continue;
                    }
                    pods.push((
                        p["metadata"]["namespace"].as_str().unwrap_or("").to_owned(),
                        p["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                        None,
                    ));
                }
            }
        }
    }
    r.check(
        "northbound database",
        run("ovn-nbctl", None, &["--timeout=5", "ls-list"])
            .map(|o| format!("{} logical switches", o.lines().count())),
    );
    let chassis = run(
        "ovn-sbctl",
        None,
        &[
            "--timeout=5",
            "--bare",
            "--columns=name,hostname",
            "list",
            "Chassis",
        ],
    );
    r.check(
        "southbound database and chassis",
        chassis.and_then(|o| {
            let names: Vec<&str> = o.split_whitespace().collect();
            if names.is_empty() {
                Err("no chassis registered".into())
            } else {
                Ok(names.join(" "))
            }
        }),
    );
    for (ns, name, node) in &pods {
        let port = format!("{name}.{ns}");
        let binding = run(
            "ovn-sbctl",
            None,
            &[
                "--bare",
                "--columns=chassis",
                "find",
                "Port_Binding",
                &format!("logical_port={port}"),
            ],
        );
        r.check(
            &format!("pod {ns}/{name}: port {port} bound to a chassis"),
            binding.and_then(|o| {
                if o.trim().is_empty() {
                    Err("no chassis".into())
                } else {
                    Ok(String::new())
                }
            }),
        );
        if let Some(n) = node {
            let iface = run(
                "ovs-vsctl",
                Some(n),
                &[
                    "--bare",
                    "--columns=name,external_ids",
                    "find",
                    "Interface",
                    &format!("external_ids:iface-id={port}"),
                ],
            );
            r.check(
                &format!("pod {ns}/{name}: interface on the bridge with ovn-installed"),
                iface.and_then(|o| {
                    if o.trim().is_empty() {
                        Err("no interface with this iface-id".into())
                    } else if !o.contains("ovn-installed=\"true\"")
                        && !o.contains("ovn-installed=true")
                    {
                        Err(format!(
                            "not ovn-installed ({})",
                            o.split_whitespace().next().unwrap_or("")
                        ))
                    } else {
                        Ok(o.split_whitespace().next().unwrap_or("").to_owned())
                    }
                }),
            );
        }
    }
    transport_checks(&mut r, &sandboxes, target);
    if r.failures == 0 {
        println!("\nall checks passed");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("\n{} checks failed", r.failures);
        Ok(ExitCode::FAILURE)
    }
}

/// TCP and UDP from every pod to every other one, from inside their namespaces: ping alone passes where a
/// datapath drops TCP and UDP (partial checksums on the userspace datapath).
fn transport_checks(r: &mut Report, pods: &[PodRecord], target: &Target) {
    if matches!(target, Target::Cluster) {
        println!(
            "SKIP  TCP and UDP between pods: needs the pods' network namespaces (sandbox only)"
        );
        return;
    }
    let with_ip: Vec<(&PodRecord, IpAddr)> = pods
        .iter()
        .filter_map(|p| {
            let ip = p.ips.first()?.split('/').next()?.parse().ok()?;
            Some((p, ip))
        })
        .collect();
    for (src, _) in &with_ip {
        for (dst, ip) in &with_ip {
            if std::ptr::eq(*src, *dst) {
                continue;
            }
            let t = transport::check(&src.netns, &dst.netns, *ip, Duration::from_secs(1));
            let res = match (&t.tcp, &t.udp) {
                (Ok(tcp), Ok(udp)) => Ok(format!(
                    "tcp {:.2}ms, udp {:.2}ms",
                    tcp.as_secs_f64() * 1e3,
                    udp.as_secs_f64() * 1e3
                )),
                (tcp, udp) => Err([tcp, udp]
                    .into_iter()
                    .filter_map(|x| x.as_ref().err().cloned())
                    .collect::<Vec<_>>()
                    .join("; ")),
            };
            r.check(
                &format!(
                    "TCP and UDP {}/{} -> {}/{} ({ip})",
                    src.namespace, src.name, dst.namespace, dst.name
                ),
                res,
            );
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, String> {
    let target = Target::detect(cli.sandbox);
    match cli.command {
        Cmd::Nbctl { args } => passthrough(target.tool("ovn-nbctl", None, &args)?),
        Cmd::Sbctl { args } => passthrough(target.tool("ovn-sbctl", None, &args)?),
        Cmd::Vsctl { node, args } => passthrough(target.tool("ovs-vsctl", Some(&node), &args)?),
        Cmd::Trace {
            pod,
            target: dst,
            protocol,
            port,
        } => trace(&target, &pod, dst, protocol, port),
        Cmd::Diagnose => diagnose(&target),
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kubectl-ko: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets() {
        assert!(same_subnet("10.16.0.0/16", "10.16.3.4"));
        assert!(!same_subnet("10.16.0.0/16", "10.17.0.1"));
        assert!(same_subnet("10.16.0.0/16,fd00::/64", "10.16.0.9"));
        assert!(!same_subnet("", "10.16.0.9"));
    }

    #[test]
    fn no_sandbox_means_cluster() {
        let d = std::env::temp_dir().join(format!("kubectl-ko-none-{}", std::process::id()));
        assert!(matches!(Target::detect(Some(d)), Target::Cluster));
    }

    fn parse(flags: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("kubectl-ko").chain(flags.iter().copied()))
    }

    #[test]
    fn usage_errors() {
        <Cli as clap::CommandFactory>::command().debug_assert();
        for (bad, says) in [
            (vec![], "<COMMAND>"),
            (vec!["nope"], "nope"),
            (vec!["--sandbox"], "--sandbox"),
            (vec!["vsctl"], "<NODE>"),
            (vec!["trace", "default/a"], "<TARGET_IP>"),
            (vec!["trace", "default/a", "10.16.0.300"], "<TARGET_IP>"),
            (vec!["trace", "default/a", "10.16.0.3", "tcp"], "<PORT>"),
            (vec!["trace", "default/a", "10.16.0.3", "sctp"], "sctp"),
        ] {
            let e = parse(&bad).expect_err("refused");
            assert!(e.to_string().contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn passthrough_arguments() {
        let c = parse(&["--sandbox=/s", "nbctl", "--format=csv", "list", "ACL"]).expect("nbctl");
        assert_eq!(c.sandbox, Some(PathBuf::from("/s")));
        let Cmd::Nbctl { args } = c.command else {
            panic!("not nbctl");
        };
        assert_eq!(args, ["--format=csv", "list", "ACL"]);
        let c = parse(&[
            "vsctl",
            "node2",
            "--bare",
            "--columns=name",
            "list",
            "Bridge",
        ])
        .expect("vsctl");
        let Cmd::Vsctl { node, args } = c.command else {
            panic!("not vsctl");
        };
        assert_eq!((node.as_str(), args.len()), ("node2", 4));
        let c = parse(&["trace", "demo/app-1", "10.16.0.3", "udp", "53"]).expect("trace");
        let Cmd::Trace { protocol, port, .. } = c.command else {
            panic!("not trace");
        };
        assert_eq!((protocol, port), (Protocol::Udp, Some(53)));
    }
}
