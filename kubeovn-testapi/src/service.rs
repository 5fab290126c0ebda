//! Services as kube-apiserver treats them: its defaults, its validation of ports and IP families,
//! and ClusterIP allocation from the service CIDR(s) (`--service-cluster-ip-range`).
//!
//! An [`Allocator`] holds one address [`Pool`] per IP family and the [`NodePorts`]. The store calls
//! [`prepare`] under its lock for a Service it is about to write (defaults, validation, and the
//! addresses and node ports chosen, which it only reads), and tells [`Allocator::commit`] every
//! Service change it commits, so the pools hold exactly what the stored Services hold: a deletion
//! frees it whatever its path (a DELETE, a namespace's cascade, the last finalizer removed), and a
//! refused request holds nothing.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde_json::{json, Map, Value};

use crate::error::{Cause, Error, Result};

/// kube-apiserver's default `--service-cluster-ip-range`.
pub const DEFAULT_RANGE: &str = "10.96.0.0/12";

/// kube-apiserver's default `--service-node-port-range`.
pub const DEFAULT_NODE_PORT_RANGE: &str = "30000-32767";

/// kube-apiserver's limit on a service CIDR's host bits (it keeps a bitmap of each range).
pub const MAX_HOST_BITS: u32 = 20;

/// An IP family, as `spec.ipFamilies` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `IPv4`.
    V4,
    /// `IPv6`.
    V6,
}

impl Family {
    /// The API's name (`IPv4`, `IPv6`).
    pub fn as_str(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    /// The family of an address.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "IPv4" => Some(Family::V4),
            "IPv6" => Some(Family::V6),
            _ => None,
        }
    }

    fn width(self) -> u32 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
}

/// Numbered slots `first..=last`, some taken: the core of the address and node port pools.
///
/// Allocation takes the first free slot from a cursor that moves past each slot taken, so a run
/// of creates costs one step each (kube-apiserver picks at random; any free slot is as valid).
#[derive(Debug, Clone)]
struct Slots {
    first: u128,
    last: u128,
    taken: BTreeSet<u128>,
    cursor: u128,
}

impl Slots {
    fn new(first: u128, last: u128) -> Self {
        Slots {
            first,
            last,
            taken: BTreeSet::new(),
            cursor: first,
        }
    }

    fn contains(&self, n: u128) -> bool {
        (self.first..=self.last).contains(&n)
    }

    fn is_taken(&self, n: u128) -> bool {
        self.taken.contains(&n)
    }

    /// The slot [`Self::take`] would be given next, passing over `except` (slots one request
    /// already chose).
    fn next_free(&self, except: &[u128]) -> Option<u128> {
        self.first_free(self.cursor, self.last, except)
            .or_else(|| self.first_free(self.first, self.cursor.saturating_sub(1), except))
    }

    /// The first slot in `lo..=hi` neither taken nor in `except`.
    fn first_free(&self, lo: u128, hi: u128, except: &[u128]) -> Option<u128> {
        if lo > hi {
            return None;
        }
        let mut c = lo;
        for t in self.taken.range(lo..=hi) {
            while c < *t {
                if !except.contains(&c) {
                    return Some(c);
                }
                c += 1;
            }
            c = t + 1;
        }
        while c <= hi {
            if !except.contains(&c) {
                return Some(c);
            }
            c += 1;
        }
        None
    }

    /// Marks `n` taken; false when it is outside the slots or already taken.
    fn take(&mut self, n: u128) -> bool {
        if !self.contains(n) || !self.taken.insert(n) {
            return false;
        }
        self.cursor = if n >= self.last { self.first } else { n + 1 };
        true
    }

    fn release(&mut self, n: u128) -> bool {
        self.taken.remove(&n)
    }
}

/// The free and allocated addresses of one service CIDR.
///
/// Usable are the addresses after the network address and, for IPv4, before the broadcast
/// address, as kube-apiserver hands them out.
#[derive(Debug, Clone)]
pub struct Pool {
    family: Family,
    network: u128,
    prefix: u32,
    /// Offsets from `network`.
    slots: Slots,
}

impl Pool {
    /// A pool for `cidr` (`10.96.0.0/12`, `fd00:10:96::/108`); host bits beyond the prefix are
    /// ignored, as Go's `net.ParseCIDR` does.
    pub fn parse(cidr: &str) -> Result<Self> {
        let bad = |why: &str| Error::Config(format!("service CIDR {cidr:?}: {why}"));
        let (addr, len) = cidr
            .trim()
            .split_once('/')
            .ok_or_else(|| bad("no prefix length"))?;
        let ip: IpAddr = addr
            .parse()
            .map_err(|_| bad("not an IP address before the '/'"))?;
        let family = Family::of(ip);
        let width = family.width();
        let prefix: u32 = len
            .parse()
            .ok()
            .filter(|l| *l <= width)
            .ok_or_else(|| bad("bad prefix length"))?;
        let host_bits = width - prefix;
        if host_bits > MAX_HOST_BITS {
            return Err(bad(&format!(
                "too large; for {width}-bit addresses, the mask must be >= {}",
                width - MAX_HOST_BITS
            )));
        }
        let size = 1u128 << host_bits;
        // IPv4 keeps its broadcast address out, IPv6 has none.
        let last = match family {
            Family::V4 => size.checked_sub(2),
            Family::V6 => size.checked_sub(1),
        }
        .filter(|l| *l >= 1)
        .ok_or_else(|| bad("too small: no usable address"))?;
        Ok(Pool {
            family,
            network: to_u128(ip) & !(size - 1),
            prefix,
            slots: Slots::new(1, last),
        })
    }

