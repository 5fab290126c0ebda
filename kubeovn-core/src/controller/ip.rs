//! IP records (`ips.kubeovn.io`): one per pod network and per node port, named like the port.

use std::collections::BTreeMap;
use std::net::IpAddr;

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, PostParams};
use kubeovn_ipam::{Addresses, Allocation};
use serde_json::{json, Value};

use super::error::{ControllerError, Result};
use super::Ctx;

/// The IP resource.
pub(crate) fn resource() -> ApiResource {
    ApiResource {
        group: "kubeovn.io".to_owned(),
        version: "v1".to_owned(),
        api_version: "kubeovn.io/v1".to_owned(),
        kind: "IP".to_owned(),
        plural: "ips".to_owned(),
    }
}

pub(crate) fn api(ctx: &Ctx) -> Api<DynamicObject> {
    Api::all_with(ctx.client.clone(), &resource())
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
    /// The owner key used in the allocator: `namespace/pod`, or the port name for node ports.
    pub fn owner(&self) -> String {
        if self.namespace.is_empty() {
            self.name.clone()
        } else {
            crate::naming::pod_key(&self.namespace, &self.pod)
        }
    }

    fn spec(&self) -> Value {
        let ips: Vec<String> = self.addrs.ips().map(|i| i.to_string()).collect();
        json!({
            "podName": self.pod,
            "namespace": self.namespace,
            "subnet": self.subnet,
            "attachSubnets": [],
            "nodeName": self.node,
            "ipAddress": ips.join(","),
            "v4IpAddress": self.addrs.v4.map(|a| a.to_string()).unwrap_or_default(),
            "v6IpAddress": self.addrs.v6.map(|a| a.to_string()).unwrap_or_default(),
            "attachIps": [],
            "macAddress": self.addrs.mac.to_string(),
            "attachMacs": [],
            "containerID": "",
            "podType": self.pod_type,
        })
    }

    fn object(&self) -> DynamicObject {
        let mut labels = BTreeMap::new();
        labels.insert("ovn.kubernetes.io/subnet".to_owned(), self.subnet.clone());
        labels.insert(self.subnet.clone(), String::new());
        if !self.node.is_empty() {
            labels.insert("ovn.kubernetes.io/node-name".to_owned(), self.node.clone());
        }
        let mut o = DynamicObject::new(&self.name, &resource());
        o.metadata.labels = Some(labels);
        o.data = json!({ "spec": self.spec() });
        o
    }

    fn from_object(o: &DynamicObject) -> Option<IpRecord> {
        let spec: crate::crd::IPSpec = serde_json::from_value(o.data.get("spec")?.clone()).ok()?;
        Self::from_spec(o.metadata.name.clone()?, &spec)
    }

    fn from_spec(name: String, spec: &crate::crd::IPSpec) -> Option<IpRecord> {
        let mut addrs = Addresses {
            v4: None,
            v6: None,
            mac: spec.mac_address.parse().ok()?,
        };
        for ip in spec
            .ip_address
            .split(',')
            .chain([spec.v4_ip_address.as_str(), spec.v6_ip_address.as_str()])
        {
            match ip.trim().parse::<IpAddr>() {
                Ok(IpAddr::V4(a)) => addrs.v4 = Some(a),
                Ok(IpAddr::V6(a)) => addrs.v6 = Some(a),
                Err(_) => {}
            }
        }
        Some(IpRecord {
            name,
            subnet: spec.subnet.clone(),
            namespace: spec.namespace.clone(),
            pod: spec.pod_name.clone(),
            node: spec.node_name.clone(),
            addrs,
            pod_type: spec.pod_type.clone(),
        })
    }

    /// The allocator record.
    pub fn allocation(&self) -> Allocation {
        Allocation::new(&self.subnet, &self.owner(), &self.name, self.addrs)
    }
}

/// Every IP record (an absent IP CRD gives none). Decoded as the typed CRD, not as JSON values: at start
/// this lists one record per pod.
pub(crate) async fn list_records(client: &kube::Client) -> Result<Vec<IpRecord>> {
    let api: Api<crate::crd::IP> = Api::all(client.clone());
    let mut out = Vec::new();
    let mut lp = ListParams::default().limit(10_000);
    loop {
        let page = match api.list(&lp).await {
            Ok(p) => p,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(out),
            Err(e) => return Err(ControllerError::kube("list ips", e)),
        };
        out.extend(
            page.items
                .iter()
                .filter_map(|ip| IpRecord::from_spec(ip.metadata.name.clone()?, &ip.spec)),
        );
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => return Ok(out),
        }
    }
}

/// Every IP record as allocator records.
pub(crate) async fn list(client: &kube::Client) -> Result<Vec<Allocation>> {
    Ok(list_records(client)
        .await?
        .iter()
        .filter(|r| !r.subnet.is_empty())
        .map(IpRecord::allocation)
        .collect())
}

/// Creates the record, or replaces it if it says something else.
pub(crate) async fn ensure(ctx: &Ctx, rec: &IpRecord) -> Result<()> {
    let api = api(ctx);
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
pub(crate) async fn delete(ctx: &Ctx, name: &str) -> Result<()> {
    match api(ctx).delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(ControllerError::kube(format!("delete ip {name}"), e)),
    }
}
