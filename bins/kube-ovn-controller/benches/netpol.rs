//! NetworkPolicy benchmark (`cargo bench --profile release -p kube-ovn-controller --bench netpol`), no
//! criterion: the controller binary as a child process against the in-memory test API server and a real NB
//! ovsdb-server, in one run.
//!
//! The cluster: `NP_BENCH_NAMESPACES` namespaces (default 500) labelled `team=t<i % 10>`, 10 pods each (5,000;
//! `app=web` on half, `app=db` on the rest), and 4 policies per namespace (2,000): a default deny, an allow
//! from the namespace's `app=web` pods, an allow from the namespaces of its team, an allow on TCP 80 from an
//! ipBlock with an except to its `app=web` pods.
//!
//! 0. setup (not measured): the pods, programmed by a first controller (ports in NB, addresses annotated).
//! 1. cold start: the policies loaded, a controller spawned over the preloaded NB: time until every
//!    policy's and namespace's ACLs are in NB; the controller's CPU and RSS; NB transactions.
//! 2. pod label change: `NP_BENCH_CHANGES` pods (default 200), one at a time, relabelled `app=web` to `db`:
//!    time until the pod's address left its namespace's `app=web` address set, and the NB transactions and
//!    rows each cost.
//! 3. pod add: `NP_BENCH_CHANGES` pods created one at a time with `app=web`: time until the address the
//!    controller gave it is in its namespace's `app=web` address set (allocation and port included).
//! 4. restart: the controller killed (SIGKILL) and started again: time until a policy created after the
//!    restart has its ACL, and the NB transactions that changed anything else.
//!
//! 5. logical flows: ovn-northd on a fresh NB and SB, `NP_BENCH_LFLOW_NAMESPACES` namespaces (default 50) of
//!    the same shape: `ovn-sbctl lflow-list` lines and Logical_Flow rows without policies, with ours, and with
//!    the same policies written as Kube-OVN writes them (a port group, allow and except address sets and a
//!    drop per policy, nothing shared), with the port group, address set and ACL rows of each; and the OpenFlow
//!    flows (`ovs-ofctl dump-flows`) of one chassis (ovs-vswitchd on the dummy datapath, ovn-controller) on
//!    which every pod's port is bound.
//!
//! `CTRL_BENCH_BIN=PATH` benchmarks that controller binary instead of this build's. `cargo test --benches`
//! runs a small smoke version.

#![allow(clippy::unwrap_used)]

#[path = "../tests/common/mod.rs"]
mod common;
mod support;

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kubeovn_core::netpol::{Pods, Selector, SetKey};
use kubeovn_ovn::cache::{Cache, CacheBuilder, CacheView};
use kubeovn_ovn::models::nb;
use kubeovn_ovn::monitor::{RowUpdate, TableUpdates};
use kubeovn_ovn::northbound::Batch;
use kubeovn_ovn::{Client, Datum, Model};
use kubeovn_testapi::{ResourceInfo, Store};
use serde_json::{json, Value};
use support::{env, kill, monitor_all, pct, spawn_controller, start_api, usage, Chassis, Northd};

const NB_DB: &str = "OVN_Northbound";
const PODS_PER_NS: usize = 10;

fn ns_name(i: usize) -> String {
    format!("ns-{i}")
}

fn pod(ns: &str, name: &str, app: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": {"nodeName": "bench-node", "containers": [{"name": "c", "image": "pause",
                 "ports": [{"name": "http", "containerPort": 80}]}]}
    })
}

fn policies(ns: &str, i: usize) -> Vec<Value> {
    let np = |name: &str, spec: Value| {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"name": name, "namespace": ns}, "spec": spec})
    };
    vec![
        np("deny", json!({"podSelector": {}})),
        np(
            "from-web",
            json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}),
        ),
        np(
            "from-team",
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector":
                {"matchLabels": {"team": format!("t{}", i % 10)}}}]}]}),
        ),
        np(
            "from-cidr",
            json!({"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{"from": [{"ipBlock":
                {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}], "ports": [{"port": 80}]}]}),
        ),
    ]
}

