//! `kube-ovn-monitor`: Prometheus metrics of the OVN databases. Every interval it connects (or stays
//! connected) to the northbound and southbound ovsdb-servers and times a one-row read transaction. Each
//! database is a reconnecting session over its comma-separated remotes (any member of a raft cluster): a
//! connection that died since the last round is replaced before the probe, so a restarted database is
//! reported up at the first round after its return.
//!
//! - `kube_ovn_monitor_db_connected{db}`: 1 while the database answers, else 0;
//! - `kube_ovn_monitor_db_transaction_seconds{db}`: histogram of the probe transactions' round trips;
//! - `kube_ovn_monitor_db_last_transaction_seconds{db}`: the last one;
//! - `kube_ovn_monitor_db_failures_total{db}`: failed connects and transactions.
//!
//! `--sandbox DIR` takes the addresses from a kube-ovn-sandbox state directory; `--once` prints one round
//! and exits (status 1 if a database is down).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kubeovn_ovn::metrics_http::MetricsEndpoint;
use kubeovn_ovn::ops::{Operation, Transaction};
use kubeovn_ovn::session::{Backoff, Session};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

const USAGE: &str =
    "usage: kube-ovn-monitor [--sandbox DIR | --ovn-nb-addr REMOTE --ovn-sb-addr REMOTE]
  [--listen IP:PORT (127.0.0.1:10661)] [--interval SECS (5)] [--once]";

type Labels = Vec<(&'static str, String)>;

struct Metrics {
    registry: Registry,
    connected: Family<Labels, Gauge>,
    txn: Family<Labels, Histogram, fn() -> Histogram>,
    last: Family<Labels, Gauge<f64, AtomicU64>>,
    failures: Family<Labels, Counter>,
}

fn histogram() -> Histogram {
    // 50 µs .. ~6.5 s.
    Histogram::new(exponential_buckets(0.00005, 2.0, 18))
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("kube_ovn_monitor");
        let connected = Family::<Labels, Gauge>::default();
        let txn: Family<Labels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(histogram);
        let last = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        let failures = Family::<Labels, Counter>::default();
        registry.register(
            "db_connected",
            "1 while the database answers",
            connected.clone(),
        );
        registry.register(
            "db_transaction_seconds",
            "Round trip of the probe transaction",
            txn.clone(),
        );
        registry.register(
            "db_last_transaction_seconds",
            "Round trip of the last probe transaction",
            last.clone(),
        );
        registry.register(
            "db_failures",
            "Failed connects and transactions",
            failures.clone(),
        );
        Metrics {
            registry,
            connected,
            txn,
            last,
            failures,
        }
    }

    fn render(&self) -> String {
        let mut s = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }
}

/// One monitored database.
struct Db {
    name: &'static str,
    schema: &'static str,
    table: &'static str,
    remote: String,
    session: Option<Session>,
}

impl Db {
    fn new(name: &'static str, schema: &'static str, table: &'static str, remote: String) -> Db {
        Db {
            name,
            schema,
            table,
            remote,
            session: None,
        }
    }

    /// The session, made on first success; it then reconnects by itself, trying the remotes for up to
    /// `timeout` per request.
    async fn session(&mut self, timeout: Duration) -> Result<Session, String> {
        if let Some(s) = &self.session {
            return Ok(s.clone());
        }
        let s = Session::builder(&self.remote)
            .map_err(|e| e.to_string())?
            .retry_for(Some(timeout))
            .backoff(Backoff {
                initial: Duration::from_millis(50),
                max: Duration::from_millis(500),
                factor: 2,
            })
            .connect();
        let s = tokio::time::timeout(timeout, s)
            .await
            .map_err(|_| format!("connect {}: timed out", self.remote))?
            .map_err(|e| format!("connect {}: {e}", self.remote))?;
        self.session = Some(s.clone());
        Ok(s)
    }

