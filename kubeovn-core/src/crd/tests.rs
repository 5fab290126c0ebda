use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

use super::*;

fn round_trip<T>(v: &T) -> T
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let text = serde_json::to_string(v).expect("serialises");
    serde_json::from_str(&text).expect("reads back")
}

#[test]
fn subnet_manifest_from_kube_ovn_docs() {
    let m = json!({
        "apiVersion": "kubeovn.io/v1",
        "kind": "Subnet",
        "metadata": {"name": "ls1"},
        "spec": {
            "protocol": "IPv4",
            "default": false,
            "cidrBlock": "10.66.0.0/16",
            "gateway": "10.66.0.1",
            "excludeIps": ["10.66.0.1..10.66.0.10", "10.66.0.101..10.66.0.151"],
            "gatewayType": "centralized",
            "gatewayNode": "kube-ovn-worker,kube-ovn-control-plane",
            "natOutgoing": true,
            "private": true,
            "allowSubnets": ["10.16.0.0/16", "10.18.0.0/16"],
            "namespaces": ["ns1", "ns2"],
            "namespaceSelectors": [{"matchLabels": {"team": "a"}}],
            "enableDHCP": true,
            "enableIPv6RA": false,
            "u2oInterconnection": true,
            "u2oInterconnectionIP": "10.66.0.254",
            "enableLb": false,
            "mtu": 1400,
            "policyRoutingTableID": 1000,
            "acls": [{"action": "drop", "direction": "to-lport", "match": "ip4.dst == 10.10.0.2 && ip", "priority": 1002}],
            "natOutgoingPolicyRules": [{"match": {"srcIPs": "10.66.0.0/24"}, "action": "forward"}],
            "someFutureField": {"x": 1}
        }
    });
    let s: Subnet = serde_json::from_value(m).expect("Kube-OVN manifest");
    assert_eq!(s.metadata.name.as_deref(), Some("ls1"));
    assert_eq!(s.spec.protocol, Some(Protocol::IPv4));
    assert_eq!(s.spec.gateway_type, Some(GatewayType::Centralized));
    assert!(
        s.spec.nat_outgoing && s.spec.private && s.spec.enable_dhcp && s.spec.u2o_interconnection
    );
    assert_eq!(s.spec.enable_lb, Some(false));
    assert_eq!(s.spec.mtu, 1400);
    assert_eq!(s.spec.policy_routing_table_id, 1000);
    assert_eq!(s.spec.acls[0].match_, "ip4.dst == 10.10.0.2 && ip");
    assert_eq!(
        s.spec.nat_outgoing_policy_rules[0].match_.src_ips,
        "10.66.0.0/24"
    );
    assert_eq!(s.spec.namespace_selectors.len(), 1);
    assert_eq!(round_trip(&s), s);
    // Field names on the wire are Kube-OVN's.
    let v = serde_json::to_value(&s).expect("value");
    for k in [
        "cidrBlock",
        "excludeIps",
        "enableDHCP",
        "u2oInterconnectionIP",
        "policyRoutingTableID",
        "natOutgoing",
        "gatewayNode",
    ] {
        assert!(v["spec"].get(k).is_some(), "{k}");
    }
}

#[test]
fn subnet_status_as_kube_ovn_writes_it() {
    let m = json!({
        "apiVersion": "kubeovn.io/v1",
        "kind": "Subnet",
        "metadata": {"name": "ovn-default"},
        "spec": {"cidrBlock": "10.16.0.0/16,fd00:10:16::/64", "gateway": "10.16.0.1,fd00:10:16::1",
                 "protocol": "Dual", "default": true, "provider": "ovn", "vpc": "ovn-cluster"},
        "status": {
            "conditions": [
                {"type": "Validated", "status": "True", "reason": "ValidateLogicalSwitchSuccess",
                 "lastUpdateTime": "2024-05-01T10:00:00Z", "lastTransitionTime": "2024-05-01T10:00:00Z"},
                {"type": "Ready", "status": "True", "reason": "ReconcileSuccess",
                 "lastUpdateTime": null, "lastTransitionTime": null}
            ],
            "v4availableIPs": 65532,
            "v4availableIPrange": "10.16.0.2-10.16.0.3,10.16.0.5-10.16.255.254",
            "v4usingIPs": 1,
            "v4usingIPrange": "10.16.0.4",
            "v6availableIPs": 1.8446744073709552e19,
            "v6availableIPrange": "fd00:10:16::2-fd00:10:16::ffff:ffff:ffff:fffe",
            "v6usingIPs": "340282366920938463463374607431768211455",
            "v6usingIPrange": "",
            "activateGateway": "",
            "dhcpV4OptionsUUID": "",
            "dhcpV6OptionsUUID": "",
            "u2oInterconnectionIP": "",
            "natOutgoingPolicyRules": null
        }
    });
    let s: Subnet = serde_json::from_value(m).expect("status");
    let st = s.status.as_ref().expect("status");
    assert_eq!(st.v4_available_ips, IpCount(65532));
    assert_eq!(st.v6_available_ips, IpCount(1 << 64));
    assert_eq!(st.v6_using_ips, IpCount(u128::MAX));
    assert!(st.is_ready() && st.is_validated());
    assert_eq!(st.conditions[1].last_update_time, None);
    // Counts that fit 64 bits stay exact integers; larger ones become floats.
    let v = serde_json::to_value(st).expect("value");
    assert_eq!(v["v4availableIPs"], json!(65532));
    assert!(v["v6availableIPs"].is_f64());
    let back: SubnetStatus = serde_json::from_value(v).expect("reads back");
    assert_eq!(back.v4_available_ips, st.v4_available_ips);
    assert!(serde_json::from_value::<IpCount>(json!(-1)).is_err());
    assert!(serde_json::from_value::<IpCount>(json!("x")).is_err());
}