    /// The pool's family.
    pub fn family(&self) -> Family {
        self.family
    }

    /// The CIDR, normalised (`10.96.0.0/12`).
    pub fn cidr(&self) -> String {
        format!("{}/{}", self.addr(0), self.prefix)
    }

    /// How many addresses the pool can hand out.
    pub fn capacity(&self) -> u128 {
        self.slots.last - self.slots.first + 1
    }

    /// How many addresses are taken.
    pub fn in_use(&self) -> usize {
        self.slots.taken.len()
    }

    fn addr(&self, offset: u128) -> IpAddr {
        let raw = self.network + offset;
        match self.family {
            // The offset stays inside the CIDR, so the IPv4 value fits 32 bits.
            Family::V4 => IpAddr::V4(Ipv4Addr::from(raw as u32)),
            Family::V6 => IpAddr::V6(Ipv6Addr::from(raw)),
        }
    }

    /// The offset of a usable address of this pool.
    fn offset(&self, ip: IpAddr) -> Option<u128> {
        if Family::of(ip) != self.family {
            return None;
        }
        to_u128(ip)
            .checked_sub(self.network)
            .filter(|o| self.slots.contains(*o))
    }

    /// Whether `ip` is one the pool hands out (in the CIDR, not the network or broadcast address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.offset(ip).is_some()
    }

    /// Whether `ip` is taken.
    pub fn is_taken(&self, ip: IpAddr) -> bool {
        self.offset(ip).is_some_and(|o| self.slots.is_taken(o))
    }

    /// The address [`Self::allocate`] would take, if any is free.
    pub fn next_free(&self) -> Option<IpAddr> {
        self.slots.next_free(&[]).map(|o| self.addr(o))
    }

    /// Marks `ip` taken; false when it is not usable here or already taken.
    pub fn take(&mut self, ip: IpAddr) -> bool {
        self.offset(ip).is_some_and(|o| self.slots.take(o))
    }

    /// Takes the next free address.
    pub fn allocate(&mut self) -> Option<IpAddr> {
        let ip = self.next_free()?;
        self.take(ip);
        Some(ip)
    }

    /// Frees `ip`; false when it was not taken.
    pub fn release(&mut self, ip: IpAddr) -> bool {
        self.offset(ip).is_some_and(|o| self.slots.release(o))
    }
}

/// The node ports NodePort and LoadBalancer Services get (`--service-node-port-range`).
#[derive(Debug, Clone)]
pub struct NodePorts {
    slots: Slots,
}

impl Default for NodePorts {
    /// [`DEFAULT_NODE_PORT_RANGE`].
    fn default() -> Self {
        NodePorts {
            slots: Slots::new(30000, 32767),
        }
    }
}

impl NodePorts {
    /// Parses `FIRST-LAST` (`30000-32767`).
    pub fn parse(range: &str) -> Result<Self> {
        let bad = || {
            Error::Config(format!(
                "node port range {range:?}: expected FIRST-LAST, 1-65535"
            ))
        };
        let (a, b) = range.trim().split_once('-').ok_or_else(bad)?;
        let a: u16 = a.trim().parse().map_err(|_| bad())?;
        let b: u16 = b.trim().parse().map_err(|_| bad())?;
        if a == 0 || a > b {
            return Err(bad());
        }
        Ok(NodePorts {
            slots: Slots::new(u128::from(a), u128::from(b)),
        })
    }

    /// The range as kube-apiserver prints it (`30000-32767`).
    pub fn range(&self) -> String {
        format!("{}-{}", self.slots.first, self.slots.last)
    }

    /// How many node ports are taken.
    pub fn in_use(&self) -> usize {
        self.slots.taken.len()
    }
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The service CIDR(s): one pool, or two of different families (dual stack); the first is the
/// primary family, given to Services that ask for none.
#[derive(Debug, Clone)]
pub struct ClusterIps {
    pools: Vec<Pool>,
}

impl Default for ClusterIps {
    /// [`DEFAULT_RANGE`].
    fn default() -> Self {
        ClusterIps::parse(DEFAULT_RANGE).unwrap_or(ClusterIps { pools: Vec::new() })
    }
}

impl ClusterIps {
    /// Parses `--service-cluster-ip-range`: `CIDR` or `CIDR,CIDR` of the two families.
    pub fn parse(range: &str) -> Result<Self> {
        let pools = range
            .split(',')
            .map(Pool::parse)
            .collect::<Result<Vec<_>>>()?;
        match pools.as_slice() {
            [_] => {}
            [a, b] if a.family != b.family => {}
            [_, _] => {
                return Err(Error::Config(format!(
                    "service CIDRs {range:?}: a dual-stack range needs one CIDR of each family"
                )))
            }
            _ => {
                return Err(Error::Config(format!(
                    "service CIDRs {range:?}: one CIDR, or two of different families"
                )))
            }
        }
        Ok(ClusterIps { pools })
    }

