//! The Open_vSwitch API against a real ovsdb-server with the Open_vSwitch schema (no ovs-vswitchd), checked
//! with ovs-vsctl (needs the OVS binaries; skipped with a message without them).

#![allow(clippy::unwrap_used)] // test code

mod common;

use std::time::Duration;

use common::{OvsdbServer, Storage};
use kubeovn_ovn::ops::{Operation, Transaction};
use kubeovn_ovn::vswitch::{
    BridgeSpec, GlobalSpec, OpenVSwitch, OvsBatch, OvsError, OvsdbOpenVSwitch, PortSpec, QosSpec,
    QueueSpec,
};
use kubeovn_ovn::{Client, Datum, Error};

fn server() -> Option<OvsdbServer> {
    let srv = OvsdbServer::start("vswitch.ovsschema", Storage::Standalone, false)?;
    if !common::have("ovs-vsctl") {
        return None;
    }
    srv.ctl("ovs-vsctl", &["--no-wait", "init"]);
    Some(srv)
}

fn vsctl(srv: &OvsdbServer, args: &[&str]) -> String {
    let mut a = vec!["--no-wait"];
    a.extend_from_slice(args);
    srv.ctl("ovs-vsctl", &a).trim().to_owned()
}

#[tokio::test]
async fn bridges_ports_and_global_settings() {
    let Some(srv) = server() else { return };
    let ovs = OvsdbOpenVSwitch::connect(&srv.unix_remote()).await.unwrap();
    let mut b = OvsBatch::new();
    b.add(
        GlobalSpec::new()
            .external_id("system-id", "node1")
            .external_id("ovn-remote", "unix:/tmp/sb.sock")
            .external_id("ovn-encap-type", "geneve")
            .external_id("ovn-encap-ip", "127.0.0.1")
            .external_id("ovn-bridge-datapath-type", "netdev"),
    );
    b.add(
        BridgeSpec::new("br-int")
            .datapath_type("netdev")
            .fail_mode(kubeovn_ovn::vswitch::BridgeFailMode::Secure)
            .external_id("vendor", "kube-ovn"),
    );
    for i in 0..10 {
        b.add(
            PortSpec::new("br-int", format!("h{i}"))
                .iface_id(format!("pod{i}.ns"))
                .external_id("pod_name", format!("pod{i}"))
                .mtu_request(1400)
                .ingress_policing(1000, 100),
        );
    }
    b.add(PortSpec::new("br-int", "mirror0").iface_type("internal"));
    ovs.commit(b.clone()).await.unwrap();

    assert_eq!(
        vsctl(&srv, &["get", "open", ".", "external_ids:system-id"]),
        "node1"
    );
    assert_eq!(
        vsctl(&srv, &["get", "open", ".", "external_ids:ovn-encap-ip"]),
        "\"127.0.0.1\""
    );
    assert_eq!(vsctl(&srv, &["list-br"]), "br-int");
    assert_eq!(
        vsctl(&srv, &["get", "bridge", "br-int", "datapath_type"]),
        "netdev"
    );
    assert_eq!(
        vsctl(&srv, &["get", "bridge", "br-int", "fail_mode"]),
        "secure"
    );
    assert_eq!(vsctl(&srv, &["list-ports", "br-int"]).lines().count(), 11);
    assert_eq!(
        vsctl(&srv, &["get", "interface", "h3", "external_ids:iface-id"]),
        "pod3.ns"
    );
    assert_eq!(
        vsctl(&srv, &["get", "interface", "h3", "mtu_request"]),
        "1400"
    );
    assert_eq!(
        vsctl(&srv, &["get", "interface", "h3", "ingress_policing_rate"]),
        "1000"
    );
    assert_eq!(
        vsctl(&srv, &["get", "interface", "h3", "ingress_policing_burst"]),
        "100"
    );
    assert_eq!(
        vsctl(&srv, &["get", "interface", "mirror0", "type"]),
        "internal"
    );
    assert_eq!(
        vsctl(&srv, &["get", "interface", "br-int", "type"]),
        "internal"
    );
    assert_eq!(ovs.external_ids()["system-id"], "node1");
    assert_eq!(ovs.bridge("br-int").unwrap().datapath_type, "netdev");
    assert_eq!(ovs.bridge_ports("br-int").len(), 12);
    assert_eq!(ovs.interfaces_by_iface_id("pod3.ns")[0].name, "h3");

    // Idempotent: nothing to send the second time.
    assert!(ovs.plan(&b).unwrap().is_none());
    ovs.commit(b).await.unwrap();

    // Updates: change the MTU, drop a key, clear policing.
    PortSpec::new("br-int", "h3")
        .mtu_request(1300)
        .remove_external_id("pod_name")
        .ingress_policing(0, 0)
        .execute(&ovs)
        .await
        .unwrap();
    assert_eq!(
        vsctl(&srv, &["get", "interface", "h3", "mtu_request"]),
        "1300"
    );
    assert_eq!(
        vsctl(&srv, &["get", "interface", "h3", "ingress_policing_rate"]),
        "0"
    );
    let h3 = ovs.interface("h3").unwrap();
    assert!(!h3.external_ids.contains_key("pod_name"));
    assert_eq!(h3.mtu_request, Some(1300));
    assert_eq!(h3.external_ids["iface-id"], "pod3.ns");

    // A port another client adds is seen (by iface-id) once the replica has it.
    vsctl(
        &srv,
        &[
            "add-port",
            "br-int",
            "x1",
            "--",
            "set",
            "interface",
            "x1",
            "external_ids:iface-id=x.ns",
        ],
    );
    assert!(
        ovs.cache()
            .wait_for(Duration::from_secs(5), |v| v
                .lookup("Interface", "name", "x1")
                .is_some())
            .await
    );
    assert_eq!(ovs.interfaces_by_iface_id("x.ns").len(), 1);

    // A port on another bridge is refused.
    BridgeSpec::new("br-ex").execute(&ovs).await.unwrap();
    let e = PortSpec::new("br-ex", "h1")
        .execute(&ovs)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("br-int"), "{e}");

    // Deletes, twice (the second is a no-op).
    for _ in 0..2 {
        let mut d = OvsBatch::new();
        d.delete_port("h0").delete_port("x1").delete_bridge("br-ex");
        ovs.commit(d).await.unwrap();
    }
    assert_eq!(vsctl(&srv, &["list-br"]), "br-int");
    assert!(!vsctl(&srv, &["list-ports", "br-int"]).contains("h0"));
    assert!(ovs.port("h0").is_none() && ovs.interface("x1").is_none());
    let mut d = OvsBatch::new();
    d.delete_bridge("br-int");
    ovs.commit(d).await.unwrap();
    assert_eq!(vsctl(&srv, &["list-br"]), "");
    assert_eq!(vsctl(&srv, &["--columns=name", "list", "interface"]), "");
    assert!(ovs.cache().rows("Port").is_empty());
}

