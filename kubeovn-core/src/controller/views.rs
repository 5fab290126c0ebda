//! What several kinds read, kept in one place below them: the subnet table (the subnets admitted, with the
//! allocator's subnets, users' reservations and IPPools kept in step with it), gateway health, the load
//! balancers of each VPC's Services, and the lookups over the stores that more than one kind makes (which
//! subnet serves a namespace, why a subnet cannot give addresses, the nodes' join addresses).
//!
//! Kinds never call each other: they read these views and change them only through these methods, and a
//! change another kind must react to is emitted as a typed signal ([`SubnetChanged`], [`AddressesFreed`],
//! [`GatewayHealthChanged`], [`VpcLbsChanged`]) that the kinds concerned subscribe to in their relations.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

use k8s_openapi::api::core::v1::Node;
use kube::{Resource, ResourceExt};
use kubeovn_ipam::{PoolSpec, SharedIpam};

use super::error::{ControllerError, Result};
use super::framework::{Key, Kinds};
use super::gateway::GatewayHealth;
use super::reservations::Reservations;
use super::subnet_spec::{self, Occupied};
use super::{Config, SubnetInfo};
use crate::crd::{Decoded, IPPool, Subnet};
use crate::naming;

/// Signal: a subnet was loaded (`old` None), changed, or removed (`new` None) in the subnet table.
#[derive(Debug)]
pub(crate) struct SubnetChanged {
    /// Before.
    pub old: Option<Arc<SubnetInfo>>,
    /// After.
    pub new: Option<Arc<SubnetInfo>>,
}

impl SubnetChanged {
    /// The subnet's name.
    pub fn name(&self) -> &str {
        self.new
            .as_deref()
            .or(self.old.as_deref())
            .map_or("", |s| s.name.as_str())
    }

    /// Both states that exist.
    pub fn states(&self) -> impl Iterator<Item = &SubnetInfo> {
        [self.old.as_deref(), self.new.as_deref()]
            .into_iter()
            .flatten()
    }
}

/// Signal: addresses were released in the subnet of this name.
#[derive(Debug)]
pub(crate) struct AddressesFreed(pub String);

/// Signal: the gateway node of this name stopped answering, or answers again.
#[derive(Debug)]
pub(crate) struct GatewayHealthChanged(pub String);

/// Signal: the load balancers of the VPC of this name changed.
#[derive(Debug)]
pub(crate) struct VpcLbsChanged(pub String);

/// The views (see the module docs). Shared as `Arc<Views>`: the context holds one, and kinds whose
/// relations read a view hold a clone.
pub(crate) struct Views {
    kinds: OnceLock<Arc<Kinds>>,
    ipam: Arc<SharedIpam>,
    config: Config,
    subnets: RwLock<HashMap<String, Arc<SubnetInfo>>>,
    /// IPPools by name: (subnet, addresses).
    pools: RwLock<HashMap<String, (String, Vec<String>)>>,
    reservations: Mutex<Reservations>,
    /// What the gateway checks found.
    pub gateways: GatewayHealth,
    /// Each Service's VPC and load balancers, by `namespace/name`.
    service_lbs: RwLock<HashMap<String, (String, Vec<String>)>>,
}

impl std::fmt::Debug for Views {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Views").finish_non_exhaustive()
    }
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

impl Views {
    /// Empty views over `ipam`; [`Views::attach`] gives them the kinds once built.
    pub fn new(ipam: Arc<SharedIpam>, config: Config) -> Arc<Self> {
        Arc::new(Views {
            kinds: OnceLock::new(),
            ipam,
            config,
            subnets: RwLock::default(),
            pools: RwLock::default(),
            reservations: Mutex::default(),
            gateways: GatewayHealth::default(),
            service_lbs: RwLock::default(),
        })
    }

    /// The kinds whose stores the lookups read and to which signals go.
    pub fn attach(&self, kinds: Arc<Kinds>) {
        let _ = self.kinds.set(kinds);
    }

