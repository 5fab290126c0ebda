use kube::CustomResourceExt;
use serde_json::{json, Value};

use super::*;
use crate::crd::Decoded;

fn anp(spec: Value) -> AdminNetworkPolicy {
    serde_json::from_value(json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha1", "kind": "AdminNetworkPolicy",
        "metadata": {"name": "p"}, "spec": spec,
    }))
    .expect("decodes")
}

fn banp(name: &str, spec: Value) -> BaselineAdminNetworkPolicy {
    serde_json::from_value(json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha1", "kind": "BaselineAdminNetworkPolicy",
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("decodes")
}

fn labels(k: &str, v: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some([(k.to_owned(), v.to_owned())].into()),
        ..Default::default()
    }
}

/// kubernetes-sigs/network-policy-api v0.1.7, conformance/base/admin_network_policy/
/// experimental-egress-selector-rules.yaml (nodes, networks, Pass), as JSON.
fn upstream_node_and_cidr_peers() -> Value {
    json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha1",
        "kind": "AdminNetworkPolicy",
        "metadata": {"name": "node-and-cidr-as-peers-example"},
        "spec": {
            "priority": 75,
            "subject": {"pods": {
                "namespaceSelector": {"matchLabels": {"conformance-house": "gryffindor"}},
                "podSelector": {"matchLabels": {"conformance-house": "gryffindor"}}
            }},
            "egress": [
                {"name": "allow-egress-to-36363-on-nodes", "action": "Allow",
                 "to": [{"nodes": {"matchLabels": {"kubernetes.io/os": "linux"}}}],
                 "ports": [{"portNumber": {"protocol": "TCP", "port": 36363}}]},
                {"name": "pass-egress-to-5353-on-nodes", "action": "Pass",
                 "to": [{"nodes": {"matchLabels": {"kubernetes.io/os": "linux"}}}],
                 "ports": [{"portNumber": {"protocol": "UDP", "port": 34345}}]},
                {"name": "deny-egress-to-slytherin-and-nodes-and-internet", "action": "Deny",
                 "to": [
                    {"pods": {
                        "namespaceSelector": {"matchLabels": {"conformance-house": "slytherin"}},
                        "podSelector": {"matchLabels": {"conformance-house": "slytherin"}}}},
                    {"nodes": {"matchLabels": {"kubernetes.io/os": "linux"}}},
                    {"networks": ["0.0.0.0/0", "::/0"]}
                 ]}
            ]
        }
    })
}

#[test]
fn upstream_anp_with_node_and_network_peers_decodes() {
    let p: AdminNetworkPolicy =
        serde_json::from_value(upstream_node_and_cidr_peers()).expect("decodes");
    p.validate().expect("valid");
    assert_eq!(p.spec.priority, 75);
    let PodSelection::Pods(subject) = p.spec.subject.selection().expect("one") else {
        panic!("pods subject")
    };
    assert_eq!(
        subject.pod_selector,
        labels("conformance-house", "gryffindor")
    );
    let actions: Vec<_> = p.spec.egress.iter().map(|r| r.action).collect();
    use AdminNetworkPolicyRuleAction::*;
    assert_eq!(actions, [Allow, Pass, Deny]);
    let ports = p.spec.egress[1].ports.as_deref().expect("ports");
    assert_eq!(
        ports[0].selection(),
        Ok(PortSelection::Number(&PortNumber {
            protocol: PortProtocol::Udp,
            port: 34345
        }))
    );
    let to: Vec<_> = p.spec.egress[2]
        .to
        .iter()
        .map(|t| t.selection().expect("one"))
        .collect();
    assert!(matches!(to[0], EgressSelection::Pods(_)));
    assert_eq!(
        to[1],
        EgressSelection::Nodes(&labels("kubernetes.io/os", "linux"))
    );
    assert_eq!(
        to[2],
        EgressSelection::Networks(&["0.0.0.0/0".to_owned(), "::/0".to_owned()])
    );
    assert!(p.spec.ingress.is_empty() && p.status.is_none());
    // Written back with upstream's field names, and read back the same.
    let v = serde_json::to_value(&p).expect("value");
    assert_eq!(v, upstream_node_and_cidr_peers());
}

