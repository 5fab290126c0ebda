//! The in-memory server against a real ovsdb-server: the same northbound batches through both give the same
//! rows (uuids aside), and the same faulty transactions give the same errors (needs the OVS binaries for the
//! comparison; skipped with a message without them).

#![cfg(feature = "mock")]
#![allow(clippy::unwrap_used)] // test code

mod common;

use std::collections::{BTreeMap, HashMap};

use common::{OvsdbServer, Storage};
use kubeovn_ovn::memdb::MemDb;

/// A value of a typed enum column, from its text.
fn e<T: std::str::FromStr>(s: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    s.parse().unwrap()
}
use kubeovn_ovn::northbound::{
    Acl, AclParent, AddressSet, Batch, ChassisTemplateVars, DhcpOptions, LbTarget, LoadBalancer,
    LogicalSwitch, Meter, Nat, NbGlobal, Northbound, Op, OvsdbNorthbound, Patch, PortGroup, Router,
    RouterPolicy, StaticRoute, SwitchPort,
};
use kubeovn_ovn::ops::{Operation, Transaction};
use kubeovn_ovn::serde_json::{json, Value as Json};
use kubeovn_ovn::vswitch::{
    BridgeSpec, GlobalSpec, OpenVSwitch, OvsBatch, OvsdbOpenVSwitch, PortSpec, QosSpec, QueueSpec,
};
use kubeovn_ovn::{Atom, Client, Datum, Uuid};

/// Every table's rows with each uuid reference replaced by the referenced row's own normalized content, sorted:
/// two databases with the same contents give the same snapshot whatever their uuids.
async fn snapshot(c: &Client) -> BTreeMap<String, Vec<String>> {
    snapshot_of(c, "OVN_Northbound").await
}

