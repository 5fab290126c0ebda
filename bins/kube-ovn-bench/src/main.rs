//! `kube-ovn-bench`: benchmarks speaking the interfaces of the peer-bench scripts.
//!
//! `kube-ovn-bench nb --db unix:SOCK [--server-pid PID] [--batch K] [--window W] [--ls LS] create N | delete |
//! lookup N | sync N` creates ports `pod-<i>.bench` on `ls0` exactly as `nb_rpc.py` does (one transaction per
//! port, `W` in flight (default 100), or `K` ports per transaction, 4 in flight by default), deletes every port of the switch, measures cache
//! lookups and memory, or times the initial sync of an N-row northbound database (built first if the database
//! is smaller: switches with 94 pod ports and a router port each, one router, a port group and two ACLs per
//! switch); it prints one line of `key=value` pairs (`wall_s`, `client_cpu_s`, the transactions' round trip
//! `p50_ms`/`p99_ms`, ...). Connection set-up (connect, schema, initial cache sync) is not timed, except by
//! `sync`.
//!
//! `kube-ovn-bench api ...` measures the in-memory test API server (see the `api` module). `--help` lists
//! the flags of each.

mod api;
mod sync;

use std::process::ExitCode;

use clap::builder::TypedValueParser as _;
use clap::{Parser, Subcommand, ValueEnum};
use std::time::{Duration, Instant};

use kubeovn_ovn::northbound::{Batch, Northbound, OvsdbNorthbound, SwitchPort};
use kubeovn_ovn::Error;

/// Counts live heap bytes, to measure the replica's memory exactly (RSS keeps freed parse buffers).
struct Counting;

static LIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

// The one unsafe item of this benchmark binary: GlobalAlloc is an unsafe trait; this forwards to mimalloc
// (the allocator kube-ovn-controller ships with) and only counts.
#[allow(unsafe_code)]
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        LIVE.fetch_add(l.size(), std::sync::atomic::Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { mimalloc::MiMalloc.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        LIVE.fetch_sub(l.size(), std::sync::atomic::Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { mimalloc::MiMalloc.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

pub(crate) fn live() -> usize {
    LIVE.load(std::sync::atomic::Ordering::Relaxed)
}

/// The benchmarks.
#[derive(Debug, Parser)]
#[command(
    name = "kube-ovn-bench",
    version,
    about = "Benchmarks of kubeovn-rs components"
)]
struct Cli {
    #[command(subcommand)]
    bench: Bench,
    /// Logs (on stderr; the result line is on stdout).
    #[command(flatten)]
    log: kube_ovn_cmd::log::LogArgs,
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// kubeovn-ovn's Northbound API against an ovsdb-server, as nb_rpc.py's interface
    Nb(NbFlags),
    /// The in-memory test API server: creates and watch events
    Api(api::Args),
}

/// What `nb` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Create N ports
    Create,
    /// Delete every port of the switch
    Delete,
    /// Cache lookups and memory of N ports
    Lookup,
    /// The initial sync of an N-row database
    Sync,
}

/// `nb` flags.
#[derive(Debug, clap::Args)]
struct NbFlags {
    /// The northbound database
    #[arg(long, value_name = "unix:SOCK")]
    db: String,
    /// The ovsdb-server's pid, for its CPU time
    #[arg(long = "server-pid", value_name = "PID")]
    server_pid: Option<u32>,
    /// Ports per transaction
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    batch: usize,
    /// Transactions in flight (default: 100 for one port per transaction, 4 for batches)
    #[arg(long, value_name = "W", value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    window: Option<usize>,
    /// The logical switch
    #[arg(long, value_name = "LS", default_value = "ls0")]
    ls: String,
    /// What to measure
    #[arg(value_enum)]
    mode: Mode,
    /// Ports (create, lookup) or rows (sync)
    #[arg(value_name = "N", required_if_eq_any = [("mode", "create"), ("mode", "lookup"), ("mode", "sync")])]
    n: Option<usize>,
}

#[derive(Debug)]
struct Args {
    db: String,
    server_pid: Option<u32>,
    batch: usize,
    /// Transactions in flight (None: 100 for one port per transaction, 4 for batches).
    window: Option<usize>,
    ls: String,
    mode: String,
    n: usize,
}

impl From<NbFlags> for Args {
    fn from(f: NbFlags) -> Args {
        let mode = match f.mode {
            Mode::Create => "create",
            Mode::Delete => "delete",
            Mode::Lookup => "lookup",
            Mode::Sync => "sync",
        };
        Args {
            db: f.db,
            server_pid: f.server_pid,
            batch: f.batch,
            window: f.window,
            ls: f.ls,
            mode: mode.to_owned(),
            n: f.n.unwrap_or(0),
        }
    }
}

/// User+system CPU seconds of a process (`self` or a pid) from /proc (USER_HZ is 100 on Linux).
pub(crate) fn cpu_s(pid: Option<u32>) -> f64 {
    let path = match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".to_owned(),
    };
    let Ok(s) = std::fs::read_to_string(path) else {
        return 0.0;
    };
    let Some(rest) = s.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (t(11) + t(12)) as f64 / 100.0
}

