//! `AdminNetworkPolicy` and `BaselineAdminNetworkPolicy`, `policy.networking.k8s.io/v1alpha1` of the
//! network-policy-api project (kubernetes-sigs/network-policy-api v0.1.7, `apis/v1alpha1/`), with its field
//! names: the cluster administrator's policies, judged before (ANP, by priority) and after (the one BANP,
//! named `default`) the namespaces' NetworkPolicies.
//!
//! Upstream's one-of objects (a subject, a peer, a port: exactly one field set) stay structs of options, as
//! the API server stores them, so an object that breaks the rule still decodes and can be refused where the
//! user looks. [`AdminNetworkPolicy::validate`] and [`BaselineAdminNetworkPolicy::validate`] check what the
//! schema cannot say; the accessors ([`AdminNetworkPolicySubject::selection`],
//! [`AdminNetworkPolicyIngressPeer::selection`], [`AdminNetworkPolicyEgressPeer::selection`],
//! [`AdminNetworkPolicyPort::selection`]) hand the one field that is set as a Rust enum. CIDRs stay strings
//! (parse them at the edge; `validate` checks they parse).

use ipnetwork::IpNetwork;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    label_selector_schema, null_default, required_label_selector_schema, Condition,
};
use super::conditions::Conditions;
use crate::error::{AnpError, OneOfError};

/// The API group of the admin network policies.
pub const POLICY_GROUP: &str = "policy.networking.k8s.io";
/// The API version of the admin network policies here.
pub const POLICY_VERSION: &str = "v1alpha1";
/// The highest `spec.priority` the API allows.
pub const MAX_API_PRIORITY: i32 = 1000;
/// The highest `spec.priority` accepted here: priorities map onto OVN ACL priorities `30000 - 100 * priority
/// - rule index` (Kube-OVN's mapping), which leaves room for 0..=99 above NetworkPolicy's band.
pub const MAX_PRIORITY: i32 = 99;
/// Rules per direction of one policy (upstream's limit; one ACL priority each in the policy's band).
pub const MAX_RULES: usize = 100;
/// Peers of one rule.
pub const MAX_PEERS: usize = 100;
/// Port entries of one rule.
pub const MAX_PORTS: usize = 100;
/// CIDRs (or domain names) of one `networks` (`domainNames`) peer.
pub const MAX_NETWORKS: usize = 25;
/// Characters of a rule's name.
pub const MAX_RULE_NAME: usize = 100;
/// The name of the only `BaselineAdminNetworkPolicy` the API allows.
pub const BASELINE_NAME: &str = "default";

/// What an `AdminNetworkPolicy` rule does with the traffic it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum AdminNetworkPolicyRuleAction {
    /// Allowed, whatever NetworkPolicies and the baseline say.
    Allow,
    /// Dropped before NetworkPolicies and the baseline are looked at.
    Deny,
    /// Skips the remaining admin policy rules: NetworkPolicies (else the baseline) decide.
    Pass,
}

/// What a `BaselineAdminNetworkPolicy` rule does with the traffic it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum BaselineAdminNetworkPolicyRuleAction {
    /// Allowed (unless an admin policy or a NetworkPolicy decided before).
    Allow,
    /// Dropped (unless an admin policy or a NetworkPolicy decided before).
    Deny,
}

/// Transport protocol of a port entry (Kubernetes' `v1.Protocol`); TCP when absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum PortProtocol {
    /// TCP.
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
    /// UDP.
    #[serde(rename = "UDP")]
    Udp,
    /// SCTP.
    #[serde(rename = "SCTP")]
    Sctp,
}

/// Spec of an `AdminNetworkPolicy`, with upstream's field names.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "policy.networking.k8s.io",
    version = "v1alpha1",
    kind = "AdminNetworkPolicy",
    plural = "adminnetworkpolicies",
    shortname = "anp",
    status = "AdminNetworkPolicyStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "An AdminNetworkPolicy: cluster-wide rules judged by priority before any NetworkPolicy",
    printcolumn = r#"{"name":"Priority","type":"string","jsonPath":".spec.priority"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct AdminNetworkPolicySpec {
    /// 0..=1000 in the API (0..=[`MAX_PRIORITY`] accepted here); lower values are judged first.
    #[schemars(range(min = 0, max = 1000))]
    pub priority: i32,
    /// The pods the policy applies to.
    pub subject: AdminNetworkPolicySubject,
    /// Rules on traffic to the subject's pods, the first matching one deciding.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(length(max = 100))]
    pub ingress: Vec<AdminNetworkPolicyIngressRule>,
    /// Rules on traffic from the subject's pods, the first matching one deciding.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(length(max = 100))]
    pub egress: Vec<AdminNetworkPolicyEgressRule>,
}

