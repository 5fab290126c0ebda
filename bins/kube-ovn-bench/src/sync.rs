//! `nb sync N`: the initial sync of a large northbound database into a fresh client's replica.
//!
//! The database is built first (if it does not hold the set yet) with big pipelined transactions: per
//! switch `ls-<s>` (subnet in other_config) 94 pod ports shaped as Kube-OVN's plus a router-type port, its
//! router port `lrp-<s>` on the one router `sync-lr`, a port group `pg-<s>` holding the pod ports and two
//! ACLs: 100 rows per switch. Then each round times a fresh [`OvsdbNorthbound::connect`] (connect, schema,
//! `monitor_cond_since` of every table the API replicates, replica filled and indexed: "ready"), and
//! separately the monitor reply alone (received and decoded, no replica).

use std::time::{Duration, Instant};

use kubeovn_ovn::datum::{Atom, Datum};
use kubeovn_ovn::monitor::{MonitorRequest, MonitorRequests};
use kubeovn_ovn::northbound::OvsdbNorthbound;
use kubeovn_ovn::ops::{Condition, Operation, Transaction};
use kubeovn_ovn::{Client, Error};

use crate::{cpu_s, live};

const NB: &str = "OVN_Northbound";
const PODS_PER_SWITCH: usize = 94;
const SWITCHES_PER_TXN: usize = 10;
const ROUNDS: usize = 3;

fn named(names: impl IntoIterator<Item = String>) -> Datum {
    Datum::Set(names.into_iter().map(Atom::NamedUuid).collect())
}

/// The operations creating switch `s` and everything hanging off it (100 rows).
fn switch_ops(txn: &mut Transaction, s: usize) {
    let pod = |p: usize| format!("s{s}p{p}");
    for p in 0..PODS_PER_SWITCH {
        let i = s * PODS_PER_SWITCH + p;
        txn.push(
            Operation::insert("Logical_Switch_Port")
                .uuid_name(pod(p))
                .value("name", format!("pod-{i}.ns-{s}"))
                .value(
                    "addresses",
                    Datum::set([format!(
                        "0a:58:{:02x}:{:02x}:{:02x}:{:02x} 10.{}.{}.{}",
                        (i >> 24) & 255,
                        (i >> 16) & 255,
                        (i >> 8) & 255,
                        i & 255,
                        64 + (s >> 8),
                        s & 255,
                        p + 2
                    )]),
                )
                .value(
                    "external_ids",
                    Datum::map([
                        ("ls", format!("ls-{s}")),
                        ("pod", format!("ns-{s}/pod-{i}")),
                        ("vendor", "kube-ovn".to_owned()),
                    ]),
                ),
        );
    }
    txn.push(
        Operation::insert("Logical_Switch_Port")
            .uuid_name(format!("s{s}r"))
            .value("name", format!("ls-{s}-sync-lr"))
            .value("type", "router")
            .value("addresses", Datum::set(["router"]))
            .value("options", Datum::map([("router-port", format!("lrp-{s}"))])),
    );
    let ports = (0..PODS_PER_SWITCH)
        .map(pod)
        .chain([format!("s{s}r")])
        .collect::<Vec<_>>();
    txn.push(
        Operation::insert("Logical_Switch")
            .value("name", format!("ls-{s}"))
            .value(
                "other_config",
                Datum::map([("subnet", format!("10.{}.{}.0/24", 64 + (s >> 8), s & 255))]),
            )
            .value("ports", named(ports)),
    );
    txn.push(
        Operation::insert("Logical_Router_Port")
            .uuid_name(format!("s{s}lrp"))
            .value("name", format!("lrp-{s}"))
            .value("mac", format!("0a:58:ff:00:{:02x}:{:02x}", s >> 8, s & 255))
            .value(
                "networks",
                Datum::set([format!("10.{}.{}.1/24", 64 + (s >> 8), s & 255)]),
            ),
    );
    txn.push(
        Operation::mutate("Logical_Router")
            .filter(Condition::eq("name", "sync-lr"))
            .insert("ports", Datum::named_uuid(format!("s{s}lrp"))),
    );
    for (k, (dir, m)) in [("to-lport", "outport"), ("from-lport", "inport")]
        .into_iter()
        .enumerate()
    {
        txn.push(
            Operation::insert("ACL")
                .uuid_name(format!("s{s}a{k}"))
                .value("priority", 2000i64)
                .value("direction", dir)
                .value("match", format!("{m} == @pg_{s} && ip4"))
                .value("action", "allow-related")
                .value("external_ids", Datum::map([("pg", format!("pg-{s}"))])),
        );
    }
    txn.push(
        Operation::insert("Port_Group")
            .value("name", format!("pg_{s}"))
            .value("ports", named((0..PODS_PER_SWITCH).map(pod)))
            .value("acls", named((0..2).map(|k| format!("s{s}a{k}"))))
            .value("external_ids", Datum::map([("ls", format!("ls-{s}"))])),
    );
}

