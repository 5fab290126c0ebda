//! A small operator on the OVN northbound database: connects, ensures a switch, a router, the patch pair
//! between them and two pod ports (one idempotent transaction), then watches the replica and prints every
//! row change until it has seen N of them or the timeout passes.
//!
//! ```text
//! cargo run -p kubeovn-examples --example nb_operator -- unix:/var/run/ovn/ovnnb_db.sock [--events N] [--timeout SECS]
//! ```
//!
//! It prints `event <insert|modify|delete> <table> <name or uuid>` lines, then `done events=<n>`; it exits 0
//! once N events were seen (N = 0: after the build), 1 on a timeout, 2 on bad arguments or errors. Changes
//! made by anyone (ovn-nbctl, another controller) show up, not only its own.

use std::process::ExitCode;
use std::time::Duration;

use kubeovn_ovn::cache::{EventKind, RowEvent};
use kubeovn_ovn::northbound::{
    Batch, LogicalSwitch, Northbound, OvsdbNorthbound, Patch, Router, SwitchPort,
};
use tokio::sync::broadcast::error::RecvError;

const USAGE: &str = "usage: nb_operator REMOTE [--events N] [--timeout SECS]";

fn describe(e: &RowEvent) -> String {
    let kind = match e.kind {
        EventKind::Insert => "insert",
        EventKind::Modify => "modify",
        EventKind::Delete => "delete",
    };
    let row = e.new.as_ref().or(e.old.as_ref());
    let name = row.map(|r| r.get_str("name")).filter(|n| !n.is_empty());
    match name {
        Some(n) => format!("event {kind} {} {n}", e.table),
        None => format!("event {kind} {} {}", e.table, e.uuid),
    }
}

/// The desired state: a subnet's switch patched to the cluster router, and two pods on it.
fn desired() -> Batch {
    let mut b = Batch::new();
    b.add(
        LogicalSwitch::new("demo")
            .subnet("10.99.0.0/24")
            .exclude_ips(["10.99.0.1"]),
    );
    b.add(Router::new("demo-router"));
    b.patch(Patch::new(
        "demo",
        "demo-router",
        "0a:58:0a:63:00:01",
        ["10.99.0.1/24"],
    ));
    for i in 2..4 {
        b.add(
            SwitchPort::new("demo", format!("pod{i}.demo"))
                .addresses([format!("0a:58:0a:63:00:{i:02x} 10.99.0.{i}")])
                .external_id("pod", format!("demo/pod{i}")),
        );
    }
    b
}

async fn run(remote: &str, want: usize, timeout: Duration) -> Result<bool, kubeovn_ovn::Error> {
    let nb = OvsdbNorthbound::connect(remote).await?;
    // Subscribe before writing, so that our own changes are among the events.
    let mut events = nb.cache().subscribe();
    nb.commit(desired()).await?;
    println!(
        "built: switch demo ({} ports), router demo-router",
        nb.switch_port_names("demo").len()
    );
    let deadline = tokio::time::Instant::now() + timeout;
    let mut seen = 0;
    while seen < want {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Ok(e)) => {
                seen += 1;
                println!("{}", describe(&e));
            }
            Ok(Err(RecvError::Lagged(n))) => println!("missed {n} events (slow reader)"),
            Ok(Err(RecvError::Closed)) => break,
            Err(_) => break,
        }
    }
    println!("done events={seen}");
    Ok(seen >= want)
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut remote, mut want, mut secs) = (None, 10usize, 30u64);
    while let Some(a) = args.next() {
        let num = |v: Option<String>| v.and_then(|s| s.parse().ok());
        match a.as_str() {
            "--events" => match num(args.next()) {
                Some(n) => want = n as usize,
                None => return usage(),
            },
            "--timeout" => match num(args.next()) {
                Some(n) => secs = n,
                None => return usage(),
            },
            _ if remote.is_none() && !a.starts_with('-') => remote = Some(a),
            _ => return usage(),
        }
    }
    let Some(remote) = remote else { return usage() };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nb_operator: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(run(&remote, want, Duration::from_secs(secs))) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("nb_operator: {e}");
            ExitCode::from(2)
        }
    }
}

fn usage() -> ExitCode {
    eprintln!("{USAGE}");
    ExitCode::from(2)
}
