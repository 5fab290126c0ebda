//! The Kubernetes writes that more than one kind or task makes: IP records (`ips.kubeovn.io`: one per pod
//! network and per node port, named like the port; the pod and node kinds write them, the GC and the start
//! read them) and Subnet status patches (the subnet kind's conditions, the status task's counters).
//!
//! The records the controller writes carry `ovn.kubernetes.io/ip_reserved=false` (as Kube-OVN's do since
//! 1.13); any other record is a user's reservation: never garbage collected, its address kept reserved.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kubeovn_ipam::{Addresses, Allocation, Mac};

use kube::api::{Patch, PatchParams};

use super::error::{ControllerError, Result};
use crate::crd::{Decoded, IPSpec, StatusPatch, Subnet, IP};

/// Label of a record: `false` on those the controller writes for a pod or a node.
pub(crate) const RESERVED_LABEL: &str = "ovn.kubernetes.io/ip_reserved";
/// Label naming a record's subnet.
pub(crate) const SUBNET_LABEL: &str = "ovn.kubernetes.io/subnet";

pub(crate) fn api(client: &kube::Client) -> Api<IP> {
    Api::all(client.clone())
}

/// What an IP record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IpRecord {
    pub name: String,
    pub subnet: String,
    pub namespace: String,
    pub pod: String,
    pub node: String,
    pub addrs: Addresses,
    pub pod_type: String,
}

impl IpRecord {
    fn spec(&self) -> IPSpec {
        let ips: Vec<String> = self.addrs.ips().map(|i| i.to_string()).collect();
        IPSpec {
            pod_name: self.pod.clone(),
            namespace: self.namespace.clone(),
            subnet: self.subnet.clone(),
            attach_subnets: Vec::new(),
            node_name: self.node.clone(),
            ip_address: ips.join(","),
            v4_ip_address: self.addrs.v4.map(|a| a.to_string()).unwrap_or_default(),
            v6_ip_address: self.addrs.v6.map(|a| a.to_string()).unwrap_or_default(),
            attach_ips: Vec::new(),
            mac_address: self.addrs.mac.to_string(),
            attach_macs: Vec::new(),
            container_id: String::new(),
            pod_type: self.pod_type.clone(),
        }
    }

    pub(crate) fn object(&self) -> IP {
        let mut labels = BTreeMap::new();
        labels.insert("ovn.kubernetes.io/subnet".to_owned(), self.subnet.clone());
        labels.insert(self.subnet.clone(), String::new());
        labels.insert(RESERVED_LABEL.to_owned(), "false".to_owned());
        if !self.node.is_empty() {
            labels.insert("ovn.kubernetes.io/node-name".to_owned(), self.node.clone());
        }
        let mut o = IP::new(&self.name, self.spec());
        o.metadata.labels = Some(labels);
        o
    }

    pub(crate) fn from_object(o: &IP) -> Option<IpRecord> {
        Self::from_spec(o.metadata.name.clone()?, &o.spec)
    }

    fn from_spec(name: String, spec: &IPSpec) -> Option<IpRecord> {
        let (v4, v6) = spec_ips(spec);
        Some(IpRecord {
            name,
            subnet: spec.subnet.clone(),
            namespace: spec.namespace.clone(),
            pod: spec.pod_name.clone(),
            node: spec.node_name.clone(),
            addrs: Addresses {
                v4,
                v6,
                mac: spec.mac_address.parse().ok()?,
            },
            pod_type: spec.pod_type.clone(),
        })
    }
}

/// The addresses a spec names, in `ipAddress` or the per-family fields.
fn spec_ips(spec: &IPSpec) -> (Option<Ipv4Addr>, Option<Ipv6Addr>) {
    let (mut v4, mut v6) = (None, None);
    for ip in spec
        .ip_address
        .split(',')
        .chain([spec.v4_ip_address.as_str(), spec.v6_ip_address.as_str()])
    {
        match ip.trim().parse::<IpAddr>() {
            Ok(IpAddr::V4(a)) => v4 = Some(a),
            Ok(IpAddr::V6(a)) => v6 = Some(a),
            // Empty fields are the usual case; a malformed address is said, not dropped in silence.
            Err(e) if !ip.trim().is_empty() => {
                tracing::warn!(address = ip, error = %e, "IP record address ignored: not an IP address")
            }
            Err(_) => {}
        }
    }
    (v4, v6)
}

/// An IP record as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    pub name: String,
    pub subnet: String,
    /// The pod's namespace (empty for a node's record or a reservation not bound to a pod).
    pub namespace: String,
    /// The pod, or the node for a node's record.
    pub pod: String,
    /// The addresses (no MAC: a reservation may name none).
    pub v4: Option<Ipv4Addr>,
    pub v6: Option<Ipv6Addr>,
    pub mac: Option<Mac>,
    /// Whether the controller wrote it for a pod or a node; else it is a reservation, left alone.
    pub ours: bool,
}

