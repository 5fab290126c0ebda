//! Tests against a real ovsdb-server (started privately in a temporary directory by `common`).
//! They skip, saying why, when the OVS/OVN binaries are not installed.

#![allow(clippy::unwrap_used)] // test code

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::{have, OvsdbServer, Storage};
use kubeovn_ovn::monitor::{MonitorRequest, MonitorRequests, RowUpdate};
use kubeovn_ovn::ops::{Condition, Operation, Transaction};
use kubeovn_ovn::{Client, DatabaseSchema, Datum, Error, Uuid};

const NB: &str = "OVN_Northbound";

fn nb_server(storage: Storage, tcp: bool) -> Option<OvsdbServer> {
    if !have("ovn-nbctl") {
        return None;
    }
    OvsdbServer::start("ovn-nb.ovsschema", storage, tcp)
}

fn file_schema(file: &str) -> DatabaseSchema {
    DatabaseSchema::parse_str(&std::fs::read_to_string(common::schema_path(file)).unwrap()).unwrap()
}

fn lsp_insert(name: &str, named: &str) -> Operation {
    Operation::insert("Logical_Switch_Port")
        .uuid_name(named)
        .value("name", name)
        .value("addresses", Datum::set(["0a:58:0a:10:00:05 10.16.0.5"]))
        .value(
            "external_ids",
            Datum::map([("vendor", "kube-ovn"), ("ls", "ls0")]),
        )
        .build()
}

#[tokio::test]
async fn list_dbs_and_get_schema_over_unix_and_tcp() {
    let Some(srv) = nb_server(Storage::Standalone, true) else {
        return;
    };
    for remote in [srv.unix_remote(), srv.tcp_remote().unwrap()] {
        let c = Client::connect(&remote).await.unwrap();
        let dbs = c.list_dbs().await.unwrap();
        assert!(dbs.contains(&NB.to_string()), "{dbs:?}");
        assert!(dbs.contains(&"_Server".to_string()), "{dbs:?}");
        let schema = c.get_schema(NB).await.unwrap();
        assert_eq!(*schema, file_schema("ovn-nb.ovsschema"));
        c.echo().await.unwrap();
        // An unknown database is the server's typed error.
        let e = c.get_schema("Nope").await.unwrap_err();
        assert_eq!(
            e.ovsdb_error().map(|e| e.error.as_str()),
            Some("unknown database"),
            "{e}"
        );
    }
}

#[tokio::test]
async fn transact_creates_switch_and_ports_seen_by_ovn_nbctl() {
    let Some(srv) = nb_server(Storage::Standalone, false) else {
        return;
    };
    let c = Client::connect(&srv.unix_remote()).await.unwrap();
    c.get_schema(NB).await.unwrap();
    let txn = Transaction::new(NB)
        .op(Operation::insert("Logical_Switch")
            .uuid_name("ls")
            .value("name", "ls0"))
        .op(lsp_insert("pod1.ns", "p1"))
        .op(lsp_insert("pod2.ns", "p2"))
        .op(Operation::mutate("Logical_Switch")
            .filter(Condition::new(
                "_uuid",
                kubeovn_ovn::ops::Function::Eq,
                Datum::named_uuid("ls"),
            ))
            .insert(
                "ports",
                Datum::set(
                    [Datum::named_uuid("p1"), Datum::named_uuid("p2")]
                        .map(|d| d.as_atom().unwrap().clone()),
                ),
            ));
    let res = c.transact(&txn).await.unwrap();
    let ls_uuid = res[0].uuid().unwrap();
    assert_eq!(res[3].count(), Some(1));

    let show = srv.ctl("ovn-nbctl", &["show"]);
    assert!(show.contains(&format!("switch {ls_uuid} (ls0)")), "{show}");
    assert!(
        show.contains("port pod1.ns") && show.contains("port pod2.ns"),
        "{show}"
    );
    let list = srv.ctl("ovn-nbctl", &["lsp-list", "ls0"]);
    assert!(
        list.contains(&format!("{} (pod1.ns)", res[1].uuid().unwrap())),
        "{list}"
    );
    assert!(list.contains("(pod2.ns)"), "{list}");

    // Select reads them back, with typed columns.
    let sel = Transaction::new(NB).op(Operation::select("Logical_Switch")
        .where_eq("name", "ls0")
        .columns(["ports"]));
    let r = c.transact(&sel).await.unwrap();
    let rows = r[0].rows().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["ports"].len(), 2);

    // Delete one port the way Kube-OVN does: drop the reference (the unreferenced row is collected).
    let p1 = res[1].uuid().unwrap();
    let del = Transaction::new(NB).op(Operation::mutate("Logical_Switch")
        .uuid(ls_uuid)
        .delete("ports", Datum::uuid(p1)));
    c.transact(&del).await.unwrap();
    let list = srv.ctl("ovn-nbctl", &["lsp-list", "ls0"]);
    assert!(
        !list.contains("pod1.ns") && list.contains("pod2.ns"),
        "{list}"
    );
}

