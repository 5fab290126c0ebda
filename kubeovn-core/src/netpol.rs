//! Network policies as OVN ACLs, pure (no I/O, no OVN types): which pods a policy isolates, the sets of pods
//! its rules name, and its ACLs' matches. The controller keeps the sets' members in northbound port groups
//! and address sets shared by every policy naming the same selector, so a pod's label change touches the
//! few sets whose membership changes and no policy is translated again.
//!
//! ```
//! use std::collections::BTreeSet;
//! use k8s_openapi::api::networking::v1::NetworkPolicy;
//! use kubeovn_core::netpol::{self, Families};
//! let np: NetworkPolicy = serde_json::from_value(serde_json::json!({
//!     "metadata": {"name": "web", "namespace": "shop"},
//!     "spec": {"podSelector": {"matchLabels": {"app": "web"}},
//!              "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "lb"}}}],
//!                           "ports": [{"port": 80}]}]}})).unwrap();
//! let t = netpol::network_policy(&np, Families::V4, &|_: &_, _, _: &str| BTreeSet::new()).unwrap();
//! assert_eq!(t.owner, "NetworkPolicy/shop/web");
//! assert_eq!(t.acls.len(), 1);
//! assert!(t.acls[0].match_.ends_with("&& tcp.dst == 80"));
//! ```
//!
//! OVN 23.03 has no ACL tiers: the layers are priority bands, highest first: the nodes' own traffic to
//! pods ([`NODE_ALLOW_PRIORITY`]), admin policies ([`ANP_MAX_PRIORITY`] down), Subnet ACLs, NetworkPolicy
//! ([`NP_ALLOW_PRIORITY`], [`NP_DENY_PRIORITY`]), baseline admin policy ([`BANP_MAX_PRIORITY`] down).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use ipnetwork::IpNetwork;
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

pub use crate::selector::{Requirement, Selector, SelectorError};

/// The `external_ids` key naming an ACL's owner (`NetworkPolicy/<ns>/<name>`, `Namespace/<ns>`, ...).
pub const OWNER_KEY: &str = "policy";
/// The `external_ids` key holding a set's selector, in words.
pub const SELECTOR_KEY: &str = "selector";
/// Nodes reach their pods whatever the policies (kubelet probes).
pub const NODE_ALLOW_PRIORITY: i64 = 31000;
/// The highest admin network policy ACL: `30000 - 100 * priority - rule index`.
pub const ANP_MAX_PRIORITY: i64 = 30000;
/// The highest admin network policy priority accepted (rules then stay above Subnet ACLs).
pub const ANP_MAX_SPEC_PRIORITY: i32 = 99;
/// NetworkPolicy allows.
pub const NP_ALLOW_PRIORITY: i64 = 2001;
/// The default deny of pods a NetworkPolicy isolates.
pub const NP_DENY_PRIORITY: i64 = 2000;
/// The highest baseline admin network policy ACL: `1750 - rule index`.
pub const BANP_MAX_PRIORITY: i64 = 1750;
/// A private Subnet's drop of everything else (below NetworkPolicy, above the baseline admin policy, as
/// Kube-OVN's tiers order them).
pub const SUBNET_DROP_PRIORITY: i64 = 1800;
/// A private Subnet's allows: its own block, `allowSubnets`, the nodes.
pub const SUBNET_ALLOW_PRIORITY: i64 = 1801;
/// `allowEWTraffic`: the subnet's own block passes its `acls`.
pub const SUBNET_EW_PRIORITY: i64 = 1900;
/// Annotation: log this policy's ACLs (`"true"`).
pub const ENABLE_LOG: &str = "ovn.kubernetes.io/enable_log";
/// Annotation: which verdicts are logged (`allow`, `drop`, comma separated; default `drop`).
pub const LOG_ACL_ACTIONS: &str = "ovn.kubernetes.io/log_acl_actions";
/// Annotation: the most log lines per second (an OVN meter).
pub const ACL_LOG_METER_RATE: &str = "ovn.kubernetes.io/acl_log_meter_rate";

/// A direction of traffic, seen from the selected pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// To the pods (`to-lport`).
    Ingress,
    /// From the pods (`from-lport`, after load balancing).
    Egress,
}

impl Direction {
    /// `ingress` or `egress`.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
    /// The port field naming the selected pod (`outport` for ingress).
    fn port_field(self) -> &'static str {
        match self {
            Direction::Ingress => "outport",
            Direction::Egress => "inport",
        }
    }
    /// The address field naming the peer (`src` for ingress).
    fn peer_side(self) -> &'static str {
        match self {
            Direction::Ingress => "src",
            Direction::Egress => "dst",
        }
    }
}

/// A transport protocol of a policy port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP (the default).
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// From Kubernetes' spelling (`TCP`); None for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }
    /// OVN's field prefix (`tcp`).
    pub fn ovn(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// The address families a cluster's pods have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Families {
    /// IPv4 only.
    V4,
    /// IPv6 only.
    V6,
    /// Both.
    Dual,
}

impl Families {
    fn has_v4(self) -> bool {
        self != Families::V6
    }
    fn has_v6(self) -> bool {
        self != Families::V4
    }
}

/// Pods chosen by selectors.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pods {
    /// The pods of one namespace its selector matches.
    In {
        /// Namespace.
        namespace: String,
        /// Pod selector.
        pods: Selector,
    },
    /// The pods its selector matches in the namespaces the other selector matches.
    Across {
        /// Namespace selector.
        namespaces: Selector,
        /// Pod selector.
        pods: Selector,
    },
}

impl Pods {
    /// Whether a pod of namespace `ns` (labelled `ns_labels`) labelled `labels` is one of them.
    pub fn matches(
        &self,
        ns: &str,
        ns_labels: &BTreeMap<String, String>,
        labels: &BTreeMap<String, String>,
    ) -> bool {
        match self {
            Pods::In { namespace, pods } => namespace == ns && pods.matches(labels),
            Pods::Across { namespaces, pods } => {
                namespaces.matches(ns_labels) && pods.matches(labels)
            }
        }
    }
}

impl fmt::Display for Pods {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pods::In { namespace, pods } => write!(f, "namespace {namespace} pods {pods}"),
            Pods::Across { namespaces, pods } => {
                write!(f, "namespaces {namespaces} pods {pods}")
            }
        }
    }
}

/// A named container port resolved to one number.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamedPort {
    /// Protocol.
    pub protocol: Protocol,
    /// The name.
    pub name: String,
    /// The number it resolves to.
    pub number: u16,
}

/// Who a set holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Members {
    /// Pods (their ports or addresses).
    Pods(Pods),
    /// The addresses of the nodes a selector matches (admin policies' egress peers).
    Nodes(Selector),
}

/// How a set is kept in OVN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Form {
    /// A port group of the pods' switch ports (`@name`): who a policy applies to.
    PortGroup,
    /// Address sets of the members' addresses, one per family (`$name_ip4`): peers.
    AddressSet,
}

