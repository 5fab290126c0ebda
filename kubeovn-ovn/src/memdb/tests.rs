//! Unit tests of the in-memory server: transaction semantics, monitors, locks, faults and speed (its
//! agreement with a real ovsdb-server is tested in `tests/memdb.rs`).

use std::time::{Duration, Instant};

use serde_json::json;

use super::*;
use crate::client::LockEvent;
use crate::monitor::{MonitorRequest, MonitorRequests, RowUpdate};
use crate::northbound::{Batch, LogicalSwitch, Northbound, Patch, Router, StaticRoute, SwitchPort};
use crate::ops::{Condition, Operation, Transaction};
use crate::session::{Backoff, Session};
use crate::vswitch::{BridgeSpec, OpenVSwitch, OvsBatch, PortSpec};

const NBDB: &str = "OVN_Northbound";

/// Creating a database and connecting a northbound (replica loaded) is cheap enough for one per test case.
#[tokio::test]
async fn memdb_is_fast() {
    // The first one parses the shipped schema.
    MemDb::new_nb().northbound().await.unwrap();
    let n = 50;
    let t0 = Instant::now();
    for _ in 0..n {
        let db = MemDb::new_nb();
        let nb = db.northbound().await.unwrap();
        assert!(nb.cache().is_online());
    }
    let each = t0.elapsed() / n;
    println!("memdb: new_nb() + northbound() takes {each:?}");
    // About 1 ms on an idle machine; the bound leaves room for a loaded one (tests run in parallel).
    assert!(each < Duration::from_millis(50), "{each:?}");
}

#[tokio::test]
async fn garbage_collection_cascades_and_weak_refs_go() {
    let db = MemDb::new_nb();
    let nb = db.northbound().await.unwrap();
    let mut b = Batch::new();
    b.add(LogicalSwitch::new("ls0"))
        .add(SwitchPort::new("ls0", "p0"))
        .add(SwitchPort::new("ls0", "p1"))
        .add(Router::new("lr0"))
        .patch(Patch::new(
            "ls0",
            "lr0",
            "0a:58:0a:10:00:01",
            ["10.16.0.1/16"],
        ))
        .add(StaticRoute::new("lr0", "0.0.0.0/0", "10.16.0.254"));
    nb.commit(b).await.unwrap();
    assert_eq!(db.rows("Logical_Switch_Port").len(), 3);
    assert_eq!(db.rows("Logical_Router_Static_Route").len(), 1);
    // Deleting the roots takes their children: nothing refers to them any more.
    let r = db.transact(&json!([NBDB,
        {"op": "delete", "table": "Logical_Switch", "where": []},
        {"op": "delete", "table": "Logical_Router", "where": []}]));
    assert_eq!(r, json!([{"count": 1}, {"count": 1}]));
    for t in [
        "Logical_Switch_Port",
        "Logical_Router_Port",
        "Logical_Router_Static_Route",
    ] {
        assert!(db.rows(t).is_empty(), "{t}");
    }
    // The replica follows.
    assert!(
        nb.cache()
            .wait_for(Duration::from_secs(5), |v| v
                .is_empty("Logical_Switch_Port"))
            .await
    );
    // A weak reference to a deleted row is removed, the referring row kept.
    let r = db.transact(&json!([NBDB,
        {"op": "insert", "table": "Load_Balancer", "uuid-name": "lb", "row": {"name": "lb0"}},
        {"op": "insert", "table": "Logical_Switch", "row": {"name": "ls1", "load_balancer": ["named-uuid", "lb"]}}]));
    assert!(r[1].get("uuid").is_some(), "{r}");
    db.transact(&json!([NBDB, {"op": "delete", "table": "Load_Balancer", "where": []}]));
    let ls = db.rows("Logical_Switch");
    assert_eq!(ls.len(), 1);
    assert_eq!(ls[0].1["load_balancer"], Datum::Set(Vec::new()));
}

