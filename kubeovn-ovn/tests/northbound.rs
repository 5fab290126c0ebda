//! The cache and the northbound API against a real ovsdb-server, checked with ovn-nbctl (needs OVS/OVN
//! binaries; skipped with a message without them).

mod common;

use std::time::Duration;

use common::{OvsdbServer, Storage};
use kubeovn_ovn::cache::{CacheBuilder, EventKind};
use kubeovn_ovn::northbound::{
    AddressSet, Batch, LogicalRouterPolicyAction, LogicalRouterStaticRoutePolicy, LogicalSwitch,
    NbError, Northbound, OvsdbNorthbound, Patch, PortGroup, Router, RouterPolicy, StaticRoute,
    SwitchPort,
};
use kubeovn_ovn::{Client, Error};

fn server() -> Option<OvsdbServer> {
    OvsdbServer::start("ovn-nb.ovsschema", Storage::Standalone, false)
}

const T: Duration = Duration::from_secs(5);

#[tokio::test]
async fn cache_initial_sync_nbctl_writes_and_events() {
    let Some(srv) = server() else { return };
    if !common::have("ovn-nbctl") {
        return;
    }
    // pre-populated
    srv.ctl(
        "ovn-nbctl",
        &["ls-add", "ls0", "--", "lsp-add", "ls0", "p0"],
    );
    let client = Client::connect(&srv.unix_remote()).await.unwrap();
    let cache = CacheBuilder::new("OVN_Northbound")
        .table("Logical_Switch")
        .table_columns("Logical_Switch_Port", ["name", "addresses", "external_ids"])
        .index("Logical_Switch", "name")
        .map_key_index("Logical_Switch_Port", "external_ids", "pod")
        .start(&client)
        .await
        .unwrap();
    let ls = cache.lookup("Logical_Switch", "name", "ls0").unwrap();
    let p0 = cache.lookup("Logical_Switch_Port", "name", "p0").unwrap();
    assert_eq!(ls.uuids("ports").collect::<Vec<_>>(), [p0.uuid()]);

    let mut events = cache.subscribe();
    srv.ctl(
        "ovn-nbctl",
        &[
            "lsp-add",
            "ls0",
            "p1",
            "--",
            "lsp-set-addresses",
            "p1",
            "0a:58:0a:10:00:05 10.16.0.5",
            "--",
            "set",
            "logical_switch_port",
            "p1",
            "external_ids:pod=ns/p1",
        ],
    );
    assert!(
        cache
            .wait_for(T, |v| v
                .lookup("Logical_Switch_Port", "name", "p1")
                .is_some())
            .await
    );
    let p1 = cache
        .lookup_map("Logical_Switch_Port", "external_ids", "pod", "ns/p1")
        .unwrap();
    assert_eq!(p1.get_str("addresses"), "0a:58:0a:10:00:05 10.16.0.5");
    // one transaction: LSP insert + LS modify, both applied before the events are sent
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let e = tokio::time::timeout(T, events.recv())
            .await
            .unwrap()
            .unwrap();
        seen.push((e.table.to_string(), e.kind));
    }
    seen.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        seen,
        [
            ("Logical_Switch".to_owned(), EventKind::Modify),
            ("Logical_Switch_Port".to_owned(), EventKind::Insert)
        ]
    );
    srv.ctl(
        "ovn-nbctl",
        &[
            "set",
            "logical_switch_port",
            "p1",
            "external_ids:pod=ns/p1b",
        ],
    );
    assert!(
        cache
            .wait_for(T, |v| v
                .lookup("Logical_Switch_Port", "name", "p1")
                .map(|r| r.map_get("external_ids", "pod"))
                == Some(Some("ns/p1b")))
            .await
    );
    assert!(cache
        .lookup_map("Logical_Switch_Port", "external_ids", "pod", "ns/p1")
        .is_none());
    let e = loop {
        let e = tokio::time::timeout(T, events.recv())
            .await
            .unwrap()
            .unwrap();
        if e.table.as_ref() == "Logical_Switch_Port" {
            break e;
        }
    };
    assert_eq!(e.kind, EventKind::Modify);
    assert_eq!(e.old.unwrap().map_get("external_ids", "pod"), Some("ns/p1"));
    srv.ctl("ovn-nbctl", &["lsp-del", "p1"]);
    assert!(
        cache
            .wait_for(T, |v| v
                .lookup("Logical_Switch_Port", "name", "p1")
                .is_none())
            .await
    );
    assert_eq!(cache.len("Logical_Switch_Port"), 1);
}

