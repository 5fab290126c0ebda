//! Starts a whole single-node OVN (needs root and the Debian OVN/OVS packages) and stops it by pid.

#![allow(clippy::unwrap_used)]

use kubeovn_ovn::vswitch::{OpenVSwitch, OvsdbOpenVSwitch};
use kubeovn_sandbox::ovn::{missing_programs, OvnOptions, OvnStack};

use kubeovn_test_support::skip;

/// Whether the test can run (root, OVN); if not, it is skipped ([`skip::skip`]: a failure under CI).
fn runnable() -> bool {
    if !skip::is_root() {
        skip::skip("needs root (netdev datapath taps)");
        return false;
    }
    if let Some(p) = missing_programs() {
        skip::skip(&format!("{p} is not installed"));
        return false;
    }
    true
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