/// The name of namespace `ns`'s `app=web` address set (IPv4), as the controller names it.
fn web_set(ns: &str) -> String {
    let sel = Selector::from_label_selector(&LabelSelector {
        match_labels: Some(BTreeMap::from([("app".into(), "web".into())])),
        ..LabelSelector::default()
    })
    .unwrap();
    SetKey::addresses(Pods::In {
        namespace: ns.into(),
        pods: sel,
    })
    .family(false)
}

/// A replica of what the benchmark watches in NB: ACLs, address sets, port groups, switch port names (the
/// client keeps the monitor open).
async fn nb_cache(remote: &str) -> (Client, Cache) {
    let client = Client::connect(remote).await.unwrap();
    let cache = CacheBuilder::new(NB_DB)
        .table(nb::Acl::TABLE)
        .table(nb::AddressSet::TABLE)
        .table(nb::PortGroup::TABLE)
        .table_columns(nb::LogicalSwitchPort::TABLE, [nb::LogicalSwitchPort::NAME])
        .start(&client)
        .await
        .unwrap();
    (client, cache)
}

/// Whether the benchmark pods' `n` switch ports all showed in NB within `limit`.
async fn ports_programmed(cache: &Cache, n: usize, limit: Duration) -> bool {
    cache
        .wait_for(limit, |v| {
            v.rows(nb::LogicalSwitchPort::TABLE)
                .filter(|r| r.get_str(nb::LogicalSwitchPort::NAME).contains(".ns-"))
                .count()
                >= n
        })
        .await
}

/// The owners (`external_ids:policy`) that have ACLs.
fn owners(v: &CacheView<'_>) -> HashSet<String> {
    v.rows(nb::Acl::TABLE)
        .filter_map(|r| r.map_get(nb::Acl::EXTERNAL_IDS, "policy"))
        .map(str::to_owned)
        .collect()
}

fn set_has(v: &CacheView<'_>, set: &str, ip: &str) -> bool {
    v.rows(nb::AddressSet::TABLE)
        .find(|r| r.get_str(nb::AddressSet::NAME) == set)
        .is_some_and(|r| {
            r.get(nb::AddressSet::ADDRESSES)
                .map(Datum::atoms)
                .unwrap_or_default()
                .iter()
                .any(|a| a.as_str() == Some(ip))
        })
}

/// NB transactions and rows changed in `updates` between `from` and `to`.
fn cost(updates: &[(Instant, TableUpdates)], from: Instant, to: Instant) -> (usize, usize) {
    updates
        .iter()
        .filter(|(t, _)| *t >= from && *t <= to)
        .fold((0, 0), |(t, r), (_, u)| {
            (t + 1, r + u.values().map(BTreeMap::len).sum::<usize>())
        })
}

struct Kube<'a> {
    store: &'a Store,
    pods: std::sync::Arc<ResourceInfo>,
}