    /// The pools, primary first.
    pub fn pools(&self) -> &[Pool] {
        &self.pools
    }

    fn pool(&self, f: Family) -> Option<&Pool> {
        self.pools.iter().find(|p| p.family == f)
    }

    /// Frees the addresses `before` held that `after` does not, takes those of `after`.
    fn commit(&mut self, before: Option<&Value>, after: Option<&Value>) {
        let now = after.map(held).unwrap_or_default();
        for ip in before.map(held).unwrap_or_default() {
            if !now.contains(&ip) {
                for p in &mut self.pools {
                    p.release(ip);
                }
            }
        }
        for ip in now {
            for p in &mut self.pools {
                p.take(ip);
            }
        }
    }
}

/// What the store hands Services: ClusterIPs and node ports.
#[derive(Debug, Clone, Default)]
pub struct Allocator {
    /// The service CIDR(s).
    pub cluster_ips: ClusterIps,
    /// The node port range.
    pub node_ports: NodePorts,
}

impl Allocator {
    /// Records a committed Service change (`before` -> `after`, either absent): frees what
    /// `before` held that `after` does not, takes what `after` holds.
    pub fn commit(&mut self, before: Option<&Value>, after: Option<&Value>) {
        self.cluster_ips.commit(before, after);
        let now = after.map(node_ports_of).unwrap_or_default();
        for n in before.map(node_ports_of).unwrap_or_default() {
            if !now.contains(&n) {
                self.node_ports.slots.release(n);
            }
        }
        for n in now {
            self.node_ports.slots.take(n);
        }
    }
}

/// The node ports a stored Service holds.
fn node_ports_of(svc: &Value) -> Vec<u128> {
    svc.pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("nodePort")?.as_u64())
        .map(u128::from)
        .collect()
}

/// The addresses a stored Service holds (`spec.clusterIPs`, else `spec.clusterIP`).
fn held(svc: &Value) -> Vec<IpAddr> {
    let spec = svc.get("spec");
    let ips = spec
        .and_then(|s| s.get("clusterIPs"))
        .and_then(Value::as_array);
    let single = spec.and_then(|s| s.get("clusterIP")).into_iter();
    ips.map(|a| a.iter().collect::<Vec<_>>())
        .unwrap_or_else(|| single.collect())
        .into_iter()
        .filter_map(|v| v.as_str()?.parse().ok())
        .collect()
}

const TYPES: &[&str] = &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"];
const POLICIES: &[&str] = &["PreferDualStack", "RequireDualStack", "SingleStack"];

/// A string field, absent when empty (Go's zero value).
fn str_of<'a>(m: &'a Map<String, Value>, k: &str) -> Option<&'a str> {
    m.get(k).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// Go's `%#v` of a `[]string`, as kube-apiserver prints invalid lists.
fn go_strings(v: &[String]) -> String {
    let items: Vec<String> = v.iter().map(|s| format!("{s:?}")).collect();
    format!("[]string{{{}}}", items.join(", "))
}

fn quoted(s: &str) -> String {
    format!("{s:?}")
}

/// Defaults, validates and assigns the addresses and node ports of the Service `name` about to
/// be stored; `old` is the stored version on an update. `alloc` is only read: the store commits
/// what this chose ([`Allocator::commit`]).
pub fn prepare(alloc: &Allocator, name: &str, obj: &mut Value, old: Option<&Value>) -> Result<()> {
    let o = obj
        .as_object_mut()
        .ok_or_else(|| Error::bad_request("the body must be a JSON object"))?;
    let spec = o.entry("spec").or_insert_with(|| json!({}));
    if spec.is_null() {
        *spec = json!({});
    }
    let spec = spec.as_object_mut().ok_or_else(|| {
        Error::invalid_object(
            "Service",
            name,
            &[Cause::invalid("spec", "", "must be an object")],
        )
    })?;
    let old_spec = old.and_then(|o| o.get("spec")).and_then(Value::as_object);
    let mut causes = Vec::new();
    defaults_and_ports(spec, old_spec, &mut causes);
    if causes.is_empty() {
        addresses(&alloc.cluster_ips, spec, old_spec, &mut causes)?;
    }
    if causes.is_empty() {
        node_ports(&alloc.node_ports, spec, old_spec, &mut causes)?;
    }
    if !causes.is_empty() {
        return Err(Error::invalid_object("Service", name, &causes));
    }
    if old.is_none() && o.get("status").is_none_or(Value::is_null) {
        o.insert("status".into(), json!({"loadBalancer": {}}));
    }
    Ok(())
}

fn is_headless(spec: &Map<String, Value>) -> bool {
    str_of(spec, "clusterIP") == Some("None")
        || spec
            .get("clusterIPs")
            .and_then(|v| v.get(0))
            .and_then(Value::as_str)
            == Some("None")
}

fn external(ty: &str) -> bool {
    ty == "NodePort" || ty == "LoadBalancer"
}