async fn snapshot_of(c: &Client, db: &str) -> BTreeMap<String, Vec<String>> {
    let schema = c.get_schema(db).await.unwrap();
    let mut txn = Transaction::new(db);
    let names: Vec<String> = schema.tables.keys().cloned().collect();
    for t in &names {
        txn.push(Operation::select(t.clone()));
    }
    let res = c.transact(&txn).await.unwrap();
    let mut rows: HashMap<Uuid, (String, BTreeMap<String, Datum>)> = HashMap::new();
    for (t, r) in names.iter().zip(&res) {
        for row in r.rows().unwrap() {
            let u = row["_uuid"].as_atom().and_then(Atom::as_uuid).unwrap();
            let cols = row
                .iter()
                .filter(|(k, _)| !k.starts_with('_'))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            rows.insert(u, (t.clone(), cols));
        }
    }
    fn ident(
        u: Uuid,
        rows: &HashMap<Uuid, (String, BTreeMap<String, Datum>)>,
        depth: u32,
    ) -> String {
        let Some((t, cols)) = rows.get(&u) else {
            return format!("<missing {u}>");
        };
        if depth > 8 {
            return format!("<{t}>");
        }
        let map = |a: &Atom| match a {
            Atom::Uuid(x) => Atom::String(ident(*x, rows, depth + 1)),
            a => a.clone(),
        };
        let body: Vec<String> = cols
            .iter()
            .map(|(k, d)| {
                let d = match d {
                    Datum::Atom(a) => Datum::Atom(map(a)),
                    Datum::Set(s) => Datum::Set(s.iter().map(map).collect()),
                    Datum::Map(m) => Datum::Map(m.iter().map(|(k, v)| (map(k), map(v))).collect()),
                };
                format!("{k}={:?}", d.canonical())
            })
            .collect();
        format!("{t}{{{}}}", body.join(","))
    }
    let mut out: BTreeMap<String, Vec<String>> =
        names.iter().map(|t| (t.clone(), Vec::new())).collect();
    for (u, (t, _)) in &rows {
        out.get_mut(t).unwrap().push(ident(*u, &rows, 0));
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

/// The batches of the northbound tests: switches, ports, routers and patches, routes, policies, port groups,
/// address sets, ACLs with meters, load balancers, NAT, DHCP options, NB_Global, deletes, and each batch
/// committed twice (the second a no-op); a snapshot after each.
async fn scenario(nb: &OvsdbNorthbound, c: &Client) -> Vec<BTreeMap<String, Vec<String>>> {
    let mut snaps = Vec::new();
    c.transact(&Transaction::new("OVN_Northbound").op(Operation::insert("NB_Global")))
        .await
        .unwrap();
    let pg = AclParent::PortGroup("pg1".into());
    let mut batches: Vec<Batch> = Vec::new();
    let mut b = Batch::new();
    b.add(
        LogicalSwitch::new("ovn-default")
            .subnet("10.16.0.0/16")
            .exclude_ips(["10.16.0.1"])
            .external_id("vendor", "kube-ovn"),
    )
    .add(
        SwitchPort::new("ovn-default", "pod1.ns")
            .addresses(["0a:58:0a:10:00:05 10.16.0.5"])
            .port_security(["0a:58:0a:10:00:05 10.16.0.5"])
            .external_id("pod", "ns/pod1")
            .may_exist(),
    );
    batches.push(b);
    let mut b = Batch::new();
    b.add(SwitchPort::new("ovn-default", "pod1.ns").addresses(["0a:58:0a:10:00:06 10.16.0.6"]))
        .add(Router::new("ovn-cluster"))
        .add(LogicalSwitch::new("join").subnet("100.64.0.0/16"))
        .patch(Patch::new(
            "join",
            "ovn-cluster",
            "0a:58:64:40:00:01",
            ["100.64.0.1/16"],
        ))
        .patch(Patch::new(
            "ovn-default",
            "ovn-cluster",
            "0a:58:0a:10:00:01",
            ["10.16.0.1/16"],
        ));
    batches.push(b);
    let mut b = Batch::new();
    b.add(StaticRoute::new("ovn-cluster", "0.0.0.0/0", "100.64.0.1"))
        .add(StaticRoute::new("ovn-cluster", "10.16.0.0/16", "100.64.0.2").policy(e("src-ip")))
        .add(RouterPolicy::new(
            "ovn-cluster",
            31000,
            "ip4.dst == 10.16.0.0/16",
            e("allow"),
        ))
        .add(
            RouterPolicy::new("ovn-cluster", 29000, "ip4.src == 10.16.0.5", e("reroute"))
                .nexthops(["100.64.0.2"]),
        );
    batches.push(b);
    let mut b = Batch::new();
    b.add(
        RouterPolicy::new("ovn-cluster", 29000, "ip4.src == 10.16.0.5", e("reroute"))
            .nexthops(["100.64.0.3"]),
    )
    .add(Op::DeleteStaticRoute {
        router: "ovn-cluster".into(),
        prefix: "10.16.0.0/16".into(),
        nexthop: None,
    })
    .add(Op::DeletePolicy {
        router: "ovn-cluster".into(),
        priority: 31000,
        match_: "ip4.dst == 10.16.0.0/16".into(),
    });
    batches.push(b);
    let mut b = Batch::new();
    b.add(PortGroup::new("pg_np1").external_id("np", "ns/np1"))
        .add(SwitchPort::new("ovn-default", "pod2.ns").addresses(["0a:58:0a:10:00:07 10.16.0.7"]))
        .port_group_add_ports("pg_np1", ["pod1.ns", "pod2.ns"])
        .add(AddressSet::new("as_np1", ["10.16.0.5", "10.16.0.7"]));
    batches.push(b);
    let mut b = Batch::new();
    b.port_group_remove_ports("pg_np1", ["pod1.ns"])
        .add(AddressSet::new("as_np1", ["10.16.0.9"]));
    batches.push(b);
    let mut b = Batch::new();
    b.add(PortGroup::new("pg1"))
        .add(Meter::new("acl-meter", e("pktps"), 100, 10))
        .add(
            Acl::new(
                pg.clone(),
                e("to-lport"),
                1001,
                "outport == @pg1 && ip4",
                e("allow-related"),
            )
            .log("np1", e("info"), Some("acl-meter"))
            .external_id("np", "ns/np1"),
        )
        .add(
            Acl::new(
                pg.clone(),
                e("to-lport"),
                1000,
                "outport == @pg1",
                e("drop"),
            )
            .external_id("np", "ns/np1"),
        )
        .add(Acl::new(
            AclParent::Switch("ovn-default".into()),
            e("from-lport"),
            2000,
            "ip4.dst == 10.0.0.1",
            e("allow"),
        ));
    batches.push(b);
    let mut b = Batch::new();
    b.add(Acl::new(
        pg.clone(),
        e("to-lport"),
        1000,
        "outport == @pg1",
        e("reject"),
    ))
    .add(Meter::new("acl-meter", e("pktps"), 200, 10))
    .delete_acl(pg.clone(), e("to-lport"), 1001, "outport == @pg1 && ip4");
    batches.push(b);
    let mut b = Batch::new();
    b.delete_acls_by_external_id(pg.clone(), "np", "ns/np1")
        .delete_meter("acl-meter")
        .add(
            LoadBalancer::new("cluster-tcp")
                .protocol(e("tcp"))
                .vip("10.96.0.1:443", ["172.18.0.2:6443", "172.18.0.3:6443"])
                .vip("10.96.0.10:53", ["10.16.0.2:53"])
                .external_id("vendor", "kube-ovn"),
        )
        .lb_attach("cluster-tcp", LbTarget::Switch("ovn-default".into()))
        .lb_attach("cluster-tcp", LbTarget::Router("ovn-cluster".into()));
    batches.push(b);
    let mut b = Batch::new();
    b.lb_remove_vip("cluster-tcp", "10.96.0.10:53")
        .lb_detach("cluster-tcp", LbTarget::Switch("ovn-default".into()))
        .add(
            Nat::new("ovn-cluster", e("snat"), "172.18.0.100", "10.16.0.0/16")
                .external_id("vendor", "kube-ovn"),
        )
        .add(Nat::new(
            "ovn-cluster",
            e("dnat_and_snat"),
            "172.18.0.50",
            "10.16.0.5",
        ))
        .add(
            DhcpOptions::new("10.16.0.0/16")
                .external_id("ls", "ovn-default")
                .option("lease_time", "3600")
                .option("router", "10.16.0.1"),
        )
        .add(
            NbGlobal::new()
                .option("mac_prefix", "0a:00:00")
                .option("northd_probe_interval", "5000"),
        );
    batches.push(b);
    let mut b = Batch::new();
    // Deleting the load balancer drops it from the router too (a weak reference).
    b.delete_load_balancer("cluster-tcp")
        .add(Nat::new(
            "ovn-cluster",
            e("snat"),
            "172.18.0.101",
            "10.16.0.0/16",
        ))
        .delete_nat("ovn-cluster", e("dnat_and_snat"), "172.18.0.50")
        .add(NbGlobal::new().remove_option("northd_probe_interval"));
    batches.push(b);
    let mut b = Batch::new();
    b.delete_switch_port("pod1.ns")
        .delete_switch_port("pod1.ns")
        .unpatch("join", "ovn-cluster")
        .add(Op::DeletePortGroup("pg_np1".into()))
        .add(Op::DeleteAddressSet("as_np1".into()));
    batches.push(b);
    let mut b = Batch::new();
    b.delete_switch("join").delete_router("ovn-cluster");
    batches.push(b);
    // Chassis template variables: a row created and merged into by one batch, then values changed, variables
    // removed (one missing), and another chassis' row deleted.
    let mut b = Batch::new();
    b.add(
        LoadBalancer::new("svc.ns.web.tcp")
            .vip("10.96.0.20:80", ["^svc.ns.web.tcp.80"])
            .option("template", "true")
            .option("address-family", "ipv4"),
    )
    .add(
        ChassisTemplateVars::new("node1")
            .var("svc.ns.web.tcp.80", "10.16.0.5:8080")
            .var("stale", "x"),
    )
    .add(
        ChassisTemplateVars::new("node1")
            .var("stale", "y")
            .var("vip6", "fd00::10")
            .external_id("vendor", "kube-ovn"),
    )
    .add(ChassisTemplateVars::new("node2").var("svc.ns.web.tcp.80", ""));
    batches.push(b);
    let mut b = Batch::new();
    b.add(
        ChassisTemplateVars::new("node1").var("svc.ns.web.tcp.80", "10.16.0.5:8080,10.16.0.6:8080"),
    )
    .remove_template_vars("node1", ["stale", "missing"])
    .delete_chassis_template_vars("node2")
    .delete_chassis_template_vars("node3");
    batches.push(b);
    for b in batches {
        nb.commit(b.clone()).await.unwrap();
        nb.commit(b).await.unwrap();
        snaps.push(snapshot(c).await);
    }
    // A batch naming a missing switch fails the same way on both.
    assert!(SwitchPort::new("nope", "x").execute(nb).await.is_err());
    snaps
}

#[tokio::test]
async fn same_rows_as_ovsdb_server() {
    let mem = MemDb::new_nb();
    let nb = mem.northbound().await.unwrap();
    let got = scenario(&nb, &mem.connect()).await;
    // Without a server the scenario still runs on the in-memory one (it must not fail), but cannot be compared.
    let Some(srv) = OvsdbServer::start("ovn-nb.ovsschema", Storage::Standalone, false) else {
        return;
    };
    let c = Client::connect(&srv.unix_remote()).await.unwrap();
    let real = OvsdbNorthbound::with_client(c.clone(), &[]).await.unwrap();
    let want = scenario(&real, &c).await;
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        for (t, rows) in w {
            assert_eq!(g.get(t), Some(rows), "after batch {i}, table {t}");
        }
    }
    // Something happened in each table the scenario touches.
    assert!(want[6]["ACL"].len() == 3, "{:?}", want[6]["ACL"]);
}

/// Raw transactions (sent without the client's validation) that ovsdb-server refuses or handles specially.
fn cases(ls: &str) -> Vec<Json> {
    let nb = "OVN_Northbound";
    vec![
        // Two ports with the same name (a unique index).
        json!([nb,
            {"op":"insert","table":"Logical_Switch_Port","uuid-name":"a","row":{"name":"dup"}},
            {"op":"insert","table":"Logical_Switch_Port","uuid-name":"b","row":{"name":"dup"}},
            {"op":"mutate","table":"Logical_Switch","where":[["name","==",ls]],
             "mutations":[["ports","insert",["set",[["named-uuid","a"],["named-uuid","b"]]]]]}]),
        // A port whose name an existing port has.
        json!([nb,
            {"op":"insert","table":"Logical_Switch_Port","uuid-name":"a","row":{"name":"p0"}},
            {"op":"mutate","table":"Logical_Switch","where":[["name","==",ls]],
             "mutations":[["ports","insert",["named-uuid","a"]]]}]),
        // A strong reference to a row that does not exist.
        json!([nb, {"op":"mutate","table":"Logical_Switch","where":[["name","==",ls]],
             "mutations":[["ports","insert",["uuid","9b2b4f43-8ba8-4ce4-a1d4-9f1a0c3a0b2e"]]]}]),
        // Deleting a port its switch still lists.
        json!([nb, {"op":"delete","table":"Logical_Switch_Port","where":[["name","==","p0"]]}]),
        // A second NB_Global row (maxRows 1).
        json!([nb, {"op":"insert","table":"NB_Global","row":{}}]),
        // Two values in a column of at most one.
        json!([nb, {"op":"mutate","table":"Logical_Switch_Port","where":[["name","==","p0"]],
             "mutations":[["tag_request","insert",5]]}]),
        json!([nb, {"op":"mutate","table":"Logical_Switch_Port","where":[["name","==","p0"]],
             "mutations":[["tag_request","insert",["set",[6,7]]]]}]),
        // Out of the allowed range, and not in an enum.
        json!([nb, {"op":"update","table":"Logical_Switch_Port","where":[["name","==","p0"]],
             "row":{"tag_request":5000}}]),
        json!([nb, {"op":"insert","table":"ACL","row":{"action":"bogus","direction":"to-lport","match":"1","priority":1}}]),
        // An enum column left to its default.
        json!([nb, {"op":"insert","table":"ACL","row":{"action":"drop","match":"1","priority":1}}]),
        // An orphan row of a non-root table is collected; the insert still reports its uuid.
        json!([nb, {"op":"insert","table":"Logical_Switch_Port","row":{"name":"orphan"}},
                   {"op":"select","table":"Logical_Switch_Port","where":[["name","==","orphan"]],"columns":["name"]}]),
        json!([nb, {"op":"select","table":"Logical_Switch_Port","where":[["name","==","orphan"]],"columns":["name"]}]),
        // abort, a wait that fails at once, an assert of a lock not held, a comment.
        json!([nb, {"op":"comment","comment":"x"}, {"op":"abort"}]),
        json!([nb, {"op":"wait","table":"Logical_Switch","where":[["name","==",ls]],"columns":["name"],
             "until":"==","rows":[],"timeout":0}]),
        json!([nb, {"op":"wait","table":"Logical_Switch","where":[["name","==",ls]],"columns":["name"],
             "until":"!=","rows":[],"timeout":0},
             {"op":"select","table":"Logical_Switch","where":[],"columns":["name","ports"]}]),
        json!([nb, {"op":"assert","lock":"nobody"}]),
        // Integer overflow and division by zero in a mutation.
        json!([nb, {"op":"mutate","table":"Logical_Switch_Port","where":[["name","==","p0"]],
             "mutations":[["tag_request","insert",1]]}]),
        json!([nb, {"op":"mutate","table":"Logical_Switch_Port","where":[["name","==","p0"]],
             "mutations":[["tag_request","+=",i64::MAX]]}]),
        json!([nb, {"op":"mutate","table":"Logical_Switch_Port","where":[["name","==","p0"]],
             "mutations":[["tag_request","/=",0]]}]),
        json!([nb, {"op":"mutate","table":"Logical_Switch_Port","where":[["name","==","p0"]],
             "mutations":[["tag_request","+=",5000]]}]),
        // Unknown table, column, operation.
        json!([nb, {"op":"select","table":"Nope","where":[]}]),
        json!([nb, {"op":"update","table":"Logical_Switch","where":[],"row":{"nope":1}}]),
        json!([nb, {"op":"frobnicate","table":"Logical_Switch"}]),
        json!([nb, {"op":"select","table":"Logical_Switch","where":[["name","<","x"]]}]),
        // Map mutations: insert keeps an existing key's value; delete by key and by pair.
        json!([nb, {"op":"mutate","table":"Logical_Switch","where":[["name","==",ls]],
             "mutations":[["external_ids","insert",["map",[["a","1"],["b","2"]]]],
                          ["external_ids","insert",["map",[["a","9"]]]],
                          ["external_ids","delete",["map",[["b","3"]]]]]},
             {"op":"select","table":"Logical_Switch","where":[["name","==",ls]],"columns":["external_ids"]},
             {"op":"mutate","table":"Logical_Switch","where":[["name","==",ls]],
             "mutations":[["external_ids","delete",["set",["a","b"]]]]},
             {"op":"select","table":"Logical_Switch","where":[["external_ids","includes",["map",[["a","1"]]]]],"columns":["name"]}]),
        // Weak references to a deleted row go away.
        json!([nb, {"op":"insert","table":"Load_Balancer","uuid-name":"lb","row":{"name":"lb0"}},
                   {"op":"mutate","table":"Logical_Switch","where":[["name","==",ls]],
                    "mutations":[["load_balancer","insert",["named-uuid","lb"]]]}]),
        json!([nb, {"op":"delete","table":"Load_Balancer","where":[["name","==","lb0"]]},
                   {"op":"select","table":"Logical_Switch","where":[["name","==",ls]],"columns":["load_balancer"]}]),
    ]
}

/// A result with uuids (they differ between servers) as `<uuid>` and `syntax` members left out; the two rows
/// of an index clash in a fixed order (the server orders them by uuid).
fn normalize(r: &Json) -> Json {
    match r {
        Json::String(s) => {
            let mut out = String::new();
            let mut rest = s.as_str();
            while !rest.is_empty() {
                if rest.len() >= 36 && rest.is_char_boundary(36) && Uuid::parse(&rest[..36]).is_ok()
                {
                    out.push_str("<uuid>");
                    rest = &rest[36..];
                } else {
                    let c = rest.chars().next().unwrap();
                    out.push(c);
                    rest = &rest[c.len_utf8()..];
                }
            }
            if let Some((head, rows)) = out.split_once("  First row") {
                let rows = format!("First row{rows}")
                    .replace("First row", "Row")
                    .replace("Second row", "Row");
                let mut parts: Vec<&str> = rows.split("  ").collect();
                parts.sort();
                out = format!("{head}  {}", parts.join("  "));
            }
            Json::String(out)
        }
        Json::Array(a) => Json::Array(a.iter().map(normalize).collect()),
        Json::Object(o) => Json::Object(
            o.iter()
                .filter(|(k, _)| *k != "syntax" && *k != "uuid")
                .map(|(k, v)| (k.clone(), normalize(v)))
                .collect(),
        ),
        v => v.clone(),
    }
}

async fn run_cases(c: &Client) -> Vec<Json> {
    let setup = json!(["OVN_Northbound",
        {"op":"insert","table":"NB_Global","row":{}},
        {"op":"insert","table":"Logical_Switch_Port","uuid-name":"p","row":{"name":"p0"}},
        {"op":"insert","table":"Logical_Switch","row":{"name":"ls0","ports":["named-uuid","p"]}}]);
    let r = c.call("transact", &setup).await.unwrap();
    assert!(r[2].get("uuid").is_some(), "{r}");
    let mut out = Vec::new();
    for t in cases("ls0") {
        out.push(normalize(&c.call("transact", &t).await.unwrap()));
    }
    out
}

#[tokio::test]
async fn same_errors_as_ovsdb_server() {
    let mem = MemDb::new_nb();
    let got = run_cases(&mem.connect()).await;
    let Some(srv) = OvsdbServer::start("ovn-nb.ovsschema", Storage::Standalone, false) else {
        return;
    };
    let want = run_cases(&Client::connect(&srv.unix_remote()).await.unwrap()).await;
    let cases = cases("ls0");
    let mut bad = Vec::new();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        if g != w {
            bad.push(format!(
                "case {i}: {}\n  memdb:  {g}\n  server: {w}",
                cases[i]
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// One monitor update with uuids left out and rows sorted: comparable between servers.
fn normalize_update(u: &kubeovn_ovn::monitor::TableUpdates) -> Vec<String> {
    let mut out = Vec::new();
    for (t, rows) in u {
        for upd in rows.values() {
            let s = format!("{t}: {upd:?}");
            out.push(normalize(&Json::String(s)).as_str().unwrap().to_owned());
        }
    }
    out.sort();
    out
}

/// Monitors (`monitor_cond_since`, all columns of some tables, a condition on one) report the same
/// updates: inserts without default values, modifications as differences, deletes, rows entering and
/// leaving the condition.
async fn monitor_run(c: &Client) -> (Vec<String>, Vec<Vec<String>>) {
    use kubeovn_ovn::monitor::{MonitorRequest, MonitorRequests};
    use kubeovn_ovn::ops::Condition;
    let req = MonitorRequests::new()
        .table("Logical_Switch", MonitorRequest::all())
        .table(
            "Logical_Switch_Port",
            MonitorRequest::all().columns(["name", "addresses", "tag_request", "options"]),
        )
        .table(
            "ACL",
            MonitorRequest::all()
                .columns(["priority", "action", "match"])
                .filter(Condition::new(
                    "priority",
                    kubeovn_ovn::ops::Function::Ge,
                    100i64,
                )),
        );
    let setup = json!(["OVN_Northbound",
        {"op":"insert","table":"Logical_Switch_Port","uuid-name":"p","row":{"name":"p0"}},
        {"op":"insert","table":"Logical_Switch","row":{"name":"ls0","ports":["named-uuid","p"]}}]);
    c.call("transact", &setup).await.unwrap();
    let (init, mut s) = c
        .monitor_cond_since("OVN_Northbound", &req, None)
        .await
        .unwrap();
    let head = vec![
        format!("found={}", init.found),
        format!("{:?}", init.last_txn_id),
    ]
    .into_iter()
    .chain(normalize_update(&init.updates))
    .collect();
    let steps = vec![
        json!(["OVN_Northbound", {"op":"update","table":"Logical_Switch_Port","where":[["name","==","p0"]],
            "row":{"addresses":["set",["a","b"]],"tag_request":7,"options":["map",[["k","v"],["x","y"]]]}}]),
        json!(["OVN_Northbound", {"op":"update","table":"Logical_Switch_Port","where":[["name","==","p0"]],
            "row":{"addresses":["set",["b","c"]],"tag_request":["set",[]],"options":["map",[["k","w"]]]}}]),
        json!(["OVN_Northbound",
            {"op":"insert","table":"ACL","uuid-name":"a1","row":{"priority":50,"action":"drop","direction":"to-lport","match":"m1"}},
            {"op":"insert","table":"ACL","uuid-name":"a2","row":{"priority":150,"action":"drop","direction":"to-lport","match":"m2"}},
            {"op":"mutate","table":"Logical_Switch","where":[["name","==","ls0"]],
             "mutations":[["acls","insert",["set",[["named-uuid","a1"],["named-uuid","a2"]]]],["external_ids","insert",["map",[["e","1"]]]]]}]),
        json!(["OVN_Northbound", {"op":"update","table":"ACL","where":[["priority","==",50]],"row":{"priority":200}},
            {"op":"update","table":"ACL","where":[["priority","==",150]],"row":{"priority":10}}]),
        json!(["OVN_Northbound", {"op":"update","table":"Logical_Switch","where":[],"row":{"acls":["set",[]],"ports":["set",[]]}}]),
    ];
    let mut got = Vec::new();
    for t in steps {
        let r = c.call("transact", &t).await.unwrap();
        assert!(
            r.as_array()
                .unwrap()
                .iter()
                .all(|x| x.get("error").is_none()),
            "{r}"
        );
        let u = s
            .next_timeout(std::time::Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        got.push(normalize_update(&u.tables));
    }
    // Widening a condition reports the rows that now match; narrowing, the rows that no longer do.
    // (Kept by a switch: an unreferenced ACL would be collected at once.)
    let r = c
        .call(
            "transact",
            &json!(["OVN_Northbound",
                {"op":"insert","table":"ACL","uuid-name":"a3","row":{"priority":5,"action":"drop","direction":"to-lport","match":"m3"}},
                {"op":"insert","table":"ACL","uuid-name":"a4","row":{"priority":500,"action":"drop","direction":"to-lport","match":"m4"}},
                {"op":"mutate","table":"Logical_Switch","where":[["name","==","ls0"]],
                 "mutations":[["acls","insert",["set",[["named-uuid","a3"],["named-uuid","a4"]]]]]}]),
        )
        .await
        .unwrap();
    assert!(r[2].get("count").is_some(), "{r}");
    got.push(normalize_update(
        &s.next_timeout(std::time::Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap()
            .tables,
    ));
    for min in [0i64, 100] {
        let cond: BTreeMap<String, Vec<Condition>> = [(
            "ACL".to_owned(),
            vec![Condition::new(
                "priority",
                kubeovn_ovn::ops::Function::Ge,
                min,
            )],
        )]
        .into();
        c.monitor_cond_change(&s, &cond).await.unwrap();
        let u = s.next_timeout(std::time::Duration::from_secs(2)).await;
        got.push(match u {
            Some(u) => normalize_update(&u.unwrap().tables),
            None => vec!["no update".to_owned()],
        });
    }
    (head, got)
}

#[tokio::test]
async fn same_monitor_updates_as_ovsdb_server() {
    let mem = MemDb::new_nb();
    let got = monitor_run(&mem.connect()).await;
    let Some(srv) = OvsdbServer::start("ovn-nb.ovsschema", Storage::Standalone, false) else {
        return;
    };
    let want = monitor_run(&Client::connect(&srv.unix_remote()).await.unwrap()).await;
    assert_eq!(got.0, want.0);
    for (i, (g, w)) in got.1.iter().zip(&want.1).enumerate() {
        assert_eq!(g, w, "step {i}");
    }
}

/// The Open_vSwitch batches of the vswitch tests through both servers give the same rows.
async fn ovs_scenario(ovs: &OvsdbOpenVSwitch, c: &Client) -> Vec<BTreeMap<String, Vec<String>>> {
    let mut batches = Vec::new();
    let mut b = OvsBatch::new();
    b.add(
        GlobalSpec::new()
            .external_id("system-id", "node1")
            .external_id("ovn-encap-type", "geneve"),
    )
    .add(
        BridgeSpec::new("br-int")
            .datapath_type("netdev")
            .fail_mode(kubeovn_ovn::vswitch::BridgeFailMode::Secure)
            .external_id("vendor", "kube-ovn"),
    );
    for i in 0..3 {
        b.add(
            PortSpec::new("br-int", format!("h{i}"))
                .iface_id(format!("pod{i}.ns"))
                .mtu_request(1400)
                .ingress_policing(1000, 100),
        );
    }
    b.add(
        PortSpec::new("br-int", "mirror0")
            .iface_type("internal")
            .tag(10),
    );
    batches.push(b);
    let mut b = OvsBatch::new();
    b.add(
        QosSpec::new("h1", "linux-htb")
            .other_config("max-rate", "10000000")
            .queue(0, QueueSpec::max_rate(1_000_000))
            .queue(
                1,
                QueueSpec::max_rate(2_000_000).other_config("priority", "1"),
            ),
    )
    .add(
        PortSpec::new("br-int", "h2")
            .iface_id("pod2b.ns")
            .mtu_request(1500),
    );
    batches.push(b);
    let mut b = OvsBatch::new();
    b.add(
        QosSpec::new("h1", "linux-htb")
            .other_config("max-rate", "20000000")
            .queue(0, QueueSpec::max_rate(5_000_000))
            .queue(2, QueueSpec::max_rate(3_000_000)),
    )
    .delete_port("h0");
    batches.push(b);
    let mut b = OvsBatch::new();
    b.delete_qos("h1").delete_bridge("br-int");
    batches.push(b);
    let mut snaps = Vec::new();
    for b in batches {
        ovs.commit(b.clone()).await.unwrap();
        ovs.commit(b).await.unwrap();
        snaps.push(snapshot_of(c, "Open_vSwitch").await);
    }
    snaps
}

#[tokio::test]
async fn same_open_vswitch_rows_as_ovsdb_server() {
    let mem = MemDb::new_ovs();
    let got = ovs_scenario(&mem.open_vswitch().await.unwrap(), &mem.connect()).await;
    let Some(srv) = OvsdbServer::start("vswitch.ovsschema", Storage::Standalone, false) else {
        return;
    };
    let c = Client::connect(&srv.unix_remote()).await.unwrap();
    // The root row, as MemDb::new_ovs and `ovs-vsctl init` make it.
    c.transact(&Transaction::new("Open_vSwitch").op(Operation::insert("Open_vSwitch")))
        .await
        .unwrap();
    let real = OvsdbOpenVSwitch::with_client(c.clone()).await.unwrap();
    let want = ovs_scenario(&real, &c).await;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        for (t, rows) in w {
            assert_eq!(g.get(t), Some(rows), "after batch {i}, table {t}");
        }
    }
    assert_eq!(want[0]["Port"].len(), 5, "{:?}", want[0]["Port"]);
}

/// Locks (lock, steal, unlock, the `assert` operation and the `locked`/`stolen` notifications) as a real
/// ovsdb-server handles them.
async fn lock_run(a: &Client, b: &Client) -> Vec<String> {
    use kubeovn_ovn::client::LockEvent;
    let mut log = Vec::new();
    let mut a_ev = a.lock_events();
    let mut b_ev = b.lock_events();
    let assert_txn = Transaction::new("OVN_Northbound").op(Operation::assert_lock("l"));
    let res = |r: Result<bool, kubeovn_ovn::Error>| match r {
        Ok(v) => format!("{v}"),
        Err(e) => e
            .ovsdb_error()
            .map(|e| e.to_string())
            .unwrap_or_else(|| e.to_string()),
    };
    let asserted = |r: Result<Vec<kubeovn_ovn::ops::OperationResult>, kubeovn_ovn::Error>| match r {
        Ok(_) => "held".to_owned(),
        Err(e) => e.ovsdb_error().map(|e| e.error.clone()).unwrap_or_default(),
    };
    /// The lock events `c` received so far. The server queues a notification when it handles the request
    /// that causes it (always one that has returned here), ahead of any later reply on `c`'s connection,
    /// and the client hands events on in arrival order: after an echo round trip on `c` they are all in.
    async fn drain(c: &Client, rx: &mut tokio::sync::mpsc::UnboundedReceiver<LockEvent>) -> String {
        c.echo().await.unwrap();
        format!(
            "{:?}",
            std::iter::from_fn(|| rx.try_recv().ok()).collect::<Vec<_>>()
        )
    }
    log.push(format!("a lock {}", res(a.lock("l").await)));
    log.push(format!("b lock {}", res(b.lock("l").await)));
    log.push(format!("b steal while waiting {}", res(b.steal("l").await)));
    log.push(format!("a lock again {}", res(a.lock("l").await)));
    log.push(format!(
        "a assert {}",
        asserted(a.transact(&assert_txn).await)
    ));
    log.push(format!(
        "b assert {}",
        asserted(b.transact(&assert_txn).await)
    ));
    b.unlock("l").await.unwrap();
    log.push(format!("b steal {}", res(b.steal("l").await)));
    log.push(format!(
        "a assert {}",
        asserted(a.transact(&assert_txn).await)
    ));
    log.push(format!(
        "b assert {}",
        asserted(b.transact(&assert_txn).await)
    ));
    log.push(format!("a events {}", drain(a, &mut a_ev).await));
    log.push(format!("b events {}", drain(b, &mut b_ev).await));
    b.unlock("l").await.unwrap();
    log.push(format!("a events {}", drain(a, &mut a_ev).await));
    log.push(format!(
        "a assert {}",
        asserted(a.transact(&assert_txn).await)
    ));
    a.unlock("l").await.unwrap();
    log.push(format!("b lock {}", res(b.lock("l").await)));
    log.push(format!("b events {}", drain(b, &mut b_ev).await));
    log
}

#[tokio::test]
async fn same_locks_as_ovsdb_server() {
    let mem = MemDb::new_nb();
    let got = lock_run(&mem.connect(), &mem.connect()).await;
    let Some(srv) = OvsdbServer::start("ovn-nb.ovsschema", Storage::Standalone, false) else {
        return;
    };
    let a = Client::connect(&srv.unix_remote()).await.unwrap();
    let b = Client::connect(&srv.unix_remote()).await.unwrap();
    let want = lock_run(&a, &b).await;
    assert_eq!(got, want);
}

/// `list_dbs`, the `_Server` schema and the database's `_Server` row (what a leader-only session reads).
async fn server_run(c: &Client) -> (Vec<String>, kubeovn_ovn::DatabaseSchema, String) {
    let dbs = c.list_dbs().await.unwrap();
    let mut schema = (*c.get_schema("_Server").await.unwrap()).clone();
    schema.cksum = None;
    let st = kubeovn_ovn::session::database_status(c, "OVN_Northbound")
        .await
        .unwrap();
    (dbs, schema, format!("{st:?}"))
}

#[tokio::test]
async fn same_server_database_as_ovsdb_server() {
    let mem = MemDb::new_nb();
    let got = server_run(&mem.connect()).await;
    let Some(srv) = OvsdbServer::start("ovn-nb.ovsschema", Storage::Standalone, false) else {
        return;
    };
    let want = server_run(&Client::connect(&srv.unix_remote()).await.unwrap()).await;
    assert_eq!(got.0, want.0);
    assert_eq!(got.1, want.1);
    assert_eq!(got.2, want.2);
}