/// Resident memory in bytes.
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 4096
}

fn ip_of(i: usize) -> String {
    let i = i + 2;
    format!("10.100.{}.{}", (i >> 8) & 255, i & 255)
}

fn mac_of(i: usize) -> String {
    format!(
        "0a:58:64:{:02x}:{:02x}:{:02x}",
        (i >> 16) & 255,
        (i >> 8) & 255,
        i & 255
    )
}

/// The port nb_rpc.py creates for index `i`.
fn port(ls: &str, i: usize) -> SwitchPort {
    SwitchPort::new(ls, format!("pod-{i}.bench"))
        .addresses([format!("{} {}", mac_of(i), ip_of(i))])
        .external_id("ls", ls)
        .external_id("pod", format!("bench/pod-{i}"))
        .external_id("vendor", "kube-ovn")
}

/// Commits `batches` with at most `window` transactions in flight; returns each commit's latency (request
/// to reply and cache update), sorted.
async fn run(
    nb: &OvsdbNorthbound,
    batches: Vec<Batch>,
    window: usize,
) -> Result<Vec<Duration>, Error> {
    let mut set = tokio::task::JoinSet::new();
    let mut lat = Vec::with_capacity(batches.len());
    let joined = |r: Result<Result<Duration, Error>, tokio::task::JoinError>| {
        r.map_err(|e| Error::Disconnected(e.to_string()))?
    };
    for b in batches {
        while set.len() >= window {
            if let Some(r) = set.join_next().await {
                lat.push(joined(r)?);
            }
        }
        let nb = nb.clone();
        set.spawn(async move {
            let t0 = Instant::now();
            nb.commit(b).await.map(|_| t0.elapsed())
        });
    }
    while let Some(r) = set.join_next().await {
        lat.push(joined(r)?);
    }
    lat.sort_unstable();
    Ok(lat)
}

/// The `q` quantile of sorted latencies, in milliseconds.
fn quantile_ms(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e3
}

fn chunk(ops: Vec<SwitchPort>, k: usize) -> Vec<Batch> {
    let mut out = Vec::new();
    let mut b = Batch::new();
    for op in ops {
        b.add(op);
        if b.len() >= k {
            out.push(std::mem::take(&mut b));
        }
    }
    if !b.is_empty() {
        out.push(b);
    }
    out
}