#[tokio::test]
async fn refused_transactions_change_nothing() {
    let db = MemDb::new_nb();
    let r = db.transact(&json!([NBDB,
        {"op": "insert", "table": "Logical_Switch", "row": {"name": "a"}},
        {"op": "insert", "table": "NB_Global", "row": {}},
        {"op": "insert", "table": "NB_Global", "row": {}}]));
    assert_eq!(r[3]["error"], "constraint violation", "{r}");
    assert!(db.rows("Logical_Switch").is_empty());
    // A failing operation: the rest is not run, its result is null.
    let r = db.transact(&json!([NBDB,
        {"op": "insert", "table": "Logical_Switch", "row": {"name": "a"}},
        {"op": "abort"},
        {"op": "insert", "table": "Logical_Switch", "row": {"name": "b"}}]));
    assert_eq!(r[1]["error"], "aborted");
    assert_eq!(r[2], Json::Null);
    assert!(db.rows("Logical_Switch").is_empty());
    // Named uuids may be used before the insert that declares them.
    let r = db.transact(&json!([NBDB,
        {"op": "insert", "table": "Logical_Switch", "row": {"name": "a", "ports": ["named-uuid", "p"]}},
        {"op": "insert", "table": "Logical_Switch_Port", "uuid-name": "p", "row": {"name": "p"}}]));
    assert_eq!(r.as_array().unwrap().len(), 2, "{r}");
    assert_eq!(
        db.rows("Logical_Switch")[0].1["ports"],
        Datum::Set(vec![Atom::Uuid(db.rows("Logical_Switch_Port")[0].0)])
    );
    let r = db.transact(&json!([NBDB,
        {"op": "insert", "table": "Logical_Switch_Port", "uuid-name": "p", "row": {"name": "q"}},
        {"op": "insert", "table": "Logical_Switch_Port", "uuid-name": "p", "row": {"name": "r"}}]));
    assert_eq!(r[1]["error"], "duplicate uuid-name", "{r}");
    // Unknown database.
    let r = db.transact(&json!(["Nope", {"op": "comment", "comment": "x"}]));
    assert_eq!(r["error"], "unknown database", "{r}");
}

use crate::datum::Atom;
use serde_json::Value as Json;

/// Whether `f` is still pending when polled once (its waker is dropped: poll it again only with `.await`).
fn pending<F: std::future::Future + Unpin>(f: &mut F) -> bool {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    std::future::Future::poll(std::pin::Pin::new(f), &mut cx).is_pending()
}

/// On a paused clock: the server handles requests of a connection in order, so the reply to a later `echo`
/// on the same connection says both waits were read and blocked (not merely not yet read); the one with a
/// timeout answers at exactly 50 ms of tokio time, the other when another client makes it true.
#[tokio::test(start_paused = true)]
async fn wait_blocks_until_satisfied_or_timed_out() {
    let db = MemDb::new_nb();
    let (a, b) = (db.connect(), db.connect());
    let t0 = tokio::time::Instant::now();
    let mut waiting = Box::pin(a.call(
        "transact",
        &json!([NBDB, {"op": "wait", "table": "Logical_Switch", "where": [["name", "==", "ls0"]],
            "columns": ["name"], "until": "!=", "rows": []},
            {"op": "insert", "table": "Logical_Switch", "row": {"name": "after-wait"}}]),
    ));
    let mut timed = Box::pin(a.call(
        "transact",
        &json!([NBDB, {"op": "wait", "table": "Logical_Switch", "where": [["name", "==", "never"]],
            "columns": ["name"], "until": "!=", "rows": [], "timeout": 50}]),
    ));
    // The barrier: replies come back in the order the connection's reader routes them, so a reply to
    // either wait would have been delivered before the echo's.
    a.echo().await.unwrap();
    assert!(pending(&mut waiting) && pending(&mut timed));
    assert!(db.rows("Logical_Switch").is_empty());
    // One millisecond before its timeout the timed wait still blocks.
    tokio::time::advance(Duration::from_millis(49)).await;
    a.echo().await.unwrap();
    assert!(pending(&mut waiting) && pending(&mut timed));
    assert_eq!(t0.elapsed(), Duration::from_millis(49));
    b.transact(
        &Transaction::new(NBDB).op(Operation::insert("Logical_Switch").value("name", "ls0")),
    )
    .await
    .unwrap();
    let r = waiting.await.unwrap();
    assert!(r[1].get("uuid").is_some(), "{r}");
    assert_eq!(db.rows("Logical_Switch").len(), 2);
    // The commit ran the timed wait again: still unsatisfied, still waiting.
    a.echo().await.unwrap();
    assert!(pending(&mut timed));
    let r = timed.await.unwrap();
    assert_eq!(r[0]["error"], "timed out", "{r}");
    assert_eq!(t0.elapsed(), Duration::from_millis(50));
}

