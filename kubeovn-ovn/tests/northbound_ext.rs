//! ACLs, meters, load balancers, NAT, DHCP options and NB_Global options against a real ovsdb-server,
//! checked with ovn-nbctl (needs OVS/OVN binaries; skipped with a message without them).

#![allow(clippy::unwrap_used)] // test code

mod common;

use std::collections::BTreeMap;

use common::{OvsdbServer, Storage};
use kubeovn_ovn::models::nb::{self, LoadBalancerGroup};
use kubeovn_ovn::northbound::{
    Acl, AclAction, AclDirection, AclParent, AclSet, AclSeverity, AddressSet, Batch,
    ChassisTemplateVars, DhcpOptions, LbTarget, LoadBalancer, LoadBalancerProtocol, LogicalSwitch,
    Meter, MeterUnit, Nat, NatType, NbError, NbGlobal, Northbound, OvsdbNorthbound, PortGroup,
    Router, SwitchPort,
};
use kubeovn_ovn::ops::{Condition, Operation};
use kubeovn_ovn::{Datum, Error, Model};

fn server() -> Option<OvsdbServer> {
    let srv = OvsdbServer::start("ovn-nb.ovsschema", Storage::Standalone, false)?;
    if !common::have("ovn-nbctl") {
        return None;
    }
    Some(srv)
}

fn nbctl(srv: &OvsdbServer, args: &[&str]) -> String {
    srv.ctl("ovn-nbctl", args).trim().to_owned()
}

#[tokio::test]
async fn acls_with_meters_on_port_groups() {
    let Some(srv) = server() else { return };
    let nb = OvsdbNorthbound::connect(&srv.unix_remote()).await.unwrap();
    let pg = AclParent::PortGroup("pg1".into());
    let mut b = Batch::new();
    b.add(PortGroup::new("pg1"));
    b.add(Meter::new("acl-meter", MeterUnit::Pktps, 100, 10));
    b.add(
        Acl::new(
            pg.clone(),
            AclDirection::ToLport,
            1001,
            "outport == @pg1 && ip4",
            AclAction::AllowRelated,
        )
        .log("np1", AclSeverity::Info, Some("acl-meter"))
        .external_id("np", "ns/np1"),
    );
    b.add(
        Acl::new(
            pg.clone(),
            AclDirection::ToLport,
            1000,
            "outport == @pg1",
            AclAction::Drop,
        )
        .external_id("np", "ns/np1"),
    );
    nb.commit(b.clone()).await.unwrap();
    let out = nbctl(&srv, &["acl-list", "pg1"]);
    assert!(out.contains("to-lport  1001 (outport == @pg1 && ip4) allow-related log(name=np1,severity=info,meter=\"acl-meter\")"), "{out}");
    assert!(
        out.contains("to-lport  1000 (outport == @pg1) drop"),
        "{out}"
    );
    assert!(nbctl(&srv, &["meter-list"]).contains("acl-meter: bands:"));
    assert_eq!(nb.acls(&pg).len(), 2);
    assert!(nb.plan(&b).unwrap().is_none(), "idempotent");

    // Change the action; the meter's rate.
    let mut b = Batch::new();
    b.add(Acl::new(
        pg.clone(),
        AclDirection::ToLport,
        1000,
        "outport == @pg1",
        AclAction::Reject,
    ));
    b.add(Meter::new("acl-meter", MeterUnit::Pktps, 200, 10));
    nb.commit(b).await.unwrap();
    assert!(nbctl(&srv, &["acl-list", "pg1"]).contains("1000 (outport == @pg1) reject"));
    assert!(nbctl(&srv, &["meter-list"]).contains("200 pktps"));

    // Delete one by identity, then the rest by external id; again as no-ops.
    for _ in 0..2 {
        let mut b = Batch::new();
        b.delete_acl(
            pg.clone(),
            AclDirection::ToLport,
            1001,
            "outport == @pg1 && ip4",
        );
        nb.commit(b).await.unwrap();
    }
    assert_eq!(nb.acls(&pg).len(), 1);
    let mut b = Batch::new();
    b.delete_acls_by_external_id(pg.clone(), "np", "ns/np1")
        .delete_meter("acl-meter");
    nb.commit(b).await.unwrap();
    assert_eq!(nbctl(&srv, &["acl-list", "pg1"]), "");
    assert_eq!(nbctl(&srv, &["meter-list"]), "");
    assert_eq!(
        nbctl(&srv, &["--bare", "--columns=_uuid", "list", "ACL"]),
        ""
    );

    // ACLs on a switch too.
    LogicalSwitch::new("ls0").execute(&nb).await.unwrap();
    let ls = AclParent::Switch("ls0".into());
    Acl::new(
        ls.clone(),
        AclDirection::FromLport,
        2000,
        "ip4.dst == 10.0.0.1",
        AclAction::Allow,
    )
    .execute(&nb)
    .await
    .unwrap();
    assert!(
        nbctl(&srv, &["acl-list", "ls0"]).contains("from-lport  2000 (ip4.dst == 10.0.0.1) allow")
    );
}

