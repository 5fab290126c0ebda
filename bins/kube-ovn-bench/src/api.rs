//! `kube-ovn-bench api`: throughput of the in-memory test API server (`kube-ovn-testapi`).
//!
//! `kube-ovn-bench api [--url http://127.0.0.1:PORT [--server-pid PID] | --in-process] [--pods N]
//! [--watchers W] [--concurrency C] [--modify M]` creates a namespace, then `N` pods over HTTP/1.1 on
//! `C` keep-alive connections while `W` watchers stream `?watch=1&resourceVersion=...` on pods and count
//! events. Then (watch-only) `M` modifications of the pre-created pods (direct store updates in-process,
//! merge patches over HTTP with `--url`) are streamed to `W` fresh watchers. It prints one line of
//! `key=value` pairs: `creates_per_s`, `create_p50_us`/`create_p99_us`, `watch_events_per_s` (events
//! delivered to all watchers / time from the first create until the last watcher saw the last event),
//! `modify_watch_events_per_s`, and the server's memory: `rss_*` from `VmRSS` (`/proc/self/status`, or
//! `/proc/PID/status` with `--server-pid`) and, in-process, `heap_per_pod_bytes` from the counting
//! allocator (live heap delta over the creates, client buffers included, after the watchers are done).
//! `create_cpu_us`/`modify_cpu_us` are this process's CPU time per operation (server and client
//! together in-process): steadier than the rates on a shared machine.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::builder::TypedValueParser as _;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// `api` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// A running kube-ovn-testapi (default: one in this process)
    #[arg(
        long,
        value_name = "http://127.0.0.1:PORT",
        conflicts_with = "in_process"
    )]
    url: Option<String>,
    /// Run the server in this process (the default)
    #[arg(long = "in-process")]
    in_process: bool,
    /// The server's pid, for its memory (with --url)
    #[arg(long = "server-pid", value_name = "PID", requires = "url")]
    server_pid: Option<u32>,
    /// Pods created
    #[arg(long, value_name = "N", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    pods: usize,
    /// Watchers streaming the pods' events
    #[arg(long, value_name = "W", default_value_t = 3)]
    watchers: usize,
    /// Keep-alive connections creating pods
    #[arg(long, value_name = "C", default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    concurrency: usize,
    /// Modifications streamed to fresh watchers (default: as many as pods)
    #[arg(long, value_name = "M")]
    modify: Option<usize>,
}

type Err = Box<dyn std::error::Error + Send + Sync>;

/// VmRSS in bytes of `pid` (or this process).
fn vm_rss(pid: Option<u32>) -> u64 {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".to_owned(),
    };
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

/// A realistic small pod.
fn pod_json(i: usize) -> Vec<u8> {
    format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"pod-{i}","namespace":"bench","labels":{{"app":"bench","pod-template-hash":"7d9f8c6b5","bench/index":"{i}"}},"annotations":{{"ovn.kubernetes.io/logical_switch":"ovn-default","kubectl.kubernetes.io/default-container":"app"}}}},"spec":{{"containers":[{{"name":"app","image":"registry.k8s.io/pause:3.10","ports":[{{"containerPort":8080,"protocol":"TCP"}}],"resources":{{"requests":{{"cpu":"10m","memory":"16Mi"}}}}}}],"nodeName":"node-{}","restartPolicy":"Always"}}}}"#,
        i % 8
    )
    .into_bytes()
}

/// One keep-alive HTTP/1.1 connection.
struct Conn {
    tx: http1::SendRequest<Full<Bytes>>,
    host: String,
}

impl Conn {
    async fn open(host: &str) -> Result<Self, Err> {
        let stream = TcpStream::connect(host).await?;
        stream.set_nodelay(true)?;
        let (tx, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn {
            tx,
            host: host.to_owned(),
        })
    }

    async fn call(
        &mut self,
        method: Method,
        path: &str,
        ct: &str,
        body: Vec<u8>,
    ) -> Result<(u16, Bytes), Err> {
        self.tx.ready().await?;
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.host)
            .header("content-type", ct)
            .body(Full::new(Bytes::from(body)))?;
        let resp = self.tx.send_request(req).await?;
        let code = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((code, body))
    }
}

fn rv_of(body: &[u8]) -> Result<String, Err> {
    let v: serde_json::Value = serde_json::from_slice(body)?;
    v.pointer("/metadata/resourceVersion")
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| "no resourceVersion in the answer".into())
}