/// Status of an `AdminNetworkPolicy`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdminNetworkPolicyStatus {
    /// Conditions written by the controller.
    #[serde(default, deserialize_with = "null_default")]
    pub conditions: Vec<Condition>,
}

/// Spec of the `BaselineAdminNetworkPolicy` (one per cluster, named `default`), with upstream's field names.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "policy.networking.k8s.io",
    version = "v1alpha1",
    kind = "BaselineAdminNetworkPolicy",
    plural = "baselineadminnetworkpolicies",
    shortname = "banp",
    status = "BaselineAdminNetworkPolicyStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "The BaselineAdminNetworkPolicy: cluster-wide default rules judged after every NetworkPolicy",
    validation = kube::core::Rule::new("self.metadata.name == 'default'").message(
        "Only one baseline admin network policy with metadata.name=\"default\" can be created in the cluster"
    ),
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct BaselineAdminNetworkPolicySpec {
    /// The pods the policy applies to.
    pub subject: AdminNetworkPolicySubject,
    /// Rules on traffic to the subject's pods, the first matching one deciding.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(length(max = 100))]
    pub ingress: Vec<BaselineAdminNetworkPolicyIngressRule>,
    /// Rules on traffic from the subject's pods, the first matching one deciding.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(length(max = 100))]
    pub egress: Vec<BaselineAdminNetworkPolicyEgressRule>,
}

/// Status of the `BaselineAdminNetworkPolicy`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BaselineAdminNetworkPolicyStatus {
    /// Conditions written by the controller.
    #[serde(default, deserialize_with = "null_default")]
    pub conditions: Vec<Condition>,
}

/// The pods a policy applies to: exactly one of `namespaces` and `pods` (see [`Self::selection`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1, "maxProperties" = 1))]
pub struct AdminNetworkPolicySubject {
    /// Every pod of the namespaces this selects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "label_selector_schema")]
    pub namespaces: Option<LabelSelector>,
    /// The pods this selects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<NamespacedPod>,
}

/// Pods by their labels in namespaces by theirs (an empty selector selects all).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespacedPod {
    /// The namespaces.
    #[schemars(schema_with = "required_label_selector_schema")]
    pub namespace_selector: LabelSelector,
    /// The pods in those namespaces.
    #[schemars(schema_with = "required_label_selector_schema")]
    pub pod_selector: LabelSelector,
}

/// An `AdminNetworkPolicy` rule on traffic to the subject.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdminNetworkPolicyIngressRule {
    /// Name of the rule, for people and logs.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    #[schemars(length(max = 100))]
    pub name: String,
    /// What is done with matching traffic.
    pub action: AdminNetworkPolicyRuleAction,
    /// Sources the rule matches (any of them).
    #[schemars(length(min = 1, max = 100))]
    pub from: Vec<AdminNetworkPolicyIngressPeer>,
    /// Destination ports on the subject the rule matches (any of them); `None`: every port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub ports: Option<Vec<AdminNetworkPolicyPort>>,
}

/// An `AdminNetworkPolicy` rule on traffic from the subject.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdminNetworkPolicyEgressRule {
    /// Name of the rule, for people and logs.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    #[schemars(length(max = 100))]
    pub name: String,
    /// What is done with matching traffic.
    pub action: AdminNetworkPolicyRuleAction,
    /// Destinations the rule matches (any of them).
    #[schemars(length(min = 1, max = 100))]
    pub to: Vec<AdminNetworkPolicyEgressPeer>,
    /// Destination ports the rule matches (any of them); `None`: every port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub ports: Option<Vec<AdminNetworkPolicyPort>>,
}