#[tokio::test]
async fn exact_groups_sets_and_acl_sets_send_only_the_difference() {
    let Some(srv) = server() else { return };
    let nb = OvsdbNorthbound::connect(&srv.unix_remote()).await.unwrap();
    let mut b = Batch::new();
    b.add(LogicalSwitch::new("ls0"));
    for p in ["p1", "p2", "p3"] {
        b.add(SwitchPort::new("ls0", p));
    }
    // A port this batch creates, one that exists, and one that does not (left out).
    b.add(PortGroup::new("pg1").ports(["p1", "p2", "gone"]));
    b.add(AddressSet::new("as1_ip4", ["10.0.0.1", "10.0.0.2"]));
    nb.commit(b).await.unwrap();
    assert_eq!(nb.port_group("pg1").unwrap().ports.len(), 2);

    // Membership changes are mutations of the difference: one delete and one insert each.
    let mut b = Batch::new();
    b.add(PortGroup::new("pg1").ports(["p2", "p3"]));
    b.add(AddressSet::new("as1_ip4", ["10.0.0.2", "10.0.0.3"]));
    let plan = nb.plan(&b).unwrap().unwrap();
    assert_eq!(plan.txn.ops.len(), 4, "{:?}", plan.txn.ops);
    assert!(plan
        .txn
        .ops
        .iter()
        .all(|o| matches!(o, Operation::Mutate { .. })));
    nb.commit(b.clone()).await.unwrap();
    assert!(nb.plan(&b).unwrap().is_none(), "idempotent");
    assert_eq!(
        nbctl(
            &srv,
            &[
                "--bare",
                "--columns=addresses",
                "list",
                "address_set",
                "as1_ip4"
            ]
        ),
        "10.0.0.2 10.0.0.3"
    );
    let ports = nbctl(
        &srv,
        &["--bare", "--columns=ports", "list", "port_group", "pg1"],
    );
    assert_eq!(ports.split_whitespace().count(), 2);

    // An owner's exact ACLs: another owner's are untouched, unchanged ones cost nothing.
    let pg = AclParent::PortGroup("pg1".into());
    let acl = |prio, m: &str| {
        Acl::new(
            pg.clone(),
            AclDirection::ToLport,
            prio,
            m,
            AclAction::AllowRelated,
        )
    };
    let mut b = Batch::new();
    b.add(AclSet::new(
        pg.clone(),
        "policy",
        "a",
        vec![
            acl(2001, "outport == @pg1 && ip4.src == $as1_ip4"),
            acl(2001, "outport == @pg1 && tcp.dst == 80"),
        ],
    ));
    b.add(AclSet::new(
        pg.clone(),
        "policy",
        "b",
        vec![acl(2001, "outport == @pg1 && tcp.dst == 80")],
    ));
    nb.commit(b.clone()).await.unwrap();
    assert_eq!(
        nb.acls(&pg).len(),
        3,
        "the same match for two owners is two rows"
    );
    assert!(nb.plan(&b).unwrap().is_none(), "idempotent");
    let mut b = Batch::new();
    b.add(AclSet::new(
        pg.clone(),
        "policy",
        "a",
        vec![acl(2001, "outport == @pg1 && tcp.dst == 80").log("a", AclSeverity::Info, None)],
    ));
    let plan = nb.plan(&b).unwrap().unwrap();
    assert_eq!(
        plan.txn.ops.len(),
        2,
        "one update, one unlink: {:?}",
        plan.txn.ops
    );
    nb.commit(b).await.unwrap();
    let out = nbctl(&srv, &["acl-list", "pg1"]);
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(out.contains("log(name=a,severity=info)"), "{out}");
    let mut b = Batch::new();
    b.add(AclSet::new(pg.clone(), "policy", "a", Vec::new()));
    nb.commit(b).await.unwrap();
    let left = nb.acls(&pg);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].external_ids["policy"], "b");
}