#[tokio::test]
async fn locks_steal_and_assert() {
    let db = MemDb::new_nb();
    let (a, b) = (db.connect(), db.connect());
    let mut a_ev = a.lock_events();
    let mut b_ev = b.lock_events();
    assert!(a.lock("l").await.unwrap());
    assert!(!b.lock("l").await.unwrap());
    let assert_op = || Transaction::new(NBDB).op(Operation::assert_lock("l"));
    a.transact(&assert_op()).await.unwrap();
    assert!(b.transact(&assert_op()).await.is_err());
    // A waiter must unlock before it steals; when it leaves, the owner is told `locked` again.
    assert!(b.steal("l").await.is_err());
    b.unlock("l").await.unwrap();
    assert_eq!(a_ev.recv().await, Some(LockEvent::Locked("l".into())));
    assert!(b.steal("l").await.unwrap());
    assert_eq!(a_ev.recv().await, Some(LockEvent::Stolen("l".into())));
    assert!(a.transact(&assert_op()).await.is_err());
    b.transact(&assert_op()).await.unwrap();
    // a still waits in line: when b lets go, a holds it.
    b.unlock("l").await.unwrap();
    assert_eq!(a_ev.recv().await, Some(LockEvent::Locked("l".into())));
    assert!(b_ev.try_recv().is_err());
}

#[tokio::test]
async fn commit_then_drop_is_an_unknown_outcome() {
    let db = MemDb::new_nb();
    let nb = db.northbound().await.unwrap();
    db.drop_after_next_commit();
    let e = LogicalSwitch::new("ls0").execute(&nb).await.unwrap_err();
    assert!(matches!(e, Error::OutcomeUnknown(_)), "{e:?}");
    assert_eq!(db.rows("Logical_Switch").len(), 1);
}

/// A session over the unix socket reconnects after every connection is dropped; the replica resynchronises
/// and commits go on. The session may insist on the leader: `_Server` says standalone.
#[tokio::test]
async fn session_reconnects_after_disconnect() {
    let dir = tempfile::tempdir().unwrap();
    let db = MemDb::new_nb();
    let remote = db.listen_unix(&dir.path().join("nb.sock")).unwrap();
    let s = Session::builder(&remote)
        .unwrap()
        .leader_only(NBDB)
        .backoff(Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(50),
            factor: 2,
        })
        .connect()
        .await
        .unwrap();
    let nb = OvsdbNorthbound::with_session(s.clone(), &[]).await.unwrap();
    LogicalSwitch::new("ls0").execute(&nb).await.unwrap();
    db.disconnect_all();
    // Changed while nobody is connected: the resync shows it.
    db.transact(
        &json!([NBDB, {"op": "insert", "table": "Logical_Switch", "row": {"name": "ls1"}}]),
    );
    // (A commit racing the client's discovery of the drop is an unknown outcome, as with a real server.)
    let t0 = Instant::now();
    while s.connects() < 2 || !nb.cache().is_online() {
        assert!(t0.elapsed() < Duration::from_secs(5), "no reconnect");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    LogicalSwitch::new("ls2").execute(&nb).await.unwrap();
    assert!(s.connects() >= 2, "{}", s.connects());
    assert!(
        nb.cache()
            .wait_for(Duration::from_secs(5), |v| v.len("Logical_Switch") == 3)
            .await
    );
    assert!(nb.switch("ls1").is_some());
}

