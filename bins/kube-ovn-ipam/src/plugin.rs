//! The commands: one function per CNI verb over the locked state of one network.

use std::collections::HashSet;
use std::net::IpAddr;

use kubeovn_cni::spec::{CniResult, Command, Env, IpCidr, IpConfig, NetConf, Version, VersionInfo};
use kubeovn_ipam::{Addresses, AllocRequest, Family, SnapshotEntry, Subnet, SubnetSpec};

use crate::conf::{static_ips, IpamConf};
use crate::state::{self, Change};
use crate::store::Store;
use crate::Error;

/// Runs one plugin invocation: environment from the process, configuration from `stdin`; `Ok(Some(json))`
/// is printed on stdout.
pub fn run(stdin: &[u8]) -> Result<Option<String>, Error> {
    let env = Env::from_process()?;
    run_with(&env, stdin)
}

/// [`run`] with an explicit environment.
pub fn run_with(env: &Env, stdin: &[u8]) -> Result<Option<String>, Error> {
    if env.command == Command::Version {
        return Ok(Some(version_answer(stdin)));
    }
    let conf = NetConf::from_slice(stdin)?;
    let version = conf.version()?;
    env.command.check_version(version)?;
    if conf.name.is_empty() {
        return Err(Error::Config {
            reason: "the network configuration has no name".into(),
        });
    }
    let ipam = IpamConf::from_conf(&conf)?;
    match env.command {
        Command::Add => add(env, &conf, &ipam, version).map(Some),
        Command::Del => del(env, &conf, &ipam).map(|()| None),
        Command::Check => check(env, &conf, &ipam).map(|()| None),
        Command::Gc => gc(&conf, &ipam).map(|()| None),
        Command::Status => status(&conf, &ipam).map(|()| None),
        Command::Version => Ok(Some(version_answer(stdin))),
    }
}

fn version_answer(stdin: &[u8]) -> String {
    let v = serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|v| {
            v.get("cniVersion")
                .and_then(|s| s.as_str())
                .map(str::to_owned)
        })
        .filter(|s| Version::parse(s).is_ok())
        .unwrap_or_default();
    serde_json::to_string(&VersionInfo::all(&v)).unwrap_or_default()
}

/// The (container id, interface) of a command that has them (the environment was validated for it).
fn attachment(env: &Env) -> (&str, &str) {
    env.attachment().unwrap_or_default()
}

/// One network's subnet, loaded from its state file and journal.
struct Network {
    subnet: Subnet,
    name: String,
    /// The generation of the state file (0: none yet).
    gen: u64,
    /// Changes in the journal.
    journal_len: usize,
    /// The next change must rewrite the state (new network, spec changed, stale journal).
    compact: bool,
}

impl Network {
    fn spec(name: &str, ipam: &IpamConf) -> SubnetSpec {
        SubnetSpec::new(name, ipam.cidr_string(), ipam.gateway_string())
            .exclude(ipam.exclude_ips.iter().cloned())
    }

    fn load(store: &Store, name: &str, ipam: &IpamConf, exclusive: bool) -> Result<Network, Error> {
        let spec = Network::spec(name, ipam);
        let corrupt = |e: state::FormatError| Error::State {
            path: store.state_path(),
            source: Box::new(e),
        };
        let (gen, mut subnet, mut compact) = match store.read_state()? {
            None => {
                let subnet = Subnet::new(&spec, seed())
                    .map_err(|source| Error::ipam("create", name, "", "", source))?;
                (0, subnet, true)
            }
            Some(bytes) => {
                let (gen, snap) = state::decode_state(&bytes).map_err(corrupt)?;
                let subnet = Subnet::from_snapshot(&snap).map_err(|e| corrupt(e.into()))?;
                (gen, subnet, false)
            }
        };
        let journal = store.read_journal()?;
        let (changes, complete) = state::decode_journal(&journal, gen).map_err(corrupt)?;
        if exclusive && complete < journal.len() {
            store.truncate_journal(complete)?;
        }
        if !journal.starts_with(state::journal_header(gen).as_bytes()) {
            compact = true;
        }
        for c in &changes {
            state::apply(&mut subnet, c).map_err(|e| corrupt(e.into()))?;
        }
        if subnet.spec() != &spec {
            let dropped = subnet.update(&spec).map_err(|source| {
                Error::ipam("apply the configuration to", name, "", "", source)
            })?;
            for d in dropped {
                eprintln!(
                    "kube-ovn-ipam: network {name}: the new subnet drops {}/{} {:?} {:?}",
                    d.pod, d.nic, d.v4, d.v6
                );
            }
            compact = true;
        }
        Ok(Network {
            subnet,
            name: name.to_owned(),
            gen,
            journal_len: changes.len(),
            compact,
        })
    }