#[tokio::test]
async fn load_balancers_and_vips() {
    let Some(srv) = server() else { return };
    let nb = OvsdbNorthbound::connect(&srv.unix_remote()).await.unwrap();
    let mut b = Batch::new();
    b.add(LogicalSwitch::new("ls0"));
    b.add(Router::new("lr0"));
    b.add(
        LoadBalancer::new("cluster-tcp")
            .protocol(LoadBalancerProtocol::Tcp)
            .vip("10.96.0.1:443", ["172.18.0.2:6443", "172.18.0.3:6443"])
            .external_id("vendor", "kube-ovn"),
    );
    b.lb_attach("cluster-tcp", LbTarget::Switch("ls0".into()));
    b.lb_attach("cluster-tcp", LbTarget::Router("lr0".into()));
    nb.commit(b.clone()).await.unwrap();
    let out = nbctl(&srv, &["lb-list"]);
    assert!(
        out.contains("cluster-tcp")
            && out.contains("10.96.0.1:443")
            && out.contains("172.18.0.2:6443,172.18.0.3:6443"),
        "{out}"
    );
    assert!(nbctl(&srv, &["ls-lb-list", "ls0"]).contains("cluster-tcp"));
    assert!(nbctl(&srv, &["lr-lb-list", "lr0"]).contains("cluster-tcp"));
    assert!(nb.plan(&b).unwrap().is_none(), "idempotent");

    // Add a VIP (merged), change backends, remove one.
    LoadBalancer::new("cluster-tcp")
        .vip("10.96.0.10:53", ["10.16.0.2:53"])
        .vip("10.96.0.1:443", ["172.18.0.2:6443"])
        .execute(&nb)
        .await
        .unwrap();
    let lb = nb.load_balancer("cluster-tcp").unwrap();
    assert_eq!(lb.vips.len(), 2);
    assert_eq!(lb.vips["10.96.0.1:443"], "172.18.0.2:6443");
    let mut b = Batch::new();
    b.lb_remove_vip("cluster-tcp", "10.96.0.10:53");
    nb.commit(b).await.unwrap();
    assert!(!nbctl(&srv, &["lb-list"]).contains("10.96.0.10:53"));

    // Detach from the switch, then delete: the router drops it as well.
    let mut b = Batch::new();
    b.lb_detach("cluster-tcp", LbTarget::Switch("ls0".into()));
    nb.commit(b).await.unwrap();
    assert_eq!(nbctl(&srv, &["ls-lb-list", "ls0"]), "");
    let mut b = Batch::new();
    b.delete_load_balancer("cluster-tcp");
    nb.commit(b.clone()).await.unwrap();
    nb.commit(b).await.unwrap();
    assert_eq!(nbctl(&srv, &["lb-list"]), "");
    assert_eq!(nbctl(&srv, &["lr-lb-list", "lr0"]), "");
}