    /// Connects if needed and times one read; the round trip or why not.
    async fn probe(&mut self, timeout: Duration) -> Result<Duration, String> {
        let s = self.session(timeout).await?;
        let txn = Transaction::new(self.schema).op(Operation::select(self.table));
        // A connection that died without our noticing yet (the server restarted between rounds) fails its
        // first request: one more try on a fresh connection.
        let mut last = String::new();
        for _ in 0..2 {
            let c = tokio::time::timeout(timeout, s.client())
                .await
                .map_err(|_| format!("connect {}: timed out", self.remote))?
                .map_err(|e| format!("connect {}: {e}", self.remote))?;
            let t0 = Instant::now();
            match tokio::time::timeout(timeout, c.transact(&txn)).await {
                Ok(Ok(_)) => return Ok(t0.elapsed()),
                Ok(Err(e)) if e.is_connection_error() => {
                    c.close("probe failed");
                    last = format!("transact: {e}");
                }
                Ok(Err(e)) => return Err(format!("transact: {e}")),
                Err(_) => {
                    c.close("probe timed out");
                    return Err("transact: timed out".into());
                }
            }
        }
        Err(last)
    }
}

async fn round(dbs: &mut [Db], m: &Metrics) -> Vec<(&'static str, Result<Duration, String>)> {
    let mut out = Vec::new();
    for db in dbs.iter_mut() {
        let labels: Labels = vec![("db", db.name.to_owned())];
        let r = db.probe(Duration::from_secs(3)).await;
        match &r {
            Ok(d) => {
                m.connected.get_or_create(&labels).set(1);
                m.txn.get_or_create(&labels).observe(d.as_secs_f64());
                m.last.get_or_create(&labels).set(d.as_secs_f64());
            }
            Err(_) => {
                m.connected.get_or_create(&labels).set(0);
                m.failures.get_or_create(&labels).inc();
            }
        }
        out.push((db.name, r));
    }
    out
}

struct Args {
    nb: String,
    sb: String,
    listen: SocketAddr,
    interval: Duration,
    once: bool,
}

/// A database's remote in a kube-ovn-sandbox state directory: `unix:DIR/ovn/<sock>` (the sandbox's layout;
/// the sandbox's root test runs `--sandbox` against a real one).
fn sandbox_remote(dir: &std::path::Path, sock: &str) -> String {
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned());
    format!("unix:{}", dir.join("ovn").join(sock).display())
}

