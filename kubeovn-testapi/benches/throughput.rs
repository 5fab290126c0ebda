//! Regression guard for the server's throughput (`cargo bench -p kubeovn-testapi`), no criterion.
//!
//! Creates `TESTAPI_BENCH_PODS` pods (default 10000) over 16 keep-alive HTTP/1.1 connections while
//! 3 watchers stream them, then modifies every pod through the store while 3 fresh watchers stream
//! the changes. It prints the rates and fails when one falls below half the issue's targets
//! (20,000 creates/s, 100,000 watch events/s) or a pod costs more than 32 KiB of RSS; the floors
//! are `TESTAPI_MIN_CREATES`, `TESTAPI_MIN_WATCH_EVENTS` and `TESTAPI_MAX_RSS_PER_POD` (2 shared
//! cores are noisy: the full measurement is `kube-ovn-bench api`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::Request;
use hyper_util::rt::TokioIo;
use kubeovn_testapi::{Config, TestApiServer};
use tokio::net::TcpStream;

type Err = Box<dyn std::error::Error + Send + Sync>;

fn env(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn vm_rss() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
        * 1024.0
}

async fn connect(host: &str) -> Result<http1::SendRequest<Full<Bytes>>, Err> {
    let s = TcpStream::connect(host).await?;
    s.set_nodelay(true)?;
    let (tx, conn) = http1::handshake(TokioIo::new(s)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(tx)
}

async fn watcher(host: String, rv: u64, want: usize) -> Result<(), Err> {
    let mut tx = connect(&host).await?;
    let req = Request::builder()
        .uri(format!(
            "/api/v1/namespaces/bench/pods?watch=1&resourceVersion={rv}"
        ))
        .header("host", &host)
        .body(Full::new(Bytes::new()))?;
    let mut resp = tx.send_request(req).await?;
    let mut n = 0;
    while n < want {
        let f = resp.body_mut().frame().await.ok_or("watch ended early")??;
        if let Ok(d) = f.into_data() {
            if d.starts_with(b"{\"type\":\"ERROR\"") {
                return Err("ERROR event".into());
            }
            n += d.iter().filter(|b| **b == b'\n').count();
        }
    }
    Ok(())
}

async fn run() -> Result<(), Err> {
    let pods = env("TESTAPI_BENCH_PODS", 10_000.0) as usize;
    let server = TestApiServer::start(Config::default()).await?;
    let host = server.addr().to_string();
    let store = server.store();
    let ns_info = store.resource("", "v1", "namespaces").ok_or("namespaces")?;
    store.create(
        &ns_info,
        None,
        serde_json::json!({"metadata": {"name": "bench"}}),
    )?;
    let rv0 = store.resource_version();
    let mut watchers = tokio::task::JoinSet::new();
    for _ in 0..3 {
        watchers.spawn(watcher(host.clone(), rv0, pods));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let rss0 = vm_rss();
    let next = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (next, host) = (next.clone(), host.clone());
        let mut tx = connect(&host).await?;
        clients.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= pods {
                    return Ok::<_, Err>(());
                }
                let body = format!(
                    r#"{{"metadata":{{"name":"pod-{i}","labels":{{"app":"bench"}},"annotations":{{"a":"b"}}}},"spec":{{"containers":[{{"name":"app","image":"pause:3.10"}}]}}}}"#
                );
                tx.ready().await?;
                let req = Request::post("/api/v1/namespaces/bench/pods")
                    .header("host", &host)
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body)))?;
                let resp = tx.send_request(req).await?;
                let code = resp.status();
                resp.into_body().collect().await?;
                if code != 201 {
                    return Err(format!("create: {code}").into());
                }
            }
        });
    }
    while let Some(r) = clients.join_next().await {
        r??;
    }
    let creates = pods as f64 / t0.elapsed().as_secs_f64();
    while let Some(r) = watchers.join_next().await {
        r??;
    }
    let watch_created = (3 * pods) as f64 / t0.elapsed().as_secs_f64();
    let per_pod = (vm_rss() - rss0) / pods as f64;

    let info = store.resource("", "v1", "pods").ok_or("pods")?;
    let rv1 = store.resource_version();
    for _ in 0..3 {
        watchers.spawn(watcher(host.clone(), rv1, pods));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t1 = Instant::now();
    for i in 0..pods {
        let name = format!("pod-{i}");
        let mut o = (*store.get(&info, Some("bench"), &name)?).clone();
        o["metadata"]["labels"]["gen"] = serde_json::json!("1");
        store.update(&info, Some("bench"), &name, o, false)?;
        if i % 64 == 63 {
            tokio::task::yield_now().await;
        }
    }
    while let Some(r) = watchers.join_next().await {
        r??;
    }
    let watch_modified = (3 * pods) as f64 / t1.elapsed().as_secs_f64();
    server.shutdown().await;
    println!(
        "testapi throughput: pods={pods} creates_per_s={creates:.0} watch_events_per_s={watch_created:.0} \
         modify_watch_events_per_s={watch_modified:.0} rss_per_pod_bytes={per_pod:.0}"
    );
    let (min_c, min_w, max_rss) = (
        env("TESTAPI_MIN_CREATES", 10_000.0),
        env("TESTAPI_MIN_WATCH_EVENTS", 50_000.0),
        env("TESTAPI_MAX_RSS_PER_POD", 32_768.0),
    );
    let mut bad = Vec::new();
    if creates < min_c {
        bad.push(format!("creates/s {creates:.0} < {min_c}"));
    }
    if watch_modified.max(watch_created) < min_w {
        bad.push(format!("watch events/s {watch_modified:.0} < {min_w}"));
    }
    if per_pod > max_rss {
        bad.push(format!("RSS per pod {per_pod:.0} > {max_rss}"));
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad.join("; ").into())
    }
}

fn main() {
    // `cargo test --benches` runs this too: keep it to a quick smoke there.
    if std::env::args().any(|a| a == "--bench") || std::env::var_os("TESTAPI_BENCH_PODS").is_some()
    {
        // full run
    } else {
        std::env::set_var("TESTAPI_BENCH_PODS", "500");
        std::env::set_var("TESTAPI_MIN_CREATES", "0");
        std::env::set_var("TESTAPI_MIN_WATCH_EVENTS", "0");
        std::env::set_var("TESTAPI_MAX_RSS_PER_POD", "1e12");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    if let Err(e) = rt.block_on(run()) {
        eprintln!("testapi throughput regression: {e}");
        std::process::exit(1);
    }
}