/// A set of pods (or nodes) the controller keeps in NB, shared by every policy naming it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SetKey {
    /// Who.
    pub members: Members,
    /// Only the pods whose container port of this name resolves to this number.
    pub port: Option<NamedPort>,
    /// Port group or address sets.
    pub form: Form,
}

/// FNV-1a: stable across releases and platforms, so names survive a restart of a newer build.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl SetKey {
    /// A port group of `pods`.
    pub fn group(pods: Pods) -> Self {
        SetKey {
            members: Members::Pods(pods),
            port: None,
            form: Form::PortGroup,
        }
    }
    /// Address sets of `pods`.
    pub fn addresses(pods: Pods) -> Self {
        SetKey {
            members: Members::Pods(pods),
            port: None,
            form: Form::AddressSet,
        }
    }
    /// The set, in words (its `external_ids:selector`).
    pub fn text(&self) -> String {
        let mut s = match &self.members {
            Members::Pods(p) => p.to_string(),
            Members::Nodes(n) => format!("nodes {n}"),
        };
        if let Some(p) = &self.port {
            s.push_str(&format!(
                " port {}/{}={}",
                p.protocol.ovn(),
                p.name,
                p.number
            ));
        }
        s
    }
    /// Its OVN name: `pg_<hash>` for a port group, `as_<hash>` for address sets (add [`Self::family`]'s
    /// suffix). Distinct prefixes: OVN names a port group's own address sets `<group>_ip4`.
    pub fn name(&self) -> String {
        let prefix = match self.form {
            Form::PortGroup => "pg",
            Form::AddressSet => "as",
        };
        format!("{prefix}_{:016x}", fnv(&self.text()))
    }
    /// The name of its address set of one family (`as_<hash>_ip4`).
    pub fn family(&self, v6: bool) -> String {
        format!("{}_{}", self.name(), if v6 { "ip6" } else { "ip4" })
    }
}

/// The port group of the pods of `ns` some policy isolates in `dir`: its drop ACL makes the isolation, and
/// every NetworkPolicy of `ns` hangs its allows on it (ovn-kubernetes' per-namespace default deny).
pub fn namespace_group(ns: &str, dir: Direction) -> String {
    // Namespace names are DNS labels: `-` is their only character OVN names cannot hold, `_` never in them.
    format!("np_{}_{}", ns.replace('-', "_"), dir.as_str())
}

/// A verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Allowed, with its replies (`allow-related`).
    Allow,
    /// Dropped.
    Deny,
}

/// One ACL of a translation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AclSpec {
    /// Direction.
    pub direction: Direction,
    /// Priority.
    pub priority: i64,
    /// The OVN match.
    pub match_: String,
    /// The verdict.
    pub verdict: Verdict,
    /// Whether matches are logged.
    pub log: bool,
}

/// What a policy asks about logging (Kube-OVN's annotations).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Logging {
    /// Log allowed connections.
    pub allow: bool,
    /// Log drops.
    pub drop: bool,
    /// The most log lines per second, if limited.
    pub rate: Option<i64>,
}

impl Logging {
    /// From a policy's annotations.
    pub fn from_annotations(a: &BTreeMap<String, String>) -> Self {
        if a.get(ENABLE_LOG).map(String::as_str) != Some("true") {
            return Logging::default();
        }
        let actions = a.get(LOG_ACL_ACTIONS).map_or("drop", String::as_str);
        let has = |x: &str| actions.split(',').any(|s| s.trim() == x);
        Logging {
            allow: has("allow"),
            drop: has("drop"),
            rate: a
                .get(ACL_LOG_METER_RATE)
                .and_then(|r| r.parse().ok())
                .filter(|r| *r > 0),
        }
    }
}

/// Resolves a named port among pods: the numbers `name`/`protocol` resolves to in their containers.
pub trait PortNames {
    /// The numbers.
    fn numbers(&self, pods: &Pods, protocol: Protocol, name: &str) -> BTreeSet<u16>;
}

impl<F: Fn(&Pods, Protocol, &str) -> BTreeSet<u16>> PortNames for F {
    fn numbers(&self, pods: &Pods, protocol: Protocol, name: &str) -> BTreeSet<u16> {
        self(pods, protocol, name)
    }
}

/// A NetworkPolicy (or admin policy) translated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Translation {
    /// The owner (`NetworkPolicy/<ns>/<name>`), the ACLs' `external_ids:policy`.
    pub owner: String,
    /// The pods it applies to, and the directions it isolates them in.
    pub isolates: Vec<(Direction, Pods)>,
    /// Its ACLs.
    pub acls: Vec<AclSpec>,
    /// The sets its ACLs name.
    pub sets: BTreeSet<SetKey>,
    /// The named ports it resolved (it is translated again when their numbers change).
    pub named: BTreeSet<(Pods, Protocol, String)>,
    /// Logging.
    pub logging: Logging,
    /// What could not be translated as asked (each left out, closed: an allow is dropped, never widened).
    pub problems: Vec<String>,
    /// The port group its ACLs hang on, for an admin policy (its subject's; one of `sets`).
    pub parent: Option<SetKey>,
}

/// A policy that cannot be translated at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The selector of the pods it applies to is invalid.
    #[error("{0}: the pod selector: {1}")]
    Subject(String, SelectorError),
    /// A required field is missing.
    #[error("{0}: {1} is missing")]
    Missing(String, &'static str),
}

/// One peer's part of a match, or a reason to leave the peer out.
enum Peer {
    /// Anyone.
    Any,
    /// Pods (address sets).
    Pods(Pods),
    /// Nodes (address sets).
    Nodes(Selector),
    /// A literal clause (CIDRs).
    Clause(String),
}

/// A port entry.
enum Port {
    /// Every port of the protocol.
    All(Protocol),
    /// A range (one number: `start == end`).
    Range(Protocol, u16, u16),
    /// A container port name.
    Named(Protocol, String),
}

/// The clause of `field` (`ip4.src`) being in `set`'s address sets, per family.
fn set_clause(fam: Families, side: &str, set: &SetKey) -> String {
    let mut parts = Vec::new();
    if fam.has_v4() {
        parts.push(format!("ip4.{side} == ${}", set.family(false)));
    }
    if fam.has_v6() {
        parts.push(format!("ip6.{side} == ${}", set.family(true)));
    }
    or(parts)
}

/// `a || b` (parenthesised when more than one).
fn or(parts: Vec<String>) -> String {
    match parts.len() {
        1 => parts.into_iter().next().unwrap_or_default(),
        _ => format!("({})", parts.join(" || ")),
    }
}

/// The clause of a CIDR with its exceptions, on `side`; None (with a problem) if unparsable.
pub fn cidr_clause(
    side: &str,
    cidr: &str,
    except: &[String],
    problems: &mut Vec<String>,
) -> Option<String> {
    let Ok(net) = cidr.parse::<IpNetwork>() else {
        problems.push(format!("invalid CIDR {cidr:?}: peer left out"));
        return None;
    };
    let ip = if net.is_ipv4() { "ip4" } else { "ip6" };
    // OVN refuses host bits under the mask: use the network address.
    let norm = |n: IpNetwork| format!("{}/{}", n.network(), n.prefix());
    let mut out = format!("{ip}.{side} == {}", norm(net));
    let mut ex = Vec::new();
    for e in except {
        match e.parse::<IpNetwork>() {
            Ok(x) if x.is_ipv4() == net.is_ipv4() => ex.push(norm(x)),
            _ => {
                problems.push(format!("invalid except {e:?} of {cidr}: peer left out"));
                return None;
            }
        }
    }
    if !ex.is_empty() {
        out.push_str(&format!(" && {ip}.{side} != {{{}}}", ex.join(", ")));
    }
    Some(out)
}