#[test]
fn other_kinds_from_kube_ovn_docs() {
    let vpc: Vpc = serde_json::from_value(json!({
        "apiVersion": "kubeovn.io/v1", "kind": "Vpc", "metadata": {"name": "test-vpc-1"},
        "spec": {
            "namespaces": ["ns1"],
            "staticRoutes": [{"cidr": "0.0.0.0/0", "nextHopIP": "10.0.1.254", "policy": "policyDst"}],
            "policyRoutes": [{"action": "reroute", "match": "ip4.src==10.0.1.0/24", "nextHopIP": "10.0.1.252", "priority": 10}],
            "enableExternal": true,
            "bfdPort": null
        },
        "status": {"default": false, "defaultLogicalSwitch": "", "router": "test-vpc-1", "standby": true,
                   "subnets": ["net1"], "tcpLoadBalancer": "vpc-test-vpc-1-tcp-load", "enableBfd": false,
                   "bfdPort": {"ip": "", "name": "", "nodes": null}}
    }))
    .expect("vpc");
    assert_eq!(vpc.spec.static_routes[0].next_hop_ip, "10.0.1.254");
    assert_eq!(vpc.spec.policy_routes[0].priority, 10);
    assert_eq!(vpc.status.as_ref().map(|s| s.standby), Some(true));
    assert_eq!(round_trip(&vpc), vpc);

    let ip: IP = serde_json::from_value(json!({
        "apiVersion": "kubeovn.io/v1", "kind": "IP", "metadata": {"name": "web-0.default"},
        "spec": {"podName": "web-0", "namespace": "default", "subnet": "ovn-default", "nodeName": "kind-worker",
                 "ipAddress": "10.16.0.9", "v4IpAddress": "10.16.0.9", "v6IpAddress": "",
                 "macAddress": "00:00:00:3e:d2:7f", "attachIps": [], "attachMacs": [], "attachSubnets": [],
                 "containerID": "", "podType": "StatefulSet"}
    }))
    .expect("ip");
    assert_eq!(ip.spec.v4_ip_address, "10.16.0.9");
    assert_eq!(ip.spec.pod_type, "StatefulSet");
    assert_eq!(round_trip(&ip), ip);

    let pool: IPPool = serde_json::from_value(json!({
        "apiVersion": "kubeovn.io/v1", "kind": "IPPool", "metadata": {"name": "pool-1"},
        "spec": {"subnet": "ovn-default", "ips": ["10.16.0.201", "10.16.0.210/30", "10.16.0.220..10.16.0.230"],
                 "namespaces": ["ns-1"], "enableAddressSet": true},
        "status": {"v4AvailableIPs": 17, "v4UsingIPs": 0, "v6AvailableIPs": 0, "v6UsingIPs": 0,
                   "v4AvailableIPRange": "10.16.0.201,10.16.0.208-10.16.0.211,10.16.0.220-10.16.0.230"}
    }))
    .expect("ippool");
    assert_eq!(pool.spec.ips.len(), 3);
    assert_eq!(
        pool.status.as_ref().map(|s| s.v4_available_ips),
        Some(IpCount(17))
    );
    assert_eq!(round_trip(&pool), pool);

    let vlan: Vlan = serde_json::from_value(json!({
        "apiVersion": "kubeovn.io/v1", "kind": "Vlan", "metadata": {"name": "vlan1"},
        "spec": {"id": 10, "provider": "net1"}
    }))
    .expect("vlan");
    assert_eq!((vlan.spec.id, vlan.spec.provider.as_str()), (10, "net1"));
    assert_eq!(round_trip(&vlan), vlan);

    let pn: ProviderNetwork = serde_json::from_value(json!({
        "apiVersion": "kubeovn.io/v1", "kind": "ProviderNetwork", "metadata": {"name": "net1"},
        "spec": {"defaultInterface": "eth1", "customInterfaces": [{"interface": "eth2", "nodes": ["node1"]}],
                 "excludeNodes": ["node2"]},
        "status": {"ready": true, "readyNodes": ["node1"],
                   "conditions": [{"node": "node1", "type": "Ready", "status": "True", "reason": "InitOVSBridgeSucceeded"}]}
    }))
    .expect("provider network");
    assert_eq!(pn.spec.custom_interfaces[0].interface, "eth2");
    let st = pn.status.as_ref().expect("status");
    assert_eq!(st.conditions[0].node, "node1");
    assert_eq!(st.conditions[0].condition.type_, "Ready");
    assert_eq!(round_trip(&pn), pn);
}