impl Kube<'_> {
    fn pod_ip(&self, ns: &str, name: &str) -> Option<String> {
        let p = self.store.get(&self.pods, Some(ns), name).ok()?;
        p["metadata"]["annotations"]["ovn.kubernetes.io/ip_address"]
            .as_str()
            .map(str::to_owned)
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let n_ns = env("NP_BENCH_NAMESPACES", if full { 500 } else { 10 }).max(1);
    let changes = env("NP_BENCH_CHANGES", if full { 200 } else { 10 }).min(n_ns * PODS_PER_NS / 2);
    let limit = Duration::from_secs(if full { 300 } else { 60 });
    let lflow_ns = env("NP_BENCH_LFLOW_NAMESPACES", if full { 50 } else { 4 }).max(1);
    if !common::have("ovsdb-server") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("np-bench")
        .tempdir()
        .unwrap();
    let nbs = common::start_nb().expect("ovsdb-server");
    let nb_addr = nbs.unix_remote();
    let (_client, cache) = nb_cache(&nb_addr).await;
    let (api, kubeconfig) = start_api(&dir.path().join("kubeconfig")).await;
    let store = api.store();
    let k = Kube {
        pods: store.resource("", "v1", "pods").unwrap(),
        store,
    };
    let np_info = store
        .resource("networking.k8s.io", "v1", "networkpolicies")
        .unwrap();

    // 0. Setup: namespaces and pods, programmed by a first controller.
    let t = Instant::now();
    load_pods(store, n_ns);
    let setup = spawn_controller(dir.path(), &kubeconfig, &nb_addr, 0);
    let n_pods = n_ns * PODS_PER_NS;
    let programmed = ports_programmed(&cache, n_pods, limit).await;
    assert!(programmed, "the pods' ports never all showed in NB");
    // Their annotations follow the ports.
    let t_ann = Instant::now();
    while (0..n_ns).any(|i| {
        k.pod_ip(&ns_name(i), &format!("p-{}", PODS_PER_NS - 1))
            .is_none()
    }) {
        assert!(t_ann.elapsed() < limit, "pods never annotated");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    kill(setup);
    println!(
        "setup: {n_ns} namespaces, {n_pods} pods programmed (ports in NB) in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // 1. Cold start with every policy.
    load_policies(store, n_ns);
    let mut want: HashSet<String> = HashSet::new();
    for i in 0..n_ns {
        let ns = ns_name(i);
        want.insert(format!("Namespace/{ns}"));
        for p in ["from-web", "from-team", "from-cidr"] {
            want.insert(format!("NetworkPolicy/{ns}/{p}"));
        }
    }
    let nb_cpu0 = usage(nbs.pid()).0;
    let (_mon, updates) = monitor_all(&nb_addr).await;
    let t0 = Instant::now();
    let mut child = spawn_controller(dir.path(), &kubeconfig, &nb_addr, 1);
    let done = cache
        .wait_for(limit, |v| {
            let o = owners(v);
            want.iter().all(|w| o.contains(w))
        })
        .await;
    let took = t0.elapsed().as_secs_f64();
    let (cpu, rss) = usage(child.id());
    let acls = cache.rows(nb::Acl::TABLE).len();
    let sets = cache.rows(nb::AddressSet::TABLE).len();
    let (txns, rows) = cost(&updates.lock().unwrap(), t0, Instant::now());
    if done {
        println!(
            "cold start: {} policies in {n_ns} namespaces over {n_pods} pods: every ACL in NB {took:.2} s after the \
             controller's spawn (target <= 5 s); {acls} ACLs, {sets} address sets; controller {cpu:.2} s CPU, RSS \
             {:.1} MiB; NB ovsdb-server {:.2} s CPU; {txns} NB transactions changing {rows} rows",
            n_ns * 4,
            rss / 1048576.0,
            usage(nbs.pid()).0 - nb_cpu0
        );
    } else {
        let o = owners(&cache.view());
        let missing = want.iter().filter(|w| !o.contains(*w)).count();
        println!(
            "cold start: {missing} of {} owners without ACLs after {took:.0} s",
            want.len()
        );
        kill(child);
        std::process::exit(1);
    }

    // 2. Pod label changes, one at a time.
    let mut lat = Vec::new();
    let mut per_txns = Vec::new();
    let mut per_rows = Vec::new();
    for c in 0..changes {
        let i = c % n_ns;
        let j = (c / n_ns) % (PODS_PER_NS / 2);
        let (ns, name) = (ns_name(i), format!("p-{j}"));
        let ip = k.pod_ip(&ns, &name).unwrap();
        let set = web_set(&ns);
        let mut p = (*k.store.get(&k.pods, Some(&ns), &name).unwrap()).clone();
        p["metadata"]["labels"]["app"] = json!("db");
        let at = Instant::now();
        k.store.update(&k.pods, Some(&ns), &name, p, false).unwrap();
        let ok = cache
            .wait_for(Duration::from_secs(10), |v| !set_has(v, &set, &ip))
            .await;
        let end = Instant::now();
        assert!(ok, "{ns}/{name} ({ip}) never left {set}");
        lat.push(end.duration_since(at).as_secs_f64() * 1000.0);
        // Writes of the same change still on their way are counted with it.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (t, r) = cost(&updates.lock().unwrap(), at, Instant::now());
        per_txns.push(t as f64);
        per_rows.push(r as f64);
    }
    println!(
        "pod label change ({changes}, one at a time, app=web to db): its address out of the set in NB after p50 \
         {:.2} ms, p99 {:.2} ms, max {:.2} ms (target p99 <= 20 ms); NB transactions each: max {}, rows each: \
         p50 {}, max {}",
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99),
        pct(&mut lat, 1.0),
        pct(&mut per_txns, 1.0),
        pct(&mut per_rows, 0.5),
        pct(&mut per_rows, 1.0)
    );

    // 3. Pod adds, one at a time: from the create, and from the address annotation (what the policy watch
    // reacts to) to the address in the set.
    let mut lat = Vec::new();
    let mut from_ann = Vec::new();
    let mut per_txns = Vec::new();
    let mut per_rows = Vec::new();
    for c in 0..changes {
        let ns = ns_name(c % n_ns);
        let name = format!("new-{c}");
        let set = web_set(&ns);
        let at = Instant::now();
        k.store
            .create(&k.pods, Some(&ns), pod(&ns, &name, "web"))
            .unwrap();
        // The annotation is not an NB event: both are polled.
        let mut ip: Option<(String, Instant)> = None;
        let end = loop {
            if ip.is_none() {
                ip = k.pod_ip(&ns, &name).map(|a| (a, Instant::now()));
            }
            if let Some((a, _)) = &ip {
                if set_has(&cache.view(), &set, a) {
                    break Instant::now();
                }
            }
            assert!(
                at.elapsed() < Duration::from_secs(10),
                "{ns}/{name} never in {set}"
            );
            tokio::time::sleep(Duration::from_micros(200)).await;
        };
        lat.push(end.duration_since(at).as_secs_f64() * 1000.0);
        from_ann.push(end.duration_since(ip.unwrap().1).as_secs_f64() * 1000.0);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (t, r) = cost(&updates.lock().unwrap(), at, Instant::now());
        per_txns.push(t as f64);
        per_rows.push(r as f64);
    }
    println!(
        "pod add ({changes}, one at a time, app=web): its address in the set in NB after p50 {:.2} ms, p99 {:.2} \
         ms, max {:.2} ms from the create (address allocation and switch port included), p50 {:.2} ms, p99 {:.2} \
         ms from its address annotation; NB transactions each (port and sets): max {}, rows each: p50 {}, max {}",
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99),
        pct(&mut lat, 1.0),
        pct(&mut from_ann, 0.5),
        pct(&mut from_ann, 0.99),
        pct(&mut per_txns, 1.0),
        pct(&mut per_rows, 0.5),
        pct(&mut per_rows, 1.0)
    );

    // 4. Restart with everything in place.
    kill(child);
    let (_mon2, updates) = monitor_all(&nb_addr).await;
    let t = Instant::now();
    child = spawn_controller(dir.path(), &kubeconfig, &nb_addr, 2);
    let marker = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "after-restart", "namespace": ns_name(0)},
        "spec": {"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                 "ports": [{"port": 81}]}]}});
    store.create(&np_info, Some(&ns_name(0)), marker).unwrap();
    let owner = format!("NetworkPolicy/{}/after-restart", ns_name(0));
    let ok = cache.wait_for(limit, |v| owners(v).contains(&owner)).await;
    let steady = t.elapsed().as_secs_f64();
    assert!(ok, "the policy created after the restart never got its ACL");
    let (cpu, rss) = usage(child.id());
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Every transaction but the marker's: one inserting its ACL and adding it to the namespace's group.
    let foreign: Vec<BTreeMap<String, usize>> = updates
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, u)| {
            let own_acl = u.get(nb::Acl::TABLE).is_some_and(|rows| {
                rows.values().all(|ch| match ch {
                    RowUpdate::Insert(r) => r
                        .get(nb::Acl::EXTERNAL_IDS)
                        .and_then(Datum::as_map)
                        .is_some_and(|m| {
                            m.iter().any(|(k, v)| {
                                k.as_str() == Some("policy") && v.as_str() == Some(&owner)
                            })
                        }),
                    _ => false,
                })
            });
            !(own_acl
                && u.keys()
                    .all(|t| t == nb::Acl::TABLE || t == nb::PortGroup::TABLE))
        })
        .map(|(_, u)| u.iter().map(|(t, r)| (t.clone(), r.len())).collect())
        .collect();
    println!(
        "restart with {} policies: steady (a policy created after the restart has its ACL) after {steady:.2} s \
         (target <= 3 s); {cpu:.2} s CPU, RSS {:.1} MiB; NB transactions that changed anything else, within a \
         second after: {} {:?}",
        n_ns * 4 + 1,
        rss / 1048576.0,
        foreign.len(),
        foreign
    );
    kill(child);
    drop(cache);
    drop(api);
    drop(nbs);

    // 5. Logical flows: ours against the same policies written the way Kube-OVN writes them.
    if let Some(northd) = Northd::start() {
        lflows(&northd, dir.path(), lflow_ns, limit).await;
    }
    drop(dir);
    // Background watches and connections would keep the runtime's shutdown waiting.
    std::process::exit(0);
}