async fn main_async(a: Args) -> Result<String, Error> {
    if a.mode == "sync" {
        // Its own connections (the first sync is what it measures).
        return sync::main(&a.db, a.n, a.server_pid).await;
    }
    let rss0 = rss();
    let nb = OvsdbNorthbound::connect(&a.db).await?;
    let rss_loaded = rss();
    match a.mode.as_str() {
        "create" | "delete" => {
            let batches = if a.mode == "create" {
                chunk((0..a.n).map(|i| port(&a.ls, i)).collect(), a.batch)
            } else {
                let mut out = Vec::new();
                let names = nb.switch_port_names(&a.ls);
                for c in names.chunks(a.batch) {
                    let mut b = Batch::new();
                    for n in c {
                        b.delete_switch_port(n.clone());
                    }
                    out.push(b);
                }
                out
            };
            let n: usize = batches.iter().map(Batch::len).sum();
            let txns = batches.len();
            let (s0, c0, t0) = (cpu_s(a.server_pid), cpu_s(None), Instant::now());
            // Batches of 100 ports: a few in flight keep ovsdb-server busy; more only queue replies and
            // update notifications behind each other (measured: 100 in flight was ~35% slower than 4).
            let window = a.window.unwrap_or(if a.batch > 1 { 4 } else { 100 });
            let lat = run(&nb, batches, window).await?;
            let wall = t0.elapsed().as_secs_f64();
            let (c1, s1) = (cpu_s(None), cpu_s(a.server_pid));
            Ok(format!(
                "wall_s={wall:.3} n={n} rate={:.0} server_cpu_s={:.2} client_cpu_s={:.2} txns={txns} window={} \
                 batch={} p50_ms={:.3} p99_ms={:.3} cached_ports={}",
                n as f64 / wall.max(1e-9),
                s1 - s0,
                c1 - c0,
                window,
                a.batch,
                quantile_ms(&lat, 0.5),
                quantile_ms(&lat, 0.99),
                nb.cache().len("Logical_Switch_Port"),
            ))
        }
        _ => {
            // lookup N: make sure N ports exist (batched), then a fresh replica measures memory and lookups.
            if nb.cache().len("Logical_Switch_Port") < a.n {
                run(
                    &nb,
                    chunk((0..a.n).map(|i| port(&a.ls, i)).collect(), 1000),
                    4,
                )
                .await?;
            }
            drop(nb);
            let before = rss();
            let live0 = live();
            let nb2 = OvsdbNorthbound::connect(&a.db).await?;
            let live1 = live();
            let after = rss();
            let cache = nb2.cache();
            let names: Vec<String> = (0..a.n).map(|i| format!("pod-{i}.bench")).collect();
            let pods: Vec<String> = (0..a.n).map(|i| format!("bench/pod-{i}")).collect();
            let rounds = (1_000_000 / a.n.max(1)).max(1);
            let t0 = Instant::now();
            let mut hits = 0usize;
            for _ in 0..rounds {
                for n in &names {
                    hits += usize::from(cache.lookup("Logical_Switch_Port", "name", n).is_some());
                }
            }
            let by_name = t0.elapsed().as_secs_f64() * 1e9 / (rounds * a.n) as f64;
            let t0 = Instant::now();
            for _ in 0..rounds {
                for p in &pods {
                    hits += usize::from(
                        cache
                            .lookup_map("Logical_Switch_Port", "external_ids", "pod", p)
                            .is_some(),
                    );
                }
            }
            let by_pod = t0.elapsed().as_secs_f64() * 1e9 / (rounds * a.n) as f64;
            let t0 = Instant::now();
            for _ in 0..rounds.min(10) {
                for n in &names {
                    hits += usize::from(nb2.switch_port(n).is_some());
                }
            }
            let typed = t0.elapsed().as_secs_f64() * 1e9 / (rounds.min(10) * a.n) as f64;
            Ok(format!(
                "n={} lookup_name_ns={by_name:.0} lookup_external_id_ns={by_pod:.0} typed_lookup_ns={typed:.0} \
                 hits={hits} heap_per_port_bytes={:.0} rss_per_port_bytes={:.0} connect_rss_bytes={}",
                a.n,
                live1.saturating_sub(live0) as f64 / a.n.max(1) as f64,
                after.saturating_sub(before) as f64 / a.n.max(1) as f64,
                rss_loaded.saturating_sub(rss0),
            ))
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    cli.log.init();
    let a = match cli.bench {
        Bench::Api(a) => return api::main(a),
        Bench::Nb(f) => Args::from(f),
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kube-ovn-bench: runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(main_async(a)) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kube-ovn-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_match_nb_rpc() {
        // nb_rpc.py: mac_of(0) = 0a:58:64:00:00:00, ip_of(0) = 10.100.0.2, ip_of(300) = 10.100.1.46
        assert_eq!(mac_of(0), "0a:58:64:00:00:00");
        assert_eq!(ip_of(0), "10.100.0.2");
        assert_eq!(ip_of(300), "10.100.1.46");
        assert_eq!(mac_of(70000), "0a:58:64:01:11:70");
    }

    fn parse(flags: &[&str]) -> Result<Args, clap::Error> {
        let cli =
            Cli::try_parse_from(std::iter::once("kube-ovn-bench").chain(flags.iter().copied()))?;
        match cli.bench {
            Bench::Nb(f) => Ok(Args::from(f)),
            Bench::Api(_) => panic!("not nb"),
        }
    }

    #[test]
    fn args() {
        <Cli as clap::CommandFactory>::command().debug_assert();
        let a = parse(&[
            "nb",
            "--batch",
            "100",
            "--db",
            "unix:/x",
            "--server-pid",
            "7",
            "create",
            "2000",
        ])
        .unwrap();
        assert_eq!(
            (a.batch, a.n, a.mode.as_str(), a.server_pid),
            (100, 2000, "create", Some(7))
        );
        // peer-bench's order: CMD --db unix:SOCK --server-pid PID create N, CMD ... delete.
        let a = parse(&[
            "nb",
            "--window",
            "1",
            "--db=unix:/x",
            "--server-pid",
            "7",
            "delete",
        ])
        .unwrap();
        assert_eq!((a.mode.as_str(), a.window), ("delete", Some(1)));
        let e = parse(&["nb", "--db", "unix:/x", "create"]).unwrap_err();
        assert!(e.to_string().contains("<N>"), "{e}");
        let e = parse(&["nb", "create", "5"]).unwrap_err();
        assert!(e.to_string().contains("--db"), "{e}");
        let e = parse(&["nb", "--db", "unix:/x", "--batch", "0", "create", "5"]).unwrap_err();
        assert!(e.to_string().contains("--batch"), "{e}");
    }
}