impl Listed {
    pub(crate) fn new(
        name: String,
        labels: Option<&BTreeMap<String, String>>,
        spec: &IPSpec,
    ) -> Self {
        let (v4, v6) = spec_ips(spec);
        Listed {
            name,
            subnet: spec.subnet.clone(),
            namespace: spec.namespace.clone(),
            pod: spec.pod_name.clone(),
            v4,
            v6,
            mac: spec.mac_address.parse().ok(),
            ours: is_ours(labels),
        }
    }

    /// The owner key used in the allocator: `namespace/pod`, or the record's name (node ports, reservations
    /// not bound to a pod).
    pub fn owner(&self) -> String {
        if self.namespace.is_empty() {
            self.name.clone()
        } else {
            crate::naming::pod_key(&self.namespace, &self.pod)
        }
    }

    /// The allocator record; None if it names no subnet or no address.
    pub fn allocation(&self) -> Option<Allocation> {
        if self.subnet.is_empty() || (self.v4.is_none() && self.v6.is_none()) {
            return None;
        }
        Some(Allocation {
            subnet: self.subnet.clone(),
            pod: self.owner(),
            nic: self.name.clone(),
            v4: self.v4,
            v6: self.v6,
            mac: self.mac,
            pool: None,
        })
    }
}

/// Whether a record's labels say the controller wrote it: `ip_reserved=false`, or no `ip_reserved` label
/// but the subnet label (records written before the mark existed, by this controller or Kube-OVN < 1.13).
pub(crate) fn is_ours(labels: Option<&BTreeMap<String, String>>) -> bool {
    let get = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    match get(RESERVED_LABEL) {
        Some(v) => v == "false",
        None => get(SUBNET_LABEL).is_some(),
    }
}

/// Every IP record (an absent IP CRD gives none). Decoded as the typed CRD, not as JSON values: at start
/// this lists one record per pod.
pub(crate) async fn list_records(client: &kube::Client) -> Result<Vec<Listed>> {
    let api: Api<IP> = Api::all(client.clone());
    let mut out = Vec::new();
    let mut lp = ListParams::default().limit(10_000);
    loop {
        let page = match api.list(&lp).await {
            Ok(p) => p,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(out),
            Err(e) => return Err(ControllerError::kube("list ips", e)),
        };
        out.extend(page.items.iter().filter_map(|ip| {
            Some(Listed::new(
                ip.metadata.name.clone()?,
                ip.metadata.labels.as_ref(),
                &ip.spec,
            ))
        }));
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => return Ok(out),
        }
    }
}

/// Creates the record, or replaces it if it says something else.
pub(crate) async fn ensure(client: &kube::Client, rec: &IpRecord) -> Result<()> {
    let api = api(client);
    let obj = rec.object();
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let cur = api
                .get(&rec.name)
                .await
                .map_err(|e| ControllerError::kube(format!("get ip {}", rec.name), e))?;
            if IpRecord::from_object(&cur).as_ref() == Some(rec) {
                return Ok(());
            }
            let mut new = obj;
            new.metadata.resource_version = cur.metadata.resource_version.clone();
            api.replace(&rec.name, &PostParams::default(), &new)
                .await
                .map(|_| ())
                .map_err(|e| ControllerError::kube(format!("replace ip {}", rec.name), e))
        }
        Err(e) => Err(ControllerError::kube(format!("create ip {}", rec.name), e)),
    }
}

/// Deletes a record (gone already is fine).
pub(crate) async fn delete(client: &kube::Client, name: &str) -> Result<()> {
    match api(client).delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(ControllerError::kube(format!("delete ip {name}"), e)),
    }
}

/// Merge-patches the fields of `status` (a [`StatusPatch`] body) into Subnet `name`'s status (gone is
/// fine).
pub(crate) async fn patch_subnet_status<T: serde::Serialize + std::fmt::Debug>(
    client: &kube::Client,
    name: &str,
    status: &StatusPatch<T>,
) -> Result<()> {
    // The reply is read as a Decoded: a Subnet whose spec does not decode gets its refusal written too.
    let api: Api<Decoded<Subnet>> = Api::all(client.clone());
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(ControllerError::kube(
            format!("patch subnet {name} status"),
            e,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_the_controllers_records_from_reservations() {
        let l = |kv: &[(&str, &str)]| {
            let m: BTreeMap<String, String> = kv
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            is_ours(Some(&m))
        };
        assert!(l(&[(RESERVED_LABEL, "false")]));
        assert!(!l(&[(RESERVED_LABEL, "true")]));
        assert!(!l(&[(RESERVED_LABEL, "true"), (SUBNET_LABEL, "s")]));
        // Written before the mark existed.
        assert!(l(&[(SUBNET_LABEL, "s"), ("s", "")]));
        // A user's record as Kube-OVN's docs write it.
        assert!(!l(&[]) && !is_ours(None));
        let rec = IpRecord {
            name: "p.ns".into(),
            subnet: "s".into(),
            namespace: "ns".into(),
            pod: "p".into(),
            node: String::new(),
            addrs: Addresses {
                v4: Some(Ipv4Addr::new(10, 0, 0, 2)),
                v6: None,
                mac: "00:00:00:00:00:01".parse().expect("mac"),
            },
            pod_type: String::new(),
        };
        assert!(is_ours(rec.object().metadata.labels.as_ref()));
    }
}