#[tokio::test]
async fn open_vswitch_bridges_and_ports() {
    let db = MemDb::new_ovs();
    let ovs = db.open_vswitch().await.unwrap();
    let mut b = OvsBatch::new();
    b.add(BridgeSpec::new("br-int"))
        .add(PortSpec::new("br-int", "p0").iface_id("pod0.ns"));
    ovs.commit(b).await.unwrap();
    // The bridge's own internal port, and ours.
    let mut ports = ovs.bridge_ports("br-int");
    ports.sort();
    assert_eq!(ports, ["br-int", "p0"]);
    assert_eq!(db.rows("Bridge").len(), 1);
    // next_cfg was bumped by the commit.
    assert_eq!(
        db.rows("Open_vSwitch")[0].1["next_cfg"],
        Datum::Atom(Atom::Integer(1))
    );
    let mut b = OvsBatch::new();
    b.delete_bridge("br-int");
    ovs.commit(b).await.unwrap();
    assert!(db.rows("Port").is_empty() && db.rows("Interface").is_empty());
}

/// Conditional monitors see rows enter and leave their condition as inserts and deletes, modifications as
/// differences; a `monitor` (update) reports old and new values.
#[tokio::test]
async fn monitors_with_conditions() {
    let db = MemDb::new_nb();
    let c = db.connect();
    let req = MonitorRequests::new().table(
        "Logical_Switch",
        MonitorRequest::all()
            .columns(["name", "external_ids"])
            .filter(Condition::includes(
                "external_ids",
                Datum::map([("k", "v")]),
            )),
    );
    let (init, mut s) = c.monitor_cond(NBDB, &req).await.unwrap();
    assert!(init.is_empty());
    let (_, mut s1) = c
        .monitor(
            NBDB,
            &MonitorRequests::new()
                .table("Logical_Switch", MonitorRequest::all().columns(["name"])),
        )
        .await
        .unwrap();
    let ins = |name: &str, k: &str| {
        json!([NBDB, {"op": "insert", "table": "Logical_Switch",
            "row": {"name": name, "external_ids": ["map", [[k, "v"]]]}}])
    };
    db.transact(&ins("a", "other"));
    db.transact(&ins("b", "k"));
    let u = s
        .next_timeout(Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let (uuid_b, upd) = u.tables["Logical_Switch"].iter().next().unwrap();
    let RowUpdate::Insert(row) = upd else {
        panic!("{upd:?}")
    };
    assert_eq!(row["name"], Datum::from("b"));
    // b leaves the condition, a enters it.
    db.transact(&json!([NBDB,
        {"op": "mutate", "table": "Logical_Switch", "where": [["name", "==", "b"]],
         "mutations": [["external_ids", "delete", ["set", ["k"]]]]},
        {"op": "mutate", "table": "Logical_Switch", "where": [["name", "==", "a"]],
         "mutations": [["external_ids", "insert", ["map", [["k", "v"]]]]]}]));
    let u = s
        .next_timeout(Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let t = &u.tables["Logical_Switch"];
    assert_eq!(t[uuid_b], RowUpdate::Delete(None));
    assert!(t.values().any(|r| matches!(r, RowUpdate::Insert(_))));
    // The unconditional `monitor` saw both inserts, then nothing for the external_ids it does not watch.
    for _ in 0..2 {
        let u = s1
            .next_timeout(Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(
            u.tables["Logical_Switch"].values().next(),
            Some(RowUpdate::Update {
                old: None,
                new: Some(_)
            })
        ));
    }
    db.transact(&json!([NBDB, {"op": "update", "table": "Logical_Switch",
        "where": [["name", "==", "a"]], "row": {"name": "a2"}}]));
    let u = s1
        .next_timeout(Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let Some(RowUpdate::Update {
        old: Some(old),
        new: Some(new),
    }) = u.tables["Logical_Switch"].values().next()
    else {
        panic!("{u:?}")
    };
    assert_eq!(
        (&old["name"], &new["name"]),
        (&Datum::from("a"), &Datum::from("a2"))
    );
}

mod props {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        Switch(u8),
        Port(u8, u8),
        DeletePort(u8),
        DeleteSwitch(u8),
        Router(u8),
        Patch(u8, u8),
        Route(u8, u8),
        DeleteRouter(u8),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0..3u8).prop_map(Step::Switch),
            (0..3u8, 0..6u8).prop_map(|(s, p)| Step::Port(s, p)),
            (0..6u8).prop_map(Step::DeletePort),
            (0..3u8).prop_map(Step::DeleteSwitch),
            (0..2u8).prop_map(Step::Router),
            (0..3u8, 0..2u8).prop_map(|(s, r)| Step::Patch(s, r)),
            (0..2u8, 0..3u8).prop_map(|(r, n)| Step::Route(r, n)),
            (0..2u8).prop_map(Step::DeleteRouter),
        ]
    }

    fn batch(steps: &[Step]) -> Batch {
        let mut b = Batch::new();
        for s in steps {
            match s {
                Step::Switch(i) => b.add(LogicalSwitch::new(format!("ls{i}"))),
                Step::Port(i, p) => b.add(SwitchPort::new(format!("ls{i}"), format!("p{p}"))),
                Step::DeletePort(p) => b.delete_switch_port(format!("p{p}")),
                Step::DeleteSwitch(i) => b.delete_switch(format!("ls{i}")),
                Step::Router(r) => b.add(Router::new(format!("lr{r}"))),
                Step::Patch(i, r) => b.patch(Patch::new(
                    format!("ls{i}"),
                    format!("lr{r}"),
                    format!("0a:58:0a:10:0{i}:0{r}"),
                    [format!("10.{i}.{r}.1/24")],
                )),
                Step::Route(r, n) => b.add(StaticRoute::new(
                    format!("lr{r}"),
                    format!("10.9{n}.0.0/16"),
                    "10.0.0.1",
                )),
                Step::DeleteRouter(r) => b.delete_router(format!("lr{r}")),
            };
        }
        b
    }

    /// After each batch: every strong reference points at a row, no row of a non-root table is unreferenced,
    /// names are unique where the schema says so, and the replica holds exactly the database's rows.
    fn check(db: &MemDb, nb: &OvsdbNorthbound) -> Result<(), TestCaseError> {
        let schema = db.schema();
        let mut all: BTreeMap<Uuid, String> = BTreeMap::new();
        let mut rows = BTreeMap::new();
        for t in schema.tables.keys() {
            for (u, r) in db.rows(t) {
                all.insert(u, t.clone());
                rows.insert(u, (t.clone(), r));
            }
        }
        let mut referenced = std::collections::BTreeSet::new();
        for (t, r) in rows.values() {
            let ts = &schema.tables[t];
            for (c, cs) in &ts.columns {
                if cs.ty.key.ref_table.is_some() {
                    for a in r[c].atoms() {
                        let u = a.as_uuid().unwrap();
                        prop_assert!(all.contains_key(&u), "{t}.{c} -> {u} dangles");
                        referenced.insert(u);
                    }
                }
            }
        }
        for (u, (t, r)) in &rows {
            prop_assert!(
                schema.tables[t].is_root || referenced.contains(u),
                "orphan {t} {r:?}"
            );
            for ix in &schema.tables[t].indexes {
                let key: Vec<_> = ix.iter().map(|c| r.get(c)).collect();
                let same = rows
                    .values()
                    .filter(|(t2, r2)| {
                        t2 == t && ix.iter().map(|c| r2.get(c)).collect::<Vec<_>>() == key
                    })
                    .count();
                prop_assert_eq!(same, 1, "{} index {:?}", t, ix);
            }
        }
        for t in crate::northbound::TABLES {
            let mut cached: Vec<Uuid> = nb.cache().rows(t).iter().map(|r| r.uuid()).collect();
            cached.sort();
            let stored: Vec<Uuid> = db.rows(t).into_iter().map(|(u, _)| u).collect();
            prop_assert_eq!(cached, stored, "{}", t);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
        #[test]
        fn planner_batches_keep_the_database_consistent(
            batches in proptest::collection::vec(proptest::collection::vec(step(), 1..6), 1..8)
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let db = MemDb::new_nb();
                let nb = db.northbound().await.unwrap().cache_wait(Duration::from_secs(2));
                for steps in &batches {
                    // A batch may be refused (a port on a missing switch, a switch both deleted and used),
                    // never left unconfirmed.
                    for _ in 0..2 {
                        if let Err(e) = nb.commit(batch(steps)).await {
                            prop_assert!(!e.to_string().contains("did not catch up"), "{:?}: {}", steps, e);
                        }
                        check(&db, &nb)?;
                    }
                }
                Ok::<(), TestCaseError>(())
            })?;
        }
    }
}

