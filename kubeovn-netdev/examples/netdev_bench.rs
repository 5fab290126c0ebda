//! Per-pod cost of the netlink plumbing, comparable with `cni-peers.sh -s ip` (raw `ip`, veth peer created in
//! the netns): netns create; veth with the pod end created in place + address + lo/eth0 up + default route + host
//! end up; then link delete + netns delete. Everything runs in namespaces the bench creates (the node side in its
//! own "node" netns); pod addresses are 10.85.x.y, only inside those namespaces.
//!
//! `cargo run --release -p kubeovn-netdev --example netdev_bench -- [-n PODS]` (root; default 200 pods).

use std::time::{Duration, Instant};

use kubeovn_netdev::{Mac, NamedNetns, Namespaces, Netdev, NetlinkNetdev, RouteSpec, VethSpec};

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

fn row(name: &str, mut v: Vec<Duration>) {
    v.sort();
    let mean = v.iter().map(Duration::as_secs_f64).sum::<f64>() / v.len().max(1) as f64 * 1e3;
    println!(
        "{name:<48} n={:<4} p50={:>7.3}ms p90={:>7.3}ms p99={:>7.3}ms max={:>7.3}ms mean={:>7.3}ms",
        v.len(),
        percentile(&v, 0.5),
        percentile(&v, 0.9),
        percentile(&v, 0.99),
        percentile(&v, 1.0),
        mean
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = match args.iter().position(|a| a == "-n") {
        Some(i) => args.get(i + 1).ok_or("-n needs a value")?.parse()?,
        None => 200,
    };
    let status = std::fs::read_to_string("/proc/self/status")?;
    if !status
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
    {
        println!("skip: the bench needs root (network namespaces, veth pairs)");
        return Ok(());
    }

    let tag = format!("nb{}", std::process::id() % 10_000);
    let names = NamedNetns::default();
    let node_name = format!("{tag}-node");
    let node_path = names.create(&node_name)?;
    let node = NetlinkNetdev::open(&node_path)?;
    node.set_link_up("lo", true).await?;

    let (mut t_ns, mut t_open, mut t_veth, mut t_cfg, mut t_pod, mut t_total) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let gw = "10.85.0.1".parse()?;
    let result = async {
        for i in 0..n {
            let ns = format!("{tag}-p{i}");
            let host = format!("{tag}h{i}");
            let ip = format!("10.85.{}.{}/16", (i + 2) / 256, (i + 2) % 256).parse()?;
            let mac: Mac =
                format!("0a:58:0a:55:{:02x}:{:02x}", (i + 2) / 256, (i + 2) % 256).parse()?;

            let t0 = Instant::now();
            let path = names.create(&ns)?;
            let t1 = Instant::now();
            node.create_veth(&VethSpec::new(&host, "eth0", &path).peer_mac(mac))
                .await?;
            let t2 = Instant::now();
            let pod = NetlinkNetdev::open(&path)?;
            let t3 = Instant::now();
            pod.add_address("eth0", ip).await?;
            pod.set_link_up("eth0", true).await?;
            pod.set_link_up("lo", true).await?;
            pod.add_route(&RouteSpec::default_via(gw)).await?;
            node.set_link_up(&host, true).await?;
            let t4 = Instant::now();
            drop(pod);
            t_ns.push(t1 - t0);
            t_veth.push(t2 - t1);
            t_open.push(t3 - t2);
            t_cfg.push(t4 - t3);
            t_pod.push(t4 - t1);
            t_total.push(t4 - t0);
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    }
    .await;

    let (mut t_del, mut t_link_del, mut t_ns_del) = (vec![], vec![], vec![]);
    for i in 0..n {
        let t0 = Instant::now();
        let _ = node.delete_link(&format!("{tag}h{i}")).await;
        let t1 = Instant::now();
        let _ = names.delete(&format!("{tag}-p{i}"));
        t_link_del.push(t1 - t0);
        t_ns_del.push(t1.elapsed());
        t_del.push(t0.elapsed());
    }
    drop(node);
    names.delete(&node_name)?;
    result?;

    println!("kubeovn-netdev, {n} pods, one at a time (node side in its own netns)");
    row("netns create (unshare + bind mount)", t_ns);
    row("veth create, peer in the pod netns", t_veth);
    row("open pod netns handle (thread + setns + socket)", t_open);
    row("addr + eth0/lo up + default route + host up", t_cfg);
    row("veth + open + addr + up + route (netns exists)", t_pod);
    row("netns + veth + addr + up + route", t_total);
    row("link del (veth, both ends)", t_link_del);
    row("netns del (umount + unlink)", t_ns_del);
    row("link del + netns del", t_del);
    Ok(())
}