/// Streams a pod watch from `rv`, counting event lines until `want`; returns when it saw them.
async fn watcher(host: String, rv: String, want: usize, seen: Arc<AtomicUsize>) -> Result<(), Err> {
    let stream = TcpStream::connect(&host).await?;
    stream.set_nodelay(true)?;
    let (mut tx, conn) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = Request::builder()
        .uri(format!(
            "/api/v1/namespaces/bench/pods?watch=1&resourceVersion={rv}"
        ))
        .header("host", &host)
        .body(Full::new(Bytes::new()))?;
    let mut resp = tx.send_request(req).await?;
    let mut n = 0usize;
    let mut errors = 0usize;
    while n < want {
        let Some(frame) = resp.body_mut().frame().await else {
            return Err(format!("watch ended after {n} of {want} events").into());
        };
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        n += data.iter().filter(|b| **b == b'\n').count();
        // An ERROR event (sent alone, or last in a small chunk) ends the run.
        if data.starts_with(b"{\"type\":\"ERROR\"")
            || (data.len() < 4096 && data.windows(16).any(|w| w == b"{\"type\":\"ERROR\"\","))
        {
            errors += 1;
        }
        seen.fetch_add(1, Ordering::Relaxed);
        if errors > 0 {
            return Err(format!("watch got an ERROR event after {n} events").into());
        }
    }
    Ok(())
}

fn pct(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Runs `n` requests made by `make(i)` on `c` connections; returns (wall seconds, sorted latencies in µs).
async fn drive(
    host: &str,
    n: usize,
    c: usize,
    make: impl Fn(usize) -> (Method, String, &'static str, Vec<u8>, u16) + Send + Sync + 'static,
) -> Result<(f64, Vec<u32>), Err> {
    let next = Arc::new(AtomicUsize::new(0));
    let make = Arc::new(make);
    let mut set = tokio::task::JoinSet::new();
    let t0 = Instant::now();
    for _ in 0..c.min(n) {
        let (next, make) = (next.clone(), make.clone());
        let mut conn = Conn::open(host).await?;
        set.spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, Err>(lat);
                }
                let (m, path, ct, body, want) = make(i);
                let t = Instant::now();
                let (code, answer) = conn.call(m, &path, ct, body).await?;
                lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
                if code != want {
                    return Err(
                        format!("{path}: {code} {}", String::from_utf8_lossy(&answer)).into(),
                    );
                }
            }
        });
    }
    let mut all = Vec::with_capacity(n);
    while let Some(r) = set.join_next().await {
        all.extend(r??);
    }
    let wall = t0.elapsed().as_secs_f64();
    all.sort_unstable();
    Ok((wall, all))
}

