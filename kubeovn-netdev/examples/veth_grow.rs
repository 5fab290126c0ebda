//! The daemon's per-pod plumbing as the node fills up, without OVS: one `create_veth` per pod with the steps
//! kube-ovn-daemon's ADD gives it (host end up and without IPv6 addresses; pod end MAC, MTU, TX checksum off,
//! no IPv6 addresses, address, lo and eth0 up, default route), pods one at a time, latency per 100 pods.
//! Every other pod goes without the TX checksum step, so one run gives that step's cost at the same node size
//! and noise (`tx off` and `tx on` columns). `--sysctl` runs the same with the `disable_ipv6` sysctls the
//! daemon used before: in a new namespace the first `/proc/sys/net` lookup walks one entry per namespace on
//! the node, so that variant grows with the pods.
//!
//! `cargo run --release -p kubeovn-netdev --example veth_grow -- [-n PODS] [--sysctl]` (root; default 500).
//! Host ends go in the root namespace (as the daemon's do), pods' addresses (10.86.x.y) only in their own.

use std::time::{Duration, Instant};

use kubeovn_netdev::{
    Mac, NamedNetns, Namespaces, NetOp, Netdev, NetlinkNetdev, RouteSpec, VethSpec,
};

fn ms(v: &[Duration], p: f64) -> f64 {
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = match args.iter().position(|a| a == "-n") {
        Some(i) => args.get(i + 1).ok_or("-n needs a value")?.parse()?,
        None => 500,
    };
    let sysctl = args.iter().any(|a| a == "--sysctl");
    if !std::fs::read_to_string("/proc/self/status")?
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
    {
        println!("skip: the bench needs root (network namespaces, veth pairs)");
        return Ok(());
    }
    let names = NamedNetns::default();
    let node = NetlinkNetdev::current()?;
    let tag = format!("vg{}", std::process::id() % 10_000);
    let gw = "10.86.0.1".parse()?;
    println!(
        "create_veth as the daemon's ADD, {n} pods one at a time{}",
        if sysctl {
            ", with disable_ipv6 sysctls"
        } else {
            ""
        }
    );
    let result = async {
        // [with the TX checksum step, without]
        let mut lat = [Vec::new(), Vec::new()];
        for i in 0..n {
            let path = names.create(&format!("{tag}-{i}"))?;
            let host = format!("{tag}h{i}");
            let mac: Mac = format!("0a:58:0a:56:{:02x}:{:02x}", i / 256, i % 256).parse()?;
            let ip = format!("10.86.{}.{}/16", (i + 2) / 256, (i + 2) % 256).parse()?;
            let fixed = [
                NetOp::SetMac {
                    link: "eth0".into(),
                    mac,
                },
                NetOp::SetMtu {
                    link: "eth0".into(),
                    mtu: 1400,
                },
            ];
            let last = [
                NetOp::up("lo"),
                NetOp::up("eth0"),
                NetOp::AddRoute(RouteSpec::default_via(gw)),
            ];
            let tx_off = i % 2 == 0;
            let spec = VethSpec::new(&host, "eth0", &path)
                .mtu(1400)
                .peer_mac(mac)
                .peer_then(fixed)
                .peer_then(tx_off.then(|| NetOp::tx_checksum_off("eth0")));
            let spec = if sysctl {
                spec.then([
                    NetOp::sysctl_if_present(format!("net/ipv6/conf/{host}/disable_ipv6"), "1"),
                    NetOp::up(&host),
                ])
                .peer_then([
                    NetOp::sysctl_if_present("net/ipv6/conf/eth0/disable_ipv6", "1"),
                    NetOp::address("eth0", ip),
                ])
            } else {
                spec.host_up()
                    .then([NetOp::ipv6_addr_gen_none(&host)])
                    .peer_then([
                        NetOp::ipv6_addr_gen_none("eth0"),
                        NetOp::address_no_dad("eth0", ip),
                    ])
            };
            let t0 = Instant::now();
            node.create_veth(&spec.peer_then(last)).await?;
            lat[usize::from(!tx_off)].push(t0.elapsed());
            if (i + 1) % 100 == 0 || i + 1 == n {
                let mut line = format!("  pods {:>4}..{:<4}", (i / 100) * 100, i + 1);
                for (label, l) in ["tx off", "tx on"].iter().zip(lat.iter_mut()) {
                    l.sort();
                    line.push_str(&format!(
                        "  {label}: p50 {:.3} ms p90 {:.3} ms p99 {:.3} ms",
                        ms(l, 0.5),
                        ms(l, 0.9),
                        ms(l, 0.99)
                    ));
                    l.clear();
                }
                println!("{line}");
            }
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    }
    .await;
    for i in 0..n {
        let _ = node.delete_link(&format!("{tag}h{i}")).await;
        let _ = names.delete(&format!("{tag}-{i}"));
    }
    result
}