/// A column of at most one value changes in the replica as in the database (update2 sends its new value,
/// not a difference: with a difference {7} -> {8} read as {7, 8}).
#[tokio::test]
async fn replica_follows_optional_columns() {
    let db = MemDb::new_nb();
    let nb = db.northbound().await.unwrap();
    let mut b = Batch::new();
    b.add(LogicalSwitch::new("ls0"))
        .add(SwitchPort::new("ls0", "p0"));
    nb.commit(b).await.unwrap();
    for tag in [json!(7), json!(8), json!(["set", []])] {
        db.transact(
            &json!([NBDB, {"op": "update", "table": "Logical_Switch_Port",
            "where": [["name", "==", "p0"]], "row": {"tag_request": tag}}]),
        );
        let want = db.rows("Logical_Switch_Port")[0].1["tag_request"].clone();
        assert!(
            nb.cache()
                .wait_for(Duration::from_secs(5), |v| {
                    v.lookup("Logical_Switch_Port", "name", "p0")
                        .and_then(|r| r.get("tag_request").cloned())
                        == Some(want.clone())
                })
                .await,
            "{tag}: {:?}",
            nb.switch_port("p0").map(|p| p.tag_request)
        );
    }
}

/// A batch of 500 ports and single commits next to them stay fast (each commit checks references, garbage
/// and indexes over the whole database).
#[tokio::test]
async fn many_ports() {
    let db = MemDb::new_nb();
    let nb = db.northbound().await.unwrap();
    LogicalSwitch::new("ls0").execute(&nb).await.unwrap();
    let t0 = Instant::now();
    let mut b = Batch::new();
    for i in 0..500 {
        b.add(
            SwitchPort::new("ls0", format!("pod-{i}")).addresses([format!(
                "0a:58:64:00:{:02x}:{:02x} 10.100.{}.{}",
                i / 256,
                i % 256,
                i / 256,
                i % 256
            )]),
        );
    }
    nb.commit(b).await.unwrap();
    let batch = t0.elapsed();
    let t0 = Instant::now();
    for i in 0..20 {
        SwitchPort::new("ls0", format!("one-{i}"))
            .execute(&nb)
            .await
            .unwrap();
    }
    let one = t0.elapsed() / 20;
    let t0 = Instant::now();
    for i in 0..20 {
        db.transact(&json!([NBDB,
            {"op": "insert", "table": "Logical_Switch_Port", "uuid-name": "p", "row": {"name": format!("raw-{i}")}},
            {"op": "mutate", "table": "Logical_Switch", "where": [["name", "==", "ls0"]],
             "mutations": [["ports", "insert", ["named-uuid", "p"]]]}]));
    }
    let raw = t0.elapsed() / 20;
    println!("memdb: 500 ports in one batch {batch:?}, then one port per commit {one:?} (the server's part {raw:?})");
    assert_eq!(db.rows("Logical_Switch_Port").len(), 540);
    assert!(one < Duration::from_millis(100), "{one:?}");
}