/// A `BaselineAdminNetworkPolicy` rule on traffic to the subject.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BaselineAdminNetworkPolicyIngressRule {
    /// Name of the rule, for people and logs.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    #[schemars(length(max = 100))]
    pub name: String,
    /// What is done with matching traffic.
    pub action: BaselineAdminNetworkPolicyRuleAction,
    /// Sources the rule matches (any of them).
    #[schemars(length(min = 1, max = 100))]
    pub from: Vec<AdminNetworkPolicyIngressPeer>,
    /// Destination ports on the subject the rule matches (any of them); `None`: every port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub ports: Option<Vec<AdminNetworkPolicyPort>>,
}

/// A `BaselineAdminNetworkPolicy` rule on traffic from the subject.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BaselineAdminNetworkPolicyEgressRule {
    /// Name of the rule, for people and logs.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    #[schemars(length(max = 100))]
    pub name: String,
    /// What is done with matching traffic.
    pub action: BaselineAdminNetworkPolicyRuleAction,
    /// Destinations the rule matches (any of them).
    #[schemars(length(min = 1, max = 100))]
    pub to: Vec<BaselineAdminNetworkPolicyEgressPeer>,
    /// Destination ports the rule matches (any of them); `None`: every port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub ports: Option<Vec<AdminNetworkPolicyPort>>,
}

/// A source of ingress traffic: exactly one of `namespaces` and `pods` (see [`Self::selection`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1, "maxProperties" = 1))]
pub struct AdminNetworkPolicyIngressPeer {
    /// Every pod of the namespaces this selects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "label_selector_schema")]
    pub namespaces: Option<LabelSelector>,
    /// The pods this selects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<NamespacedPod>,
}

/// A destination of an `AdminNetworkPolicy`'s egress traffic: exactly one field set (see
/// [`Self::selection`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1, "maxProperties" = 1))]
pub struct AdminNetworkPolicyEgressPeer {
    /// Every pod of the namespaces this selects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "label_selector_schema")]
    pub namespaces: Option<LabelSelector>,
    /// The pods this selects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<NamespacedPod>,
    /// The addresses (`status.addresses`) of the nodes this selects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "label_selector_schema")]
    pub nodes: Option<LabelSelector>,
    /// CIDRs (`10.0.0.0/8`, `fd00::/8`), cluster addresses included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 25))]
    pub networks: Option<Vec<String>>,
    /// Domain names (`kubernetes.io`, `*.kubernetes.io`); Allow rules only (upstream's experimental channel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 25))]
    pub domain_names: Option<Vec<String>>,
}

/// A destination of the `BaselineAdminNetworkPolicy`'s egress traffic: exactly one field set (see
/// [`Self::selection`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1, "maxProperties" = 1))]
pub struct BaselineAdminNetworkPolicyEgressPeer {
    /// Every pod of the namespaces this selects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "label_selector_schema")]
    pub namespaces: Option<LabelSelector>,
    /// The pods this selects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<NamespacedPod>,
    /// The addresses (`status.addresses`) of the nodes this selects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "label_selector_schema")]
    pub nodes: Option<LabelSelector>,
    /// CIDRs (`10.0.0.0/8`, `fd00::/8`), cluster addresses included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 25))]
    pub networks: Option<Vec<String>>,
}

/// Ports a rule matches: exactly one of `portNumber`, `namedPort` and `portRange` (see [`Self::selection`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1, "maxProperties" = 1))]
pub struct AdminNetworkPolicyPort {
    /// One port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_number: Option<PortNumber>,
    /// A container port by name, resolved on each destination pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub named_port: Option<String>,
    /// A range of ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_range: Option<PortRange>,
}

/// One port (upstream's `Port`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortNumber {
    /// Protocol; TCP when absent.
    #[serde(default)]
    pub protocol: PortProtocol,
    /// The port, 1..=65535.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
}

/// Ports `start..=end`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortRange {
    /// Protocol; TCP when absent.
    #[serde(default)]
    pub protocol: PortProtocol,
    /// First port, 1..=65535.
    #[schemars(range(min = 1, max = 65535))]
    pub start: u16,
    /// Last port, `start..=65535`.
    #[schemars(range(min = 1, max = 65535))]
    pub end: u16,
}