#[tokio::test]
async fn failing_transactions_carry_the_servers_error() {
    let Some(srv) = nb_server(Storage::Standalone, false) else {
        return;
    };
    // No schema fetched: nothing is validated locally, the server decides.
    let c = Client::connect(&srv.unix_remote()).await.unwrap();
    let mk = |name: &str| {
        Transaction::new(NB)
            .op(Operation::insert("Logical_Switch")
                .uuid_name("ls")
                .value("name", format!("ls-{name}")))
            .op(lsp_insert(name, "p"))
            .op(Operation::mutate("Logical_Switch")
                .filter(Condition::new(
                    "_uuid",
                    kubeovn_ovn::ops::Function::Eq,
                    Datum::named_uuid("ls"),
                ))
                .insert("ports", Datum::named_uuid("p")))
    };
    c.transact(&mk("dup")).await.unwrap();
    // Duplicate index value: a commit-time constraint violation (the trailing error entry).
    let e = c.transact(&mk("dup")).await.unwrap_err();
    let Error::Transact(t) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(t.index, None, "{e}");
    assert_eq!(t.error.error, "constraint violation");
    assert!(
        t.error.details.as_deref().unwrap_or("").contains("dup"),
        "{e}"
    );

    // A value outside the column's range: the operation's own error.
    let bad = Transaction::new(NB).op(Operation::insert("Logical_Switch_Port")
        .value("name", "x")
        .value("tag_request", 5000i64));
    let e = c.transact(&bad).await.unwrap_err();
    let Error::Transact(t) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(t.index, Some(0));
    assert_eq!(t.op, Some("insert"));
    assert_eq!(t.error.error, "constraint violation", "{e}");
    assert!(t.error.details.is_some());

    // With the schema known, the same mistake is caught locally without a round trip.
    c.get_schema(NB).await.unwrap();
    let e = c.transact(&bad).await.unwrap_err();
    assert!(matches!(e, Error::Validation(_)), "{e:?}");
    let e = c
        .transact(&Transaction::new(NB).op(Operation::insert("Logical_Switch").value("nmae", "x")))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Validation(kubeovn_ovn::ops::ValidationError::UnknownColumn { .. })
        ),
        "{e:?}"
    );
    // abort fails with "aborted".
    let e = c
        .transact(&Transaction::new(NB).op(Operation::abort()))
        .await
        .unwrap_err();
    assert_eq!(e.ovsdb_error().unwrap().error, "aborted");
}

fn lsp_names(t: &kubeovn_ovn::monitor::TableUpdates) -> BTreeSet<String> {
    t.get("Logical_Switch_Port")
        .into_iter()
        .flat_map(|rows| rows.values())
        .filter_map(|u| match u {
            RowUpdate::Initial(r) | RowUpdate::Insert(r) => {
                r.get("name").and_then(|d| d.as_str()).map(str::to_owned)
            }
            RowUpdate::Update { new: Some(r), .. } => {
                r.get("name").and_then(|d| d.as_str()).map(str::to_owned)
            }
            _ => None,
        })
        .collect()
}

async fn next_with_lsp(
    s: &mut kubeovn_ovn::client::MonitorStream,
    name: &str,
) -> kubeovn_ovn::client::Update {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let u = s
            .next_timeout(left)
            .await
            .expect("update before the deadline")
            .unwrap();
        if lsp_names(&u.tables).contains(name) {
            return u;
        }
    }
}