    /// Persists changes already applied to `self.subnet`: one journal append, or a new state when due.
    fn commit(&mut self, store: &Store, changes: &[Change]) -> Result<(), Error> {
        if self.compact || self.journal_len + changes.len() >= state::COMPACT_AFTER {
            self.gen += 1;
            let text = state::encode_state(self.gen, self.subnet.snapshot());
            store.write_state(text.as_bytes(), state::journal_header(self.gen).as_bytes())?;
            self.journal_len = 0;
            self.compact = false;
        } else {
            let text: String = changes.iter().map(state::encode_change).collect();
            store.append_journal(text.as_bytes())?;
            self.journal_len += changes.len();
        }
        Ok(())
    }

    fn ipam_err(
        &self,
        op: &'static str,
        container: &str,
        ifname: &str,
    ) -> impl FnOnce(kubeovn_ipam::IpamError) -> Error {
        let (network, container, ifname) =
            (self.name.clone(), container.to_owned(), ifname.to_owned());
        move |source| Error::ipam(op, &network, &container, &ifname, source)
    }
}

fn entry(container: &str, ifname: &str, a: &Addresses) -> SnapshotEntry {
    SnapshotEntry {
        pod: container.to_owned(),
        nic: ifname.to_owned(),
        v4: a.v4,
        v6: a.v6,
        mac: a.mac,
        shared: false,
    }
}

/// A MAC generator seed (the MACs are not returned, but must differ between networks and runs).
fn seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    (t as u64) ^ (u64::from(std::process::id()) << 32)
}

fn add(env: &Env, conf: &NetConf, ipam: &IpamConf, version: Version) -> Result<String, Error> {
    let (container, ifname) = attachment(env);
    let statics = static_ips(conf, env)?;
    let store = Store::open(&ipam.data_dir, &conf.name, true, ipam.fsync)?;
    let mut net = Network::load(&store, &conf.name, ipam, true)?;
    let existing = net.subnet.get(container, ifname);
    let addrs = match existing {
        // Idempotent: the same attachment gets the same addresses (unless it now asks for others).
        Some(a) if statics.iter().all(|ip| a.ips().any(|x| x == *ip)) => {
            if net.compact {
                net.commit(&store, &[])?;
            }
            a
        }
        _ => {
            let req = AllocRequest::new(container, ifname).static_ips(&statics);
            let a = net
                .subnet
                .allocate(&req)
                .map_err(net.ipam_err("allocate", container, ifname))?;
            net.commit(&store, &[Change::Add(entry(container, ifname, &a))])?;
            a
        }
    };
    drop(store);
    Ok(result(ipam, &addrs).convert_to(version).to_json())
}

fn result(ipam: &IpamConf, addrs: &Addresses) -> CniResult {
    let mut r = CniResult::new(Version::LATEST);
    for ip in addrs.ips() {
        let (cidr, gw) = ipam
            .cidr_of(ip)
            .map_or((None, None), |(c, g)| (Some(c), Some(g)));
        let prefix = cidr.map_or(if ip.is_ipv4() { 32 } else { 128 }, |c| c.prefix);
        r.ips.push(IpConfig {
            address: IpCidr { addr: ip, prefix },
            gateway: gw,
            interface: None,
        });
    }
    r.routes.clone_from(&ipam.routes);
    r.dns.clone_from(&ipam.dns);
    r
}

fn del(env: &Env, conf: &NetConf, ipam: &IpamConf) -> Result<(), Error> {
    let (container, ifname) = attachment(env);
    let store = Store::open(&ipam.data_dir, &conf.name, true, ipam.fsync)?;
    if del_fast(&store, container, ifname)? {
        return Ok(());
    }
    let mut net = Network::load(&store, &conf.name, ipam, true)?;
    if net.subnet.release(container, ifname).is_some() {
        net.commit(
            &store,
            &[Change::Del {
                pod: container.to_owned(),
                nic: ifname.to_owned(),
            }],
        )?;
    }
    Ok(())
}

