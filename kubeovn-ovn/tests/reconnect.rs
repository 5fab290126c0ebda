//! Reconnect, resume and raft failover against real ovsdb-servers that the tests kill with SIGKILL and
//! restart (needs OVS/OVN binaries; skipped with a message without them).

#![allow(clippy::unwrap_used)] // test code

mod common;

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use common::{Cluster, OvsdbServer, Storage};
use kubeovn_ovn::cache::{Cache, EventKind, RowEvent};
use kubeovn_ovn::northbound::{
    Batch, LogicalRouterPolicyAction, Northbound, OvsdbNorthbound, RouterPolicy, SwitchPort,
};
use kubeovn_ovn::ops::{Condition, Operation, Transaction};
use kubeovn_ovn::session::{Backoff, Session};
use kubeovn_ovn::{Datum, Error, Uuid};
use tokio::sync::broadcast;

fn backoff() -> Backoff {
    Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_millis(800),
        factor: 2,
    }
}

fn cache_names(cache: &Cache) -> BTreeSet<String> {
    cache
        .rows("Logical_Switch_Port")
        .iter()
        .map(|r| r.get_str("name").to_owned())
        .collect()
}

fn server_names(out: &str) -> BTreeSet<String> {
    out.split_whitespace().map(str::to_owned).collect()
}