#[tokio::test]
async fn load_balancer_groups_exact_vips_and_group_delete() {
    let Some(srv) = server() else { return };
    let nb = OvsdbNorthbound::connect(&srv.unix_remote()).await.unwrap();
    let lb = |backends: &[&str]| {
        LoadBalancer::new("svc.default.web.tcp")
            .protocol(LoadBalancerProtocol::Tcp)
            .vip("10.96.0.10:80", backends)
            .option("reject", "true")
            .external_id("service", "default/web")
            .exact()
    };
    // Group, member and attachment in the same transaction as the switch and the load balancer.
    let mut b = Batch::new();
    b.add(LogicalSwitch::new("ls0"));
    b.add(Router::new("lr0"));
    b.add(lb(&["10.16.0.2:8080", "10.16.0.3:8080"]));
    b.add(kubeovn_ovn::northbound::LoadBalancerGroup::new("lbg.vpc"));
    b.lb_group_add("lbg.vpc", ["svc.default.web.tcp"]);
    b.lb_group_attach("lbg.vpc", LbTarget::Switch("ls0".into()));
    b.lb_group_attach("lbg.vpc", LbTarget::Router("lr0".into()));
    nb.commit(b.clone()).await.unwrap();
    assert!(nb.plan(&b).unwrap().is_none(), "idempotent");
    let g = nb.load_balancer_group("lbg.vpc").unwrap();
    assert_eq!(g.load_balancer.len(), 1);
    let members = nbctl(
        &srv,
        &[
            "--bare",
            "--columns=load_balancer",
            "list",
            "Load_Balancer_Group",
        ],
    );
    let lb_uuid = nbctl(
        &srv,
        &["--bare", "--columns=_uuid", "list", "Load_Balancer"],
    );
    assert_eq!(members, lb_uuid);
    let on_switch = nbctl(
        &srv,
        &["get", "Logical_Switch", "ls0", "load_balancer_group"],
    );
    assert!(
        on_switch.starts_with('[') && on_switch.len() > 2,
        "{on_switch}"
    );
    assert_eq!(
        nb.load_balancers_by_external_id("service", "default/web")
            .len(),
        1
    );

    // Exact: a backend list that shrinks and an option dropped are one update of that row.
    let mut b = Batch::new();
    b.add(
        LoadBalancer::new("svc.default.web.tcp")
            .protocol(LoadBalancerProtocol::Tcp)
            .vip("10.96.0.10:80", ["10.16.0.3:8080"])
            .external_id("service", "default/web")
            .exact(),
    );
    let plan = nb.plan(&b).unwrap().unwrap();
    assert_eq!(plan.txn.ops.len(), 1, "one update");
    nb.commit(b).await.unwrap();
    let got = nb.load_balancer("svc.default.web.tcp").unwrap();
    assert_eq!(got.vips["10.96.0.10:80"], "10.16.0.3:8080");
    assert!(got.options.is_empty(), "{:?}", got.options);

    // Removing the member, then deleting the group detaches it from the switch and the router first.
    let mut b = Batch::new();
    b.lb_group_remove("lbg.vpc", ["svc.default.web.tcp"]);
    nb.commit(b).await.unwrap();
    assert!(nb
        .load_balancer_group("lbg.vpc")
        .unwrap()
        .load_balancer
        .is_empty());
    let mut b = Batch::new();
    b.delete_lb_group("lbg.vpc");
    nb.commit(b.clone()).await.unwrap();
    nb.commit(b).await.unwrap();
    assert!(nb.load_balancer_group("lbg.vpc").is_none());
    assert_eq!(
        nbctl(
            &srv,
            &["get", "Logical_Switch", "ls0", "load_balancer_group"]
        ),
        "[]"
    );
    assert_eq!(
        nbctl(
            &srv,
            &["get", "Logical_Router", "lr0", "load_balancer_group"]
        ),
        "[]"
    );
}