/// One NetworkPolicy port entry.
fn np_port(p: &NetworkPolicyPort, problems: &mut Vec<String>) -> Option<Port> {
    let proto = match p.protocol.as_deref() {
        None => Protocol::Tcp,
        Some(s) => match Protocol::parse(s) {
            Some(p) => p,
            None => {
                problems.push(format!("unsupported protocol {s:?}: port left out"));
                return None;
            }
        },
    };
    match &p.port {
        None => Some(Port::All(proto)),
        Some(IntOrString::Int(n)) => {
            let end = p.end_port.unwrap_or(*n);
            match (u16::try_from(*n), u16::try_from(end)) {
                (Ok(a), Ok(b)) if a > 0 && a <= b => Some(Port::Range(proto, a, b)),
                _ => {
                    problems.push(format!("invalid port {n}..{end}: port left out"));
                    None
                }
            }
        }
        Some(IntOrString::String(s)) => match s.parse::<u16>() {
            Ok(n) if n > 0 => Some(Port::Range(proto, n, n)),
            _ => Some(Port::Named(proto, s.clone())),
        },
    }
}

/// `tcp.dst == 80`, `tcp.dst >= 80 && tcp.dst <= 90`, `tcp`.
fn port_clause(p: &Port) -> String {
    match p {
        Port::All(proto) => proto.ovn().to_owned(),
        Port::Range(proto, a, b) if a == b => format!("{}.dst == {a}", proto.ovn()),
        Port::Range(proto, a, b) => {
            let f = proto.ovn();
            format!("({f}.dst >= {a} && {f}.dst <= {b})")
        }
        Port::Named(..) => String::new(),
    }
}

/// Builds the ACLs of rules: the part every policy kind shares.
pub struct RuleBuilder<'a> {
    fam: Families,
    names: &'a dyn PortNames,
    /// The translation being built.
    pub out: Translation,
}

/// A rule in the kind-independent form.
pub struct Rule {
    /// Direction.
    pub direction: Direction,
    /// Who it applies to.
    pub subject: Pods,
    /// Peers (empty: anyone).
    pub peers: Vec<RulePeer>,
    /// Ports (empty: every port).
    pub ports: Vec<RulePort>,
    /// Priority.
    pub priority: i64,
    /// Verdict.
    pub verdict: Verdict,
}

/// A peer of a [`Rule`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RulePeer {
    /// Pods.
    Pods(Pods),
    /// Nodes (egress).
    Nodes(Selector),
    /// A CIDR with exceptions.
    Cidr(String, Vec<String>),
}

/// A port of a [`Rule`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RulePort {
    /// Every port of a protocol.
    All(Protocol),
    /// A range of numbers.
    Range(Protocol, u16, u16),
    /// A container port name.
    Named(Protocol, String),
}

impl<'a> RuleBuilder<'a> {
    /// A builder for `owner`'s translation.
    pub fn new(owner: String, fam: Families, names: &'a dyn PortNames) -> Self {
        RuleBuilder {
            fam,
            names,
            out: Translation {
                owner,
                ..Translation::default()
            },
        }
    }

    /// The matches of `r` (one per peer, and per peer and named-port number), without its priority and
    /// verdict: the ACLs.
    pub fn matches(&mut self, r: &Rule) -> Vec<String> {
        self.matches_as(r, false)
    }

    /// [`Self::matches`], the selected pods named by their addresses (the port group's own address sets,
    /// `$pg_<hash>_ip4`) when `by_address`: OVN refuses a negated `outport ==`, and a Pass is written as
    /// the negation of its matches in every later rule.
    pub fn matches_as(&mut self, r: &Rule, by_address: bool) -> Vec<String> {
        let dir = r.direction;
        let side = dir.peer_side();
        let subject = SetKey::group(r.subject.clone());
        let peers: Vec<Peer> = if r.peers.is_empty() {
            vec![Peer::Any]
        } else {
            r.peers
                .iter()
                .filter_map(|p| match p {
                    RulePeer::Pods(p) => Some(Peer::Pods(p.clone())),
                    RulePeer::Nodes(n) => Some(Peer::Nodes(n.clone())),
                    RulePeer::Cidr(c, ex) => {
                        cidr_clause(side, c, ex, &mut self.out.problems).map(Peer::Clause)
                    }
                })
                .collect()
        };
        let ports: Vec<Port> = r
            .ports
            .iter()
            .map(|p| match p {
                RulePort::All(x) => Port::All(*x),
                RulePort::Range(x, a, b) => Port::Range(*x, *a, *b),
                RulePort::Named(x, n) => Port::Named(*x, n.clone()),
            })
            .collect();
        let numbered: Vec<String> = ports
            .iter()
            .filter(|p| !matches!(p, Port::Named(..)))
            .map(port_clause)
            .collect();
        let named: Vec<(Protocol, &str)> = ports
            .iter()
            .filter_map(|p| match p {
                Port::Named(x, n) => Some((*x, n.as_str())),
                _ => None,
            })
            .collect();
        let mut out = Vec::new();
        let own_side = match dir {
            Direction::Ingress => "dst",
            Direction::Egress => "src",
        };
        let me_of = |g: &SetKey| {
            if by_address {
                set_clause(self.fam, own_side, g)
            } else {
                format!("{} == @{}", dir.port_field(), g.name())
            }
        };
        let me = me_of(&subject);
        let mut used_subject = false;
        for peer in &peers {
            let peer_clause = match peer {
                Peer::Any => None,
                Peer::Pods(p) => {
                    let s = SetKey::addresses(p.clone());
                    let c = set_clause(self.fam, side, &s);
                    self.out.sets.insert(s);
                    Some(c)
                }
                Peer::Nodes(n) => {
                    let s = SetKey {
                        members: Members::Nodes(n.clone()),
                        port: None,
                        form: Form::AddressSet,
                    };
                    let c = set_clause(self.fam, side, &s);
                    self.out.sets.insert(s);
                    Some(c)
                }
                Peer::Clause(c) => Some(c.clone()),
            };
            if ports.is_empty() || !numbered.is_empty() {
                let mut m = vec![me.clone()];
                m.extend(peer_clause.clone());
                if !numbered.is_empty() {
                    m.push(or(numbered.clone()));
                }
                used_subject = true;
                out.push(m.join(" && "));
            }
            for (proto, name) in &named {
                // Ingress: the selected pods whose port resolves to the number; egress: such peers.
                let pods = match (dir, peer) {
                    (Direction::Ingress, _) => r.subject.clone(),
                    (Direction::Egress, Peer::Pods(p)) => p.clone(),
                    (Direction::Egress, Peer::Any) => Pods::Across {
                        namespaces: Selector::everything(),
                        pods: Selector::everything(),
                    },
                    // A name means nothing for addresses outside pods: no match.
                    (Direction::Egress, _) => continue,
                };
                self.out
                    .named
                    .insert((pods.clone(), *proto, (*name).to_owned()));
                for number in self.names.numbers(&pods, *proto, name) {
                    let np = NamedPort {
                        protocol: *proto,
                        name: (*name).to_owned(),
                        number,
                    };
                    let m = match dir {
                        Direction::Ingress => {
                            let g = SetKey {
                                members: Members::Pods(pods.clone()),
                                port: Some(np),
                                form: Form::PortGroup,
                            };
                            let mut m = vec![me_of(&g)];
                            self.out.sets.insert(g);
                            m.extend(peer_clause.clone());
                            m
                        }
                        Direction::Egress => {
                            let s = SetKey {
                                members: Members::Pods(pods.clone()),
                                port: Some(np),
                                form: Form::AddressSet,
                            };
                            let c = set_clause(self.fam, "dst", &s);
                            self.out.sets.insert(s);
                            used_subject = true;
                            vec![me.clone(), c]
                        }
                    };
                    let mut m = m;
                    m.push(format!("{}.dst == {number}", proto.ovn()));
                    out.push(m.join(" && "));
                }
            }
        }
        if used_subject {
            self.out.sets.insert(subject);
        }
        out
    }