fn requests() -> MonitorRequests {
    MonitorRequests::new()
        .table(
            "Logical_Switch",
            MonitorRequest::all().columns(["name", "ports"]),
        )
        .table(
            "Logical_Switch_Port",
            MonitorRequest::all().columns(["name", "addresses", "external_ids"]),
        )
}

#[tokio::test]
async fn monitors_see_what_ovn_nbctl_writes() {
    let Some(srv) = nb_server(Storage::Standalone, false) else {
        return;
    };
    srv.ctl(
        "ovn-nbctl",
        &["ls-add", "ls0", "--", "lsp-add", "ls0", "before"],
    );
    let c = Client::connect(&srv.unix_remote()).await.unwrap();

    // monitor (update), monitor_cond (update2) on one connection.
    let (init1, mut s1) = c.monitor(NB, &requests()).await.unwrap();
    let (init2, mut s2) = c.monitor_cond(NB, &requests()).await.unwrap();
    assert_eq!(lsp_names(&init1), BTreeSet::from(["before".to_string()]));
    assert_eq!(lsp_names(&init2), BTreeSet::from(["before".to_string()]));
    assert!(init2["Logical_Switch_Port"]
        .values()
        .all(|u| matches!(u, RowUpdate::Initial(_))));

    srv.ctl(
        "ovn-nbctl",
        &[
            "lsp-add",
            "ls0",
            "after",
            "--",
            "lsp-set-addresses",
            "after",
            "0a:58:0a:10:00:07 10.16.0.7",
        ],
    );
    let u1 = next_with_lsp(&mut s1, "after").await;
    assert!(u1.tables["Logical_Switch_Port"].values().any(|u| matches!(
        u,
        RowUpdate::Update {
            old: None,
            new: Some(_)
        }
    )));
    let u2 = next_with_lsp(&mut s2, "after").await;
    let (_, RowUpdate::Insert(row)) = u2.tables["Logical_Switch_Port"].iter().next().unwrap()
    else {
        panic!("{u2:?}")
    };
    assert_eq!(
        row["addresses"],
        Datum::set(["0a:58:0a:10:00:07 10.16.0.7"])
    );
    // The switch row is a modify whose ports column holds the added element.
    let ls = u2.tables["Logical_Switch"].values().next().unwrap();
    let RowUpdate::Modify(m) = ls else {
        panic!("{ls:?}")
    };
    assert_eq!(m["ports"].len(), 1);

    // monitor_cond_change narrows the condition: a port not matching is not reported.
    let narrowed = BTreeMap::from([(
        "Logical_Switch_Port".to_string(),
        vec![Condition::eq("name", "wanted")],
    )]);
    c.monitor_cond_change(&s2, &narrowed).await.unwrap();
    srv.ctl(
        "ovn-nbctl",
        &[
            "lsp-add", "ls0", "unwanted", "--", "lsp-add", "ls0", "wanted",
        ],
    );
    let u = next_with_lsp(&mut s2, "wanted").await;
    assert!(!lsp_names(&u.tables).contains("unwanted"));

    c.monitor_cancel(s1).await.unwrap();
    // Cancelling an unknown monitor is the server's error.
    let e = c.call("monitor_cancel", &["nope"]).await.unwrap_err();
    assert!(e.ovsdb_error().is_some(), "{e:?}");
}