#[tokio::test]
async fn northbound_switches_ports_routers_patch() {
    let Some(srv) = server() else { return };
    if !common::have("ovn-nbctl") {
        return;
    }
    let nb = OvsdbNorthbound::connect(&srv.unix_remote()).await.unwrap();
    let ls = LogicalSwitch::new("ovn-default")
        .subnet("10.16.0.0/16")
        .exclude_ips(["10.16.0.1"])
        .external_id("vendor", "kube-ovn");
    ls.clone().execute(&nb).await.unwrap();
    ls.execute(&nb).await.unwrap(); // idempotent
    assert_eq!(
        srv.ctl(
            "ovn-nbctl",
            &[
                "get",
                "logical_switch",
                "ovn-default",
                "other_config:subnet"
            ]
        )
        .trim(),
        "\"10.16.0.0/16\""
    );
    assert_eq!(
        nb.switch("ovn-default").unwrap().other_config["exclude_ips"],
        "10.16.0.1"
    );

    SwitchPort::new("ovn-default", "pod1.ns")
        .addresses(["0a:58:0a:10:00:05 10.16.0.5"])
        .port_security(["0a:58:0a:10:00:05 10.16.0.5"])
        .external_id("pod", "ns/pod1")
        .may_exist()
        .execute(&nb)
        .await
        .unwrap();
    assert_eq!(
        srv.ctl("ovn-nbctl", &["lsp-get-addresses", "pod1.ns"])
            .trim(),
        "0a:58:0a:10:00:05 10.16.0.5"
    );
    // update in place, idempotent, and refusal without may_exist
    SwitchPort::new("ovn-default", "pod1.ns")
        .addresses(["0a:58:0a:10:00:06 10.16.0.6"])
        .execute(&nb)
        .await
        .unwrap();
    assert_eq!(
        srv.ctl("ovn-nbctl", &["lsp-get-addresses", "pod1.ns"])
            .trim(),
        "0a:58:0a:10:00:06 10.16.0.6"
    );
    assert_eq!(
        nb.switch_port("pod1.ns").unwrap().external_ids["pod"],
        "ns/pod1"
    );
    // Refusals are typed: a caller matches them instead of reading a message.
    let e = SwitchPort::new("ovn-default", "pod1.ns")
        .must_not_exist()
        .execute(&nb)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Nb(NbError::Exists { table: "Logical_Switch_Port", name }) if name == "pod1.ns"),
        "{e:?}"
    );
    assert!(e.is_exists() && !e.is_not_found() && !e.is_connection_error());
    assert_eq!(nb.switch_ports_by_external_id("pod", "ns/pod1").len(), 1);
    let e = SwitchPort::new("nope", "x").execute(&nb).await.unwrap_err();
    assert!(
        matches!(&e, Error::Nb(NbError::NotFound { table: "Logical_Switch", name }) if name == "nope"),
        "{e:?}"
    );
    assert!(e.is_not_found());

    // router and the patch pair in one transaction with a switch created by the same batch
    let mut b = Batch::new();
    b.add(Router::new("ovn-cluster"))
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
    nb.commit(b.clone()).await.unwrap();
    nb.commit(b).await.unwrap(); // nothing to do the second time
    let show = srv.ctl("ovn-nbctl", &["show"]);
    assert!(show.contains("router-port: ovn-cluster-join"), "{show}");
    assert!(
        show.contains("router-port: ovn-cluster-ovn-default"),
        "{show}"
    );
    assert_eq!(
        srv.ctl("ovn-nbctl", &["lrp-get-enabled", "ovn-cluster-join"])
            .trim(),
        "enabled"
    );
    assert_eq!(
        nb.router_port("ovn-cluster-join").unwrap().networks,
        ["100.64.0.1/16"]
    );
    assert_eq!(nb.router("ovn-cluster").unwrap().ports.len(), 2);

    // static routes and policies
    StaticRoute::new("ovn-cluster", "0.0.0.0/0", "100.64.0.1")
        .execute(&nb)
        .await
        .unwrap();
    StaticRoute::new("ovn-cluster", "0.0.0.0/0", "100.64.0.1")
        .execute(&nb)
        .await
        .unwrap();
    StaticRoute::new("ovn-cluster", "10.16.0.0/16", "100.64.0.2")
        .policy(LogicalRouterStaticRoutePolicy::SrcIp)
        .execute(&nb)
        .await
        .unwrap();
    let routes = srv.ctl("ovn-nbctl", &["lr-route-list", "ovn-cluster"]);
    assert!(
        routes.contains("0.0.0.0/0") && routes.contains("10.16.0.0/16"),
        "{routes}"
    );
    assert_eq!(nb.static_routes("ovn-cluster").len(), 2);
    RouterPolicy::new(
        "ovn-cluster",
        31000,
        "ip4.dst == 10.16.0.0/16",
        LogicalRouterPolicyAction::Allow,
    )
    .execute(&nb)
    .await
    .unwrap();
    RouterPolicy::new(
        "ovn-cluster",
        29000,
        "ip4.src == 10.16.0.5",
        LogicalRouterPolicyAction::Reroute,
    )
    .nexthops(["100.64.0.2"])
    .execute(&nb)
    .await
    .unwrap();
    RouterPolicy::new(
        "ovn-cluster",
        29000,
        "ip4.src == 10.16.0.5",
        LogicalRouterPolicyAction::Reroute,
    )
    .nexthops(["100.64.0.3"])
    .execute(&nb)
    .await
    .unwrap();
    let pols = srv.ctl("ovn-nbctl", &["lr-policy-list", "ovn-cluster"]);
    assert!(
        pols.contains("100.64.0.3") && !pols.contains("100.64.0.2"),
        "{pols}"
    );
    assert_eq!(nb.policies("ovn-cluster").len(), 2);
    let mut b = Batch::new();
    b.add(kubeovn_ovn::northbound::Op::DeleteStaticRoute {
        router: "ovn-cluster".into(),
        prefix: "10.16.0.0/16".into(),
        nexthop: None,
    })
    .add(kubeovn_ovn::northbound::Op::DeletePolicy {
        router: "ovn-cluster".into(),
        priority: 31000,
        match_: "ip4.dst == 10.16.0.0/16".into(),
    });
    nb.commit(b).await.unwrap();
    assert_eq!(nb.static_routes("ovn-cluster").len(), 1);
    assert_eq!(nb.policies("ovn-cluster").len(), 1);
    assert_eq!(
        srv.ctl(
            "ovn-nbctl",
            &[
                "--bare",
                "--columns=_uuid",
                "list",
                "logical_router_static_route"
            ]
        )
        .lines()
        .filter(|l| !l.is_empty())
        .count(),
        1
    );

    // port groups and address sets
    let mut b = Batch::new();
    b.add(PortGroup::new("pg_np1").external_id("np", "ns/np1"))
        .add(SwitchPort::new("ovn-default", "pod2.ns").addresses(["0a:58:0a:10:00:07 10.16.0.7"]))
        .port_group_add_ports("pg_np1", ["pod1.ns", "pod2.ns"])
        .add(AddressSet::new("as_np1", ["10.16.0.5", "10.16.0.7"]));
    nb.commit(b).await.unwrap();
    assert_eq!(nb.port_group("pg_np1").unwrap().ports.len(), 2);
    let mut b = Batch::new();
    b.port_group_remove_ports("pg_np1", ["pod1.ns"]);
    nb.commit(b).await.unwrap();
    let pg_ports = srv.ctl(
        "ovn-nbctl",
        &["--bare", "--columns=ports", "list", "port_group", "pg_np1"],
    );
    assert_eq!(pg_ports.split_whitespace().count(), 1);
    AddressSet::new("as_np1", ["10.16.0.9"])
        .execute(&nb)
        .await
        .unwrap();
    assert_eq!(
        srv.ctl(
            "ovn-nbctl",
            &[
                "--bare",
                "--columns=addresses",
                "list",
                "address_set",
                "as_np1"
            ]
        )
        .trim(),
        "10.16.0.9"
    );

    // deletes are idempotent and leave nothing behind
    let mut b = Batch::new();
    b.delete_switch_port("pod1.ns")
        .delete_switch_port("pod1.ns")
        .unpatch("join", "ovn-cluster")
        .add(kubeovn_ovn::northbound::Op::DeletePortGroup(
            "pg_np1".into(),
        ))
        .add(kubeovn_ovn::northbound::Op::DeleteAddressSet(
            "as_np1".into(),
        ));
    nb.commit(b).await.unwrap();
    assert!(nb.switch_port("pod1.ns").is_none());
    assert_eq!(
        srv.ctl("ovn-nbctl", &["lsp-list", "ovn-default"])
            .lines()
            .count(),
        2
    );
    assert!(srv
        .ctl("ovn-nbctl", &["lrp-list", "ovn-cluster"])
        .lines()
        .all(|l| !l.contains("ovn-cluster-join")));
    let mut b = Batch::new();
    b.delete_switch("join").delete_router("ovn-cluster");
    nb.commit(b).await.unwrap();
    assert!(nb.router("ovn-cluster").is_none());
    assert_eq!(srv.ctl("ovn-nbctl", &["ls-list"]).lines().count(), 1);
}