/// The one selector of a subject or an ingress peer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PodSelection<'a> {
    /// Every pod of the namespaces the selector matches.
    Namespaces(&'a LabelSelector),
    /// The pods matched in the namespaces matched.
    Pods(&'a NamespacedPod),
}

/// The one selector of an egress peer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EgressSelection<'a> {
    /// Every pod of the namespaces the selector matches.
    Namespaces(&'a LabelSelector),
    /// The pods matched in the namespaces matched.
    Pods(&'a NamespacedPod),
    /// The addresses of the nodes the selector matches.
    Nodes(&'a LabelSelector),
    /// CIDRs, as written (checked by `validate`).
    Networks(&'a [String]),
    /// Domain names, as written.
    DomainNames(&'a [String]),
}

/// The one kind of a port entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortSelection<'a> {
    /// One port.
    Number(&'a PortNumber),
    /// A container port by name.
    Named(&'a str),
    /// A range of ports.
    Range(&'a PortRange),
}

/// The one `Some` of `set`, else the names of those set.
fn exactly_one<T, const N: usize>(
    expected: &'static str,
    set: [(&'static str, Option<T>); N],
) -> Result<T, OneOfError> {
    let found: Vec<&'static str> = set
        .iter()
        .filter(|(_, v)| v.is_some())
        .map(|(n, _)| *n)
        .collect();
    if found.len() != 1 {
        return Err(OneOfError { expected, found });
    }
    set.into_iter()
        .find_map(|(_, v)| v)
        .ok_or(OneOfError { expected, found })
}

const POD_PEER_FIELDS: &str = "namespaces, pods";

fn pod_selection<'a>(
    namespaces: &'a Option<LabelSelector>,
    pods: &'a Option<NamespacedPod>,
) -> Result<PodSelection<'a>, OneOfError> {
    exactly_one(
        POD_PEER_FIELDS,
        [
            (
                "namespaces",
                namespaces.as_ref().map(PodSelection::Namespaces),
            ),
            ("pods", pods.as_ref().map(PodSelection::Pods)),
        ],
    )
}

impl AdminNetworkPolicySubject {
    /// The one selector set, else which are.
    pub fn selection(&self) -> Result<PodSelection<'_>, OneOfError> {
        pod_selection(&self.namespaces, &self.pods)
    }
}

impl AdminNetworkPolicyIngressPeer {
    /// The one selector set, else which are.
    pub fn selection(&self) -> Result<PodSelection<'_>, OneOfError> {
        pod_selection(&self.namespaces, &self.pods)
    }
}

impl AdminNetworkPolicyEgressPeer {
    /// The one peer kind set, else which are.
    pub fn selection(&self) -> Result<EgressSelection<'_>, OneOfError> {
        exactly_one(
            "namespaces, pods, nodes, networks, domainNames",
            [
                (
                    "namespaces",
                    self.namespaces.as_ref().map(EgressSelection::Namespaces),
                ),
                ("pods", self.pods.as_ref().map(EgressSelection::Pods)),
                ("nodes", self.nodes.as_ref().map(EgressSelection::Nodes)),
                (
                    "networks",
                    self.networks.as_deref().map(EgressSelection::Networks),
                ),
                (
                    "domainNames",
                    self.domain_names
                        .as_deref()
                        .map(EgressSelection::DomainNames),
                ),
            ],
        )
    }
}

impl BaselineAdminNetworkPolicyEgressPeer {
    /// The one peer kind set, else which are.
    pub fn selection(&self) -> Result<EgressSelection<'_>, OneOfError> {
        exactly_one(
            "namespaces, pods, nodes, networks",
            [
                (
                    "namespaces",
                    self.namespaces.as_ref().map(EgressSelection::Namespaces),
                ),
                ("pods", self.pods.as_ref().map(EgressSelection::Pods)),
                ("nodes", self.nodes.as_ref().map(EgressSelection::Nodes)),
                (
                    "networks",
                    self.networks.as_deref().map(EgressSelection::Networks),
                ),
            ],
        )
    }
}

impl AdminNetworkPolicyPort {
    /// The one kind set, else which are.
    pub fn selection(&self) -> Result<PortSelection<'_>, OneOfError> {
        exactly_one(
            "portNumber, namedPort, portRange",
            [
                (
                    "portNumber",
                    self.port_number.as_ref().map(PortSelection::Number),
                ),
                (
                    "namedPort",
                    self.named_port.as_deref().map(PortSelection::Named),
                ),
                (
                    "portRange",
                    self.port_range.as_ref().map(PortSelection::Range),
                ),
            ],
        )
    }
}

/// `Err` when `count` exceeds `max`.
fn at_most(field: impl Fn() -> String, count: usize, max: usize) -> Result<(), AnpError> {
    if count > max {
        return Err(AnpError::TooMany {
            field: field(),
            count,
            max,
        });
    }
    Ok(())
}

/// `Err` when the list is empty or longer than `max`.
fn list(field: impl Fn() -> String, count: usize, max: usize) -> Result<(), AnpError> {
    if count == 0 {
        return Err(AnpError::Empty { field: field() });
    }
    at_most(field, count, max)
}

fn one_of(field: String) -> impl FnOnce(OneOfError) -> AnpError {
    move |error| AnpError::OneOf { field, error }
}

/// A rule's name and ports (the parts every rule kind shares); `no_named_ports` when a peer has none.
fn check_rule_common(
    field: &str,
    name: &str,
    ports: Option<&[AdminNetworkPolicyPort]>,
    no_named_ports: bool,
) -> Result<(), AnpError> {
    let len = name.chars().count();
    if len > MAX_RULE_NAME {
        return Err(AnpError::NameTooLong {
            field: format!("{field}.name"),
            len,
            max: MAX_RULE_NAME,
        });
    }
    let Some(ports) = ports else {
        return Ok(());
    };
    list(|| format!("{field}.ports"), ports.len(), MAX_PORTS)?;
    for (i, p) in ports.iter().enumerate() {
        let at = || format!("{field}.ports[{i}]");
        match p.selection().map_err(one_of(at()))? {
            PortSelection::Number(n) if n.port == 0 => {
                return Err(AnpError::PortZero { field: at() })
            }
            PortSelection::Range(r) if r.start == 0 || r.end == 0 => {
                return Err(AnpError::PortZero { field: at() })
            }
            PortSelection::Range(r) if r.start > r.end => {
                return Err(AnpError::PortRange {
                    field: at(),
                    start: r.start,
                    end: r.end,
                })
            }
            PortSelection::Named("") => return Err(AnpError::EmptyNamedPort { field: at() }),
            PortSelection::Named(_) if no_named_ports => {
                return Err(AnpError::NamedPortPeer {
                    field: field.to_owned(),
                })
            }
            _ => {}
        }
    }
    Ok(())
}

/// An ingress rule's peers, name and ports.
fn check_ingress_rule(
    field: &str,
    name: &str,
    from: &[AdminNetworkPolicyIngressPeer],
    ports: Option<&[AdminNetworkPolicyPort]>,
) -> Result<(), AnpError> {
    list(|| format!("{field}.from"), from.len(), MAX_PEERS)?;
    for (j, p) in from.iter().enumerate() {
        p.selection()
            .map_err(one_of(format!("{field}.from[{j}]")))?;
    }
    check_rule_common(field, name, ports, false)
}

/// An egress rule's peers (already selected), name and ports; `allow`: whether the action is Allow.
fn check_egress_rule<'a>(
    field: &str,
    name: &str,
    to: impl ExactSizeIterator<Item = Result<EgressSelection<'a>, OneOfError>>,
    ports: Option<&[AdminNetworkPolicyPort]>,
    allow: bool,
) -> Result<(), AnpError> {
    list(|| format!("{field}.to"), to.len(), MAX_PEERS)?;
    let mut no_named_ports = false;
    for (j, p) in to.enumerate() {
        let at = format!("{field}.to[{j}]");
        match p.map_err(one_of(at.clone()))? {
            EgressSelection::Namespaces(_) | EgressSelection::Pods(_) => {}
            EgressSelection::Nodes(_) => no_named_ports = true,
            EgressSelection::Networks(nets) => {
                no_named_ports = true;
                list(|| format!("{at}.networks"), nets.len(), MAX_NETWORKS)?;
                for (k, n) in nets.iter().enumerate() {
                    if !is_cidr(n) {
                        return Err(AnpError::Cidr {
                            field: format!("{at}.networks[{k}]"),
                            value: n.clone(),
                        });
                    }
                }
            }
            EgressSelection::DomainNames(names) => {
                no_named_ports = true;
                list(|| format!("{at}.domainNames"), names.len(), MAX_NETWORKS)?;
                if !allow {
                    return Err(AnpError::DomainNamesNotAllow {
                        field: field.to_owned(),
                    });
                }
            }
        }
    }
    check_rule_common(field, name, ports, no_named_ports)
}

/// Whether `s` is `address/prefix` (a bare address is not a CIDR to the API server's `isCIDR`).
fn is_cidr(s: &str) -> bool {
    s.contains('/') && s.parse::<IpNetwork>().is_ok()
}

impl AdminNetworkPolicySpec {
    /// Checks what the CRD schema cannot say (one field per one-of object, named ports only towards pods,
    /// CIDRs that parse), what a server that skips the schema let through (lengths, ports), and the
    /// priorities accepted here (0..=[`MAX_PRIORITY`]).
    pub fn validate(&self) -> Result<(), AnpError> {
        if !(0..=MAX_PRIORITY).contains(&self.priority) {
            return Err(AnpError::Priority {
                priority: self.priority,
                max: MAX_PRIORITY,
            });
        }
        self.subject
            .selection()
            .map_err(one_of("spec.subject".to_owned()))?;
        at_most(|| "spec.ingress".to_owned(), self.ingress.len(), MAX_RULES)?;
        at_most(|| "spec.egress".to_owned(), self.egress.len(), MAX_RULES)?;
        for (i, r) in self.ingress.iter().enumerate() {
            let field = format!("spec.ingress[{i}]");
            check_ingress_rule(&field, &r.name, &r.from, r.ports.as_deref())?;
        }
        for (i, r) in self.egress.iter().enumerate() {
            let field = format!("spec.egress[{i}]");
            let to = r.to.iter().map(AdminNetworkPolicyEgressPeer::selection);
            let allow = r.action == AdminNetworkPolicyRuleAction::Allow;
            check_egress_rule(&field, &r.name, to, r.ports.as_deref(), allow)?;
        }
        Ok(())
    }
}

impl AdminNetworkPolicy {
    /// See [`AdminNetworkPolicySpec::validate`].
    pub fn validate(&self) -> Result<(), AnpError> {
        self.spec.validate()
    }
}

impl BaselineAdminNetworkPolicySpec {
    /// Checks what the CRD schema cannot say (one field per one-of object, named ports only towards pods,
    /// CIDRs that parse) and what a server that skips the schema let through (lengths, ports).
    pub fn validate(&self) -> Result<(), AnpError> {
        self.subject
            .selection()
            .map_err(one_of("spec.subject".to_owned()))?;
        at_most(|| "spec.ingress".to_owned(), self.ingress.len(), MAX_RULES)?;
        at_most(|| "spec.egress".to_owned(), self.egress.len(), MAX_RULES)?;
        for (i, r) in self.ingress.iter().enumerate() {
            let field = format!("spec.ingress[{i}]");
            check_ingress_rule(&field, &r.name, &r.from, r.ports.as_deref())?;
        }
        for (i, r) in self.egress.iter().enumerate() {
            let field = format!("spec.egress[{i}]");
            let to =
                r.to.iter()
                    .map(BaselineAdminNetworkPolicyEgressPeer::selection);
            check_egress_rule(&field, &r.name, to, r.ports.as_deref(), true)?;
        }
        Ok(())
    }
}

impl BaselineAdminNetworkPolicy {
    /// The name (only [`BASELINE_NAME`] is allowed), then [`BaselineAdminNetworkPolicySpec::validate`].
    pub fn validate(&self) -> Result<(), AnpError> {
        let name = self.metadata.name.as_deref().unwrap_or_default();
        if name != BASELINE_NAME {
            return Err(AnpError::BaselineName {
                name: name.to_owned(),
            });
        }
        self.spec.validate()
    }
}

impl Conditions for AdminNetworkPolicyStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.conditions
    }
}

impl Conditions for BaselineAdminNetworkPolicyStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.conditions
    }
}

#[cfg(test)]
#[path = "anp_tests.rs"]
mod tests;
