//! Starts a whole single-node OVN (needs root and the Debian OVN/OVS packages) and stops it by pid.

#![allow(clippy::unwrap_used)]

use kube_ovn_sandbox::ovn::{missing_programs, OvnOptions, OvnStack};
use kubeovn_ovn::vswitch::{OpenVSwitch, OvsdbOpenVSwitch};

fn runnable() -> bool {
    if !nix_is_root() {
        eprintln!("SKIPPED: needs root (netdev datapath taps)");
        return false;
    }
    if let Some(p) = missing_programs() {
        eprintln!("SKIPPED: {p} is not installed");
        return false;
    }
    true
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stack_starts_and_stops() {
    if !runnable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bridge = format!("br-sbx{}", std::process::id() % 10000);
    let stack = OvnStack::start(dir.path(), OvnOptions::new(&bridge))
        .await
        .unwrap();
    let ovs = OvsdbOpenVSwitch::connect(&stack.ovs_remote())
        .await
        .unwrap();
    assert!(ovs.bridge(&bridge).is_some());
    assert_eq!(
        ovs.external_ids().get("ovn-bridge").map(String::as_str),
        Some(bridge.as_str())
    );
    let pids = stack.pids();
    assert_eq!(pids.len(), 6, "{pids:?}");
    stack.stop();
    for (name, pid) in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .map(|s| s.contains(") Z "))
                    .unwrap_or(true),
            "{name} still running"
        );
    }
    assert!(
        !std::path::Path::new(&format!("/sys/class/net/{bridge}")).exists(),
        "tap {bridge} left behind"
    );
}