/// `DEL` without loading the allocations: find the attachment in the state's text and the journal, and
/// append one release line. `false` when the full path is needed (no usable journal, compaction due).
fn del_fast(store: &Store, container: &str, ifname: &str) -> Result<bool, Error> {
    let Some(bytes) = store.read_state()? else {
        // Nothing was ever allocated in this network.
        return Ok(true);
    };
    let Ok(gen) = state::state_generation(&bytes) else {
        return Ok(false);
    };
    let journal = store.read_journal()?;
    if !journal.starts_with(state::journal_header(gen).as_bytes()) {
        return Ok(false);
    }
    let Ok((changes, complete)) = state::decode_journal(&journal, gen) else {
        return Ok(false);
    };
    if changes.len() + 1 >= state::COMPACT_AFTER {
        return Ok(false);
    }
    let mut present = state::state_has(&bytes, container, ifname);
    for c in &changes {
        match c {
            Change::Add(e) if e.pod == container && e.nic == ifname => present = true,
            Change::Del { pod, nic } if pod == container && nic == ifname => present = false,
            _ => {}
        }
    }
    if !present {
        return Ok(true);
    }
    if complete < journal.len() {
        store.truncate_journal(complete)?;
    }
    let line = state::encode_change(&Change::Del {
        pod: container.to_owned(),
        nic: ifname.to_owned(),
    });
    store.append_journal(line.as_bytes())?;
    Ok(true)
}

fn check(env: &Env, conf: &NetConf, ipam: &IpamConf) -> Result<(), Error> {
    let (container, ifname) = attachment(env);
    let fail = |reason: String| Error::Check {
        container: container.to_owned(),
        ifname: ifname.to_owned(),
        reason,
    };
    let store = Store::open(&ipam.data_dir, &conf.name, false, ipam.fsync)?;
    let net = Network::load(&store, &conf.name, ipam, false)?;
    let Some(addrs) = net.subnet.get(container, ifname) else {
        return Err(fail("no allocation".into()));
    };
    if let Some(prev) = conf.prev_result()? {
        for ip in crate::result_ips(&prev)
            .into_iter()
            .filter(|ip| ipam.cidr_of(*ip).is_some())
        {
            if !addrs.ips().any(|a| a == ip) {
                let ours: Vec<IpAddr> = addrs.ips().collect();
                return Err(fail(format!(
                    "prevResult lists {ip}, the allocation is {ours:?}"
                )));
            }
        }
    }
    Ok(())
}

fn gc(conf: &NetConf, ipam: &IpamConf) -> Result<(), Error> {
    let valid: HashSet<(&str, &str)> = conf
        .valid_attachments
        .iter()
        .flatten()
        .map(|a| (a.container_id.as_str(), a.ifname.as_str()))
        .collect();
    let store = Store::open(&ipam.data_dir, &conf.name, true, ipam.fsync)?;
    let mut net = Network::load(&store, &conf.name, ipam, true)?;
    let stale: Vec<(String, String)> = net
        .subnet
        .iter()
        .filter(|n| !valid.contains(&(n.pod, n.nic)))
        .map(|n| (n.pod.to_owned(), n.nic.to_owned()))
        .collect();
    for (pod, nic) in &stale {
        eprintln!(
            "kube-ovn-ipam: GC releases {pod}/{nic} in network {}",
            conf.name
        );
        net.subnet.release(pod, nic);
    }
    if !stale.is_empty() {
        net.compact = true;
        net.commit(&store, &[])?;
    }
    Ok(())
}

fn status(conf: &NetConf, ipam: &IpamConf) -> Result<(), Error> {
    let store = Store::open(&ipam.data_dir, &conf.name, false, ipam.fsync)?;
    let net = Network::load(&store, &conf.name, ipam, false)?;
    let stats = net.subnet.stats();
    for (family, s) in [(Family::V4, &stats.v4), (Family::V6, &stats.v6)] {
        let has = ipam
            .cidrs
            .iter()
            .any(|c| c.is_ipv4() == (family == Family::V4));
        if has && s.available == 0 {
            return Err(Error::NotAvailable {
                reason: format!("no free {family} address in network {}", conf.name),
            });
        }
    }
    Ok(())
}