/// Creates `n_ns` namespaces of the benchmark's shape and their pods.
fn load_pods(store: &Store, n_ns: usize) {
    let ns_info = store.resource("", "v1", "namespaces").unwrap();
    let pods = store.resource("", "v1", "pods").unwrap();
    for i in 0..n_ns {
        let ns = ns_name(i);
        store
            .create(
                &ns_info,
                None,
                json!({"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": ns, "labels": {"team": format!("t{}", i % 10)}}}),
            )
            .unwrap();
        for j in 0..PODS_PER_NS {
            let app = if j < PODS_PER_NS / 2 { "web" } else { "db" };
            store
                .create(&pods, Some(&ns), pod(&ns, &format!("p-{j}"), app))
                .unwrap();
        }
    }
}

/// Creates the 4 policies of each of the `n_ns` namespaces.
fn load_policies(store: &Store, n_ns: usize) {
    let np_info = store
        .resource("networking.k8s.io", "v1", "networkpolicies")
        .unwrap();
    for i in 0..n_ns {
        let ns = ns_name(i);
        for p in policies(&ns, i) {
            store.create(&np_info, Some(&ns), p).unwrap();
        }
    }
}

/// Port group, address set and ACL rows in NB.
fn rows(v: &CacheView<'_>) -> (usize, usize, usize) {
    (
        v.rows(nb::PortGroup::TABLE).count(),
        v.rows(nb::AddressSet::TABLE).count(),
        v.rows(nb::Acl::TABLE).count(),
    )
}