/// kube-apiserver's `SetDefaults_Service` and the port and policy parts of `ValidateService`.
fn defaults_and_ports(
    spec: &mut Map<String, Value>,
    old: Option<&Map<String, Value>>,
    causes: &mut Vec<Cause>,
) {
    let ty = str_of(spec, "type").unwrap_or("ClusterIP").to_owned();
    spec.insert("type".into(), json!(ty));
    if !TYPES.contains(&ty.as_str()) {
        causes.push(Cause::unsupported("spec.type", &ty, TYPES));
    }
    let affinity = str_of(spec, "sessionAffinity").unwrap_or("None").to_owned();
    spec.insert("sessionAffinity".into(), json!(affinity));
    match affinity.as_str() {
        "ClientIP" => {
            let timeout = spec
                .get("sessionAffinityConfig")
                .and_then(|c| c.pointer("/clientIP/timeoutSeconds"))
                .cloned();
            match timeout {
                None | Some(Value::Null) => {
                    let cfg = spec
                        .entry("sessionAffinityConfig")
                        .or_insert_with(|| json!({}));
                    if !cfg.is_object() {
                        *cfg = json!({});
                    }
                    let client = &mut cfg["clientIP"];
                    if !client.is_object() {
                        *client = json!({});
                    }
                    client["timeoutSeconds"] = json!(10800);
                }
                Some(t) if t.as_i64().is_some_and(|t| (1..=86400).contains(&t)) => {}
                Some(t) => causes.push(Cause::invalid(
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                    &t.to_string(),
                    "must be greater than 0 and less than 86400",
                )),
            }
        }
        "None" => {
            if spec
                .get("sessionAffinityConfig")
                .is_some_and(|c| !c.is_null())
            {
                causes.push(Cause::forbidden(
                    "spec.sessionAffinityConfig",
                    "must not be set when session affinity is None",
                ));
            }
        }
        other => causes.push(Cause::unsupported(
            "spec.sessionAffinity",
            other,
            &["ClientIP", "None"],
        )),
    }
    let traffic = ["Cluster", "Local"];
    if ty != "ExternalName" {
        let itp = str_of(spec, "internalTrafficPolicy")
            .unwrap_or("Cluster")
            .to_owned();
        if !traffic.contains(&itp.as_str()) {
            causes.push(Cause::unsupported(
                "spec.internalTrafficPolicy",
                &itp,
                &traffic,
            ));
        }
        spec.insert("internalTrafficPolicy".into(), json!(itp));
    }
    match str_of(spec, "externalTrafficPolicy").map(str::to_owned) {
        None if external(&ty) => {
            spec.insert("externalTrafficPolicy".into(), json!("Cluster"));
        }
        None => {
            spec.remove("externalTrafficPolicy");
        }
        Some(etp) if external(&ty) => {
            if !traffic.contains(&etp.as_str()) {
                causes.push(Cause::unsupported(
                    "spec.externalTrafficPolicy",
                    &etp,
                    &traffic,
                ));
            }
        }
        Some(etp) => {
            // Left over from before a change of type: dropped, as kube-apiserver does.
            let was = old.and_then(|o| str_of(o, "externalTrafficPolicy"));
            if was == Some(etp.as_str()) {
                spec.remove("externalTrafficPolicy");
            } else {
                causes.push(Cause::invalid(
                    "spec.externalTrafficPolicy",
                    &quoted(&etp),
                    "may only be set for externally-accessible services",
                ));
            }
        }
    }
    // Plain Go fields a protobuf body always carries, left out of JSON at their zero value.
    if spec.get("healthCheckNodePort").and_then(Value::as_i64) == Some(0) {
        spec.remove("healthCheckNodePort");
    }
    if spec.get("publishNotReadyAddresses") == Some(&json!(false)) {
        spec.remove("publishNotReadyAddresses");
    }
    if ty == "LoadBalancer" && spec.get("allocateLoadBalancerNodePorts").is_none() {
        spec.insert("allocateLoadBalancerNodePorts".into(), json!(true));
    }
    if ty == "ExternalName" && str_of(spec, "externalName").is_none() {
        causes.push(Cause::required("spec.externalName", ""));
    }
    let headless = is_headless(spec);
    let mut ports = match spec.get_mut("ports") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => std::mem::take(a),
        Some(_) => {
            causes.push(Cause::invalid("spec.ports", "", "must be a list"));
            return;
        }
    };
    if ports.is_empty() && ty != "ExternalName" && !headless {
        causes.push(Cause::required("spec.ports", ""));
    }
    let many = ports.len() > 1;
    let mut names: Vec<String> = Vec::new();
    let mut keys: Vec<(i64, String)> = Vec::new();
    for (i, p) in ports.iter_mut().enumerate() {
        let path = format!("spec.ports[{i}]");
        let Some(p) = p.as_object_mut() else {
            causes.push(Cause::invalid(path, "", "must be an object"));
            continue;
        };
        let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
        if !(1..=65535).contains(&port) {
            causes.push(Cause::invalid(
                format!("{path}.port"),
                &port.to_string(),
                "must be between 1 and 65535, inclusive",
            ));
        }
        let protocol = str_of(p, "protocol").unwrap_or("TCP").to_owned();
        if !["SCTP", "TCP", "UDP"].contains(&protocol.as_str()) {
            causes.push(Cause::unsupported(
                format!("{path}.protocol"),
                &protocol,
                &["SCTP", "TCP", "UDP"],
            ));
        }
        p.insert("protocol".into(), json!(protocol));
        match p.get("targetPort") {
            None | Some(Value::Null) => {
                p.insert("targetPort".into(), json!(port));
            }
            Some(Value::Number(n)) if n.as_i64() == Some(0) => {
                p.insert("targetPort".into(), json!(port));
            }
            Some(Value::String(s)) if s.is_empty() => {
                p.insert("targetPort".into(), json!(port));
            }
            Some(Value::Number(n)) if !n.as_i64().is_some_and(|t| (1..=65535).contains(&t)) => {
                causes.push(Cause::invalid(
                    format!("{path}.targetPort"),
                    &n.to_string(),
                    "must be between 1 and 65535, inclusive",
                ));
            }
            _ => {}
        }
        // A protobuf body always carries the plain int32 nodePort; 0 means none.
        if p.get("nodePort").and_then(Value::as_i64) == Some(0) {
            p.remove("nodePort");
        }
        match str_of(p, "name") {
            None if many => causes.push(Cause::required(format!("{path}.name"), "")),
            None => {}
            Some(n) if names.iter().any(|m| m == n) => {
                causes.push(Cause::duplicate(format!("{path}.name"), &quoted(n)));
            }
            Some(n) => names.push(n.to_owned()),
        }
        let key = (port, protocol);
        if keys.contains(&key) {
            causes.push(Cause::duplicate(
                path,
                &format!(
                    "core.ServicePort{{Name:\"\", Protocol:{:?}, AppProtocol:(*string)(nil), Port:{}, \
                     TargetPort:intstr.IntOrString{{Type:0, IntVal:0, StrVal:\"\"}}, NodePort:0}}",
                    key.1, key.0
                ),
            ));
        } else {
            keys.push(key);
        }
    }
    if !ports.is_empty() {
        spec.insert("ports".into(), Value::Array(ports));
    }
}

