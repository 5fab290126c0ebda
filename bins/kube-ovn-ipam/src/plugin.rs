//! The commands: one function per CNI verb over the locked state of one network.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use kubeovn_cni::spec::{CniResult, Command, Env, IpCidr, IpConfig, NetConf, Version, VersionInfo};
use kubeovn_ipam::range::{Addr, RangeSet};
use kubeovn_ipam::{
    Addresses, AllocRequest, Family, IpRangeList, Mac, SnapshotEntry, Subnet, SubnetSpec,
};

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
            let text =
                state::encode_state(self.gen, self.subnet.snapshot(), never_used(&self.subnet));
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

/// The never-used addresses of a subnet without pools (`None` with pools: the fast `ADD` does not serve them).
fn never_used(subnet: &Subnet) -> Option<String> {
    if subnet.pools().next().is_some() {
        return None;
    }
    let v4: IpRangeList = subnet.free_and_released(Family::V4).0.parse().ok()?;
    let v6: IpRangeList = subnet.free_and_released(Family::V6).0.parse().ok()?;
    Some(
        IpRangeList {
            v4: v4.v4,
            v6: v6.v6,
        }
        .to_string(),
    )
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
    if statics.is_empty() {
        if let Some(a) = add_fast(&store, &conf.name, ipam, container, ifname)? {
            drop(store);
            return Ok(result(ipam, &a).convert_to(version).to_json());
        }
    }
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

/// An attachment's IPv4 and IPv6 addresses as integers.
type Pair = (Option<u32>, Option<u128>);

/// Free space of one family as a full load would rebuild it: never-used and released addresses.
struct FreeSpace<A> {
    free: RangeSet<A>,
    released: RangeSet<A>,
    /// The addresses next-free may hand out in an empty subnet (usable, not the gateway, not excluded).
    base: RangeSet<A>,
}

impl<A: Addr> FreeSpace<A> {
    /// A journal allocation (replayed as a static request: never-used first, then released).
    fn take(&mut self, a: Option<A>) {
        if let Some(a) = a {
            if !self.free.remove(a) {
                self.released.remove(a);
            }
        }
    }

    /// A journal release: the address waits in the released set if next-free may hand it out.
    fn give(&mut self, a: Option<A>) {
        if let Some(a) = a.filter(|&a| self.base.contains(a)) {
            self.released.insert(a);
        }
    }

    /// Next-free: the lowest never-used address, else the lowest released one.
    fn next(&self) -> Option<A> {
        self.free.first().or_else(|| self.released.first())
    }
}

/// `ADD` of a new attachment without static addresses, without loading the allocations: the next free
/// address comes from the state's header (never-used and released sets) and the journal's changes since,
/// the MAC is checked against the text of both, and one line is appended. It takes exactly what a full
/// load would (the tests compare them). `None` when the full path is needed: no state or no free set in
/// it yet, another configuration, pools, shared entries, an existing attachment, compaction due, or no
/// free address (the full path reports the error).
fn add_fast(
    store: &Store,
    name: &str,
    ipam: &IpamConf,
    container: &str,
    ifname: &str,
) -> Result<Option<Addresses>, Error> {
    let Some(bytes) = store.read_state()? else {
        return Ok(None);
    };
    let Ok(head) = state::decode_head(&bytes) else {
        return Ok(None);
    };
    let spec = Network::spec(name, ipam);
    let snap = &head.snapshot;
    if snap.spec != spec || !snap.pools.is_empty() || spec.gateway_mac.is_some() {
        return Ok(None);
    }
    let (Some(Ok(free)), Ok(released)) = (
        head.free.as_deref().map(str::parse::<IpRangeList>),
        snap.released.parse::<IpRangeList>(),
    ) else {
        return Ok(None);
    };
    let journal = store.read_journal()?;
    if !journal.starts_with(state::journal_header(head.gen).as_bytes()) {
        return Ok(None);
    }
    let Ok((changes, complete)) = state::decode_journal(&journal, head.gen) else {
        return Ok(None);
    };
    if changes.len() + 1 >= state::COMPACT_AFTER {
        return Ok(None);
    }
    let Ok(empty) = Subnet::new(&spec, 0) else {
        return Ok(None);
    };
    let base = |f| -> Option<IpRangeList> { empty.free_and_released(f).0.parse().ok() };
    let (Some(b4), Some(b6)) = (base(Family::V4), base(Family::V6)) else {
        return Ok(None);
    };
    let mut v4 = FreeSpace {
        free: free.v4,
        released: released.v4,
        base: b4.v4,
    };
    let mut v6 = FreeSpace {
        free: free.v6,
        released: released.v6,
        base: b6.v6,
    };
    // One pass over the state's lines finds the entries the journal and this ADD name, and whether the
    // MAC drawn is taken.
    let mut keys: HashSet<(&str, &str)> = changes
        .iter()
        .map(|c| match c {
            Change::Add(e) => (e.pod.as_str(), e.nic.as_str()),
            Change::Del { pod, nic } => (pod.as_str(), nic.as_str()),
        })
        .collect();
    keys.insert((container, ifname));
    let mut rng = seed() | 1;
    let (scan, mac) = loop {
        let m = random_mac(&mut rng);
        let Some(scan) = state::scan(&bytes, &keys, &m) else {
            return Ok(None);
        };
        let in_journal = changes
            .iter()
            .any(|c| matches!(c, Change::Add(e) if e.mac == m));
        if !scan.mac_used && !in_journal {
            break (scan, m);
        }
    };
    if scan.shared {
        // A release frees nothing while another owner is left: the full path knows the owners.
        return Ok(None);
    }
    // Attachments the journal added (with their addresses) and state entries it released.
    let mut added: HashMap<(&str, &str), Pair> = HashMap::new();
    let mut gone: HashSet<(&str, &str)> = HashSet::new();
    let in_state = |key: (&str, &str), gone: &HashSet<(&str, &str)>| {
        scan.entries
            .get(&key)
            .filter(|_| !gone.contains(&key))
            .map(|e| (e.v4.map(u32::from), e.v6.map(u128::from)))
    };
    for c in &changes {
        match c {
            Change::Add(e) => {
                let key = (e.pod.as_str(), e.nic.as_str());
                if e.shared || added.contains_key(&key) || in_state(key, &gone).is_some() {
                    // A change of an existing attachment's addresses: the full path replays it.
                    return Ok(None);
                }
                let (a4, a6) = (e.v4.map(u32::from), e.v6.map(u128::from));
                v4.take(a4);
                v6.take(a6);
                added.insert(key, (a4, a6));
            }
            Change::Del { pod, nic } => {
                let key = (pod.as_str(), nic.as_str());
                let addrs = match added.remove(&key) {
                    Some(a) => Some(a),
                    None => in_state(key, &gone).inspect(|_| {
                        gone.insert(key);
                    }),
                };
                if let Some((a4, a6)) = addrs {
                    v4.give(a4);
                    v6.give(a6);
                }
            }
        }
    }
    let key = (container, ifname);
    if added.contains_key(&key) || in_state(key, &gone).is_some() {
        // Idempotent ADD: the full path answers with the existing addresses.
        return Ok(None);
    }
    let has = |v4: bool| ipam.cidrs.iter().any(|c| c.is_ipv4() == v4);
    let a4 = match has(true) {
        true => match v4.next() {
            Some(a) => Some(a),
            None => return Ok(None),
        },
        false => None,
    };
    let a6 = match has(false) {
        true => match v6.next() {
            Some(a) => Some(a),
            None => return Ok(None),
        },
        false => None,
    };
    let a = Addresses {
        v4: a4.map(std::net::Ipv4Addr::from),
        v6: a6.map(std::net::Ipv6Addr::from),
        mac,
    };
    if complete < journal.len() {
        store.truncate_journal(complete)?;
    }
    let line = state::encode_change(&Change::Add(entry(container, ifname, &a)));
    store.append_journal(line.as_bytes())?;
    Ok(Some(a))
}

/// A random locally administered unicast MAC (xorshift64*; uniqueness is checked by the caller).
fn random_mac(x: &mut u64) -> Mac {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
    Mac([(r[0] & 0xfe) | 0x02, r[1], r[2], r[3], r[4], r[5]])
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env(command: &str, container: &str) -> Env {
        let vars = [
            ("CNI_COMMAND", command.to_owned()),
            ("CNI_CONTAINERID", container.to_owned()),
            ("CNI_NETNS", "/var/run/netns/x".to_owned()),
            ("CNI_IFNAME", "eth0".to_owned()),
            ("CNI_PATH", "/usr/lib/cni".to_owned()),
        ];
        Env::from_lookup(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()))
            .expect("valid environment")
    }

    /// Random ADDs, repeated ADDs and DELs in a small dual-stack subnet (exhaustion, delayed reuse,
    /// compactions): every fast `ADD` takes exactly the addresses a full load would have given, and the
    /// state always loads back consistently.
    #[test]
    fn fast_add_takes_what_a_full_load_would() {
        let dir = tempfile::tempdir().expect("tempdir");
        let stdin = serde_json::json!({
            "cniVersion": "1.0.0", "name": "fast", "type": "kube-ovn-ipam",
            "ipam": {"type": "kube-ovn-ipam", "subnet": "10.9.0.0/27,fd00:9::/123",
                     "excludeIps": ["10.9.0.5..10.9.0.7", "fd00:9::10"],
                     "dataDir": dir.path()}
        })
        .to_string();
        let conf = NetConf::from_slice(stdin.as_bytes()).expect("conf");
        let ipam = IpamConf::from_conf(&conf).expect("ipam conf");
        let mut live: Vec<String> = Vec::new();
        let (mut fast, mut full, mut x) = (0, 0, 0x9e37_79b9_7f4a_7c15u64);
        for i in 0..600 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x % 5 < 2 && !live.is_empty() {
                let c = live.swap_remove((x as usize / 5) % live.len());
                run_with(&env("DEL", &c), stdin.as_bytes()).expect("DEL");
                continue;
            }
            let c = match x % 7 {
                0 if !live.is_empty() => live[(x as usize / 7) % live.len()].clone(),
                _ => format!("c{i}"),
            };
            let expected = {
                let store = Store::open(&ipam.data_dir, "fast", false, false).expect("store");
                let mut net = Network::load(&store, "fast", &ipam, false).expect("load");
                net.subnet
                    .allocate(&AllocRequest::new(&c, "eth0"))
                    .map(|a| (a.v4, a.v6))
            };
            let store = Store::open(&ipam.data_dir, "fast", true, false).expect("store");
            let got = match add_fast(&store, "fast", &ipam, &c, "eth0").expect("fast ADD") {
                Some(a) => {
                    fast += 1;
                    drop(store);
                    Ok((a.v4, a.v6))
                }
                None => {
                    full += 1;
                    drop(store);
                    run_with(&env("ADD", &c), stdin.as_bytes()).map(|out| {
                        let r = CniResult::from_slice(out.unwrap_or_default().as_bytes())
                            .expect("result");
                        let ip = |v4: bool| {
                            r.ips
                                .iter()
                                .map(|i| i.address.addr)
                                .find(|a| a.is_ipv4() == v4)
                        };
                        let v4 = ip(true).and_then(|a| match a {
                            IpAddr::V4(a) => Some(a),
                            IpAddr::V6(_) => None,
                        });
                        let v6 = ip(false).and_then(|a| match a {
                            IpAddr::V6(a) => Some(a),
                            IpAddr::V4(_) => None,
                        });
                        (v4, v6)
                    })
                }
            };
            match (&expected, &got) {
                (Ok(e), Ok(g)) => assert_eq!(e, g, "step {i}: ADD {c}"),
                (Err(_), Err(_)) => {}
                _ => panic!("step {i}: ADD {c}: expected {expected:?}, got {got:?}"),
            }
            if got.is_ok() && !live.contains(&c) {
                live.push(c);
            }
            let store = Store::open(&ipam.data_dir, "fast", false, false).expect("store");
            let net = Network::load(&store, "fast", &ipam, false).expect("consistent state");
            let mut held: Vec<&str> = net.subnet.iter().map(|n| n.pod).collect();
            let mut want: Vec<&str> = live.iter().map(String::as_str).collect();
            held.sort_unstable();
            want.sort_unstable();
            assert_eq!(held, want, "step {i}");
        }
        assert!(fast > 150 && full > 10, "fast {fast}, full {full}");
    }
}