#[tokio::test]
async fn monitor_cond_since_update3_and_resume() {
    let Some(srv) = nb_server(Storage::Clustered, false) else {
        return;
    };
    let c = Client::connect(&srv.unix_remote()).await.unwrap();
    // ovsdb-server keeps at most 100 transactions of history, and drops the oldest while the history holds
    // more atoms than the database: give the database some bulk so that the small transactions below stay.
    let padding = Datum::set((0..2000).map(|i| format!("10.0.{}.{}", i / 250, i % 250)));
    c.transact(
        &Transaction::new(NB).op(Operation::insert("Address_Set")
            .value("name", "padding")
            .value("addresses", padding)),
    )
    .await
    .unwrap();
    srv.ctl("ovn-nbctl", &["ls-add", "ls0"]);
    let (r, mut s) = c.monitor_cond_since(NB, &requests(), None).await.unwrap();
    assert!(!r.found);
    assert_eq!(r.updates["Logical_Switch"].len(), 1);
    let first = r.last_txn_id.expect("clustered database gives a txn id");

    srv.ctl("ovn-nbctl", &["lsp-add", "ls0", "p1"]);
    let u = next_with_lsp(&mut s, "p1").await;
    let last = u.last_txn_id.expect("update3 carries the txn id");
    assert_ne!(last, first);
    assert_eq!(s.last_txn_id(), Some(last));
    drop(s);

    // Changes while we are away, then resume on a new connection from `last`.
    srv.ctl("ovn-nbctl", &["lsp-add", "ls0", "p2"]);
    let c2 = Client::connect(&srv.unix_remote()).await.unwrap();
    let (r, _s) = c2
        .monitor_cond_since(NB, &requests(), Some(last))
        .await
        .unwrap();
    assert!(r.found, "the server still has transaction {last}");
    assert_eq!(
        lsp_names(&r.updates),
        BTreeSet::from(["p2".to_string()]),
        "only the missed change"
    );

    // Unknown transaction id: everything, found = false.
    let (r, _s) = c2
        .monitor_cond_since(NB, &requests(), Some(Uuid::from_u128(12345)))
        .await
        .unwrap();
    assert!(!r.found);
    assert_eq!(lsp_names(&r.updates).len(), 2);
}

#[tokio::test]
async fn a_thousand_pipelined_transactions_on_one_connection() {
    let Some(srv) = nb_server(Storage::Standalone, false) else {
        return;
    };
    srv.ctl("ovn-nbctl", &["ls-add", "ls0"]);
    let c = Client::connect(&srv.unix_remote()).await.unwrap();
    c.get_schema(NB).await.unwrap();
    let n = 1000;
    let txns: Vec<Transaction> = (0..n)
        .map(|i| {
            Transaction::new(NB)
                .op(lsp_insert(&format!("pod-{i}.bench"), "p"))
                .op(Operation::mutate("Logical_Switch")
                    .where_eq("name", "ls0")
                    .insert("ports", Datum::named_uuid("p")))
        })
        .collect();
    let t0 = Instant::now();
    // Every request is on the wire before the first reply is awaited.
    let futs: Vec<_> = txns.iter().map(|t| c.transact(t)).collect();
    let mut uuids = BTreeSet::new();
    for f in futs {
        let r = f.await.unwrap();
        assert_eq!(r[1].count(), Some(1));
        uuids.insert(r[0].uuid().unwrap());
    }
    let dt = t0.elapsed();
    assert_eq!(uuids.len(), n);
    eprintln!(
        "{n} pipelined transactions: {dt:?} ({:.0}/s)",
        n as f64 / dt.as_secs_f64()
    );
    let count = srv.ctl(
        "ovn-nbctl",
        &["--bare", "--columns=_uuid", "list", "Logical_Switch_Port"],
    );
    assert_eq!(count.split_whitespace().count(), n);
}