/// conformance/base/baseline_admin_network_policy/experimental-egress-selector-rules.yaml (portRange), plus
/// an ingress rule from standard-gress-rules-combined.yaml.
#[test]
fn upstream_banp_decodes() {
    let spec = json!({
        "subject": {"namespaces": {"matchLabels": {
            "kubernetes.io/metadata.name": "network-policy-conformance-gryffindor"}}},
        "egress": [
            {"name": "allow-egress-to-36363-on-nodes", "action": "Allow",
             "to": [{"nodes": {"matchLabels": {"kubernetes.io/os": "linux"}}}],
             "ports": [{"portRange": {"protocol": "TCP", "start": 36363, "end": 36364}}]},
            {"name": "deny-egress-to-nodes-and-internet", "action": "Deny",
             "to": [{"nodes": {"matchLabels": {"kubernetes.io/os": "linux"}}},
                    {"networks": ["0.0.0.0/0", "::/0"]}]}
        ],
        "ingress": [
            {"name": "allow-from-hufflepuff-at-port-80-5353-9003", "action": "Allow",
             "from": [{"namespaces": {"matchLabels": {
                "kubernetes.io/metadata.name": "network-policy-conformance-hufflepuff"}}}],
             "ports": [{"portNumber": {"protocol": "TCP", "port": 80}},
                       {"portNumber": {"protocol": "UDP", "port": 5353}},
                       {"portNumber": {"protocol": "SCTP", "port": 9003}}]}
        ]
    });
    let b = banp("default", spec.clone());
    b.validate().expect("valid");
    assert_eq!(
        b.spec.subject.selection(),
        Ok(PodSelection::Namespaces(&labels(
            "kubernetes.io/metadata.name",
            "network-policy-conformance-gryffindor"
        )))
    );
    assert_eq!(
        b.spec.egress[0].ports.as_deref().expect("ports")[0].selection(),
        Ok(PortSelection::Range(&PortRange {
            protocol: PortProtocol::Tcp,
            start: 36363,
            end: 36364
        }))
    );
    assert_eq!(
        b.spec.egress[1].action,
        BaselineAdminNetworkPolicyRuleAction::Deny
    );
    let protocols: Vec<_> = b.spec.ingress[0]
        .ports
        .iter()
        .flatten()
        .filter_map(|p| p.port_number.map(|n| n.protocol))
        .collect();
    use PortProtocol::*;
    assert_eq!(protocols, [Tcp, Udp, Sctp]);
    assert_eq!(serde_json::to_value(&b).expect("value")["spec"], spec);

    // The singleton's name.
    let e = banp("other", spec).validate().expect_err("refused");
    assert_eq!(
        e,
        AnpError::BaselineName {
            name: "other".into()
        }
    );
    assert!(e.to_string().contains("metadata.name=\"default\""), "{e}");
}

#[test]
fn protocol_defaults_to_tcp_and_named_ports_decode() {
    let p = anp(json!({
        "priority": 0,
        "subject": {"namespaces": {}},
        "ingress": [{"action": "Allow", "from": [{"pods": {"namespaceSelector": {}, "podSelector": {}}}],
                     "ports": [{"portNumber": {"port": 80}}, {"namedPort": "http"},
                               {"portRange": {"start": 1000, "end": 2000}}]}]
    }));
    p.validate().expect("valid");
    let ports = p.spec.ingress[0].ports.as_deref().expect("ports");
    assert_eq!(
        ports[0].port_number.map(|n| n.protocol),
        Some(PortProtocol::Tcp)
    );
    assert_eq!(ports[1].selection(), Ok(PortSelection::Named("http")));
    assert_eq!(
        ports[2].port_range.map(|r| r.protocol),
        Some(PortProtocol::Tcp)
    );
    // An empty subject selector selects everything: it is set, and valid.
    assert_eq!(
        p.spec.subject.selection(),
        Ok(PodSelection::Namespaces(&LabelSelector::default()))
    );
}