/// Waits until the replica's port names equal what `server` returns.
async fn converge(cache: &Cache, server: impl Fn() -> BTreeSet<String>) -> BTreeSet<String> {
    let t0 = Instant::now();
    loop {
        let want = server();
        if cache.is_online() && cache_names(cache) == want {
            return want;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no convergence: cache {:?} server {:?}",
            cache_names(cache),
            want
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn drain(rx: &mut broadcast::Receiver<RowEvent>) -> Vec<RowEvent> {
    let mut v = Vec::new();
    while let Ok(e) = rx.try_recv() {
        v.push(e);
    }
    v
}

/// Inserts port `name` on ls0 (raw transaction).
fn insert_port(name: &str) -> Transaction {
    Transaction::new("OVN_Northbound")
        .op(Operation::insert("Logical_Switch_Port")
            .uuid_name("p")
            .value("name", name))
        .op(Operation::mutate("Logical_Switch")
            .filter(Condition::eq("name", "ls0"))
            .insert("ports", Datum::named_uuid("p")))
}

/// A writer pipelining single-port transactions in windows of 16 until its connection dies; returns each
/// port's outcome: "ok", "unknown" (cut off after sending) or "not-sent".
fn spawn_writer(
    client: kubeovn_ovn::Client,
    prefix: &'static str,
) -> tokio::task::JoinHandle<Vec<(String, &'static str)>> {
    tokio::spawn(async move {
        let mut outcome: Vec<(String, &'static str)> = Vec::new();
        'outer: for w in 0..1000 {
            let txns: Vec<(String, Transaction)> = (0..16)
                .map(|j| {
                    let n = format!("{prefix}{}", w * 16 + j);
                    let t = insert_port(&n);
                    (n, t)
                })
                .collect();
            let futs: Vec<_> = txns.iter().map(|(_, t)| client.transact(t)).collect();
            let mut stop = false;
            for ((n, _), f) in txns.iter().zip(futs) {
                let r = f.await;
                let kind = match r {
                    Ok(_) => "ok",
                    Err(Error::OutcomeUnknown(_)) => {
                        stop = true;
                        "unknown"
                    }
                    Err(Error::Disconnected(_)) => {
                        stop = true;
                        "not-sent"
                    }
                    Err(e) => panic!("unexpected error for {n}: {e}"),
                };
                outcome.push((n.clone(), kind));
            }
            if stop {
                break 'outer;
            }
        }
        outcome
    })
}

async fn kill_restart(storage: Storage) {
    let Some(mut srv) = OvsdbServer::start("ovn-nb.ovsschema", storage, false) else {
        return;
    };
    if !common::have("ovn-nbctl") {
        return;
    }
    srv.ctl("ovn-nbctl", &["ls-add", "ls0"]);
    let session = Session::builder(&srv.unix_remote())
        .unwrap()
        .backoff(backoff())
        .retry_for(Some(Duration::from_secs(2)))
        .connect()
        .await
        .unwrap();
    let nb = OvsdbNorthbound::with_session(session.clone(), &[])
        .await
        .unwrap()
        .cache_wait(Duration::from_secs(5));
    let cache = nb.cache().clone();
    let mut events = cache.subscribe();
    let mut b = Batch::new();
    for i in 0..10 {
        b.add(SwitchPort::new("ls0", format!("p{i}")));
    }
    nb.commit(b).await.unwrap();

    // A writer pipelining transactions, windows of 16, until its connection dies.
    let client = session.client().await.unwrap();
    let writer = spawn_writer(client, "m");
    // Kill once some of the writer's ports are in.
    let t0 = Instant::now();
    while cache.len("Logical_Switch_Port") < 60 && t0.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    srv.kill9();
    let outcome = writer.await.unwrap();
    assert!(
        outcome.iter().any(|(_, k)| *k != "ok"),
        "the writer never saw the connection die"
    );

    // While the server is down: a commit fails as not done (or unknown), never as committed.
    let down = nb.commit({
        let mut b = Batch::new();
        b.add(SwitchPort::new("ls0", "while-down"));
        b
    });
    let r = tokio::time::timeout(Duration::from_secs(15), down)
        .await
        .unwrap();
    assert!(r.as_ref().is_err_and(Error::is_connection_error), "{r:?}");
    assert!(!cache.is_online());

    // Restart on the same socket and database; C clients write while our client is (probably) backing off.
    srv.restart();
    srv.ctl(
        "ovn-nbctl",
        &[
            "lsp-add",
            "ls0",
            "nbctl1",
            "--",
            "lsp-del",
            "p0",
            "--",
            "lsp-set-addresses",
            "p1",
            "0a:00:00:00:00:01 10.0.0.1",
        ],
    );
    let names = converge(&cache, || {
        server_names(&srv.ctl(
            "ovn-nbctl",
            &["--bare", "--columns=name", "list", "Logical_Switch_Port"],
        ))
    })
    .await;
    for (n, k) in &outcome {
        match *k {
            "ok" => assert!(names.contains(n), "committed {n} lost"),
            "not-sent" => assert!(!names.contains(n), "{n} was never sent but exists"),
            _ => {}
        }
    }
    assert!(names.contains("nbctl1") && !names.contains("p0"));
    assert!(!names.contains("while-down"));
    let p1 = cache.lookup("Logical_Switch_Port", "name", "p1").unwrap();
    assert_eq!(
        p1.get("addresses"),
        Some(&Datum::set(["0a:00:00:00:00:01 10.0.0.1"]))
    );
    // A write after the reconnect.
    SwitchPort::new("ls0", "after").execute(&nb).await.unwrap();
    assert!(nb.switch_port("after").is_some());

    // Every row change was reported once: one insert per row that exists, one delete for p0.
    let evs = drain(&mut events);
    let mut inserts: HashMap<Uuid, usize> = HashMap::new();
    let mut deletes = 0;
    for e in evs.iter().filter(|e| &*e.table == "Logical_Switch_Port") {
        match e.kind {
            EventKind::Insert => *inserts.entry(e.uuid).or_default() += 1,
            EventKind::Delete => deletes += 1,
            EventKind::Modify => {}
        }
    }
    assert!(
        inserts.values().all(|n| *n == 1),
        "an insert reported twice"
    );
    // Every port now, plus p0 (deleted by ovn-nbctl), and nothing else.
    let final_uuids: BTreeSet<Uuid> = cache
        .rows("Logical_Switch_Port")
        .iter()
        .map(|r| r.uuid())
        .collect();
    let extra: Vec<_> = evs
        .iter()
        .filter(|e| e.kind == EventKind::Insert && !final_uuids.contains(&e.uuid))
        .map(|e| {
            (
                e.table.clone(),
                e.new.as_ref().map(|r| r.get_str("name").to_owned()),
            )
        })
        .collect();
    assert_eq!(extra.len(), 1, "inserted and gone: {extra:?}");
    assert_eq!(inserts.len(), final_uuids.len() + 1);
    assert_eq!(final_uuids.len(), names.len() + 1, "after");
    assert_eq!(deletes, 1);
    assert!(session.connects() >= 2);
    assert!(cache.resyncs() >= 2);
    eprintln!(
        "{storage:?}: {} writer outcomes ({} ok), full resyncs {}",
        outcome.len(),
        outcome.iter().filter(|(_, k)| *k == "ok").count(),
        cache.full_resyncs()
    );
    if storage == Storage::Standalone {
        assert_eq!(cache.full_resyncs(), 1);
    }
}

#[tokio::test]
async fn standalone_kill9_restart_converges() {
    kill_restart(Storage::Standalone).await;
}

#[tokio::test]
async fn clustered_kill9_restart_converges() {
    kill_restart(Storage::Clustered).await;
}

/// A commit whose outcome is unknown (our connection closed while the frozen server held the request) is
/// committed again: it is planned against the replica resumed on the new connection, which shows whether the
/// first one went through, so the policy exists once. The policy table has no unique index: a blind retry
/// would add a second row.
#[tokio::test]
async fn an_unknown_outcome_is_rechecked_not_applied_twice() {
    let Some(srv) = OvsdbServer::start("ovn-nb.ovsschema", Storage::Standalone, false) else {
        return;
    };
    if !common::have("ovn-nbctl") {
        return;
    }
    srv.ctl("ovn-nbctl", &["lr-add", "lr0"]);
    let session = Session::builder(&srv.unix_remote())
        .unwrap()
        .backoff(backoff())
        .connect()
        .await
        .unwrap();
    let nb = OvsdbNorthbound::with_session(session.clone(), &[])
        .await
        .unwrap()
        .cache_wait(Duration::from_secs(5));
    let policy = || {
        RouterPolicy::new(
            "lr0",
            1000,
            "ip4.src == 10.0.0.1",
            LogicalRouterPolicyAction::Allow,
        )
    };
    let commit = |nb: &OvsdbNorthbound| {
        let nb = nb.clone();
        tokio::spawn(async move { policy().execute(&nb).await })
    };
    assert!(
        nb.cache()
            .wait_for(Duration::from_secs(5), |v| v
                .lookup("Logical_Router", "name", "lr0")
                .is_some())
            .await
    );
    srv.signal("STOP");
    let first = commit(&nb);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cut = session.current().unwrap();
    cut.close("test: cut off before the reply");
    let r = first.await.unwrap();
    assert!(matches!(r, Err(Error::OutcomeUnknown(_))), "{r:?}");
    // Again at once, while the server still holds the first request unread.
    let again = commit(&nb);
    tokio::time::sleep(Duration::from_millis(200)).await;
    srv.signal("CONT");
    again.await.unwrap().unwrap();
    let c = session.current().unwrap();
    assert!(!c.same_connection(&cut) && nb.cache().follows(&c));
    let list = srv.ctl("ovn-nbctl", &["lr-policy-list", "lr0"]);
    assert_eq!(list.matches("ip4.src == 10.0.0.1").count(), 1, "{list}");
    assert_eq!(nb.policies("lr0").len(), 1);
}

#[tokio::test]
async fn raft_leader_failover() {
    let Some(mut cl) = Cluster::start("ovn-nb.ovsschema", 3) else {
        return;
    };
    if !common::have("ovn-nbctl") {
        return;
    }
    let session = Session::builder(&cl.remotes())
        .unwrap()
        .backoff(backoff())
        .leader_only("OVN_Northbound")
        .connect()
        .await
        .unwrap();
    let leader = cl.leader();
    assert_eq!(session.current().unwrap().remote(), cl.remote(leader));
    let nb = OvsdbNorthbound::with_session(session.clone(), &[])
        .await
        .unwrap();
    let mut b = Batch::new();
    b.add(kubeovn_ovn::northbound::LogicalSwitch::new("ls0"));
    for i in 0..5 {
        b.add(SwitchPort::new("ls0", format!("p{i}")));
    }
    nb.commit(b).await.unwrap();
    assert_eq!(nb.switch_port_names("ls0").len(), 5);

    // A pipelined writer on the leader when it is killed.
    let writer = spawn_writer(session.client().await.unwrap(), "w");
    let t0 = Instant::now();
    while nb.cache().len("Logical_Switch_Port") < 40 && t0.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let t_kill = Instant::now();
    cl.kill9(leader);
    let outcome = writer.await.unwrap();
    assert!(outcome.iter().any(|(_, k)| *k != "ok"));
    // Commits until one succeeds: the failures are connection errors only.
    let mut failures = 0;
    loop {
        let r = SwitchPort::new("ls0", "after-failover")
            .may_exist()
            .execute(&nb)
            .await;
        match r {
            Ok(()) => break,
            Err(e) => {
                assert!(e.is_connection_error(), "{e}");
                failures += 1;
                assert!(
                    t_kill.elapsed() < Duration::from_secs(30),
                    "no failover: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let failover = t_kill.elapsed();
    let new_leader = cl.leader();
    assert_ne!(new_leader, leader);
    assert_eq!(session.current().unwrap().remote(), cl.remote(new_leader));
    // A C client write through the survivors reaches the replica.
    cl.ctl("ovn-nbctl", &["lsp-add", "ls0", "nbctl1"]);
    let names = converge(nb.cache(), || {
        server_names(&cl.ctl(
            "ovn-nbctl",
            &["--bare", "--columns=name", "list", "Logical_Switch_Port"],
        ))
    })
    .await;
    assert!(names.contains("after-failover") && names.contains("nbctl1"));
    for (n, k) in &outcome {
        match *k {
            "ok" => assert!(names.contains(n), "committed {n} lost in the failover"),
            "not-sent" => assert!(!names.contains(n), "{n} was never sent but exists"),
            _ => {}
        }
    }
    let unknown: Vec<&String> = outcome
        .iter()
        .filter(|(_, k)| *k == "unknown")
        .map(|(n, _)| n)
        .collect();
    let unknown_committed = unknown.iter().filter(|n| names.contains(**n)).count();
    eprintln!(
        "raft writer: {} ok, {} outcome unknown of which {} committed",
        outcome.iter().filter(|(_, k)| *k == "ok").count(),
        unknown.len(),
        unknown_committed
    );
    eprintln!(
        "raft failover: first successful write {failover:?} after the kill ({failures} failed attempts), full resyncs {}",
        nb.cache().full_resyncs()
    );
    // The old leader comes back as a follower; writes still go to the leader.
    cl.restart(leader);
    SwitchPort::new("ls0", "later").execute(&nb).await.unwrap();
    assert!(nb.switch_port("later").is_some());
}

#[tokio::test]
async fn raft_leader_change_without_disconnect() {
    // The leader is frozen (SIGSTOP) long enough for the others to elect a new one, then thawed: it is still
    // up and our connection to it still open, but it is no longer the leader. The leader-only session sees
    // that in _Server and moves to the new leader.
    let Some(cl) = Cluster::start("ovn-nb.ovsschema", 3) else {
        return;
    };
    let session = Session::builder(&cl.remotes())
        .unwrap()
        .backoff(backoff())
        .client(
            kubeovn_ovn::client::ClientBuilder::default()
                .inactivity_probe(Some(Duration::from_secs(60))),
        )
        .leader_only("OVN_Northbound")
        .connect()
        .await
        .unwrap();
    let nb = OvsdbNorthbound::with_session(session.clone(), &[])
        .await
        .unwrap();
    kubeovn_ovn::northbound::LogicalSwitch::new("ls0")
        .execute(&nb)
        .await
        .unwrap();
    let old = cl.leader();
    assert_eq!(session.current().unwrap().remote(), cl.remote(old));
    cl.signal(old, "STOP");
    // Wait for another member to win an election.
    let t0 = Instant::now();
    let new = loop {
        let l = (0..3).find(|i| *i != old && cl.status(*i).contains("Role: leader"));
        if let Some(l) = l {
            break l;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no new leader");
        std::thread::sleep(Duration::from_millis(50));
    };
    cl.signal(old, "CONT");
    let t0 = Instant::now();
    loop {
        if let Some(c) = session.current() {
            if c.remote() == cl.remote(new) {
                break;
            }
        }
        // Requests nudge the session to reconnect once the old connection is closed.
        let _ = tokio::time::timeout(Duration::from_millis(200), session.client()).await;
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "still on {:?}",
            session.current().map(|c| c.remote().to_owned())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let moved = t0.elapsed();
    SwitchPort::new("ls0", "p-after")
        .execute(&nb)
        .await
        .unwrap();
    assert!(nb.switch_port("p-after").is_some());
    eprintln!("leader change seen and left {moved:?} after the old leader thawed");
}