/// A pod of the logical-flow cluster: namespace, name, `app` label, address.
type BenchPod = (String, String, String, String);

/// A policy as Kube-OVN writes it: name, its pods, the allow set's members (None: a deny), the except set's
/// members, the port clause.
type KubeOvnRule<'a> = (
    &'a str,
    &'a Vec<&'a BenchPod>,
    Option<Vec<String>>,
    Vec<String>,
    &'a str,
);

/// The benchmark's policies as Kube-OVN writes them: per policy a port group of its pods (`<name>.<ns>`),
/// an allow and an except address set per rule, a drop, the node allow and an allow per rule.
fn kube_ovn_style(n_ns: usize, pods: &[(String, String, String, String)]) -> Batch {
    use kubeovn_ovn::northbound::{
        Acl, AclAction, AclDirection, AclParent, AclSet, AddressSet, PortGroup,
    };
    let mut b = Batch::new();
    let port = |p: &(String, String, String, String)| format!("{}.{}", p.1, p.0);
    for i in 0..n_ns {
        let ns = ns_name(i);
        let in_ns: Vec<&(String, String, String, String)> =
            pods.iter().filter(|p| p.0 == ns).collect();
        let web: Vec<&(String, String, String, String)> =
            in_ns.iter().copied().filter(|p| p.2 == "web").collect();
        let team: Vec<&(String, String, String, String)> = pods
            .iter()
            .filter(|p| p.0.trim_start_matches("ns-").parse::<usize>().unwrap() % 10 == i % 10)
            .collect();
        let rules: [KubeOvnRule<'_>; 4] = [
            ("deny", &in_ns, None, vec![], ""),
            (
                "from-web",
                &in_ns,
                Some(web.iter().map(|p| p.3.clone()).collect()),
                vec![],
                "",
            ),
            (
                "from-team",
                &in_ns,
                Some(team.iter().map(|p| p.3.clone()).collect()),
                vec![],
                "",
            ),
            (
                "from-cidr",
                &web,
                Some(vec!["10.0.0.0/8".into()]),
                vec!["10.1.0.0/16".into()],
                " && tcp.dst == 80",
            ),
        ];
        for (name, members, allow, except, ports) in rules {
            let pg = format!("{name}.{ns}").replace('-', ".");
            b.add(
                PortGroup::new(&pg)
                    .ports(members.iter().map(|p| port(p)))
                    .external_id("np", format!("{ns}/{name}")),
            );
            let mut acls = vec![
                Acl::new(
                    AclParent::PortGroup(pg.clone()),
                    AclDirection::ToLport,
                    2000,
                    format!("outport == @{pg} && ip"),
                    AclAction::Drop,
                ),
                Acl::new(
                    AclParent::PortGroup(pg.clone()),
                    AclDirection::ToLport,
                    3000,
                    format!("ip4.src == 100.64.0.0/16 && outport == @{pg}"),
                    AclAction::AllowRelated,
                ),
            ];
            if let Some(allow) = allow {
                let a = format!("{pg}.ingress.allow.IPv4.0");
                let e = format!("{pg}.ingress.except.IPv4.0");
                b.add(AddressSet::new(&a, allow));
                b.add(AddressSet::new(&e, except));
                acls.push(Acl::new(
                    AclParent::PortGroup(pg.clone()),
                    AclDirection::ToLport,
                    2001,
                    format!("ip4.src == ${a} && ip4.src != ${e} && outport == @{pg} && ip{ports}"),
                    AclAction::AllowRelated,
                ));
            }
            b.add(AclSet::new(
                AclParent::PortGroup(pg.clone()),
                "np",
                format!("{ns}/{name}"),
                acls,
            ));
        }
    }
    b
}