    /// Adds `r`'s ACLs, each match narrowed by `and` (a Pass of an earlier rule excluded).
    pub fn add(&mut self, r: &Rule, and: &str, log: bool) {
        for m in self.matches(r) {
            let match_ = if and.is_empty() {
                m
            } else {
                format!("{m} && {and}")
            };
            self.out.acls.push(AclSpec {
                direction: r.direction,
                priority: r.priority,
                match_,
                verdict: r.verdict,
                log,
            });
        }
    }
}

/// A NetworkPolicy peer as a [`RulePeer`].
fn np_peer(ns: &str, p: &NetworkPolicyPeer, problems: &mut Vec<String>) -> Option<RulePeer> {
    if let Some(IPBlock { cidr, except }) = &p.ip_block {
        return Some(RulePeer::Cidr(
            cidr.clone(),
            except.clone().unwrap_or_default(),
        ));
    }
    let sel = |s: &Option<_>| -> Result<Selector, SelectorError> {
        match s {
            Some(s) => Selector::from_label_selector(s),
            None => Ok(Selector::everything()),
        }
    };
    let pods = match sel(&p.pod_selector) {
        Ok(s) => s,
        Err(e) => {
            problems.push(format!("peer {e}: peer left out"));
            return None;
        }
    };
    match &p.namespace_selector {
        None if p.pod_selector.is_none() => {
            problems.push("a peer with no selector and no ipBlock: peer left out".into());
            None
        }
        None => Some(RulePeer::Pods(Pods::In {
            namespace: ns.to_owned(),
            pods,
        })),
        Some(n) => match Selector::from_label_selector(n) {
            Ok(namespaces) => Some(RulePeer::Pods(Pods::Across { namespaces, pods })),
            Err(e) => {
                problems.push(format!("peer namespace {e}: peer left out"));
                None
            }
        },
    }
}

/// A NetworkPolicy translated: the pods it isolates and its allows (priority [`NP_ALLOW_PRIORITY`]). The
/// drops are the namespace's ([`namespace_group`]), not the policy's.
pub fn network_policy(
    np: &NetworkPolicy,
    fam: Families,
    names: &dyn PortNames,
) -> Result<Translation, PolicyError> {
    let ns = np.metadata.namespace.clone().unwrap_or_default();
    let name = np.metadata.name.clone().unwrap_or_default();
    let owner = format!("NetworkPolicy/{ns}/{name}");
    let spec = np
        .spec
        .as_ref()
        .ok_or_else(|| PolicyError::Missing(owner.clone(), "spec"))?;
    let pods = match &spec.pod_selector {
        Some(s) => {
            Selector::from_label_selector(s).map_err(|e| PolicyError::Subject(owner.clone(), e))?
        }
        None => Selector::everything(),
    };
    let subject = Pods::In {
        namespace: ns.clone(),
        pods,
    };
    // Ingress always; Egress when egress rules are given (the API server's default).
    let types: Vec<String> = spec.policy_types.clone().unwrap_or_else(|| {
        let mut t = vec!["Ingress".to_owned()];
        if spec.egress.is_some() {
            t.push("Egress".to_owned());
        }
        t
    });
    let mut b = RuleBuilder::new(owner, fam, names);
    b.out.logging =
        Logging::from_annotations(np.metadata.annotations.as_ref().unwrap_or(&BTreeMap::new()));
    let log = b.out.logging.allow;
    for t in &types {
        let (dir, rules) = match t.as_str() {
            "Ingress" => (
                Direction::Ingress,
                spec.ingress
                    .iter()
                    .flatten()
                    .map(|r| (r.from.as_deref(), r.ports.as_deref()))
                    .collect::<Vec<_>>(),
            ),
            "Egress" => (
                Direction::Egress,
                spec.egress
                    .iter()
                    .flatten()
                    .map(|r| (r.to.as_deref(), r.ports.as_deref()))
                    .collect(),
            ),
            other => {
                b.out
                    .problems
                    .push(format!("unknown policy type {other:?}"));
                continue;
            }
        };
        b.out.isolates.push((dir, subject.clone()));
        for (peers, ports) in rules {
            let peer_list = peers.unwrap_or_default();
            let mut problems = Vec::new();
            let rp: Vec<RulePeer> = peer_list
                .iter()
                .filter_map(|p| np_peer(&ns, p, &mut problems))
                .collect();
            let port_list = ports.unwrap_or_default();
            let pp: Vec<RulePort> = port_list
                .iter()
                .filter_map(|p| np_port(p, &mut problems))
                .map(|p| match p {
                    Port::All(x) => RulePort::All(x),
                    Port::Range(x, a, c) => RulePort::Range(x, a, c),
                    Port::Named(x, n) => RulePort::Named(x, n),
                })
                .collect();
            b.out.problems.extend(problems);
            // Every peer (or port) left out: the rule allows nothing rather than everything.
            if (!peer_list.is_empty() && rp.is_empty()) || (!port_list.is_empty() && pp.is_empty())
            {
                continue;
            }
            let rule = Rule {
                direction: dir,
                subject: subject.clone(),
                peers: rp,
                ports: pp,
                priority: NP_ALLOW_PRIORITY,
                verdict: Verdict::Allow,
            };
            b.add(&rule, "", log);
        }
    }
    Ok(b.out)
}