#[tokio::test]
async fn nat_dhcp_and_nb_global() {
    let Some(srv) = server() else { return };
    nbctl(&srv, &["init"]);
    let nb = OvsdbNorthbound::connect(&srv.unix_remote()).await.unwrap();
    let mut b = Batch::new();
    b.add(Router::new("lr0"));
    b.add(
        Nat::new("lr0", NatType::Snat, "172.18.0.100", "10.16.0.0/16")
            .external_id("vendor", "kube-ovn"),
    );
    b.add(Nat::new(
        "lr0",
        NatType::DnatAndSnat,
        "172.18.0.50",
        "10.16.0.5",
    ));
    nb.commit(b.clone()).await.unwrap();
    let out = nbctl(&srv, &["lr-nat-list", "lr0"]);
    assert!(
        out.contains("snat") && out.contains("172.18.0.100") && out.contains("10.16.0.0/16"),
        "{out}"
    );
    assert!(
        out.contains("dnat_and_snat") && out.contains("172.18.0.50") && out.contains("10.16.0.5"),
        "{out}"
    );
    assert!(nb.plan(&b).unwrap().is_none(), "idempotent");
    // Change the snat's external IP (identified by its logical IP).
    Nat::new("lr0", NatType::Snat, "172.18.0.101", "10.16.0.0/16")
        .execute(&nb)
        .await
        .unwrap();
    let nats = nb.nats("lr0");
    assert_eq!(nats.len(), 2);
    assert!(nbctl(&srv, &["lr-nat-list", "lr0"]).contains("172.18.0.101"));
    let mut b = Batch::new();
    b.delete_nat("lr0", NatType::Snat, "10.16.0.0/16")
        .delete_nat("lr0", NatType::DnatAndSnat, "172.18.0.50");
    nb.commit(b).await.unwrap();
    assert_eq!(nbctl(&srv, &["lr-nat-list", "lr0"]), "");
    assert_eq!(
        nbctl(&srv, &["--bare", "--columns=_uuid", "list", "NAT"]),
        ""
    );

    // DHCP options identified by cidr and external_ids.
    let d = DhcpOptions::new("10.16.0.0/16")
        .external_id("ls", "ls0")
        .option("lease_time", "3600")
        .option("router", "10.16.0.1")
        .option("server_id", "169.254.0.254")
        .option("server_mac", "0a:00:00:00:00:01");
    d.clone().execute(&nb).await.unwrap();
    d.clone().execute(&nb).await.unwrap();
    let out = nbctl(&srv, &["dhcp-options-list"]);
    assert_eq!(out.lines().count(), 1);
    let uuid = out.trim().to_owned();
    assert_eq!(
        nbctl(&srv, &["dhcp-options-get-options", &uuid])
            .lines()
            .count(),
        4
    );
    let ids: BTreeMap<String, String> = [("ls".to_owned(), "ls0".to_owned())].into();
    assert_eq!(
        nb.dhcp_options("10.16.0.0/16", &ids).unwrap().options["lease_time"],
        "3600"
    );
    d.clone()
        .option("lease_time", "600")
        .execute(&nb)
        .await
        .unwrap();
    assert!(nbctl(&srv, &["dhcp-options-get-options", &uuid]).contains("lease_time=600"));
    let mut b = Batch::new();
    b.delete_dhcp_options(&d);
    nb.commit(b).await.unwrap();
    assert_eq!(nbctl(&srv, &["dhcp-options-list"]), "");

    // NB_Global options.
    NbGlobal::new()
        .option("mac_prefix", "0a:00:00")
        .option("northd_probe_interval", "5000")
        .execute(&nb)
        .await
        .unwrap();
    assert_eq!(
        nbctl(&srv, &["get", "NB_Global", ".", "options:mac_prefix"]),
        "\"0a:00:00\""
    );
    NbGlobal::new()
        .remove_option("northd_probe_interval")
        .execute(&nb)
        .await
        .unwrap();
    let g = nb.nb_global().unwrap();
    assert_eq!(g.options.len(), 1);
}

