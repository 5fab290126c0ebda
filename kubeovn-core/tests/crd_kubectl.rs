//! The CRDs applied with kubectl (a client no one here wrote) to the project's test API server, then Subnet,
//! Vpc and IPPool manifests in Kube-OVN's format created and read back.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use kubeovn_core::crd::{self, CustomResourceDefinition, IPPool, Protocol, Subnet, Vpc};

use kubeovn_test_support::skip;

/// Whether kubectl runs; if not, the test is skipped ([`skip::skip`]: a failure under CI).
fn have_kubectl() -> bool {
    match Command::new("kubectl")
        .args(["version", "--client"])
        .output()
    {
        Ok(o) if o.status.success() => true,
        _ => {
            skip::skip("kubectl is not installed on this machine");
            false
        }
    }
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {stderr}{stdout}"
    );
    stdout
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Manifests as Kube-OVN's documentation writes them.
const MANIFESTS: &str = r#"apiVersion: kubeovn.io/v1
kind: Subnet
metadata:
  name: ls1
spec:
  protocol: IPv4
  default: false
  cidrBlock: 10.66.0.0/16
  gateway: 10.66.0.1
  excludeIps:
  - 10.66.0.1..10.66.0.10
  gatewayType: distributed
  natOutgoing: true
  private: false
  namespaces:
  - ns1
  namespaceSelectors:
  - matchLabels:
      team: a
  enableLb: true
---
apiVersion: kubeovn.io/v1
kind: Vpc
metadata:
  name: test-vpc-1
spec:
  namespaces:
  - ns2
  staticRoutes:
  - cidr: 0.0.0.0/0
    nextHopIP: 10.0.1.254
    policy: policyDst
---
apiVersion: kubeovn.io/v1
kind: IPPool
metadata:
  name: pool-1
spec:
  subnet: ls1
  ips:
  - 10.66.0.101
  - 10.66.0.110..10.66.0.120
  namespaces:
  - ns1
"#;

#[test]
fn crds_apply_and_kube_ovn_manifests_round_trip() {
    if !have_kubectl() {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = rt
        .block_on(kubeovn_testapi::TestApiServer::start(
            kubeovn_testapi::Config::default(),
        ))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = server.write_kubeconfig_in(dir.path()).unwrap();

    // The YAML `kube-ovn-controller crd` prints.
    let crds = write(dir.path(), "crds.yaml", &crd::crds_yaml());
    let out = kubectl(&kc, &["apply", "-f", crds.to_str().unwrap()]);
    for name in [
        "subnets.kubeovn.io",
        "vpcs.kubeovn.io",
        "ips.kubeovn.io",
        "ippools.kubeovn.io",
        "vlans.kubeovn.io",
        "provider-networks.kubeovn.io",
    ] {
        assert!(
            out.contains(&format!(
                "customresourcedefinition.apiextensions.k8s.io/{name} created"
            )),
            "{out}"
        );
    }
    // What the server stored is what we generated.
    let stored: CustomResourceDefinition = serde_json::from_str(&kubectl(
        &kc,
        &["get", "crd", "subnets.kubeovn.io", "-o", "json"],
    ))
    .unwrap();
    let ours = crd::crds().remove(0);
    assert_eq!(stored.spec, ours.spec);

    let m = write(dir.path(), "m.yaml", MANIFESTS);
    let out = kubectl(&kc, &["apply", "-f", m.to_str().unwrap()]);
    assert!(out.contains("subnet.kubeovn.io/ls1 created"), "{out}");
    assert!(out.contains("vpc.kubeovn.io/test-vpc-1 created"), "{out}");
    assert!(out.contains("ippool.kubeovn.io/pool-1 created"), "{out}");

    let list = kubectl(&kc, &["get", "subnets"]);
    println!("{list}");
    assert!(list.lines().any(|l| l.starts_with("ls1 ")), "{list}");
    // Short names from the CRDs resolve.
    assert!(kubectl(&kc, &["get", "subnet", "ls1", "-o", "name"]).contains("subnet.kubeovn.io/ls1"));
    let pns = kubectl(&kc, &["get", "pn", "-o", "json"]);
    assert!(pns.contains("\"items\": []"), "{pns}");

    let s: Subnet =
        serde_json::from_str(&kubectl(&kc, &["get", "subnet", "ls1", "-o", "json"])).unwrap();
    assert_eq!(s.spec.cidr_block, "10.66.0.0/16");
    assert_eq!(s.spec.protocol, Some(Protocol::IPv4));
    assert_eq!(s.spec.exclude_ips, ["10.66.0.1..10.66.0.10"]);
    assert!(s.spec.nat_outgoing && !s.spec.private);
    assert_eq!(s.spec.namespaces, ["ns1"]);
    assert_eq!(s.spec.namespace_selectors.len(), 1);
    assert_eq!(s.spec.enable_lb, Some(true));
    let cidr = kubectl(
        &kc,
        &["get", "subnet", "ls1", "-o", "jsonpath={.spec.cidrBlock}"],
    );
    assert_eq!(cidr, "10.66.0.0/16");

    let v: Vpc =
        serde_json::from_str(&kubectl(&kc, &["get", "vpc", "test-vpc-1", "-o", "json"])).unwrap();
    assert_eq!(v.spec.static_routes[0].next_hop_ip, "10.0.1.254");
    let p: IPPool =
        serde_json::from_str(&kubectl(&kc, &["get", "ippools", "pool-1", "-o", "json"])).unwrap();
    assert_eq!(p.spec.ips.len(), 2);

    // What we serialise is accepted back: a Subnet written by us (JSON) applies too.
    let mut ours = s.clone();
    ours.metadata = Default::default();
    ours.metadata.name = Some("ls2".into());
    ours.spec.cidr_block = "10.67.0.0/16,fd00:67::/64".into();
    ours.spec.protocol = Some(Protocol::Dual);
    let f = write(
        dir.path(),
        "ls2.json",
        &serde_json::to_string(&ours).unwrap(),
    );
    kubectl(&kc, &["create", "-f", f.to_str().unwrap()]);
    let back: Subnet =
        serde_json::from_str(&kubectl(&kc, &["get", "subnet", "ls2", "-o", "json"])).unwrap();
    assert_eq!(back.spec, ours.spec);

    rt.block_on(server.shutdown());
}