#[tokio::test]
async fn qos_and_queues() {
    let Some(srv) = server() else { return };
    let ovs = OvsdbOpenVSwitch::connect(&srv.unix_remote()).await.unwrap();
    let mut b = OvsBatch::new();
    b.add(BridgeSpec::new("br0").datapath_type("netdev"));
    b.add(PortSpec::new("br0", "p1"));
    b.add(
        QosSpec::new("p1", "linux-htb")
            .other_config("max-rate", "10000000")
            .external_id("iface-id", "pod1.ns")
            .queue(0, QueueSpec::max_rate(1_000_000))
            .queue(
                1,
                QueueSpec::max_rate(2_000_000).other_config("priority", "1"),
            ),
    );
    ovs.commit(b).await.unwrap();
    assert_eq!(
        vsctl(
            &srv,
            &[
                "get",
                "qos",
                &vsctl(&srv, &["get", "port", "p1", "qos"]),
                "type"
            ]
        ),
        "linux-htb"
    );
    assert_eq!(
        vsctl(&srv, &["--columns=_uuid", "list", "queue"])
            .lines()
            .filter(|l| !l.is_empty())
            .count(),
        2
    );
    let (q, queues) = ovs.qos("p1").unwrap();
    assert_eq!(q.other_config["max-rate"], "10000000");
    assert_eq!(queues[&1].other_config["max-rate"], "2000000");

    // Idempotent, then replace the queues: 0 changes, 1 goes, 2 comes.
    let spec = QosSpec::new("p1", "linux-htb")
        .other_config("max-rate", "10000000")
        .external_id("iface-id", "pod1.ns")
        .queue(0, QueueSpec::max_rate(1_000_000))
        .queue(
            1,
            QueueSpec::max_rate(2_000_000).other_config("priority", "1"),
        );
    let mut again = OvsBatch::new();
    again.add(spec);
    assert!(ovs.plan(&again).unwrap().is_none());
    QosSpec::new("p1", "linux-htb")
        .other_config("max-rate", "20000000")
        .queue(0, QueueSpec::max_rate(5_000_000))
        .queue(2, QueueSpec::max_rate(3_000_000))
        .execute(&ovs)
        .await
        .unwrap();
    let (q, queues) = ovs.qos("p1").unwrap();
    assert_eq!(q.other_config["max-rate"], "20000000");
    assert!(q.external_ids.is_empty());
    assert_eq!(queues.keys().copied().collect::<Vec<_>>(), [0, 2]);
    assert_eq!(queues[&0].other_config["max-rate"], "5000000");
    assert_eq!(
        vsctl(&srv, &["--columns=_uuid", "list", "queue"])
            .lines()
            .filter(|l| !l.is_empty())
            .count(),
        2
    );

    // Remove the QoS: no QoS or Queue row is left behind.
    let mut d = OvsBatch::new();
    d.delete_qos("p1");
    ovs.commit(d.clone()).await.unwrap();
    ovs.commit(d).await.unwrap();
    assert_eq!(vsctl(&srv, &["get", "port", "p1", "qos"]), "[]");
    assert_eq!(vsctl(&srv, &["list", "qos"]), "");
    assert_eq!(vsctl(&srv, &["list", "queue"]), "");

    // Deleting a port with a QoS deletes the QoS too.
    QosSpec::new("p1", "linux-htb")
        .queue(0, QueueSpec::max_rate(1))
        .execute(&ovs)
        .await
        .unwrap();
    let mut d = OvsBatch::new();
    d.delete_port("p1");
    ovs.commit(d).await.unwrap();
    assert_eq!(vsctl(&srv, &["list", "qos"]), "");
    assert_eq!(vsctl(&srv, &["list", "queue"]), "");
}