/// The address fields: `clusterIP`, `clusterIPs`, `ipFamilies`, `ipFamilyPolicy`.
fn addresses(
    ips: &ClusterIps,
    spec: &mut Map<String, Value>,
    old: Option<&Map<String, Value>>,
    causes: &mut Vec<Cause>,
) -> Result<()> {
    let ty = str_of(spec, "type").unwrap_or("ClusterIP").to_owned();
    let old_ips: Vec<String> = old
        .filter(|o| str_of(o, "type") != Some("ExternalName"))
        .map(|o| strings(o, "clusterIPs"))
        .unwrap_or_default();
    if ty == "ExternalName" {
        // Wiped on a change to ExternalName; refused when asked for.
        let asked = str_of(spec, "clusterIP").map(str::to_owned);
        if asked.is_some_and(|a| old_ips.first() != Some(&a)) {
            causes.push(Cause::forbidden(
                "spec.clusterIPs",
                "may not be set for ExternalName services",
            ));
        }
        for k in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            spec.remove(k);
        }
        return Ok(());
    }
    if let Some(old) = old.filter(|_| !old_ips.is_empty()) {
        // kube-apiserver's patchAllocatedValues then NormalizeClusterIPs: an update that omits
        // them keeps them (kubectl replace and apply send none), and a change of `clusterIP`
        // alone is a change of `clusterIPs[0]` (refused below).
        let old_ip = str_of(old, "clusterIP").unwrap_or("").to_owned();
        if str_of(spec, "clusterIP").is_none() {
            spec.insert("clusterIP".into(), json!(old_ip));
        }
        if strings(spec, "clusterIPs").is_empty() {
            spec.insert("clusterIPs".into(), json!(old_ips));
        }
        let new_ip = str_of(spec, "clusterIP").unwrap_or("").to_owned();
        if new_ip != old_ip && strings(spec, "clusterIPs") == old_ips {
            spec.insert("clusterIPs".into(), json!([new_ip]));
        }
        for k in ["ipFamilies", "ipFamilyPolicy"] {
            let absent = spec.get(k).is_none_or(|v| {
                v.is_null() || v.as_str() == Some("") || v.as_array().is_some_and(Vec::is_empty)
            });
            if absent {
                if let Some(v) = old.get(k) {
                    spec.insert(k.into(), v.clone());
                }
            }
        }
    }
    let mut requested = strings(spec, "clusterIPs");
    match (str_of(spec, "clusterIP"), requested.first()) {
        (Some(ip), None) => requested = vec![ip.to_owned()],
        (Some(ip), Some(first)) if ip != first => causes.push(Cause::invalid(
            "spec.clusterIPs",
            &go_strings(&requested),
            "first value must match `clusterIP`",
        )),
        _ => {}
    }
    for (i, (was, now)) in old_ips.iter().zip(&requested).enumerate() {
        if was != now {
            causes.push(Cause::invalid(
                format!("spec.clusterIPs[{i}]"),
                &go_strings(&requested),
                "may not change once set",
            ));
        }
    }
    if !causes.is_empty() {
        return Ok(());
    }
    let headless = requested.first().map(String::as_str) == Some("None");
    if headless && external(&ty) {
        causes.push(Cause::invalid(
            "spec.clusterIPs[0]",
            &quoted("None"),
            &format!("may not be set to 'None' for {ty} services"),
        ));
    }
    let mut addrs: Vec<IpAddr> = Vec::new();
    if headless && requested.len() > 1 {
        causes.push(Cause::invalid(
            "spec.clusterIPs",
            &go_strings(&requested),
            "'None' may only be the only value",
        ));
    }
    if !headless {
        for (i, s) in requested.iter().enumerate() {
            match s.parse::<IpAddr>() {
                Ok(ip) => addrs.push(ip),
                Err(_) => causes.push(Cause::invalid(
                    format!("spec.clusterIPs[{i}]"),
                    &quoted(s),
                    "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
                )),
            }
        }
    }
    if requested.len() > 2 {
        causes.push(Cause::invalid(
            "spec.clusterIPs",
            &go_strings(&requested),
            "may only hold up to 2 values",
        ));
    } else if let [a, b] = addrs.as_slice() {
        if Family::of(*a) == Family::of(*b) {
            causes.push(Cause::invalid(
                "spec.clusterIPs[1]",
                &quoted(&b.to_string()),
                "may not have the same IP family as clusterIPs[0]",
            ));
        }
    }
    let mut families: Vec<Family> = Vec::new();
    for (i, f) in strings(spec, "ipFamilies").iter().enumerate() {
        let path = format!("spec.ipFamilies[{i}]");
        match Family::parse(f) {
            None => causes.push(Cause::unsupported(path, f, &["IPv4", "IPv6"])),
            Some(f) if families.contains(&f) => {
                causes.push(Cause::duplicate(path, &quoted(f.as_str())))
            }
            Some(f) => families.push(f),
        }
    }
    for (i, (f, ip)) in families.iter().zip(&addrs).enumerate() {
        if *f != Family::of(*ip) {
            causes.push(Cause::invalid(
                format!("spec.ipFamilies[{i}]"),
                &quoted(f.as_str()),
                &format!("does not match the IP family of clusterIPs[{i}]"),
            ));
        }
    }
    let selectorless = spec
        .get("selector")
        .and_then(Value::as_object)
        .is_none_or(Map::is_empty);
    let policy = match str_of(spec, "ipFamilyPolicy") {
        Some(p) => p.to_owned(),
        None if addrs.len() == 2 || families.len() == 2 || headless && selectorless => {
            "RequireDualStack".to_owned()
        }
        None => "SingleStack".to_owned(),
    };
    if !POLICIES.contains(&policy.as_str()) {
        causes.push(Cause::unsupported("spec.ipFamilyPolicy", &policy, POLICIES));
    }
    if policy == "SingleStack" && (addrs.len() == 2 || families.len() == 2) {
        causes.push(Cause::invalid(
            "spec.ipFamilyPolicy",
            &quoted(&policy),
            "must be RequireDualStack or PreferDualStack when multiple IP families are specified",
        ));
    }
    if policy == "RequireDualStack" && ips.pools.len() < 2 && !(headless && selectorless) {
        causes.push(Cause::invalid(
            "spec.ipFamilyPolicy",
            &quoted(&policy),
            "this cluster is not configured for dual-stack services",
        ));
    }
    if !causes.is_empty() {
        return Ok(());
    }
    // Families: as asked (ipFamilies, else the requested addresses'), else the primary; a
    // dual-stack policy adds the other family where the range has it.
    for ip in addrs.iter().skip(families.len()) {
        families.push(Family::of(*ip));
    }
    if families.is_empty() {
        if let Some(p) = ips.pools.first() {
            families.push(p.family);
        }
    }
    if policy != "SingleStack" && families.len() == 1 {
        if let Some(p) = ips.pools.iter().find(|p| p.family != families[0]) {
            families.push(p.family);
        }
    }
    for (i, f) in families.iter().enumerate() {
        if ips.pool(*f).is_none() {
            causes.push(Cause::invalid(
                format!("spec.ipFamilies[{i}]"),
                &quoted(f.as_str()),
                "not configured on this cluster",
            ));
        }
    }
    if !causes.is_empty() {
        return Ok(());
    }
    let chosen: Vec<String> = if headless {
        vec!["None".to_owned()]
    } else {
        let mut chosen = Vec::new();
        for (i, f) in families.iter().enumerate() {
            let Some(pool) = ips.pool(*f) else { continue };
            let ip = match addrs.get(i) {
                Some(ip) => {
                    let fail = |why: String| {
                        Cause::invalid(
                            "spec.clusterIPs",
                            &go_strings(&requested),
                            &format!("failed to allocate IP {ip}: {why}"),
                        )
                    };
                    if !pool.contains(*ip) {
                        causes.push(fail(format!(
                            "the provided IP ({ip}) is not in the valid range. The range of valid IPs is {}",
                            pool.cidr()
                        )));
                        continue;
                    }
                    if pool.is_taken(*ip) && !old_ips.contains(&ip.to_string()) {
                        causes.push(fail("provided IP is already allocated".to_owned()));
                        continue;
                    }
                    *ip
                }
                None => pool.next_free().ok_or_else(|| {
                    Error::internal("failed to allocate a serviceIP: range is full")
                })?,
            };
            chosen.push(ip.to_string());
        }
        chosen
    };
    if !causes.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = families.iter().map(|f| f.as_str()).collect();
    let Some(primary) = chosen.first() else {
        return Err(Error::internal(
            "no service CIDR to allocate a ClusterIP from",
        ));
    };
    spec.insert("clusterIP".into(), json!(primary));
    spec.insert("clusterIPs".into(), json!(chosen));
    spec.insert("ipFamilies".into(), json!(names));
    spec.insert("ipFamilyPolicy".into(), json!(policy));
    Ok(())
}