#[test]
fn bad_manifests_are_errors() {
    for bad in [
        json!({"apiVersion": "kubeovn.io/v1", "kind": "Subnet", "metadata": {}, "spec": {"protocol": "IPv5"}}),
        json!({"apiVersion": "kubeovn.io/v1", "kind": "Subnet", "metadata": {}, "spec": {"mtu": -1}}),
        json!({"apiVersion": "kubeovn.io/v1", "kind": "Subnet", "metadata": {}, "spec": {"natOutgoing": "yes"}}),
        json!({"apiVersion": "kubeovn.io/v1", "kind": "Subnet", "metadata": {}}),
    ] {
        assert!(
            serde_json::from_value::<Subnet>(bad.clone()).is_err(),
            "{bad}"
        );
    }
    // Kube-OVN's Go types hold these enums as strings: empty is unset, as null is.
    let s: Subnet = serde_json::from_value(json!({"apiVersion": "kubeovn.io/v1", "kind": "Subnet",
        "metadata": {}, "spec": {"protocol": "", "gatewayType": null}}))
    .expect("empty enums");
    assert_eq!((s.spec.protocol, s.spec.gateway_type), (None, None));
    let vlan = json!({"apiVersion": "kubeovn.io/v1", "kind": "Vlan", "metadata": {}, "spec": {"id": 70000}});
    assert!(serde_json::from_value::<Vlan>(vlan).is_err());
}

#[test]
fn crds_are_cluster_scoped_with_status_and_columns() {
    let crds = crds();
    let names: Vec<&str> = crds
        .iter()
        .filter_map(|c| c.metadata.name.as_deref())
        .collect();
    assert_eq!(
        names,
        [
            "subnets.kubeovn.io",
            "vpcs.kubeovn.io",
            "ips.kubeovn.io",
            "ippools.kubeovn.io",
            "vlans.kubeovn.io",
            "provider-networks.kubeovn.io",
            "adminnetworkpolicies.policy.networking.k8s.io",
            "baselineadminnetworkpolicies.policy.networking.k8s.io"
        ]
    );
    for crd in &crds {
        let policy = crd.spec.group == POLICY_GROUP;
        assert_eq!(crd.spec.group, if policy { POLICY_GROUP } else { GROUP });
        assert_eq!(crd.spec.scope, "Cluster");
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, if policy { POLICY_VERSION } else { VERSION });
        assert!(v.served && v.storage);
        assert!(v.schema.is_some());
        let has_status = crd.spec.names.kind != "IP";
        assert_eq!(
            v.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some(),
            has_status
        );
        assert!(!v
            .additional_printer_columns
            .as_deref()
            .unwrap_or_default()
            .is_empty());
    }
    let subnet = &crds[0];
    assert_eq!(
        subnet.spec.names.short_names.as_deref(),
        Some(&["subnet".to_owned()][..])
    );
    let cols: Vec<&str> = subnet.spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.json_path.as_str())
        .collect();
    assert!(cols.contains(&".status.v4availableIPs") && cols.contains(&".spec.cidrBlock"));
    let pn = &crds[5];
    assert_eq!(pn.spec.names.singular.as_deref(), Some("provider-network"));
    assert_eq!(
        pn.spec.names.short_names.as_deref(),
        Some(&["pn".to_owned()][..])
    );

    let yaml = crds_yaml();
    assert_eq!(yaml.matches("\n---\n").count(), 7);
    assert!(yaml.starts_with("apiVersion: apiextensions.k8s.io/v1\n"));
    assert!(yaml.contains("  name: subnets.kubeovn.io\n"));
}