/// The admin policies translated, in order: each AdminNetworkPolicy by (priority, name), its rules at
/// `30000 - 100 * priority - index`, then the baseline (`1750 - index`). Without OVN tiers a Pass has no
/// action of its own: every later admin rule of its direction excludes what it matches, so that traffic
/// goes on to NetworkPolicies, then the baseline. Each translation's ACLs go on its subject's port group
/// ([`Translation::parent`]); a policy that cannot be translated gets no ACLs and says why in `problems`.
pub fn admin_policies(
    anps: &[&crate::crd::AdminNetworkPolicy],
    banp: Option<&crate::crd::BaselineAdminNetworkPolicy>,
    fam: Families,
    names: &dyn PortNames,
    node_cidrs: &[String],
) -> Vec<Translation> {
    let mut sorted: Vec<&crate::crd::AdminNetworkPolicy> = anps.to_vec();
    sorted.sort_by(|a, b| {
        (a.spec.priority, a.metadata.name.as_deref())
            .cmp(&(b.spec.priority, b.metadata.name.as_deref()))
    });
    // The negated matches of the Passes so far, per direction.
    let mut passes: BTreeMap<Direction, Vec<String>> = BTreeMap::new();
    let mut out = Vec::new();
    for anp in sorted {
        let owner = format!(
            "AdminNetworkPolicy/{}",
            anp.metadata.name.as_deref().unwrap_or_default()
        );
        let mut b = RuleBuilder::new(owner, fam, names);
        let checked = admin_subject(&anp.spec.subject)
            .and_then(|s| anp.validate().map(|_| s).map_err(|e| e.to_string()))
            .and_then(|s| {
                if (0..=ANP_MAX_SPEC_PRIORITY).contains(&anp.spec.priority) {
                    Ok(s)
                } else {
                    Err(format!(
                        "priority {} is above {ANP_MAX_SPEC_PRIORITY}, the most OVN's priorities leave room for: not applied",
                        anp.spec.priority
                    ))
                }
            });
        let subject = match checked {
            Ok(s) => s,
            Err(e) => {
                b.out.problems.push(e);
                out.push(b.out);
                continue;
            }
        };
        let base = ANP_MAX_PRIORITY - 100 * i64::from(anp.spec.priority);
        let ingress = anp.spec.ingress.iter().map(|r| {
            (
                Direction::Ingress,
                r.action.into(),
                admin_ingress_peers(&r.from),
                r.ports.as_deref(),
            )
        });
        let egress = anp.spec.egress.iter().map(|r| {
            let peers = admin_egress_peers(r.to.iter().map(|p| p.selection()));
            (
                Direction::Egress,
                r.action.into(),
                peers,
                r.ports.as_deref(),
            )
        });
        for (action, rule) in admin_rules(&mut b, &subject, base, ingress.chain(egress)) {
            let dir = rule.direction;
            let before = passes.get(&dir).cloned().unwrap_or_default();
            if action == AdminAction::Pass {
                let ms = b.matches_as(&rule, true);
                passes
                    .entry(dir)
                    .or_default()
                    .extend(ms.into_iter().map(|m| format!("!({m})")));
                continue;
            }
            b.add(&rule, &before.join(" && "), false);
        }
        admin_node_allow(&mut b, &subject, node_cidrs);
        out.push(b.out);
    }
    if let Some(banp) = banp {
        let mut b = RuleBuilder::new(
            format!(
                "BaselineAdminNetworkPolicy/{}",
                banp.metadata.name.as_deref().unwrap_or_default()
            ),
            fam,
            names,
        );
        let checked = admin_subject(&banp.spec.subject)
            .and_then(|s| banp.validate().map(|_| s).map_err(|e| e.to_string()));
        match checked {
            Err(e) => b.out.problems.push(e),
            Ok(subject) => {
                let ingress = banp.spec.ingress.iter().map(|r| {
                    (
                        Direction::Ingress,
                        AdminAction::from(r.action),
                        admin_ingress_peers(&r.from),
                        r.ports.as_deref(),
                    )
                });
                let egress = banp.spec.egress.iter().map(|r| {
                    let peers = admin_egress_peers(r.to.iter().map(|p| p.selection()));
                    (
                        Direction::Egress,
                        AdminAction::from(r.action),
                        peers,
                        r.ports.as_deref(),
                    )
                });
                for (_, rule) in
                    admin_rules(&mut b, &subject, BANP_MAX_PRIORITY, ingress.chain(egress))
                {
                    b.add(&rule, "", false);
                }
                admin_node_allow(&mut b, &subject, node_cidrs);
            }
        }
        out.push(b.out);
    }
    out
}

/// What an admin rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AdminAction {
    Allow,
    Deny,
    /// On to NetworkPolicy (AdminNetworkPolicy only).
    Pass,
}

impl From<crate::crd::AdminNetworkPolicyRuleAction> for AdminAction {
    fn from(a: crate::crd::AdminNetworkPolicyRuleAction) -> Self {
        use crate::crd::AdminNetworkPolicyRuleAction as A;
        match a {
            A::Allow => AdminAction::Allow,
            A::Deny => AdminAction::Deny,
            A::Pass => AdminAction::Pass,
        }
    }
}

impl From<crate::crd::BaselineAdminNetworkPolicyRuleAction> for AdminAction {
    fn from(a: crate::crd::BaselineAdminNetworkPolicyRuleAction) -> Self {
        use crate::crd::BaselineAdminNetworkPolicyRuleAction as B;
        match a {
            B::Allow => AdminAction::Allow,
            B::Deny => AdminAction::Deny,
        }
    }
}

/// An admin rule as read: direction, action, peers, ports.
type AdminRule<'a> = (
    Direction,
    AdminAction,
    Peers,
    Option<&'a [crate::crd::AdminNetworkPolicyPort]>,
);

/// One admin policy's rules as [`Rule`]s of `subject`, each direction's at `base - index`; a rule whose
/// peers or ports cannot be read is left out (closed), with its problems in the translation.
fn admin_rules<'a>(
    b: &mut RuleBuilder<'_>,
    subject: &Pods,
    base: i64,
    rules: impl Iterator<Item = AdminRule<'a>>,
) -> Vec<(AdminAction, Rule)> {
    let mut idx: BTreeMap<Direction, i64> = BTreeMap::new();
    let mut out = Vec::new();
    for (dir, action, (peers, mut problems), ports) in rules {
        let i = idx.entry(dir).or_insert(0);
        let priority = base - *i;
        *i += 1;
        let ports = admin_ports(ports, &mut problems);
        b.out.problems.extend(problems);
        let (Some(peers), Some(ports)) = (peers, ports) else {
            continue;
        };
        let verdict = if action == AdminAction::Deny {
            Verdict::Deny
        } else {
            Verdict::Allow
        };
        out.push((
            action,
            Rule {
                direction: dir,
                subject: subject.clone(),
                peers,
                ports,
                priority,
                verdict,
            },
        ));
    }
    out
}

/// Lets the nodes reach the subject's pods above every admin rule (kubelet probes).
fn admin_node_allow(b: &mut RuleBuilder<'_>, subject: &Pods, node_cidrs: &[String]) {
    if b.out.acls.is_empty() {
        return;
    }
    let g = SetKey::group(subject.clone());
    let Some(from) = from_nodes(node_cidrs) else {
        return;
    };
    b.out.acls.push(AclSpec {
        direction: Direction::Ingress,
        priority: NODE_ALLOW_PRIORITY,
        match_: format!("outport == @{} && {from}", g.name()),
        verdict: Verdict::Allow,
        log: false,
    });
    b.out.sets.insert(g.clone());
    b.out.parent = Some(g);
}

