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
//! and exits (status 1 if a database is down). `--help` lists the flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use kube_ovn_cmd::log::LogArgs;
use kube_ovn_cmd::metrics::MetricsEndpoint;
use kubeovn_ovn::ops::{Operation, Transaction};
use kubeovn_ovn::session::{Backoff, Session};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

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

/// The monitor's flags.
#[derive(Debug, Parser)]
#[command(
    name = "kube-ovn-monitor",
    version,
    about = "Prometheus metrics of the OVN databases: NB/SB connection state and transaction latency"
)]
struct Cli {
    /// Northbound database: REMOTE[,REMOTE...] (default: the sandbox's, else tcp:127.0.0.1:6641)
    #[arg(long = "ovn-nb-addr", value_name = "REMOTES")]
    ovn_nb_addr: Option<String>,
    /// Southbound database: REMOTE[,REMOTE...] (default: the sandbox's, else tcp:127.0.0.1:6642)
    #[arg(long = "ovn-sb-addr", value_name = "REMOTES")]
    ovn_sb_addr: Option<String>,
    /// A kube-ovn-sandbox state directory: its databases' sockets
    #[arg(long, value_name = "DIR")]
    sandbox: Option<PathBuf>,
    /// Prometheus endpoint
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:10661")]
    listen: SocketAddr,
    /// Seconds between rounds (at least 1)
    #[arg(long, value_name = "SECS", default_value_t = 5)]
    interval: u64,
    /// Print one round (and the metrics) and exit: status 1 if a database is down
    #[arg(long)]
    once: bool,
    /// Logs.
    #[command(flatten)]
    log: LogArgs,
}

struct Args {
    nb: String,
    sb: String,
    listen: SocketAddr,
    interval: Duration,
    once: bool,
    log: LogArgs,
}

/// A database's remote in a kube-ovn-sandbox state directory: `unix:DIR/ovn/<sock>` (the sandbox's layout;
/// the sandbox's root test runs `--sandbox` against a real one).
fn sandbox_remote(dir: &std::path::Path, sock: &str) -> String {
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned());
    format!("unix:{}", dir.join("ovn").join(sock).display())
}

impl From<Cli> for Args {
    fn from(c: Cli) -> Args {
        let from_sandbox = |sock| c.sandbox.as_deref().map(|d| sandbox_remote(d, sock));
        Args {
            nb: c
                .ovn_nb_addr
                .clone()
                .or_else(|| from_sandbox("nb.sock"))
                .unwrap_or_else(|| "tcp:127.0.0.1:6641".into()),
            sb: c
                .ovn_sb_addr
                .clone()
                .or_else(|| from_sandbox("sb.sock"))
                .unwrap_or_else(|| "tcp:127.0.0.1:6642".into()),
            listen: c.listen,
            interval: Duration::from_secs(c.interval.max(1)),
            once: c.once,
            log: c.log,
        }
    }
}

fn main() -> ExitCode {
    let args = Args::from(Cli::parse());
    args.log.init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kube-ovn-monitor: tokio runtime: {e}");
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
                    tracing::info!("metrics on http://{}/metrics", e.local_addr());
                    e
                }
                Err(e) => {
                    eprintln!("kube-ovn-monitor: --listen {}: {e}", args.listen);
                    return ExitCode::FAILURE;
                }
            };
        let stop = kube_ovn_cmd::shutdown_signal();
        tokio::pin!(stop);
        loop {
            for (name, r) in round(&mut dbs, &m).await {
                if let Err(e) = r {
                    tracing::warn!(db = name, error = %e, "probe failed");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(args.interval) => {}
                _ = &mut stop => return ExitCode::SUCCESS,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeovn_test_support::ovsdb as ovn_common;

    fn parse(flags: &[&str]) -> Result<Args, clap::Error> {
        Cli::try_parse_from(std::iter::once("kube-ovn-monitor").chain(flags.iter().copied()))
            .map(Args::from)
    }

    #[test]
    fn sandbox_addresses() {
        <Cli as clap::CommandFactory>::command().debug_assert();
        let a = parse(&["--sandbox", "/tmp/x", "--once"]).expect("args");
        assert_eq!(a.nb, "unix:/tmp/x/ovn/nb.sock");
        assert_eq!(a.sb, "unix:/tmp/x/ovn/sb.sock");
        assert!(a.once);
        let a = parse(&[
            "--sandbox=/tmp/x",
            "--ovn-nb-addr=tcp:127.0.0.1:1",
            "--interval=0",
        ])
        .expect("args");
        assert_eq!(a.nb, "tcp:127.0.0.1:1");
        assert_eq!(a.sb, "unix:/tmp/x/ovn/sb.sock");
        assert_eq!(a.interval, Duration::from_secs(1));
        assert!(!a.once);
        let a = parse(&[]).expect("defaults");
        assert_eq!(
            (a.nb.as_str(), a.sb.as_str()),
            ("tcp:127.0.0.1:6641", "tcp:127.0.0.1:6642")
        );
        assert_eq!(a.listen, SocketAddr::from(([127, 0, 0, 1], 10661)));
        let e = parse(&["--bogus"]).err().expect("refused");
        assert!(e.to_string().contains("--bogus"), "{e}");
        let e = parse(&["--listen", "nowhere"]).err().expect("refused");
        assert!(e.to_string().contains("--listen"), "{e}");
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