#[test]
fn subnet_conditions_like_kube_ovn() {
    let t = |s: &str| Time(s.parse().expect("timestamp"));
    let (t0, t1, t2) = (
        t("2024-01-01T00:00:00Z"),
        t("2024-01-01T00:01:00Z"),
        t("2024-01-01T00:02:00Z"),
    );
    let mut st = SubnetStatus::default();
    st.ensure_standard_conditions(&t0);
    assert_eq!(st.conditions.len(), 3);
    assert!(st
        .conditions
        .iter()
        .all(|c| c.status == "Unknown" && c.reason == "Init"));
    assert!(!st.is_ready());

    assert!(st.validated(reasons::VALIDATE_SUCCESS, "", &t1));
    assert!(st.ready(reasons::RECONCILE_SUCCESS, "", &t1));
    assert!(st.is_ready() && st.is_validated());
    // The same write again changes nothing, times included.
    assert!(!st.ready(reasons::RECONCILE_SUCCESS, "", &t2));
    assert_eq!(
        st.condition("Ready")
            .and_then(|c| c.last_update_time.clone()),
        Some(t1.clone())
    );
    // A new message moves the update time, not the transition time.
    assert!(st.ready(reasons::RECONCILE_SUCCESS, "again", &t2));
    let c = st.condition("Ready").expect("ready");
    assert_eq!(
        (c.last_update_time.clone(), c.last_transition_time.clone()),
        (Some(t2.clone()), Some(t1.clone()))
    );
    assert!(st.not_ready(reasons::NO_READY_GATEWAY, "no gateway", &t2));
    assert_eq!(
        st.condition("Ready")
            .and_then(|c| c.last_transition_time.clone()),
        Some(t2.clone())
    );
    assert!(st.set_error(reasons::VALIDATE_FAILED, "bad cidr", &t2));
    assert!(st.is_condition_true("Error"));
    assert!(st.clear_error(&t2));
    assert_eq!(
        st.condition("Error").map(|c| c.reason.as_str()),
        Some("NoError")
    );
    st.remove_condition("Error");
    assert!(st.condition("Error").is_none());
    assert_eq!(round_trip(&st), st);
}

proptest::proptest! {
    #[test]
    fn ip_counts_round_trip(n in proptest::prelude::any::<u128>()) {
        let text = serde_json::to_string(&IpCount(n)).expect("serialises");
        let back: IpCount = serde_json::from_str(&text).expect("reads back");
        if n <= u128::from(u64::MAX) {
            proptest::prop_assert_eq!(back, IpCount(n));
        } else {
            // Beyond 64 bits the count travels as an f64: relative error below 2^-52.
            let err = back.0.abs_diff(n) as f64 / n as f64;
            proptest::prop_assert!(err < 1e-15, "{} -> {}", n, back.0);
        }
    }
}

#[test]
fn subnet_edge_parsing() {
    let mut s = Subnet::new(
        "ls1",
        SubnetSpec {
            cidr_block: "10.66.0.0/16,fd00:66::/64".into(),
            ..Default::default()
        },
    );
    assert_eq!(s.cidrs().expect("valid").len(), 2);
    assert_eq!(s.derived_protocol().expect("valid"), Protocol::Dual);
    let gws: Vec<String> = s
        .gateways()
        .expect("default")
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(gws, ["10.66.0.1", "fd00:66::1"]);
    s.spec.gateway = "10.66.0.254".into();
    assert_eq!(s.gateways().expect("given")[0].to_string(), "10.66.0.254");
    s.spec.gateway = "10.66.0.1,10.66.0.2".into();
    let err = s.gateways().expect_err("two v4 gateways");
    assert!(
        err.to_string().contains("Subnet ls1: spec.gateway"),
        "{err}"
    );
    s.spec.cidr_block = "10.66.0.0".into();
    assert!(matches!(
        s.cidrs(),
        Err(crate::Error::InvalidField {
            field: "spec.cidrBlock",
            ..
        })
    ));
    s.spec.cidr_block = "fd00::/120".into();
    assert_eq!(s.derived_protocol().expect("v6"), Protocol::IPv6);
}