fn label_selector(
    s: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) -> Result<Selector, String> {
    Selector::from_label_selector(s).map_err(|e| e.to_string())
}

fn admin_pods(p: crate::crd::PodSelection<'_>) -> Result<Pods, String> {
    use crate::crd::PodSelection as P;
    Ok(match p {
        P::Namespaces(n) => Pods::Across {
            namespaces: label_selector(n)?,
            pods: Selector::everything(),
        },
        P::Pods(np) => Pods::Across {
            namespaces: label_selector(&np.namespace_selector)?,
            pods: label_selector(&np.pod_selector)?,
        },
    })
}

fn admin_subject(s: &crate::crd::AdminNetworkPolicySubject) -> Result<Pods, String> {
    admin_pods(s.selection().map_err(|e| format!("subject: {e}"))?)
}

/// Peers; None (rule left out, closed) if one cannot be read.
type Peers = (Option<Vec<RulePeer>>, Vec<String>);

fn admin_ingress_peers(from: &[crate::crd::AdminNetworkPolicyIngressPeer]) -> Peers {
    let mut problems = Vec::new();
    let mut out = Vec::new();
    for p in from {
        match p
            .selection()
            .map_err(|e| e.to_string())
            .and_then(admin_pods)
        {
            Ok(pods) => out.push(RulePeer::Pods(pods)),
            Err(e) => {
                problems.push(format!("peer: {e}: rule left out"));
                return (None, problems);
            }
        }
    }
    (Some(out), problems)
}

fn admin_egress_peers<'a>(
    to: impl Iterator<Item = Result<crate::crd::EgressSelection<'a>, crate::crd::OneOfError>>,
) -> Peers {
    use crate::crd::EgressSelection as E;
    let mut problems = Vec::new();
    let mut out = Vec::new();
    for p in to {
        let peer = match p {
            Ok(E::Namespaces(n)) => {
                admin_pods(crate::crd::PodSelection::Namespaces(n)).map(|p| vec![RulePeer::Pods(p)])
            }
            Ok(E::Pods(n)) => {
                admin_pods(crate::crd::PodSelection::Pods(n)).map(|p| vec![RulePeer::Pods(p)])
            }
            Ok(E::Nodes(n)) => label_selector(n).map(|s| vec![RulePeer::Nodes(s)]),
            Ok(E::Networks(cidrs)) => Ok(cidrs
                .iter()
                .map(|c| RulePeer::Cidr(c.clone(), Vec::new()))
                .collect()),
            Ok(E::DomainNames(_)) => Err("domainNames peers are not supported".to_owned()),
            Err(e) => Err(e.to_string()),
        };
        match peer {
            Ok(v) => out.extend(v),
            Err(e) => {
                problems.push(format!("peer: {e}: rule left out"));
                return (None, problems);
            }
        }
    }
    (Some(out), problems)
}