/// The ports' `nodePort`s: kept from the stored version where omitted, checked where asked for,
/// allocated for NodePort and LoadBalancer Services (unless `allocateLoadBalancerNodePorts` is
/// false), dropped on a change to a type without them.
fn node_ports(
    pool: &NodePorts,
    spec: &mut Map<String, Value>,
    old: Option<&Map<String, Value>>,
    causes: &mut Vec<Cause>,
) -> Result<()> {
    let ty = str_of(spec, "type").unwrap_or("ClusterIP").to_owned();
    let auto = external(&ty)
        && !(ty == "LoadBalancer"
            && spec.get("allocateLoadBalancerNodePorts") == Some(&json!(false)));
    // (name, nodePort) of the stored version.
    let old_ports: Vec<(String, i64)> = old
        .and_then(|o| o.get("ports"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let n = p.get("nodePort")?.as_i64()?;
            Some((
                p.get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                n,
            ))
        })
        .collect();
    let Some(Value::Array(ports)) = spec.get_mut("ports") else {
        return Ok(());
    };
    let node_port = |p: &Value| p.get("nodePort").and_then(Value::as_i64);
    if !external(&ty) {
        for (i, p) in ports.iter_mut().enumerate() {
            let Some(n) = node_port(p) else { continue };
            if old_ports.iter().any(|(_, o)| *o == n) {
                // Left over from before a change of type: dropped, as kube-apiserver does.
                if let Some(p) = p.as_object_mut() {
                    p.remove("nodePort");
                }
            } else {
                causes.push(Cause::forbidden(
                    format!("spec.ports[{i}].nodePort"),
                    &format!("may not be used when `type` is '{ty}'"),
                ));
            }
        }
        return Ok(());
    }
    // kube-apiserver's patchAllocatedValues: a port that omits its node port keeps its name's
    // stored one, unless another port of the update took it.
    let asked: Vec<i64> = ports.iter().filter_map(node_port).collect();
    for p in ports.iter_mut() {
        let name = p
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if node_port(p).is_none() {
            if let Some((_, n)) = old_ports
                .iter()
                .find(|(o, n)| *o == name && !asked.contains(n))
            {
                if let Some(p) = p.as_object_mut() {
                    p.insert("nodePort".into(), json!(n));
                }
            }
        }
    }
    let held: Vec<i64> = old_ports.iter().map(|(_, n)| *n).collect();
    // (nodePort, protocol, port) chosen so far in this request.
    let mut chosen: Vec<(i64, String, i64)> = Vec::new();
    for (i, p) in ports.iter_mut().enumerate() {
        let path = format!("spec.ports[{i}].nodePort");
        let protocol = p
            .get("protocol")
            .and_then(Value::as_str)
            .unwrap_or("TCP")
            .to_owned();
        let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
        let n = match node_port(p) {
            Some(n) => {
                let shared = chosen.iter().any(|(c, _, _)| *c == n);
                if chosen.iter().any(|(c, pr, _)| *c == n && *pr == protocol) {
                    causes.push(Cause::duplicate(path, &n.to_string()));
                    continue;
                }
                let slot = u128::try_from(n).ok().filter(|s| pool.slots.contains(*s));
                match slot {
                    None => causes.push(Cause::invalid(
                        path,
                        &n.to_string(),
                        &format!(
                            "provided port is not in the valid range. The range of valid ports is {}",
                            pool.range()
                        ),
                    )),
                    Some(s) if pool.slots.is_taken(s) && !held.contains(&n) && !shared => causes
                        .push(Cause::invalid(path, &n.to_string(), "provided port is already allocated")),
                    Some(_) => {}
                }
                n
            }
            None if auto => {
                // The same port number on another protocol shares its node port, as there.
                let same = chosen
                    .iter()
                    .find(|(_, pr, po)| *po == port && *pr != protocol);
                let n = match same {
                    Some((n, _, _)) => *n,
                    None => {
                        let except: Vec<u128> = chosen
                            .iter()
                            .filter_map(|(c, _, _)| u128::try_from(*c).ok())
                            .collect();
                        let s = pool.slots.next_free(&except).ok_or_else(|| {
                            Error::internal("failed to allocate a nodePort: range is full")
                        })?;
                        i64::try_from(s).unwrap_or(0)
                    }
                };
                if let Some(p) = p.as_object_mut() {
                    p.insert("nodePort".into(), json!(n));
                }
                n
            }
            None => continue,
        };
        chosen.push((n, protocol, port));
    }
    Ok(())
}