/// Refused while decoding: the serde message names the value and what was expected.
#[test]
fn unknown_action_or_protocol_fails_to_decode() {
    for (spec, want) in [
        (
            json!({"priority": 1, "subject": {"namespaces": {}},
                   "egress": [{"action": "Drop", "to": [{"namespaces": {}}]}]}),
            "unknown variant `Drop`, expected one of `Allow`, `Deny`, `Pass`",
        ),
        (
            json!({"priority": 1, "subject": {"namespaces": {}},
                   "ingress": [{"action": "Allow", "from": [{"namespaces": {}}],
                                "ports": [{"portNumber": {"protocol": "ICMP", "port": 1}}]}]}),
            "unknown variant `ICMP`, expected one of `TCP`, `UDP`, `SCTP`",
        ),
        (
            json!({"priority": 1, "subject": {"namespaces": {}},
                   "ingress": [{"action": "Allow", "from": [{"namespaces": {}}],
                                "ports": [{"portNumber": {"port": 70000}}]}]}),
            "invalid value: integer `70000`",
        ),
    ] {
        let v = json!({"apiVersion": "policy.networking.k8s.io/v1alpha1",
                       "kind": "AdminNetworkPolicy", "metadata": {"name": "p"}, "spec": spec});
        let e = serde_json::from_value::<AdminNetworkPolicy>(v.clone()).expect_err("refused");
        assert!(e.to_string().contains(want), "{e}");
        // As a watcher reads it: listed with the default spec and the reason.
        let d: Decoded<AdminNetworkPolicy> = serde_json::from_value(v).expect("listed");
        let why = d.spec_error.expect("refused");
        assert!(why.contains(want), "{why}");
    }
    // Pass is not a baseline action.
    let v = json!({"apiVersion": "policy.networking.k8s.io/v1alpha1",
                   "kind": "BaselineAdminNetworkPolicy", "metadata": {"name": "default"},
                   "spec": {"subject": {"namespaces": {}},
                            "ingress": [{"action": "Pass", "from": [{"namespaces": {}}]}]}});
    let e = serde_json::from_value::<BaselineAdminNetworkPolicy>(v).expect_err("refused");
    assert!(
        e.to_string()
            .contains("unknown variant `Pass`, expected `Allow` or `Deny`"),
        "{e}"
    );
}

/// Refused by `validate`, with the field and a message a user can act on.
#[test]
fn validate_refuses_what_the_schema_cannot() {
    let ns = json!({"namespaces": {}});
    let pods = json!({"pods": {"namespaceSelector": {}, "podSelector": {}}});
    let cases = [
        (
            json!({"priority": 1, "subject": {"namespaces": {}, "pods": {"namespaceSelector": {}, "podSelector": {}}}}),
            "spec.subject: exactly one of namespaces, pods must be set, found namespaces, pods",
        ),
        (
            json!({"priority": 1, "subject": {}}),
            "spec.subject: exactly one of namespaces, pods must be set, found none",
        ),
        (
            json!({"priority": 1, "subject": ns,
                   "ingress": [{"action": "Allow", "from": [ns, {"namespaces": {}, "pods": pods["pods"]}]}]}),
            "spec.ingress[0].from[1]: exactly one of namespaces, pods must be set, found namespaces, pods",
        ),
        (
            json!({"priority": 1, "subject": ns,
                   "egress": [{"action": "Deny", "to": [{"nodes": {}, "networks": ["10.0.0.0/8"]}]}]}),
            "spec.egress[0].to[0]: exactly one of namespaces, pods, nodes, networks, domainNames must be \
             set, found nodes, networks",
        ),
        (
            json!({"priority": 1, "subject": ns,
                   "egress": [{"action": "Deny", "to": [{"namespaces": {}}],
                               "ports": [{"portNumber": {"port": 80}, "namedPort": "http"}]}]}),
            "spec.egress[0].ports[0]: exactly one of portNumber, namedPort, portRange must be set, found \
             portNumber, namedPort",
        ),
        (
            json!({"priority": 1, "subject": ns,
                   "egress": [{"action": "Deny", "to": [{"namespaces": {}}], "ports": [{}]}]}),
            "spec.egress[0].ports[0]: exactly one of portNumber, namedPort, portRange must be set, found none",
        ),
        (
            json!({"priority": 100, "subject": ns}),
            "spec.priority: 100 is outside 0..=99",
        ),
        (
            json!({"priority": -1, "subject": ns}),
            "spec.priority: -1 is outside 0..=99",
        ),
        (
            json!({"priority": 1, "subject": ns, "ingress": [{"action": "Allow", "from": []}]}),
            "spec.ingress[0].from: must not be empty",
        ),
        (
            json!({"priority": 1, "subject": ns,
                   "ingress": [{"action": "Allow", "from": [ns], "ports": []}]}),
            "spec.ingress[0].ports: must not be empty",
        ),
        (
            json!({"priority": 1, "subject": ns,
                   "egress": [{"action": "Allow", "to": [{"networks": ["10.0.0.1"]}]}]}),
            "spec.egress[0].to[0].networks[0]: \"10.0.0.1\" is not a CIDR",
        ),
        (
            json!({"priority": 1, "subject": ns,
                   "egress": [{"action": "Allow", "to": [{"networks": ["10.0.0.0/33"]}]}]}),
            "spec.egress[0].to[0].networks[0]: \"10.0.0.0/33\" is not a CIDR",
        ),
        (
            json!({"priority": 1, "subject": ns,
                   "egress": [{"action": "Allow", "to": [{"networks": []}]}]}),
            "spec.egress[0].to[0].networks: must not be empty",
        ),
        (
            json!({"priority": 1, "subject": ns,
                   "egress": [{"action": "Allow", "to": [ns, {"nodes": {}}], "ports": [{"namedPort": "dns"}]}]}),
            "spec.egress[0]: networks/nodes/domainNames peer cannot be set with namedPorts",
        ),
        (
            json!({"priority": 1, "subject": ns,
                   "ingress": [{"action": "Allow", "from": [ns], "ports": [{"portNumber": {"port": 0}}]}]}),
            "spec.ingress[0].ports[0]: port 0 is not a port",
        ),
        (
            json!({"priority": 1, "subject": ns,
                   "ingress": [{"action": "Allow", "from": [ns],
                                "ports": [{"portRange": {"start": 90, "end": 80}}]}]}),
            "spec.ingress[0].ports[0]: start 90 is above end 80",
        ),
        (
            json!({"priority": 1, "subject": ns,
                   "egress": [{"action": "Deny", "to": [{"domainNames": ["kubernetes.io"]}]}]}),
            "spec.egress[0]: domainNames peers are only allowed in Allow rules",
        ),
        (
            json!({"priority": 1, "subject": ns,
                   "ingress": [{"name": "x".repeat(101), "action": "Allow", "from": [ns]}]}),
            "spec.ingress[0].name: 101 characters, at most 100",
        ),
    ];
    for (spec, want) in cases {
        let e = anp(spec.clone()).validate().expect_err("refused");
        assert!(e.to_string().starts_with(want), "{spec}:\n{e}\nwant {want}");
    }

    // At most 100 rules a direction.
    let rule = json!({"action": "Deny", "to": [ns]});
    let e = anp(json!({"priority": 1, "subject": ns, "egress": vec![rule; 101]}))
        .validate()
        .expect_err("refused");
    assert_eq!(
        e,
        AnpError::TooMany {
            field: "spec.egress".into(),
            count: 101,
            max: 100
        }
    );
    let rule = json!({"action": "Deny", "from": [ns]});
    anp(json!({"priority": 99, "subject": ns, "ingress": vec![rule; 100]}))
        .validate()
        .expect("100 rules and priority 99 are fine");

    // The baseline: the same checks.
    let e = banp(
        "default",
        json!({"subject": ns, "egress": [{"action": "Allow", "to": [{"pods": {"namespaceSelector": {}, "podSelector": {}}, "nodes": {}}]}]}),
    )
    .validate()
    .expect_err("refused");
    assert_eq!(
        e.to_string(),
        "spec.egress[0].to[0]: exactly one of namespaces, pods, nodes, networks must be set, found pods, nodes"
    );
    let e = banp(
        "default",
        json!({"subject": pods, "ingress": [{"action": "Deny", "from": [{}]}]}),
    )
    .validate()
    .expect_err("refused");
    assert!(
        e.to_string()
            .starts_with("spec.ingress[0].from[0]: exactly one"),
        "{e}"
    );
}