/// Part 5 (see the module doc).
async fn lflows(northd: &Northd, dir: &std::path::Path, n_ns: usize, limit: Duration) {
    use kubeovn_ovn::northbound::{Northbound, Op, OvsdbNorthbound};
    let nb_addr = northd.nb.unix_remote();
    let (_client, cache) = nb_cache(&nb_addr).await;
    let (api, kubeconfig) = start_api(&dir.join("kubeconfig-lflows")).await;
    let store = api.store();
    load_pods(store, n_ns);
    let child = spawn_controller(dir, &kubeconfig, &nb_addr, 3);
    let n_pods = n_ns * PODS_PER_NS;
    assert!(
        ports_programmed(&cache, n_pods, limit).await,
        "lflows: the pods' ports never all showed in NB"
    );
    let k = Kube {
        pods: store.resource("", "v1", "pods").unwrap(),
        store,
    };
    let mut pods = Vec::new();
    let t = Instant::now();
    for i in 0..n_ns {
        for j in 0..PODS_PER_NS {
            let (ns, name) = (ns_name(i), format!("p-{j}"));
            let ip = loop {
                if let Some(ip) = k.pod_ip(&ns, &name) {
                    break ip;
                }
                assert!(t.elapsed() < limit, "lflows: {ns}/{name} never annotated");
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let app = if j < PODS_PER_NS / 2 { "web" } else { "db" };
            pods.push((ns, name, app.to_owned(), ip));
        }
    }
    // One chassis with every pod's port bound, so ovn-controller installs the flows of every port.
    let chassis =
        Chassis::start(&northd.sb.unix_remote()).expect("ovs-vswitchd and ovn-controller");
    chassis.bind(
        &pods
            .iter()
            .map(|(ns, name, _, _)| kubeovn_core::naming::pod_port(name, ns, "ovn"))
            .collect::<Vec<_>>(),
    );
    let settle = || {
        northd.sync();
        northd.sync_hv();
        chassis.flows()
    };
    let f0 = settle();
    let (l0, r0) = northd.lflows();
    load_policies(store, n_ns);
    let want = n_ns * 4;
    let ok = cache
        .wait_for(limit, |v| {
            owners(v)
                .iter()
                .filter(|o| o.starts_with("NetworkPolicy/"))
                .count()
                >= n_ns * 3
        })
        .await;
    assert!(ok, "lflows: the policies' ACLs never all showed in NB");
    kill(child);
    let f1 = settle();
    let (l1, r1) = northd.lflows();
    let ours = rows(&cache.view());
    // Ours out, Kube-OVN's in, on the same switches and ports.
    let nb = OvsdbNorthbound::connect(&nb_addr).await.unwrap();
    let mut b = Batch::new();
    for r in cache.rows(nb::PortGroup::TABLE) {
        let n = r.get_str(nb::PortGroup::NAME);
        if n.starts_with("pg_") || n.starts_with("np_") {
            b.add(Op::DeletePortGroup(n.to_owned()));
        }
    }
    for r in cache.rows(nb::AddressSet::TABLE) {
        let n = r.get_str(nb::AddressSet::NAME);
        if n.starts_with("as_") {
            b.add(Op::DeleteAddressSet(n.to_owned()));
        }
    }
    nb.commit(b).await.unwrap();
    cache
        .wait_for(limit, |v| {
            !v.rows(nb::PortGroup::TABLE)
                .any(|r| r.get_str(nb::PortGroup::NAME).starts_with("np_"))
        })
        .await;
    let base = rows(&cache.view());
    nb.commit(kube_ovn_style(n_ns, &pods)).await.unwrap();
    let ok = cache.wait_for(limit, |v| rows(v).0 >= base.0 + want).await;
    assert!(ok, "lflows: Kube-OVN's port groups never all showed in NB");
    let f2 = settle();
    let (l2, r2) = northd.lflows();
    let theirs = rows(&cache.view());
    println!(
        "logical flows (lflow-list lines / Logical_Flow rows) for {want} policies over {n_pods} pods: none {l0} / \
         {r0}; ours {l1} / {r1} (the policies' own {} / {}); Kube-OVN's way {l2} / {r2} (their own {} / {})",
        l1 - l0,
        r1 - r0,
        l2 - l0,
        r2 - r0
    );
    println!(
        "OpenFlow flows (ovs-ofctl dump-flows, every pod's port bound on one chassis): none {f0}; ours {f1} (the \
         policies' own {}); Kube-OVN's way {f2} (their own {})",
        f1 - f0,
        f2 - f0
    );
    println!(
        "  NB rows (port groups, address sets, ACLs): ours {:?}, Kube-OVN's way {:?} (before either: {:?})",
        (ours.0 - base.0, ours.1 - base.1, ours.2 - base.2),
        (theirs.0 - base.0, theirs.1 - base.1, theirs.2 - base.2),
        base
    );
}