#[tokio::test]
async fn locks_steal_and_notifications() {
    let Some(srv) = nb_server(Storage::Standalone, false) else {
        return;
    };
    let a = Client::connect(&srv.unix_remote()).await.unwrap();
    let b = Client::connect(&srv.unix_remote()).await.unwrap();
    let mut a_events = a.lock_events();
    let mut b_events = b.lock_events();
    assert!(a.lock("leader").await.unwrap());
    assert!(!b.lock("leader").await.unwrap());
    // A client waiting for a lock must give up waiting before it steals.
    b.unlock("leader").await.unwrap();
    // assert op succeeds only for the holder.
    let assert_txn = Transaction::new(NB).op(Operation::assert_lock("leader"));
    a.transact(&assert_txn).await.unwrap();
    assert_eq!(
        b.transact(&assert_txn)
            .await
            .unwrap_err()
            .ovsdb_error()
            .unwrap()
            .error,
        "not owner"
    );
    assert!(b.steal("leader").await.unwrap());
    let mut seen = Vec::new();
    while seen.last() != Some(&kubeovn_ovn::client::LockEvent::Stolen("leader".into())) {
        seen.push(
            tokio::time::timeout(Duration::from_secs(5), a_events.recv())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    eprintln!("lock events seen by the first holder: {seen:?}");
    assert_eq!(
        a.transact(&assert_txn)
            .await
            .unwrap_err()
            .ovsdb_error()
            .unwrap()
            .error,
        "not owner"
    );
    // ovsdb-server also notifies `locked` when the lock is granted at once.
    assert_eq!(
        seen[0],
        kubeovn_ovn::client::LockEvent::Locked("leader".into())
    );
    b.unlock("leader").await.unwrap();
    // A stolen lock is still "requested" by its old owner: it unlocks before asking again.
    a.unlock("leader").await.unwrap();
    assert!(a.lock("leader").await.unwrap());
    a.transact(&assert_txn).await.unwrap();
    let b_seen: Vec<_> = std::iter::from_fn(|| b_events.try_recv().ok()).collect();
    // The thief is told by the reply to steal, not by a notification; nobody stole from it.
    assert!(
        b_seen
            .iter()
            .all(|e| !matches!(e, kubeovn_ovn::client::LockEvent::Stolen(_))),
        "{b_seen:?}"
    );
}

/// What the probe proxy saw: the client's requests by method, and the server's replies to its echoes.
#[derive(Debug, Default, Clone, PartialEq)]
struct ProbeTraffic {
    echoes: Vec<serde_json::Value>,
    answered: usize,
    other_requests: usize,
}

/// Copies `from` to `to` frame by frame, reporting each decoded message to `seen`.
async fn relay<R, W>(mut from: R, mut to: W, mut seen: impl FnMut(kubeovn_ovn::framing::Message))
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut dec = kubeovn_ovn::framing::FrameDecoder::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        dec.feed(&buf[..n]);
        while let Ok(Some(m)) = dec.next_message() {
            seen(m);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// The client's inactivity probe against ovsdb-server, watched by a proxy between them: with no traffic of
/// ours, the client sends an echo after each quiet interval and the server answers it. The client gives up
/// two intervals after its last message from the server, so a third probe sent and answered means it kept the
/// connection over the server's answers; a request then still works.
#[tokio::test]
async fn inactivity_probe_keeps_a_live_connection() {
    use kubeovn_ovn::framing::Message;
    let Some(srv) = nb_server(Storage::Standalone, false) else {
        return;
    };
    let remote = srv.unix_remote();
    let server = tokio::net::UnixStream::connect(remote.trim_start_matches("unix:"))
        .await
        .unwrap();
    let (ours, proxy) = tokio::io::duplex(64 * 1024);
    let (traffic, mut seen) = tokio::sync::watch::channel(ProbeTraffic::default());
    let traffic = std::sync::Arc::new(traffic);
    let (srv_rd, srv_wr) = server.into_split();
    let (px_rd, px_wr) = tokio::io::split(proxy);
    let t = traffic.clone();
    tokio::spawn(relay(px_rd, srv_wr, move |m| {
        t.send_modify(|s| match m {
            Message::Request { id, method, .. } if method == "echo" => s.echoes.push(id),
            Message::Request { .. } => s.other_requests += 1,
            _ => {}
        })
    }));
    let t = traffic.clone();
    tokio::spawn(relay(srv_rd, px_wr, move |m| {
        if let Message::Response { id, result: Ok(_) } = m {
            t.send_modify(|s| {
                if s.echoes.contains(&id) {
                    s.answered += 1;
                }
            })
        }
    }));
    let c = Client::builder()
        .inactivity_probe(Some(Duration::from_millis(50)))
        .with_stream(ours, remote);
    let got = tokio::time::timeout(Duration::from_secs(10), seen.wait_for(|s| s.answered >= 3))
        .await
        .expect("three probes answered within 10 s")
        .unwrap()
        .clone();
    assert_eq!(got.other_requests, 0, "{got:?}");
    assert!(!c.is_closed());
    assert_eq!(c.list_dbs().await.unwrap().len(), 2);
}

#[tokio::test]
async fn open_vswitch_database() {
    if !have("ovs-vsctl") {
        return;
    }
    let Some(srv) = OvsdbServer::start("vswitch.ovsschema", Storage::Standalone, false) else {
        return;
    };
    srv.ctl("ovs-vsctl", &["--no-wait", "init"]);
    srv.ctl(
        "ovs-vsctl",
        &[
            "--no-wait",
            "add-br",
            "br-test",
            "--",
            "set",
            "bridge",
            "br-test",
            "datapath_type=netdev",
        ],
    );
    let c = Client::connect(&srv.unix_remote()).await.unwrap();
    assert_eq!(
        *c.get_schema("Open_vSwitch").await.unwrap(),
        file_schema("vswitch.ovsschema")
    );
    let reqs = MonitorRequests::new().table(
        "Bridge",
        MonitorRequest::all().columns(["name", "datapath_type"]),
    );
    let (init, _s) = c.monitor_cond("Open_vSwitch", &reqs).await.unwrap();
    let RowUpdate::Initial(br) = init["Bridge"].values().next().unwrap() else {
        panic!()
    };
    assert_eq!(br["name"], Datum::from("br-test"));
    assert_eq!(br["datapath_type"], Datum::from("netdev"));
    // Write external_ids on the bridge and read it with ovs-vsctl.
    let txn = Transaction::new("Open_vSwitch").op(Operation::mutate("Bridge")
        .where_eq("name", "br-test")
        .insert("external_ids", Datum::map([("owner", "kubeovn-rs")])));
    c.transact(&txn).await.unwrap();
    let v = srv.ctl(
        "ovs-vsctl",
        &["get", "bridge", "br-test", "external_ids:owner"],
    );
    assert_eq!(v.trim(), "kubeovn-rs");
}

#[tokio::test]
async fn typed_models_round_trip_through_the_server() {
    use kubeovn_ovn::models::nb::{LogicalSwitch, LogicalSwitchPort};
    use kubeovn_ovn::Model;
    let Some(srv) = nb_server(Storage::Standalone, false) else {
        return;
    };
    let c = Client::connect(&srv.unix_remote()).await.unwrap();
    c.get_schema(NB).await.unwrap();
    let mut lsp = LogicalSwitchPort {
        name: "typed.ns".into(),
        addresses: vec!["0a:58:0a:10:00:09 10.16.0.9".into()],
        tag_request: Some(7),
        enabled: Some(true),
        ..Default::default()
    };
    lsp.external_ids.insert("vendor".into(), "kube-ovn".into());
    let ls = LogicalSwitch {
        name: "typed".into(),
        ..Default::default()
    };
    let txn = Transaction::new(NB)
        .op(Operation::insert(LogicalSwitch::TABLE)
            .uuid_name("ls")
            .row(ls.to_row()))
        .op(Operation::insert(LogicalSwitchPort::TABLE)
            .uuid_name("p")
            .row(lsp.to_row()))
        .op(Operation::mutate(LogicalSwitch::TABLE)
            .where_eq(LogicalSwitch::NAME, "typed")
            .insert(LogicalSwitch::PORTS, Datum::named_uuid("p")));
    let r = c.transact(&txn).await.unwrap();
    lsp.uuid = r[1].uuid().unwrap();

    let sel = Transaction::new(NB)
        .op(Operation::select(LogicalSwitchPort::TABLE).where_eq("name", "typed.ns"));
    let r = c.transact(&sel).await.unwrap();
    assert_eq!(
        LogicalSwitchPort::from_select_row(&r[0].rows().unwrap()[0]).unwrap(),
        lsp
    );

    let reqs = MonitorRequests::new().table(LogicalSwitchPort::TABLE, MonitorRequest::all());
    let (init, _s) = c.monitor_cond(NB, &reqs).await.unwrap();
    let RowUpdate::Initial(row) = &init[LogicalSwitchPort::TABLE][&lsp.uuid] else {
        panic!()
    };
    assert_eq!(LogicalSwitchPort::from_row(lsp.uuid, row).unwrap(), lsp);
    let addrs = srv.ctl("ovn-nbctl", &["lsp-get-addresses", "typed.ns"]);
    assert_eq!(addrs.trim(), "0a:58:0a:10:00:09 10.16.0.9");
}