#[test]
fn crds_are_upstreams_names_and_shape() {
    let anp = AdminNetworkPolicy::crd();
    assert_eq!(
        anp.metadata.name.as_deref(),
        Some("adminnetworkpolicies.policy.networking.k8s.io")
    );
    assert_eq!(anp.spec.scope, "Cluster");
    assert_eq!(
        anp.spec.names.short_names.as_deref(),
        Some(&["anp".to_owned()][..])
    );
    let banp = BaselineAdminNetworkPolicy::crd();
    assert_eq!(
        banp.metadata.name.as_deref(),
        Some("baselineadminnetworkpolicies.policy.networking.k8s.io")
    );
    assert_eq!(banp.spec.scope, "Cluster");
    let v = serde_json::to_value(&banp).expect("value");
    let schema = &v["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    assert_eq!(
        schema["x-kubernetes-validations"][0]["rule"],
        "self.metadata.name == 'default'"
    );
    let spec = &schema["properties"]["spec"]["properties"];
    assert_eq!(spec["subject"]["maxProperties"], 1);
    assert_eq!(
        spec["ingress"]["items"]["properties"]["action"]["enum"],
        json!(["Allow", "Deny"])
    );
    let v = serde_json::to_value(&anp).expect("value");
    let spec = &v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert_eq!(spec["required"], json!(["priority", "subject"]));
    assert_eq!(spec["properties"]["priority"]["maximum"], 1000.0);
    assert_eq!(
        spec["properties"]["egress"]["items"]["properties"]["action"]["enum"],
        json!(["Allow", "Deny", "Pass"])
    );
    assert_eq!(
        spec["properties"]["egress"]["items"]["required"],
        json!(["action", "to"])
    );
}