fn admin_ports(
    ports: Option<&[crate::crd::AdminNetworkPolicyPort]>,
    problems: &mut Vec<String>,
) -> Option<Vec<RulePort>> {
    use crate::crd::PortProtocol as P;
    use crate::crd::PortSelection as S;
    let proto = |p: &P| match p {
        P::Tcp => Protocol::Tcp,
        P::Udp => Protocol::Udp,
        P::Sctp => Protocol::Sctp,
    };
    let mut out = Vec::new();
    for p in ports.unwrap_or_default() {
        match p.selection() {
            Ok(S::Number(n)) => out.push(RulePort::Range(proto(&n.protocol), n.port, n.port)),
            Ok(S::Range(r)) => out.push(RulePort::Range(proto(&r.protocol), r.start, r.end)),
            // A named port carries no protocol: whichever the container port has.
            Ok(S::Named(n)) => out.extend(
                [Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
                    .map(|x| RulePort::Named(x, n.to_owned())),
            ),
            Err(e) => {
                problems.push(format!("port: {e}: rule left out"));
                return None;
            }
        }
    }
    Some(out)
}

/// The ACLs of the pods of a namespace isolated in `dir` (port group [`namespace_group`]): the drop, and for
/// ingress the nodes (`node_cidrs`: the join subnet's) above it.
///
/// The switch must track connections, or the replies of allowed connections meet the drop: OVN tracks them
/// only on a switch with an `allow-related` ACL. The nodes' allow is one; without it (egress), IPv6
/// neighbour discovery is allowed instead, as that changes nothing else (ovn-northd passes neighbour
/// discovery above every ACL) and costs the fewest flows of any real match.
pub fn namespace_acls(
    ns: &str,
    dir: Direction,
    node_cidrs: &[String],
    log_drops: bool,
) -> Vec<AclSpec> {
    let g = namespace_group(ns, dir);
    let me = format!("{} == @{g}", dir.port_field());
    let mut out = vec![AclSpec {
        direction: dir,
        priority: NP_DENY_PRIORITY,
        match_: format!("{me} && ip"),
        verdict: Verdict::Deny,
        log: log_drops,
    }];
    let nodes = from_nodes(node_cidrs).filter(|_| dir == Direction::Ingress);
    out.push(match nodes {
        Some(from) => AclSpec {
            direction: dir,
            priority: NODE_ALLOW_PRIORITY,
            match_: format!("{me} && {from}"),
            verdict: Verdict::Allow,
            log: false,
        },
        None => AclSpec {
            direction: dir,
            priority: NP_ALLOW_PRIORITY,
            match_: format!("{me} && (nd || nd_ra || nd_rs)"),
            verdict: Verdict::Allow,
            log: false,
        },
    });
    out
}

/// A Subnet's own ACLs on its switch, Kube-OVN's `private` and `allowEWTraffic` (its `acls` are written as
/// given): a private subnet's switch lets through only traffic within its `cidrs`, to and from
/// `allow_subnets`, and from the nodes (`node_cidrs`), both into its pods and out of them (to-lport on the
/// switch covers the router port too). CIDRs that do not parse are left out, with a problem each.
pub fn subnet_acls(
    cidrs: &[String],
    private: bool,
    allow_subnets: &[String],
    allow_ew_traffic: bool,
    node_cidrs: &[String],
    problems: &mut Vec<String>,
) -> Vec<AclSpec> {
    let parse = |c: &String, problems: &mut Vec<String>| match c.trim().parse::<IpNetwork>() {
        Ok(n) => Some(n),
        Err(_) => {
            problems.push(format!("invalid CIDR {c:?}: left out"));
            None
        }
    };
    let own: Vec<IpNetwork> = cidrs.iter().filter_map(|c| parse(c, problems)).collect();
    let acl = |priority, match_: String, verdict| AclSpec {
        direction: Direction::Ingress,
        priority,
        match_,
        verdict,
        log: false,
    };
    let ip = |n: &IpNetwork| if n.is_ipv4() { "ip4" } else { "ip6" };
    let norm = |n: &IpNetwork| format!("{}/{}", n.network(), n.prefix());
    let within = |n: &IpNetwork| format!("{0}.src == {1} && {0}.dst == {1}", ip(n), norm(n));
    let mut out = Vec::new();
    if allow_ew_traffic {
        for n in &own {
            out.push(acl(SUBNET_EW_PRIORITY, within(n), Verdict::Allow));
        }
    }
    if !private {
        return out;
    }
    // No neighbour-discovery allow: ovn-northd passes it above every ACL.
    out.push(acl(SUBNET_DROP_PRIORITY, "ip".into(), Verdict::Deny));
    let allowed: Vec<IpNetwork> = allow_subnets
        .iter()
        .filter_map(|c| parse(c, problems))
        .collect();
    for n in &own {
        out.push(acl(SUBNET_ALLOW_PRIORITY, within(n), Verdict::Allow));
        for a in allowed.iter().filter(|a| a.is_ipv4() == n.is_ipv4()) {
            out.push(acl(
                SUBNET_ALLOW_PRIORITY,
                format!(
                    "({0}.src == {1} && {0}.dst == {2}) || ({0}.src == {2} && {0}.dst == {1})",
                    ip(n),
                    norm(n),
                    norm(a)
                ),
                Verdict::Allow,
            ));
        }
    }
    if let Some(from) = from_nodes(node_cidrs) {
        out.push(acl(NODE_ALLOW_PRIORITY, from, Verdict::Allow));
    }
    out
}

/// The clause of traffic from the nodes (`ip4.src == <join CIDR>`, per family); None without a CIDR that
/// parses.
fn from_nodes(node_cidrs: &[String]) -> Option<String> {
    let mut sink = Vec::new();
    let from: Vec<String> = node_cidrs
        .iter()
        .filter_map(|c| cidr_clause("src", c, &[], &mut sink))
        .collect();
    (!from.is_empty()).then(|| or(from))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn np(v: serde_json::Value) -> NetworkPolicy {
        let mut v = v;
        v["metadata"] = json!({"name": "p", "namespace": "x"});
        serde_json::from_value(v).expect("policy")
    }

    fn none(_: &Pods, _: Protocol, _: &str) -> BTreeSet<u16> {
        BTreeSet::new()
    }

    fn matches(t: &Translation) -> Vec<&str> {
        t.acls.iter().map(|a| a.match_.as_str()).collect()
    }

    #[test]
    fn default_deny_isolates_and_allows_nothing() {
        let t = network_policy(
            &np(json!({"spec": {"podSelector": {}}})),
            Families::V4,
            &none,
        )
        .expect("translates");
        assert_eq!(
            t.isolates,
            vec![(
                Direction::Ingress,
                Pods::In {
                    namespace: "x".into(),
                    pods: Selector::everything()
                }
            )]
        );
        assert!(t.acls.is_empty());
        let t = network_policy(
            &np(json!({"spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}})),
            Families::V4,
            &none,
        )
        .expect("translates");
        assert_eq!(t.isolates.len(), 2);
    }

    #[test]
    fn peers_ports_and_families() {
        let t = network_policy(
            &np(
                json!({"spec": {"podSelector": {"matchLabels": {"app": "a"}},
                "ingress": [{"from": [
                    {"podSelector": {"matchLabels": {"app": "b"}}},
                    {"namespaceSelector": {"matchLabels": {"team": "t"}}, "podSelector": {}},
                    {"ipBlock": {"cidr": "10.1.2.3/16", "except": ["10.1.5.0/24"]}}],
                  "ports": [{"port": 80}, {"protocol": "UDP", "port": 81, "endPort": 90}]}]}}),
            ),
            Families::Dual,
            &none,
        )
        .expect("translates");
        let m = matches(&t);
        assert_eq!(m.len(), 3, "{m:?}");
        let subject = SetKey::group(Pods::In {
            namespace: "x".into(),
            pods: Selector::new(vec![Requirement::Equals("app".into(), "a".into())]),
        });
        assert!(m[0].starts_with(&format!(
            "outport == @{} && (ip4.src == $as_",
            subject.name()
        )));
        assert!(m[0].contains("_ip4 || ip6.src == $as_"), "{}", m[0]);
        assert!(m[0].ends_with("&& (tcp.dst == 80 || (udp.dst >= 81 && udp.dst <= 90))"));
        assert!(
            m[2].contains("ip4.src == 10.1.0.0/16 && ip4.src != {10.1.5.0/24}"),
            "{}",
            m[2]
        );
        // The subject's group and the two peers' address sets.
        assert_eq!(t.sets.len(), 3);
        assert!(t.sets.contains(&subject));
    }

    #[test]
    fn same_selector_same_set_name() {
        let a = SetKey::addresses(Pods::Across {
            namespaces: Selector::new(vec![
                Requirement::Equals("b".into(), "1".into()),
                Requirement::Equals("a".into(), "1".into()),
            ]),
            pods: Selector::everything(),
        });
        let b = SetKey::addresses(Pods::Across {
            namespaces: Selector::new(vec![
                Requirement::Equals("a".into(), "1".into()),
                Requirement::Equals("b".into(), "1".into()),
            ]),
            pods: Selector::everything(),
        });
        assert_eq!(a.name(), b.name());
        assert_ne!(
            a.name(),
            SetKey::group(match a.members {
                Members::Pods(p) => p,
                Members::Nodes(_) => unreachable!(),
            })
            .name()
        );
    }

    #[test]
    fn named_ports_resolve_per_pod() {
        let names = |_: &Pods, _: Protocol, n: &str| -> BTreeSet<u16> {
            if n == "http" {
                BTreeSet::from([80, 8080])
            } else {
                BTreeSet::new()
            }
        };
        let t = network_policy(
            &np(json!({"spec": {"podSelector": {},
                "ingress": [{"ports": [{"port": "http"}, {"port": "none"}]}],
                "egress": [{"to": [{"podSelector": {}}], "ports": [{"port": "http"}]},
                           {"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": "http"}]}]}})),
            Families::V4,
            &names,
        )
        .expect("translates");
        let m = matches(&t);
        // Ingress: one ACL per number, on the selected pods whose port resolves to it; egress likewise on
        // the peers; the ipBlock peer with a name matches nothing; "none" resolves to nothing.
        assert_eq!(m.len(), 4, "{m:?}");
        assert!(m[0].starts_with("outport == @pg_") && m[0].ends_with("tcp.dst == 80"));
        assert!(m[2].starts_with("inport == @pg_") && m[2].contains("ip4.dst == $as_"));
        assert_eq!(
            t.named.len(),
            2,
            "the egress peer is the ingress subject: {:?}",
            t.named
        );
    }

    #[test]
    fn bad_peers_are_left_out_closed() {
        let t = network_policy(
            &np(json!({"spec": {"podSelector": {},
                "ingress": [{"from": [{"ipBlock": {"cidr": "nonsense"}}]},
                            {"ports": [{"protocol": "ICMP", "port": 1}]},
                            {"ports": [{"port": 0}]}]}})),
            Families::V4,
            &none,
        )
        .expect("translates");
        assert!(t.acls.is_empty(), "{:?}", t.acls);
        assert_eq!(t.problems.len(), 3, "{:?}", t.problems);
        assert_eq!(t.isolates.len(), 1);
    }

    #[test]
    fn admin_priorities_pass_and_baseline() {
        let anp = |name: &str,
                   prio: i32,
                   rules: serde_json::Value|
         -> crate::crd::AdminNetworkPolicy {
            serde_json::from_value(json!({"apiVersion": "policy.networking.k8s.io/v1alpha1",
                "kind": "AdminNetworkPolicy", "metadata": {"name": name},
                "spec": {"priority": prio, "subject": {"namespaces": {"matchLabels": {"team": "x"}}},
                         "ingress": rules}}))
            .expect("anp")
        };
        let pass = anp(
            "pass",
            5,
            json!([{"name": "p", "action": "Pass",
            "from": [{"namespaces": {"matchLabels": {"team": "y"}}}]}]),
        );
        let deny = anp(
            "deny",
            10,
            json!([
            {"name": "a", "action": "Allow", "from": [{"namespaces": {}}],
             "ports": [{"portNumber": {"protocol": "TCP", "port": 80}}]},
            {"name": "d", "action": "Deny", "from": [{"namespaces": {}}]}]),
        );
        let too_high = anp("high", 500, json!([]));
        let banp: crate::crd::BaselineAdminNetworkPolicy = serde_json::from_value(json!({
            "apiVersion": "policy.networking.k8s.io/v1alpha1", "kind": "BaselineAdminNetworkPolicy",
            "metadata": {"name": "default"},
            "spec": {"subject": {"namespaces": {}},
                     "egress": [{"name": "d", "action": "Deny", "to": [{"networks": ["10.0.0.0/8"]}]}]}}))
        .expect("banp");
        let ts = admin_policies(
            &[&deny, &too_high, &pass],
            Some(&banp),
            Families::V4,
            &none,
            &["100.64.0.0/16".into()],
        );
        let owners: Vec<&str> = ts.iter().map(|t| t.owner.as_str()).collect();
        assert_eq!(
            owners,
            [
                "AdminNetworkPolicy/pass",
                "AdminNetworkPolicy/deny",
                "AdminNetworkPolicy/high",
                "BaselineAdminNetworkPolicy/default"
            ]
        );
        // A Pass has no ACL; it is excluded from every later rule of its direction, by addresses.
        assert!(ts[0].acls.is_empty() && ts[0].parent.is_none());
        let d = &ts[1];
        let prios: Vec<i64> = d.acls.iter().map(|a| a.priority).collect();
        assert_eq!(prios, [29000, 28999, NODE_ALLOW_PRIORITY]);
        assert!(
            d.acls[0].match_.contains("&& !(ip4.dst == $pg_"),
            "{}",
            d.acls[0].match_
        );
        assert!(
            d.acls[0].match_.contains("&& ip4.src == $as_"),
            "{}",
            d.acls[0].match_
        );
        assert_eq!(d.acls[1].verdict, Verdict::Deny);
        assert!(d.parent.is_some());
        assert!(
            ts[2].acls.is_empty() && ts[2].problems.len() == 1,
            "{:?}",
            ts[2].problems
        );
        let b = &ts[3];
        assert_eq!(b.acls[0].priority, BANP_MAX_PRIORITY);
        assert_eq!(b.acls[0].direction, Direction::Egress);
        assert!(
            b.acls[0].match_.ends_with("&& ip4.dst == 10.0.0.0/8"),
            "{}",
            b.acls[0].match_
        );
    }

    #[test]
    fn logging_annotations() {
        let a = BTreeMap::from([
            (ENABLE_LOG.to_owned(), "true".to_owned()),
            (LOG_ACL_ACTIONS.to_owned(), "allow,drop".to_owned()),
            (ACL_LOG_METER_RATE.to_owned(), "10".to_owned()),
        ]);
        assert_eq!(
            Logging::from_annotations(&a),
            Logging {
                allow: true,
                drop: true,
                rate: Some(10)
            }
        );
        assert_eq!(
            Logging::from_annotations(&BTreeMap::new()),
            Logging::default()
        );
    }

    #[test]
    fn namespace_acls_drop_and_let_nodes_in() {
        let a = namespace_acls(
            "my-ns",
            Direction::Ingress,
            &["100.64.0.0/16".into()],
            false,
        );
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].match_, "outport == @np_my_ns_ingress && ip");
        assert_eq!(
            a[1].match_,
            "outport == @np_my_ns_ingress && ip4.src == 100.64.0.0/16"
        );
        // Egress: the neighbour-discovery allow keeps the switch tracking connections.
        let e = namespace_acls("n", Direction::Egress, &[], true);
        assert_eq!(e.len(), 2);
        assert_eq!(
            e[1].match_,
            "inport == @np_n_egress && (nd || nd_ra || nd_rs)"
        );
        assert_eq!(e[1].verdict, Verdict::Allow);
    }

    #[test]
    fn subnet_private_allows_its_block_allow_subnets_and_nodes() {
        let mut problems = Vec::new();
        let none = subnet_acls(
            &["10.1.0.0/24".into()],
            false,
            &[],
            false,
            &[],
            &mut problems,
        );
        assert!(none.is_empty());
        let a = subnet_acls(
            &["10.1.0.0/24".into(), "fd00:1::/120".into()],
            true,
            &["10.2.0.5/32".into(), "nonsense".into()],
            true,
            &["100.64.0.0/16".into()],
            &mut problems,
        );
        let m: Vec<(i64, &str, Verdict)> = a
            .iter()
            .map(|a| (a.priority, a.match_.as_str(), a.verdict))
            .collect();
        assert_eq!(
            m,
            [
                (SUBNET_EW_PRIORITY, "ip4.src == 10.1.0.0/24 && ip4.dst == 10.1.0.0/24", Verdict::Allow),
                (SUBNET_EW_PRIORITY, "ip6.src == fd00:1::/120 && ip6.dst == fd00:1::/120", Verdict::Allow),
                (SUBNET_DROP_PRIORITY, "ip", Verdict::Deny),
                (SUBNET_ALLOW_PRIORITY, "ip4.src == 10.1.0.0/24 && ip4.dst == 10.1.0.0/24", Verdict::Allow),
                (
                    SUBNET_ALLOW_PRIORITY,
                    "(ip4.src == 10.1.0.0/24 && ip4.dst == 10.2.0.5/32) || (ip4.src == 10.2.0.5/32 && ip4.dst == 10.1.0.0/24)",
                    Verdict::Allow
                ),
                (SUBNET_ALLOW_PRIORITY, "ip6.src == fd00:1::/120 && ip6.dst == fd00:1::/120", Verdict::Allow),
                (NODE_ALLOW_PRIORITY, "ip4.src == 100.64.0.0/16", Verdict::Allow),
            ]
        );
        assert_eq!(problems, ["invalid CIDR \"nonsense\": left out"]);
        assert!(a.iter().all(|a| a.direction == Direction::Ingress));
    }
}