fn parse(args: Vec<String>) -> Result<Args, String> {
    let mut nb = None;
    let mut sb = None;
    let mut sandbox: Option<PathBuf> = None;
    let mut a = Args {
        nb: String::new(),
        sb: String::new(),
        listen: SocketAddr::from(([127, 0, 0, 1], 10661)),
        interval: Duration::from_secs(5),
        once: false,
    };
    let mut it = args.into_iter();
    while let Some(f) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{f} needs a value"));
        match f.as_str() {
            "--ovn-nb-addr" => nb = Some(value()?),
            "--ovn-sb-addr" => sb = Some(value()?),
            "--sandbox" => sandbox = Some(PathBuf::from(value()?)),
            "--listen" => a.listen = value()?.parse().map_err(|e| format!("--listen: {e}"))?,
            "--interval" => {
                let s: u64 = value()?.parse().map_err(|e| format!("--interval: {e}"))?;
                a.interval = Duration::from_secs(s.max(1));
            }
            "--once" => a.once = true,
            _ => return Err(USAGE.to_owned()),
        }
    }
    if let Some(d) = sandbox {
        nb = nb.or_else(|| Some(sandbox_remote(&d, "nb.sock")));
        sb = sb.or_else(|| Some(sandbox_remote(&d, "sb.sock")));
    }
    a.nb = nb.unwrap_or_else(|| "tcp:127.0.0.1:6641".into());
    a.sb = sb.unwrap_or_else(|| "tcp:127.0.0.1:6642".into());
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1).collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kube-ovn-monitor: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        let m = Arc::new(Metrics::new());
        let mut dbs = vec![
            Db::new("nb", "OVN_Northbound", "NB_Global", args.nb.clone()),
            Db::new("sb", "OVN_Southbound", "SB_Global", args.sb.clone()),
        ];
        if args.once {
            let mut ok = true;
            for (name, r) in round(&mut dbs, &m).await {
                match r {
                    Ok(d) => println!(
                        "{name}: connected, transaction {:.3} ms",
                        d.as_secs_f64() * 1e3
                    ),
                    Err(e) => {
                        ok = false;
                        println!("{name}: DOWN: {e}");
                    }
                }
            }
            print!("{}", m.render());
            return if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            };
        }
        let mr = m.clone();
        // Kept for the process's life: dropping it stops the endpoint.
        let _endpoint =
            match MetricsEndpoint::bind(args.listen, Arc::new(move || mr.render())).await {
                Ok(e) => {
                    eprintln!(
                        "kube-ovn-monitor: metrics on http://{}/metrics",
                        e.local_addr()
                    );
                    e
                }
                Err(e) => {
                    eprintln!("kube-ovn-monitor: listen {}: {e}", args.listen);
                    return ExitCode::FAILURE;
                }
            };
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("kube-ovn-monitor: {e}");
                    return ExitCode::FAILURE;
                }
            };
        loop {
            for (name, r) in round(&mut dbs, &m).await {
                if let Err(e) = r {
                    eprintln!("kube-ovn-monitor: {name}: {e}");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(args.interval) => {}
                _ = term.recv() => return ExitCode::SUCCESS,
                _ = tokio::signal::ctrl_c() => return ExitCode::SUCCESS,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_addresses() {
        let a = parse(vec!["--sandbox".into(), "/tmp/x".into(), "--once".into()]).expect("args");
        assert_eq!(a.nb, "unix:/tmp/x/ovn/nb.sock");
        assert_eq!(a.sb, "unix:/tmp/x/ovn/sb.sock");
        assert!(a.once);
        assert!(parse(vec!["--bogus".into()]).is_err());
    }

    #[tokio::test]
    async fn a_missing_database_is_down() {
        let m = Metrics::new();
        let mut dbs = vec![Db::new(
            "nb",
            "OVN_Northbound",
            "NB_Global",
            "unix:/nonexistent/nb.sock".into(),
        )];
        let r = round(&mut dbs, &m).await;
        assert!(r[0].1.is_err());
        let text = m.render();
        assert!(
            text.contains("kube_ovn_monitor_db_connected{db=\"nb\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("kube_ovn_monitor_db_failures_total{db=\"nb\"} 1"),
            "{text}"
        );
    }

    fn connected(m: &Metrics) -> bool {
        m.render()
            .contains("kube_ovn_monitor_db_connected{db=\"nb\"} 1")
    }

    /// A northbound killed and restarted between two rounds is up at the next round (the connection the
    /// previous round used is dead: it is replaced, not reported as a failure), and down while it is down.
    #[tokio::test]
    async fn a_restarted_database_is_up_at_the_next_round() {
        let schema = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../kubeovn-ovn/schemas/ovn-nb.ovsschema"
        );
        let Some(mut srv) =
            ovn_common::OvsdbServer::start(schema, ovn_common::Storage::Standalone, false)
        else {
            return;
        };
        let m = Metrics::new();
        let mut dbs = vec![Db::new(
            "nb",
            "OVN_Northbound",
            "NB_Global",
            srv.unix_remote(),
        )];
        assert!(round(&mut dbs, &m).await[0].1.is_ok());
        assert!(connected(&m));
        srv.restart();
        let r = round(&mut dbs, &m).await;
        assert!(r[0].1.is_ok(), "{:?}", r[0].1);
        assert!(connected(&m));
        srv.kill9();
        assert!(round(&mut dbs, &m).await[0].1.is_err());
        assert!(!connected(&m));
        srv.restart();
        assert!(round(&mut dbs, &m).await[0].1.is_ok());
        assert!(connected(&m));
    }
}

#[cfg(test)]
use kubeovn_test_support::ovsdb as ovn_common;