mod malformed {
    use super::*;
    use proptest::prelude::*;

    fn value() -> impl Strategy<Value = Json> {
        prop_oneof![
            Just(json!("x")),
            Just(json!(5)),
            Just(json!(-1)),
            Just(json!(5000)),
            Just(json!(1.5)),
            Just(json!(true)),
            Just(json!(null)),
            Just(json!(["set", []])),
            Just(json!(["set", ["a", "b"]])),
            Just(json!(["set", [1, 1]])),
            Just(json!(["map", [["k", "v"]]])),
            Just(json!(["map", [["k", "v"], ["k", "w"]]])),
            Just(json!(["uuid", "not-a-uuid"])),
            Just(json!(["uuid", "9b2b4f43-8ba8-4ce4-a1d4-9f1a0c3a0b2e"])),
            Just(json!(["named-uuid", "n"])),
            Just(json!(["named-uuid", "m"])),
            Just(json!({"a": 1})),
            Just(json!([])),
        ]
    }

    fn op() -> impl Strategy<Value = Json> {
        let table = prop_oneof![
            Just("Logical_Switch"),
            Just("Logical_Switch_Port"),
            Just("ACL"),
            Just("NB_Global"),
            Just("Load_Balancer"),
            Just("Nope"),
        ];
        let column = prop_oneof![
            Just("name"),
            Just("ports"),
            Just("tag_request"),
            Just("external_ids"),
            Just("action"),
            Just("load_balancer"),
            Just("_uuid"),
            Just("nope"),
        ];
        let opname = prop_oneof![
            Just("insert"),
            Just("select"),
            Just("update"),
            Just("mutate"),
            Just("delete"),
            Just("wait"),
            Just("abort"),
            Just("bogus"),
        ];
        let func = prop_oneof![
            Just("=="),
            Just("!="),
            Just("<"),
            Just("includes"),
            Just("excludes"),
            Just("~")
        ];
        let mutator = prop_oneof![
            Just("insert"),
            Just("delete"),
            Just("+="),
            Just("/="),
            Just("%="),
            Just("?")
        ];
        (
            opname,
            table,
            column.clone(),
            value(),
            func,
            column,
            value(),
            mutator,
            proptest::option::of(prop_oneof![Just("n"), Just("m")]),
        )
            .prop_map(|(op, t, c, v, f, c2, v2, m, name)| {
                let mut o = json!({"op": op, "table": t,
                    "row": {c: v.clone()},
                    "where": [[c2, f, v2.clone()]],
                    "mutations": [[c, m, v]],
                    "columns": [c2], "until": "==", "rows": [], "timeout": 0});
                if let Some(n) = name {
                    o["uuid-name"] = json!(n);
                }
                o
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        /// Whatever a client sends, the server answers (a result or an error object) without panicking, and
        /// what it commits keeps references whole and no orphan rows.
        #[test]
        fn malformed_transactions_are_answered(txns in proptest::collection::vec(proptest::collection::vec(op(), 0..5), 1..6)) {
            let db = MemDb::new_nb();
            for ops in txns {
                let mut params = vec![json!(NBDB)];
                params.extend(ops.iter().cloned());
                let r = db.transact(&Json::Array(params));
                prop_assert!(r.is_array() || r.get("error").is_some(), "{}", r);
                let schema = db.schema();
                let mut all = std::collections::BTreeSet::new();
                let mut rows = Vec::new();
                for t in schema.tables.keys() {
                    for (u, r) in db.rows(t) {
                        all.insert(u);
                        rows.push((t.clone(), u, r));
                    }
                }
                let mut referenced = std::collections::BTreeSet::new();
                for (t, _, r) in &rows {
                    for (c, cs) in &schema.tables[t].columns {
                        if cs.ty.key.ref_table.is_some() {
                            for a in r[c].atoms() {
                                let u = a.as_uuid().unwrap();
                                prop_assert!(all.contains(&u), "{}.{} dangles", t, c);
                                if cs.ty.key.ref_type == crate::schema::RefType::Strong {
                                    referenced.insert(u);
                                }
                            }
                        }
                    }
                }
                for (t, u, _) in &rows {
                    prop_assert!(schema.tables[t].is_root || referenced.contains(u), "orphan in {}", t);
                }
            }
        }
    }
}