    fn emit<S: Send + Sync + 'static>(&self, s: S) {
        if let Some(k) = self.kinds.get() {
            k.emit(&s);
        }
    }

    fn list<K: 'static>(&self) -> Vec<Arc<K>> {
        self.kinds.get().map(|k| k.list::<K>()).unwrap_or_default()
    }

    // --- the subnet table ---------------------------------------------------------------------------

    /// The admitted subnet `name`.
    pub fn subnet(&self, name: &str) -> Option<Arc<SubnetInfo>> {
        read(&self.subnets).get(name).cloned()
    }

    /// Every admitted subnet, by name.
    pub fn subnet_list(&self) -> Vec<Arc<SubnetInfo>> {
        let mut v: Vec<_> = read(&self.subnets).values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// The join subnet, once loaded.
    pub fn join_subnet(&self) -> Option<Arc<SubnetInfo>> {
        self.subnet(&self.config.join_subnet.name)
    }

    /// Loads a subnet into the allocator and the table without checking conflicts (the built-in ones).
    pub fn install(&self, info: SubnetInfo) -> Result<()> {
        self.install_checked(info, false)
    }

    /// Loads a subnet unless it conflicts with one already loaded ([`subnet_spec::check_conflicts`]): a
    /// refused subnet never reaches the allocator. The check and the load happen under the table's lock,
    /// so of two overlapping subnets handled at once only one gets in.
    pub fn admit(&self, info: SubnetInfo) -> Result<()> {
        self.install_checked(info, true)
    }

    fn install_checked(&self, info: SubnetInfo, check: bool) -> Result<()> {
        let mut subnets = write(&self.subnets);
        if check {
            let accepted: Vec<Arc<SubnetInfo>> = subnets.values().cloned().collect();
            subnet_spec::check_conflicts(
                &info,
                &Occupied {
                    default_vpc: &self.config.default_vpc,
                    subnets: &accepted,
                    service_cidrs: &subnet_spec::service_cidrs(&self.config)?,
                    node_ips: &self.node_ips(),
                },
            )?;
        }
        let dropped = self.ipam.add_or_update_subnet(&info.ipam_spec())?;
        for d in dropped {
            tracing::warn!(subnet = %info.name, pod = %d.pod, "allocation outside the updated subnet dropped");
        }
        if !subnets.contains_key(&info.name) {
            // Its pools: those handled while it was missing were not loaded (or went with its delete).
            self.install_pools_of(&info);
        }
        let name = info.name.clone();
        // Its reservations first: pods find the subnet only once it is in the table.
        self.reservations().subnet_loaded(&self.ipam, &name);
        let new = Arc::new(info);
        let old = subnets.insert(name, new.clone());
        drop(subnets);
        // A new, fixed or wider subnet may serve pods that were waiting for it.
        self.emit(SubnetChanged {
            old,
            new: Some(new),
        });
        Ok(())
    }

    /// Removes subnet `name` from the allocator and the table; its last state if it was there.
    pub fn remove_subnet(&self, name: &str) -> Result<Option<Arc<SubnetInfo>>> {
        match self.ipam.delete_subnet(name) {
            Ok(()) | Err(kubeovn_ipam::IpamError::NoSuchSubnet { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let old = write(&self.subnets).remove(name);
        if let Some(o) = &old {
            self.emit(SubnetChanged {
                old: Some(o.clone()),
                new: None,
            });
        }
        Ok(old)
    }

    /// Releases `owner`'s addresses on `nic` in `subnet`, and says so to those waiting for one.
    pub fn release(&self, subnet: &str, owner: &str, nic: &str) -> Result<bool> {
        match self.ipam.release(subnet, owner, nic) {
            Ok(Some(_)) => {
                self.emit(AddressesFreed(subnet.to_owned()));
                Ok(true)
            }
            Ok(None) | Err(kubeovn_ipam::IpamError::NoSuchSubnet { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Says that addresses were released in `subnet` by other means (several at once).
    pub fn freed(&self, subnet: &str) {
        self.emit(AddressesFreed(subnet.to_owned()));
    }

    /// Every node's InternalIP addresses.
    fn node_ips(&self) -> Vec<(String, IpAddr)> {
        let mut out = Vec::new();
        for n in self.list::<Node>() {
            let name = n.name_any();
            out.extend(internal_ips(&n).into_iter().map(|ip| (name.clone(), ip)));
        }
        out
    }

    /// The subnet a namespace is bound to: an accepted subnet naming it, else a Subnet object naming it
    /// that is refused or not loaded yet (its pods wait rather than take an address elsewhere).
    pub fn namespace_subnet(&self, ns: &str) -> Option<String> {
        let binds = |s: &[String]| s.iter().any(|n| n == ns);
        // Called for every pod: the loaded subnets first, without copying or sorting them (first by name).
        let objs = self.list::<Decoded<Subnet>>();
        let subnets = read(&self.subnets);
        let loaded = subnets
            .values()
            .filter(|s| binds(&s.namespaces))
            .map(|s| s.name.as_str())
            .min();
        if let Some(name) = loaded {
            return Some(name.to_owned());
        }
        // Then the objects not loaded (refused, or not handled yet): only their specs need reading.
        objs.iter()
            .filter_map(|o| o.meta().name.as_deref().map(|n| (n, o)))
            .filter(|(n, _)| !subnets.contains_key(*n))
            .filter(|(_, o)| binds(&o.object.spec.namespaces))
            .map(|(n, _)| n)
            .min()
            .map(str::to_owned)
    }

    /// Why the subnet `name` cannot give addresses (it is not loaded): the event reason and the error.
    pub fn unusable(&self, name: &str) -> (&'static str, ControllerError) {
        let obj = self
            .kinds
            .get()
            .and_then(|k| k.get(&Key::<Decoded<Subnet>>::cluster(name)));
        match obj.as_deref().and_then(subnet_spec::refusal) {
            Some(msg) => (
                "SubnetNotValidated",
                ControllerError::NotReady(format!("subnet {name} (refused: {msg})")),
            ),
            None => (
                "SubnetNotFound",
                ControllerError::NotReady(format!("subnet {name}")),
            ),
        }
    }

    /// The join addresses of every node that has one.
    pub fn node_join_ips(&self) -> Vec<(String, Vec<IpAddr>)> {
        let join = &self.config.join_subnet.name;
        let mut out: Vec<(String, Vec<IpAddr>)> = self
            .list::<Node>()
            .iter()
            .filter_map(|n| {
                let name = n.name_any();
                let port = naming::node_port(&name);
                let a = self.ipam.get(join, &port, &port).ok().flatten()?;
                Some((name, a.ips().collect()))
            })
            .collect();
        out.sort();
        out
    }

    // --- IPPools ------------------------------------------------------------------------------------

    /// The subnet of IPPool `name`, if loaded.
    pub fn pool_subnet(&self, name: &str) -> Option<String> {
        read(&self.pools).get(name).map(|(s, _)| s.clone())
    }

    /// Whether IPPool `name` is loaded.
    #[cfg(test)]
    pub fn has_pool(&self, name: &str) -> bool {
        read(&self.pools).contains_key(name)
    }

    /// Loads an IPPool into the allocator (its subnet's, if loaded: its addresses must lie inside).
    pub fn install_pool(&self, p: &Decoded<IPPool>) -> Result<()> {
        let subnet = self.subnet(&p.object.spec.subnet);
        self.install_pool_in(p, subnet.as_deref())
    }

    fn install_pool_in(&self, p: &Decoded<IPPool>, subnet: Option<&SubnetInfo>) -> Result<()> {
        let name = p.name_any();
        if let Some(e) = &p.spec_error {
            return Err(ControllerError::invalid(
                format!("ippool {name}"),
                e.clone(),
            ));
        }
        let ips = p.object.spec.ips.clone();
        if let Some(s) = subnet {
            // The allocator would clip them away in silence: a typo'd pool would reserve nothing.
            subnet_spec::check_inside(&format!("ippool {name}"), "ips", &ips, &s.cidr_block())?;
        }
        let subnet = p.object.spec.subnet.clone();
        self.ipam
            .add_or_update_pool(&subnet, &PoolSpec::new(&name, ips.iter().cloned()))?;
        write(&self.pools).insert(name, (subnet, ips));
        Ok(())
    }

    /// Loads the pools of the subnet `info`, just loaded into the allocator (new, or back after a delete),
    /// before pods can find it; a pool refused here is reported by its own kind, which the
    /// [`SubnetChanged`] signal runs.
    fn install_pools_of(&self, info: &SubnetInfo) {
        for p in self.list::<Decoded<IPPool>>() {
            if p.object.spec.subnet != info.name {
                continue;
            }
            if let Err(e) = self.install_pool_in(&p, Some(info)) {
                tracing::debug!(pool = %p.name_any(), error = %e, "ippool not loaded with its subnet");
            }
        }
    }

    /// Unloads IPPool `name`.
    pub fn remove_pool(&self, name: &str) -> Result<()> {
        let gone = write(&self.pools).remove(name);
        if let Some((subnet, _)) = gone {
            match self.ipam.delete_pool(&subnet, name) {
                Ok(())
                | Err(kubeovn_ipam::IpamError::NoSuchSubnet { .. })
                | Err(kubeovn_ipam::IpamError::NoSuchPool { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    // --- reservations -------------------------------------------------------------------------------

    /// Users' reservations, locked.
    pub fn reservations(&self) -> MutexGuard<'_, Reservations> {
        self.reservations.lock().unwrap_or_else(|e| e.into_inner())
    }

    // --- the load balancers of Services -------------------------------------------------------------

    /// Sets the VPC and load balancers of Service `key` (None: it has none).
    pub fn set_service_lbs(&self, key: &str, now: Option<(String, Vec<String>)>) {
        let old = {
            let mut m = write(&self.service_lbs);
            match &now {
                Some(v) if m.get(key) == Some(v) => return,
                Some(v) => m.insert(key.to_owned(), v.clone()),
                None => m.remove(key),
            }
        };
        let mut vpcs: Vec<String> = old.into_iter().chain(now).map(|(v, _)| v).collect();
        vpcs.dedup();
        for v in vpcs {
            self.emit(VpcLbsChanged(v));
        }
    }

    /// The load balancers of VPC `vpc`'s Services, sorted.
    pub fn lbs_of(&self, vpc: &str) -> Vec<String> {
        let mut v: Vec<String> = read(&self.service_lbs)
            .values()
            .filter(|(x, _)| x == vpc)
            .flat_map(|(_, lbs)| lbs.iter().cloned())
            .collect();
        v.sort();
        v
    }
}

/// A node's OVN chassis name: its `ovn.kubernetes.io/chassis` annotation, else its name (the daemon's
/// `system-id`).
pub(crate) fn chassis_of(n: &Node) -> String {
    n.annotations()
        .get(crate::annotations::CHASSIS)
        .cloned()
        .unwrap_or_else(|| n.name_any())
}

/// A node's InternalIP addresses.
pub(crate) fn internal_ips(n: &Node) -> Vec<IpAddr> {
    n.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| {
            a.iter()
                .filter(|x| x.type_ == "InternalIP")
                .filter_map(|x| x.address.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}