#[tokio::test]
async fn northbound_many_ports_in_one_batch() {
    let Some(srv) = server() else { return };
    if !common::have("ovn-nbctl") {
        return;
    }
    let nb = OvsdbNorthbound::connect(&srv.unix_remote()).await.unwrap();
    LogicalSwitch::new("ls0").execute(&nb).await.unwrap();
    let mut b = Batch::new();
    for i in 0..500 {
        b.add(
            SwitchPort::new("ls0", format!("pod-{i}.bench"))
                .addresses([format!(
                    "0a:58:64:00:00:{:02x} 10.100.{}.{}",
                    i % 256,
                    i / 256,
                    i % 256
                )])
                .external_id("pod", format!("bench/pod-{i}")),
        );
    }
    nb.commit(b).await.unwrap();
    assert_eq!(
        srv.ctl("ovn-nbctl", &["lsp-list", "ls0"]).lines().count(),
        500
    );
    assert_eq!(nb.switch_port_names("ls0").len(), 500);
    let mut b = Batch::new();
    for n in nb.switch_port_names("ls0") {
        b.delete_switch_port(n);
    }
    nb.commit(b).await.unwrap();
    assert_eq!(
        srv.ctl("ovn-nbctl", &["lsp-list", "ls0"]).lines().count(),
        0
    );
}