/// Builds the database unless `sync-lr` is there already; returns the seconds it took (0 if skipped).
async fn populate(client: &Client, switches: usize) -> Result<f64, Error> {
    let found = client
        .transact(
            &Transaction::new(NB).op(Operation::select("Logical_Router")
                .filter(Condition::eq("name", "sync-lr"))
                .columns(["name"])),
        )
        .await?;
    if found[0].rows().is_some_and(|r| !r.is_empty()) {
        return Ok(0.0);
    }
    let t0 = Instant::now();
    client
        .transact(
            &Transaction::new(NB).op(Operation::insert("Logical_Router").value("name", "sync-lr")),
        )
        .await?;
    let mut set = tokio::task::JoinSet::new();
    for first in (0..switches).step_by(SWITCHES_PER_TXN) {
        let mut txn = Transaction::new(NB);
        for s in first..(first + SWITCHES_PER_TXN).min(switches) {
            switch_ops(&mut txn, s);
        }
        // One ports mutation of the router per transaction, not one per switch.
        txn.coalesce_set_mutations();
        while set.len() >= 4 {
            if let Some(r) = set.join_next().await {
                r.map_err(|e| Error::Disconnected(e.to_string()))??;
            }
        }
        let c = client.clone();
        set.spawn(async move { c.transact(&txn).await.map(|_| ()) });
    }
    while let Some(r) = set.join_next().await {
        r.map_err(|e| Error::Disconnected(e.to_string()))??;
    }
    Ok(t0.elapsed().as_secs_f64())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// A client whose inactivity probe tolerates the server's silence while it builds a reply of tens of
/// megabytes (ovsdb-server sends nothing, echo replies included, until the whole reply is built: over 10 s on
/// a loaded machine, which the default 5 s probe takes for a dead peer).
async fn connect(db: &str) -> Result<Client, Error> {
    Client::builder()
        .inactivity_probe(Some(Duration::from_secs(60)))
        .connect(db)
        .await
}

/// Runs `nb sync N`.
pub(crate) async fn main(db: &str, rows: usize, server_pid: Option<u32>) -> Result<String, Error> {
    let switches = rows.div_ceil(100).max(1);
    let client = Client::connect(db).await?;
    client.get_schema(NB).await?;
    let build_s = populate(&client, switches).await?;
    drop(client);

    let mut ready = Vec::new();
    let mut decode = Vec::new();
    let (mut server, mut reply_bytes) = (Vec::new(), 0usize);
    let (mut cached, mut heap, mut client_cpu, mut server_cpu) = (0usize, 0usize, 0.0, 0.0);
    for _ in 0..ROUNDS {
        // The replica's way: connect, schema, monitor every replicated table, fill and index.
        let (c0, s0, h0) = (cpu_s(None), cpu_s(server_pid), live());
        let t0 = Instant::now();
        let nb = OvsdbNorthbound::with_client(connect(db).await?, &[]).await?;
        ready.push(t0.elapsed().as_secs_f64());
        let (c1, s1, h1) = (cpu_s(None), cpu_s(server_pid), live());
        client_cpu += (c1 - c0) / ROUNDS as f64;
        server_cpu += (s1 - s0) / ROUNDS as f64;
        heap = h1.saturating_sub(h0);
        let view = nb.cache().view();
        cached = [
            "Logical_Switch",
            "Logical_Switch_Port",
            "Logical_Router",
            "Logical_Router_Port",
            "Port_Group",
            "ACL",
        ]
        .iter()
        .map(|t| view.len(t))
        .sum();
        drop(view);
        drop(nb);

        // The monitor reply alone: received and decoded into table updates, no replica.
        let client = connect(db).await?;
        let schema = client.get_schema(NB).await?;
        let mut req = MonitorRequests::new();
        // The replica's request: every declared column (no `_version`).
        for (t, ts) in &schema.tables {
            req = req.table(
                t.clone(),
                MonitorRequest::all().columns(ts.columns.keys().cloned()),
            );
        }
        let t0 = Instant::now();
        let (r, stream) = client.monitor_cond_since(NB, &req, None).await?;
        decode.push(t0.elapsed().as_secs_f64());
        drop((r, stream, client));

        // The server alone: the same request on a bare socket, until the reply's last byte (framed, not parsed).
        if let Some(path) = db.strip_prefix("unix:") {
            let (secs, bytes) = server_only(path, &req).await.map_err(|e| Error::Io {
                remote: db.to_owned(),
                source: e,
            })?;
            server.push(secs);
            reply_bytes = bytes;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(format!(
        "rows={cached} switches={switches} build_s={build_s:.2} ready_s={:.3} ready_min_s={:.3} \
         monitor_reply_s={:.3} server_reply_s={:.3} reply_bytes={reply_bytes} client_cpu_s={client_cpu:.2} server_cpu_s={server_cpu:.2} \
         replica_heap_bytes={heap} rounds={ROUNDS}",
        median(ready.clone()),
        ready.iter().copied().fold(f64::INFINITY, f64::min),
        median(decode),
        median(server),
    ))
}

/// Sends `monitor_cond_since` for `req` on a bare unix socket and reads until the reply is complete: the
/// server's time to answer (and the kernel's to carry it), with no decoding but the framing.
async fn server_only(path: &str, req: &MonitorRequests) -> std::io::Result<(f64, usize)> {
    use kubeovn_ovn::framing::{encode_request, FrameDecoder};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::UnixStream::connect(path).await?;
    let mut out = Vec::new();
    encode_request(
        &mut out,
        1,
        "monitor_cond_since",
        &(NB, "raw", req, kubeovn_ovn::Uuid::NIL),
    )
    .map_err(std::io::Error::other)?;
    let t0 = Instant::now();
    s.write_all(&out).await?;
    let mut dec = FrameDecoder::new();
    let mut total = 0;
    loop {
        let buf = dec.read_buffer(1 << 20);
        let n = s.read_buf(buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        total += n;
        if let Some(f) = dec.next_frame().map_err(std::io::Error::other)? {
            let len = f.len();
            return Ok((t0.elapsed().as_secs_f64(), len.max(total)));
        }
    }
}