async fn run(a: Args) -> Result<String, Err> {
    let rss_start = vm_rss(a.server_pid);
    let (server, host, pid) = match &a.url {
        Some(u) => (
            None,
            u.trim_start_matches("http://")
                .trim_end_matches('/')
                .to_owned(),
            a.server_pid,
        ),
        None => {
            let s =
                kubeovn_testapi::TestApiServer::start(kubeovn_testapi::Config::default()).await?;
            let h = s.addr().to_string();
            (Some(s), h, None)
        }
    };
    let mut ctl = Conn::open(&host).await?;
    let (code, body) = ctl
        .call(
            Method::POST,
            "/api/v1/namespaces",
            "application/json",
            br#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"bench"}}"#.to_vec(),
        )
        .await?;
    if code != 201 {
        return Err(format!(
            "creating the namespace: {code} {}",
            String::from_utf8_lossy(&body)
        )
        .into());
    }
    let rv0 = rv_of(&body)?;
    let n = a.pods;
    let w = a.watchers;
    let frames = Arc::new(AtomicUsize::new(0));

    // Phase 1: creates with watchers.
    let mut watchers = tokio::task::JoinSet::new();
    for _ in 0..w {
        watchers.spawn(watcher(host.clone(), rv0.clone(), n, frames.clone()));
    }
    // Let the watch requests reach the server before timing.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let rss_before = vm_rss(pid);
    let heap_before = crate::live();
    let cpu0 = crate::cpu_s(None);
    let t0 = Instant::now();
    let (create_wall, lat) = drive(&host, n, a.concurrency, |i| {
        (
            Method::POST,
            "/api/v1/namespaces/bench/pods".to_owned(),
            "application/json",
            pod_json(i),
            201,
        )
    })
    .await?;
    while let Some(r) = watchers.join_next().await {
        r??;
    }
    let watch_wall = t0.elapsed().as_secs_f64();
    let cpu1 = crate::cpu_s(None);
    let heap_after = crate::live();
    let rss_after = vm_rss(pid);
    let frames1 = frames.swap(0, Ordering::Relaxed);

    // Phase 2: watch-only; modify pre-created pods rapidly, fresh watchers count MODIFIED events.
    let (code, body) = ctl
        .call(
            Method::GET,
            "/api/v1/namespaces/bench/pods?limit=1",
            "application/json",
            Vec::new(),
        )
        .await?;
    if code != 200 {
        return Err(format!("list: {code}").into());
    }
    let rv1 = rv_of(&body)?;
    let m = a.modify.filter(|m| *m > 0).unwrap_or(a.pods);
    for _ in 0..w {
        watchers.spawn(watcher(host.clone(), rv1.clone(), m, frames.clone()));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let cpu2 = crate::cpu_s(None);
    let t1 = Instant::now();
    let modify_wall = match &server {
        Some(s) => {
            let store = s.store();
            let info = store.resource("", "v1", "pods").ok_or("no pods resource")?;
            let t = Instant::now();
            for i in 0..m {
                let name = format!("pod-{}", i % n);
                let cur = store.get(&info, Some("bench"), &name)?;
                let mut obj = (*cur).clone();
                obj["metadata"]["labels"]["bench/gen"] = serde_json::json!(i.to_string());
                store.update(&info, Some("bench"), &name, obj, false)?;
                if i % 64 == 63 {
                    tokio::task::yield_now().await;
                }
            }
            t.elapsed().as_secs_f64()
        }
        None => {
            drive(&host, m, a.concurrency, move |i| {
                (
                    Method::PATCH,
                    format!("/api/v1/namespaces/bench/pods/pod-{}", i % n),
                    "application/merge-patch+json",
                    format!(r#"{{"metadata":{{"labels":{{"bench/gen":"{i}"}}}}}}"#).into_bytes(),
                    200,
                )
            })
            .await?
            .0
        }
    };
    while let Some(r) = watchers.join_next().await {
        r??;
    }
    let modify_watch_wall = t1.elapsed().as_secs_f64();
    let cpu3 = crate::cpu_s(None);
    let frames2 = frames.load(Ordering::Relaxed);
    if let Some(s) = server {
        s.shutdown().await;
    }
    let heap = if a.url.is_none() {
        format!(
            " heap_per_pod_bytes={:.0}",
            heap_after.saturating_sub(heap_before) as f64 / n as f64
        )
    } else {
        String::new()
    };
    Ok(format!(
        "pods={n} watchers={w} concurrency={} creates_per_s={:.0} create_p50_us={} create_p99_us={} \
         create_wall_s={create_wall:.3} watch_events_per_s={:.0} watch_wall_s={watch_wall:.3} \
         watch_frames={frames1} create_cpu_us={:.1} modify={m} modify_per_s={:.0} modify_watch_events_per_s={:.0} \
         modify_watch_wall_s={modify_watch_wall:.3} modify_frames={frames2} modify_cpu_us={:.1} \
         rss_source=VmRSS rss_start_bytes={rss_start} rss_before_bytes={rss_before} \
         rss_after_bytes={rss_after} rss_per_pod_bytes={:.0}{heap}",
        a.concurrency,
        n as f64 / create_wall,
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        (n * w) as f64 / watch_wall,
        (cpu1 - cpu0) * 1e6 / n as f64,
        m as f64 / modify_wall,
        (m * w) as f64 / modify_watch_wall,
        (cpu3 - cpu2) * 1e6 / m as f64,
        rss_after.saturating_sub(rss_before) as f64 / n as f64,
    ))
}

/// Runs the `api` mode on a two-worker runtime and prints its line.
pub fn main(a: Args) -> std::process::ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kube-ovn-bench: runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(a)) {
        Ok(line) => {
            println!("{line}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kube-ovn-bench api: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        a: Args,
    }

    fn parse(flags: &[&str]) -> Result<Args, clap::Error> {
        <Cli as clap::Parser>::try_parse_from(std::iter::once("api").chain(flags.iter().copied()))
            .map(|c| c.a)
    }

    #[test]
    fn args_and_pod() {
        let a = parse(&["--pods", "100", "--concurrency=4"]).unwrap();
        assert_eq!(
            (a.pods, a.concurrency, a.watchers, a.modify),
            (100, 4, 3, None)
        );
        assert!(parse(&["--pods", "0"])
            .unwrap_err()
            .to_string()
            .contains("--pods"));
        assert!(
            parse(&["--server-pid", "1"]).is_err(),
            "--server-pid needs --url"
        );
        let v: serde_json::Value = serde_json::from_slice(&pod_json(3)).unwrap();
        assert_eq!(v["metadata"]["name"], "pod-3");
    }

    /// A tiny end-to-end run against the in-process server (a smoke test, not timed).
    #[test]
    fn smoke() {
        let a = parse(&["--pods", "50", "--concurrency", "4"]).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let line = rt.block_on(run(a)).unwrap();
        assert!(line.contains("creates_per_s="), "{line}");
    }
}