/// A list of strings (non-strings and empty strings left out).
fn strings(m: &Map<String, Value>, k: &str) -> Vec<String> {
    m.get(k)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_parse_as_kube_apiserver_accepts_them() {
        let d = ClusterIps::default();
        assert_eq!(d.pools().len(), 1);
        assert_eq!(d.pools()[0].cidr(), "10.96.0.0/12");
        assert_eq!(d.pools()[0].capacity(), (1 << 20) - 2);
        let ds = ClusterIps::parse("10.96.0.0/12,fd00:10:96::/108").unwrap();
        assert_eq!(ds.pools()[1].family(), Family::V6);
        assert_eq!(ds.pools()[1].capacity(), (1 << 20) - 1);
        for bad in [
            "10.96.0.0/8",
            "fd00::/64",
            "10.96.0.0",
            "10.96.0.0/33",
            "10.0.0.0/16,10.1.0.0/16",
            "10.0.0.0/31",
            "x/12",
            "",
        ] {
            assert!(
                matches!(ClusterIps::parse(bad), Err(Error::Config(_))),
                "{bad}"
            );
        }
        let p = Pool::parse("10.96.0.7/24").unwrap();
        assert_eq!(p.cidr(), "10.96.0.0/24");
        assert!(!p.contains(ip("10.96.0.0")) && !p.contains(ip("10.96.0.255")));
        assert!(p.contains(ip("10.96.0.1")) && p.contains(ip("10.96.0.254")));
        let p6 = Pool::parse("fd00::/120").unwrap();
        assert!(!p6.contains(ip("fd00::")) && p6.contains(ip("fd00::ff")));
    }

    #[test]
    fn commit_follows_the_stored_services() {
        let mut ips = ClusterIps::default();
        let a = json!({"spec": {"clusterIPs": ["10.96.0.1"]}});
        let b = json!({"spec": {"clusterIP": "10.96.0.2"}});
        ips.commit(None, Some(&a));
        ips.commit(None, Some(&b));
        assert_eq!(ips.pools()[0].in_use(), 2);
        ips.commit(Some(&a), Some(&json!({"spec": {"type": "ExternalName"}})));
        assert!(!ips.pools()[0].is_taken(ip("10.96.0.1")));
        ips.commit(Some(&b), None);
        assert_eq!(ips.pools()[0].in_use(), 0);
    }

    #[test]
    fn slots_pass_over_what_a_request_already_chose() {
        let mut s = Slots::new(30000, 30003);
        assert!(s.take(30000) && !s.take(30000) && !s.take(29999));
        assert_eq!(s.next_free(&[30001]), Some(30002));
        assert_eq!(s.next_free(&[30001, 30002, 30003]), None);
        assert!(s.take(30003));
        // The cursor wrapped to the start: the free slots before it are found.
        assert_eq!(s.next_free(&[]), Some(30001));
        assert_eq!(
            NodePorts::parse("30000-32767").unwrap().range(),
            "30000-32767"
        );
        for bad in ["0-10", "20-10", "30000", "a-b", "1-70000"] {
            assert!(NodePorts::parse(bad).is_err(), "{bad}");
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Allocate,
        /// Frees the n-th address held (modulo their count).
        Release(usize),
        /// Takes an arbitrary offset from the network address, inside the CIDR or past it.
        Take(u32),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        proptest::collection::vec(
            prop_oneof![
                4 => Just(Op::Allocate),
                2 => any::<usize>().prop_map(Op::Release),
                1 => (0u32..40).prop_map(Op::Take),
            ],
            0..120,
        )
    }

    fn cidrs() -> impl Strategy<Value = String> {
        prop_oneof![
            (27u32..=30).prop_map(|l| format!("10.96.0.32/{l}")),
            (123u32..=127).prop_map(|l| format!("fd00:10:96::20/{l}")),
        ]
    }

    proptest! {
        /// No address is handed out twice, a released one becomes free again, the network and
        /// (IPv4) broadcast addresses are never given, everything given is inside the CIDR, and
        /// allocation fails only when every usable address is held.
        #[test]
        fn allocator_invariants(cidr in cidrs(), ops in ops()) {
            let mut pool = Pool::parse(&cidr).unwrap();
            let (net, len) = cidr.split_once('/').unwrap();
            let net = to_u128(ip(net));
            let size = 1u128 << (pool.family().width() - len.parse::<u32>().unwrap());
            let mut held: Vec<IpAddr> = Vec::new();
            for op in ops {
                match op {
                    Op::Allocate => match pool.allocate() {
                        Some(a) => {
                            prop_assert!(!held.contains(&a), "{a} handed out twice");
                            let off = to_u128(a) - net;
                            prop_assert!(off > 0 && off < size, "{a} outside {cidr} or the network address");
                            if pool.family() == Family::V4 {
                                prop_assert!(off != size - 1, "{a} is the broadcast address");
                            }
                            held.push(a);
                        }
                        None => prop_assert_eq!(held.len() as u128, pool.capacity()),
                    },
                    Op::Release(n) if !held.is_empty() => {
                        let a = held.remove(n % held.len());
                        prop_assert!(pool.release(a));
                        prop_assert!(!pool.is_taken(a));
                        prop_assert!(!pool.release(a), "released twice");
                        // Reusable: with every other address held, it is the next one given.
                        if held.len() as u128 + 1 == pool.capacity() {
                            prop_assert_eq!(pool.next_free(), Some(a));
                        }
                    }
                    Op::Release(_) => {}
                    Op::Take(off) => {
                        let a = match pool.family() {
                            Family::V4 => IpAddr::V4(Ipv4Addr::from((net + u128::from(off)) as u32)),
                            Family::V6 => IpAddr::V6(Ipv6Addr::from(net + u128::from(off))),
                        };
                        let usable = pool.contains(a);
                        let took = pool.take(a);
                        prop_assert_eq!(took, usable && !held.contains(&a));
                        if took {
                            held.push(a);
                        }
                    }
                }
                prop_assert_eq!(pool.in_use(), held.len());
            }
        }
    }
}