/// A batch that creates a router and then deletes it is refused whole, rather than leaving the router (each
/// op was planned against the replica before the batch: the delete found no row and dropped out).
#[tokio::test]
async fn northbound_batch_adding_then_deleting_a_router_is_refused() {
    let Some(srv) = server() else { return };
    if !common::have("ovn-nbctl") {
        return;
    }
    let nb = OvsdbNorthbound::connect(&srv.unix_remote()).await.unwrap();
    let mut b = Batch::new();
    b.add(Router::new("lr2")).delete_router("lr2");
    let e = nb.commit(b).await.unwrap_err();
    assert!(
        matches!(&e, Error::Nb(NbError::DeletedAndUsed { table: "Logical_Router", name }) if name == "lr2"),
        "{e:?}"
    );
    assert_eq!(srv.ctl("ovn-nbctl", &["lr-list"]), "");
    // The same changes as two batches, applied in order.
    Router::new("lr2").execute(&nb).await.unwrap();
    let mut b = Batch::new();
    b.delete_router("lr2");
    nb.commit(b).await.unwrap();
    assert_eq!(srv.ctl("ovn-nbctl", &["lr-list"]), "");
}

/// A batch that deletes a switch and then patches it to a new router is refused at once and changes nothing
/// (the patch's switch port went into the deleted switch, was garbage collected, and the commit waited for it
/// until "the cache did not catch up").
#[tokio::test]
async fn northbound_batch_patching_a_switch_it_deletes_is_refused() {
    let Some(srv) = server() else { return };
    if !common::have("ovn-nbctl") {
        return;
    }
    let nb = OvsdbNorthbound::connect(&srv.unix_remote())
        .await
        .unwrap()
        .cache_wait(T);
    LogicalSwitch::new("ls0").execute(&nb).await.unwrap();
    let mut b = Batch::new();
    b.add(Router::new("lr1"))
        .delete_switch("ls0")
        .patch(Patch::new(
            "ls0",
            "lr1",
            "0a:58:0a:10:00:01",
            ["10.16.0.1/16"],
        ));
    let e = nb.commit(b).await.unwrap_err();
    assert!(
        matches!(&e, Error::Nb(NbError::DeletedAndUsed { table: "Logical_Switch", name }) if name == "ls0"),
        "{e:?}"
    );
    assert_eq!(srv.ctl("ovn-nbctl", &["lr-list"]), "");
    assert!(srv.ctl("ovn-nbctl", &["ls-list"]).contains("(ls0)"));
    assert_eq!(srv.ctl("ovn-nbctl", &["lsp-list", "ls0"]), "");
}

#[cfg(feature = "mock")]
#[tokio::test]
async fn users_can_mock_northbound() {
    let mut m = kubeovn_ovn::northbound::MockNorthbound::new();
    m.expect_commit().times(1).returning(|b| {
        assert_eq!(b.len(), 1);
        Ok(())
    });
    SwitchPort::new("ls0", "p").execute(&m).await.unwrap();
}
