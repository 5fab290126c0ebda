//! The `kube-ovn-daemon` binary: flag errors, node start on a real OVN with a static pod table, a pod
//! plugged through the shim, socket mode 0600, clean exit on SIGTERM. As root.

#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube_ovn_sandbox::ovn::{OvnOptions, OvnStack};
use kubeovn_netdev::{NamedNetns, Namespaces};
use kubeovn_ovn::northbound::{Northbound, OvsdbNorthbound, SwitchPort};
use serde_json::json;

const DAEMON: &str = env!("CARGO_BIN_EXE_kube-ovn-daemon");

#[test]
fn flag_errors_exit_2() {
    for args in [
        vec!["--bogus", "x"],
        vec!["--node-name", "n1", "--mtu", "9"],
        vec!["--node-name", "n1", "--pod-source", "etcd"],
        vec!["--node-name", "n1"], // node start needs --ovn-remote
    ] {
        let out = Command::new(DAEMON)
            .args(&args)
            .env_remove("KUBE_NODE_NAME")
            .env_remove("NODE_NAME")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!out.stderr.is_empty());
    }
}

#[test]
fn daemon_binary_serves_the_shim() {
    if !common::runnable() {
        return;
    }
    let _serial = common::serial();
    let dir = tempfile::Builder::new()
        .prefix("kovn-bin")
        .tempdir()
        .unwrap();
    let tag = format!("{:05}", std::process::id() % 100_000);
    let bridge = format!("br-b{tag}");
    let rt = common::runtime();
    let stack = rt
        .block_on(OvnStack::start(
            dir.path(),
            OvnOptions::new(&bridge).without_chassis_config(),
        ))
        .unwrap();
    rt.block_on(async {
        let nb = OvsdbNorthbound::connect(&stack.nb_remote()).await.unwrap();
        let mut b = kubeovn_ovn::northbound::Batch::new();
        b.add(kubeovn_ovn::northbound::LogicalSwitch::new("ls"));
        b.add(SwitchPort::new("ls", "pb.e2e").addresses(["00:00:00:bb:00:05 10.231.5.5"]));
        nb.commit(b).await.unwrap();
    });
    let table = dir.path().join("pods.json");
    std::fs::write(
        &table,
        json!([{"namespace": "e2e", "name": "pb", "ips": ["10.231.5.5/24"],
                "mac": "00:00:00:bb:00:05", "gateways": ["10.231.5.1"], "logical_switch": "ls"}])
        .to_string(),
    )
    .unwrap();
    let sock = dir.path().join("d.sock");
    let mut child = Command::new(DAEMON)
        .args([
            "--node-name",
            &stack.options().system_id,
            "--bridge",
            &bridge,
        ])
        .args(["--datapath-type", "netdev", "--metrics-addr", "127.0.0.1:0"])
        .arg("--socket")
        .arg(&sock)
        .args([
            "--ovs-remote",
            &stack.ovs_remote(),
            "--ovn-remote",
            &stack.sb_remote(),
        ])
        .arg("--pod-source")
        .arg(format!("static:{}", table.display()))
        .args(["--gateway-check-timeout", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "daemon did not start"
        );
        assert!(child.try_wait().unwrap().is_none(), "daemon exited");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    rt.block_on(stack.wait_chassis()).unwrap();

    let netns_name = format!("kovn-{tag}-bin");
    let netns = NamedNetns::default().create(&netns_name).unwrap();
    let conf = json!({"cniVersion": "1.1.0", "name": "kube-ovn", "type": "kube-ovn",
                      "server_socket": sock});
    let env = |cmd: &str| -> Vec<(String, String)> {
        vec![
            ("CNI_COMMAND".into(), cmd.into()),
            ("CNI_CONTAINERID".into(), format!("b{tag}0123456789")),
            ("CNI_NETNS".into(), netns.display().to_string()),
            ("CNI_IFNAME".into(), "eth0".into()),
            ("CNI_PATH".into(), "/opt/cni/bin".into()),
            (
                "CNI_ARGS".into(),
                "K8S_POD_NAMESPACE=e2e;K8S_POD_NAME=pb".into(),
            ),
        ]
    };
    let (code, status) = common::run_shim(&env("STATUS"), &conf);
    let (add_code, add) = common::run_shim(&env("ADD"), &conf);
    let (del_code, _) = common::run_shim(&env("DEL"), &conf);
    let _ = NamedNetns::default().delete(&netns_name);

    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let st = child.wait().unwrap();
    stack.stop();
    assert_eq!(code, 0, "{status}");
    assert_eq!(add_code, 0, "{add}");
    assert_eq!(add["ips"][0]["address"], "10.231.5.5/24");
    assert_eq!(del_code, 0);
    assert!(st.success(), "{st}");
    assert!(!sock.exists(), "socket removed on exit");
}