#[tokio::test]
async fn waits_for_ofport_and_ovn_installed() {
    let Some(srv) = server() else { return };
    let ovs = OvsdbOpenVSwitch::connect(&srv.unix_remote()).await.unwrap();
    let mut b = OvsBatch::new();
    b.add(BridgeSpec::new("br-int").datapath_type("netdev"));
    b.add(PortSpec::new("br-int", "h1").iface_id("pod1.ns"));
    b.add(PortSpec::new("br-int", "h2").iface_id("pod2.ns"));
    ovs.commit(b).await.unwrap();
    // No ovs-vswitchd: the wait times out.
    let e = ovs
        .wait_ofport("h1", Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Ovs(OvsError::Timeout(d, _)) if *d == Duration::from_millis(200)),
        "{e:?}"
    );
    assert!(e.is_timeout() && !e.is_connection_error());
    // Play ovs-vswitchd and ovn-controller from another connection.
    let other = Client::connect(&srv.unix_remote()).await.unwrap();
    let mut waiter = Box::pin(async {
        let port = ovs.wait_ofport("h1", Duration::from_secs(5)).await?;
        ovs.wait_ovn_installed("h1", Duration::from_secs(5)).await?;
        Ok::<i64, Error>(port)
    });
    // Polled once: it looked at the replica (no ofport yet) and waits for a change, before there is one.
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(std::future::Future::poll(waiter.as_mut(), &mut cx).is_pending());
    let txn = Transaction::new("Open_vSwitch")
        .op(Operation::update("Interface")
            .where_eq("name", "h1")
            .value("ofport", Datum::set([7i64])))
        .op(Operation::update("Interface")
            .where_eq("name", "h2")
            .value("ofport", Datum::set([-1i64]))
            .value(
                "error",
                Datum::set(["could not open network device h2 (No such device)"]),
            ));
    other.transact(&txn).await.unwrap();
    vsctl(
        &srv,
        &["set", "interface", "h1", "external_ids:ovn-installed=true"],
    );
    assert_eq!(waiter.await.unwrap(), 7);
    let e = ovs
        .wait_ofport("h2", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("No such device"), "{e}");
}

#[tokio::test]
async fn with_ovs_vswitchd_dummy_datapath() {
    let Some(srv) = server() else { return };
    let Some(_vswitchd) = srv.start_vswitchd() else {
        return;
    };
    let ovs = OvsdbOpenVSwitch::connect(&srv.unix_remote())
        .await
        .unwrap()
        .wait_vswitchd(true);
    let mut b = OvsBatch::new();
    b.add(
        BridgeSpec::new("br-test")
            .datapath_type("dummy")
            .fail_mode(kubeovn_ovn::vswitch::BridgeFailMode::Secure),
    );
    ovs.commit(b).await.unwrap();
    // Ports one transaction each, as a CNI ADD would do, waiting for ovs-vswitchd to give each an ofport.
    let n = 20;
    let t0 = std::time::Instant::now();
    let mut ofports = Vec::new();
    for i in 0..n {
        PortSpec::new("br-test", format!("veth{i}"))
            .iface_type("dummy")
            .iface_id(format!("pod{i}.ns"))
            .execute(&ovs)
            .await
            .unwrap();
        ofports.push(
            ovs.wait_ofport(&format!("veth{i}"), Duration::from_secs(10))
                .await
                .unwrap(),
        );
    }
    let per_port = t0.elapsed() / n;
    ofports.sort_unstable();
    ofports.dedup();
    assert_eq!(ofports.len(), n as usize);
    assert!(ofports.iter().all(|p| *p > 0));
    // An interface of a type ovs-vswitchd cannot create fails with ofport -1 and an error.
    PortSpec::new("br-test", "bad0")
        .iface_type("no-such-type")
        .execute(&ovs)
        .await
        .unwrap();
    let e = ovs
        .wait_ofport("bad0", Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("bad0"), "{e}");
    eprintln!("ovs-vswitchd (dummy datapath): add port + wait for cur_cfg + ofport: {per_port:?} per port");
    let mut d = OvsBatch::new();
    d.delete_bridge("br-test");
    ovs.commit(d).await.unwrap();
}