#[tokio::test]
async fn raw_operations_create_a_load_balancer_group_read_back_typed() {
    let Some(srv) = server() else { return };
    let nb = OvsdbNorthbound::connect(&srv.unix_remote()).await.unwrap();
    LoadBalancer::new("svc1")
        .protocol(LoadBalancerProtocol::Udp)
        .vip("10.96.0.10:53", ["10.16.0.2:53"])
        .execute(&nb)
        .await
        .unwrap();
    let lb = nb.load_balancer("svc1").unwrap();
    assert_eq!(lb.protocol, Some(LoadBalancerProtocol::Udp));

    // The group (no spec covers Load_Balancer_Group) in the same transaction as a switch that uses it.
    let mut b = Batch::new();
    b.add(LogicalSwitch::new("ls0"));
    let group = b.raw(
        Operation::insert(LoadBalancerGroup::TABLE)
            .uuid_name("group")
            .value(LoadBalancerGroup::NAME, "cluster-lbs")
            .value(LoadBalancerGroup::LOAD_BALANCER, Datum::uuid(lb.uuid)),
    );
    let attached = b.raw(
        Operation::mutate(nb::LogicalSwitch::TABLE)
            .filter(Condition::eq(nb::LogicalSwitch::NAME, "ls0"))
            .insert(
                nb::LogicalSwitch::LOAD_BALANCER_GROUP,
                Datum::named_uuid("group"),
            ),
    );
    let read = b.raw(
        Operation::select(LoadBalancerGroup::TABLE)
            .filter(Condition::eq("_uuid", Datum::named_uuid("group"))),
    );
    assert!(group.uuid().is_err(), "no result before the commit");
    nb.commit(b).await.unwrap();

    let uuid = group.uuid().unwrap();
    assert_eq!(attached.count().unwrap(), 1);
    let rows: Vec<LoadBalancerGroup> = read.rows().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].uuid, uuid);
    assert_eq!(rows[0].name, "cluster-lbs");
    assert_eq!(rows[0].load_balancer, [lb.uuid]);
    // A result read as the wrong shape is a typed error.
    assert!(matches!(
        read.uuid(),
        Err(Error::Nb(NbError::RawResult { .. }))
    ));
    // ovn-nbctl sees the group holding the load balancer, and the switch using the group.
    assert_eq!(
        nbctl(
            &srv,
            &["get", "Load_Balancer_Group", "cluster-lbs", "load_balancer"]
        ),
        format!("[{}]", lb.uuid)
    );
    assert_eq!(
        nbctl(
            &srv,
            &["get", "Logical_Switch", "ls0", "load_balancer_group"]
        ),
        format!("[{uuid}]")
    );
    assert_eq!(nb.switch("ls0").unwrap().load_balancer_group, [uuid]);

    // A uuid-name the planner uses for the batch's own rows is refused before anything is sent.
    let mut b = Batch::new();
    b.raw(Operation::insert(LoadBalancerGroup::TABLE).uuid_name("r1"));
    let e = nb.commit(b).await.unwrap_err();
    assert!(
        matches!(&e, Error::Nb(NbError::ReservedName(n)) if n == "r1"),
        "{e:?}"
    );
    assert_eq!(
        nbctl(
            &srv,
            &["--bare", "--columns=name", "list", "Load_Balancer_Group"]
        ),
        "cluster-lbs"
    );
}

/// A newer server's schema: the shipped one with `pass` added to the ACL actions (as OVN 23.06 did).
fn newer_nb_schema(dir: &std::path::Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(common::schema_path("ovn-nb.ovsschema")).unwrap();
    let mut s: kubeovn_ovn::serde_json::Value = kubeovn_ovn::serde_json::from_str(&text).unwrap();
    let values = s["tables"]["ACL"]["columns"]["action"]["type"]["key"]["enum"][1]
        .as_array_mut()
        .unwrap();
    values.push("pass".into());
    let path = dir.join("ovn-nb-newer.ovsschema");
    std::fs::write(&path, s.to_string()).unwrap();
    path
}

#[tokio::test]
async fn an_enum_value_of_a_newer_server_reads_as_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let schema = newer_nb_schema(dir.path());
    let Some(srv) = OvsdbServer::start(schema.to_str().unwrap(), Storage::Standalone, false) else {
        return;
    };
    let nb = OvsdbNorthbound::connect(&srv.unix_remote()).await.unwrap();
    let pg = AclParent::PortGroup("pg1".into());
    PortGroup::new("pg1").execute(&nb).await.unwrap();
    // Another client writes an action these models do not know.
    let pass = AclAction::Unknown("pass".into());
    Acl::new(pg.clone(), AclDirection::ToLport, 1000, "ip4", pass.clone())
        .execute(&nb)
        .await
        .unwrap();
    // The row is still read, with the value kept, not dropped or a failure of the whole lookup.
    let acls = nb.acls(&pg);
    assert_eq!(acls.len(), 1, "{acls:?}");
    assert_eq!(acls[0].action, pass);
    let mut b = Batch::new();
    b.add(Acl::new(
        pg.clone(),
        AclDirection::ToLport,
        1000,
        "ip4",
        pass,
    ));
    assert!(nb.plan(&b).unwrap().is_none(), "idempotent");
    // And it can be changed to a known action, and deleted.
    Acl::new(
        pg.clone(),
        AclDirection::ToLport,
        1000,
        "ip4",
        AclAction::Drop,
    )
    .execute(&nb)
    .await
    .unwrap();
    assert_eq!(nb.acls(&pg)[0].action, AclAction::Drop);
    let mut b = Batch::new();
    b.delete_acl(pg.clone(), AclDirection::ToLport, 1000, "ip4");
    nb.commit(b).await.unwrap();
    assert!(nb.acls(&pg).is_empty());
}

/// The variables of `chassis` as ovn-nbctl reads them.
fn template_vars(srv: &OvsdbServer, chassis: &str) -> String {
    nbctl(srv, &["get", "Chassis_Template_Var", chassis, "variables"])
}

#[tokio::test]
async fn chassis_template_vars_merge_remove_and_delete() {
    let Some(srv) = server() else { return };
    let nb = OvsdbNorthbound::connect(&srv.unix_remote()).await.unwrap();
    let mut b = Batch::new();
    b.add(
        ChassisTemplateVars::new("node1")
            .var("svc.ns.web.tcp.80", "10.16.0.5:8080")
            .var("empty", "")
            .external_id("vendor", "kube-ovn"),
    );
    nb.commit(b.clone()).await.unwrap();
    assert_eq!(
        template_vars(&srv, "node1"),
        r#"{empty="", svc.ns.web.tcp.80="10.16.0.5:8080"}"#
    );
    assert!(nb.plan(&b).unwrap().is_none(), "idempotent");
    let row = nb.chassis_template_var("node1").unwrap();
    assert_eq!(row.variables["svc.ns.web.tcp.80"], "10.16.0.5:8080");
    assert_eq!(row.external_ids["vendor"], "kube-ovn");
    assert!(nb.chassis_template_var("node2").is_none());

    // Another client adds a variable; a change of ours is one mutation that keeps it, even before our replica
    // has seen it.
    nbctl(
        &srv,
        &["set", "Chassis_Template_Var", "node1", "variables:other=x"],
    );
    let mut b = Batch::new();
    b.add(ChassisTemplateVars::new("node1").var("svc.ns.web.tcp.80", "10.16.0.6:8080"));
    let plan = nb.plan(&b).unwrap().unwrap();
    assert_eq!(plan.txn.ops.len(), 1, "{:?}", plan.txn.ops);
    assert!(
        matches!(plan.txn.ops[0], Operation::Mutate { .. }),
        "{:?}",
        plan.txn.ops
    );
    nb.commit(b).await.unwrap();
    assert_eq!(
        template_vars(&srv, "node1"),
        r#"{empty="", other=x, svc.ns.web.tcp.80="10.16.0.6:8080"}"#
    );

    // Remove by name (a missing one ignored); again a no-op.
    let mut b = Batch::new();
    b.remove_template_vars("node1", ["empty", "missing"]);
    nb.commit(b.clone()).await.unwrap();
    assert_eq!(
        template_vars(&srv, "node1"),
        r#"{other=x, svc.ns.web.tcp.80="10.16.0.6:8080"}"#
    );
    assert!(nb.plan(&b).unwrap().is_none(), "idempotent");

    // A row created and merged into by one batch; removing from a chassis without a row does nothing.
    let mut b = Batch::new();
    b.add(
        ChassisTemplateVars::new("node2")
            .var("a", "1")
            .var("b", "2"),
    )
    .add(
        ChassisTemplateVars::new("node2")
            .var("b", "3")
            .var("c", "4"),
    )
    .remove_template_vars("node2", ["a"])
    .remove_template_vars("node3", ["a"]);
    nb.commit(b).await.unwrap();
    assert_eq!(template_vars(&srv, "node2"), "{b=\"3\", c=\"4\"}");

    // Delete a chassis' row; again a no-op. Deleting and using one chassis in a batch is refused.
    let mut b = Batch::new();
    b.delete_chassis_template_vars("node2");
    nb.commit(b.clone()).await.unwrap();
    nb.commit(b).await.unwrap();
    assert!(nb.chassis_template_var("node2").is_none());
    assert!(
        nbctl(
            &srv,
            &[
                "--bare",
                "--columns=chassis",
                "list",
                "Chassis_Template_Var"
            ]
        ) == "node1"
    );
    let mut b = Batch::new();
    b.delete_chassis_template_vars("node1")
        .add(ChassisTemplateVars::new("node1").var("a", "1"));
    let err = nb.commit(b).await.unwrap_err();
    assert!(
        matches!(err, Error::Nb(NbError::DeletedAndUsed { .. })),
        "{err:?}"
    );
}
