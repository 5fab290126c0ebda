//! Embedding kubeovn-ipam in another CNI plugin or operator: one dual-stack subnet, a few pods, a static IP,
//! a named pool, a release, and the snapshot a plugin would persist between calls.
//!
//! `cargo run -p kubeovn-examples --example ipam_embed`

use std::net::IpAddr;

use kubeovn_ipam::{AllocRequest, Allocation, Ipam, IpamError, PoolSpec, SubnetSpec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A fixed seed makes the MACs reproducible; `Ipam::new()` seeds from the OS.
    let mut ipam = Ipam::with_seed(2024);

    // The subnet as Kube-OVN's Subnet CRD writes it.
    let spec = SubnetSpec::new(
        "ovn-default",
        "10.16.0.0/16,fd00:10:16::/64",
        "10.16.0.1,fd00:10:16::1",
    )
    .exclude(["10.16.0.2..10.16.0.10"])
    .gateway_mac("0a:58:0a:10:00:01".parse()?);
    ipam.add_or_update_subnet(&spec)?;

    // Next-free allocation for two pods; asking again gives the same answer.
    for pod in ["default/web-0", "default/web-1"] {
        let a = ipam.allocate("ovn-default", &AllocRequest::new(pod, "eth0"))?;
        println!(
            "{pod}: {} {} {}",
            a.v4.unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
            a.v6.map_or(String::new(), |v| v.to_string()),
            a.mac
        );
    }

    // A static IPv4 address (the IPv6 one is next-free), then someone else wanting the same address.
    let fixed: [IpAddr; 1] = ["10.16.0.100".parse()?];
    let db = ipam.allocate(
        "ovn-default",
        &AllocRequest::new("default/db-0", "eth0").static_ips(&fixed),
    )?;
    println!("default/db-0: static {:?}", db.v4);
    match ipam.allocate(
        "ovn-default",
        &AllocRequest::new("default/intruder", "eth0").static_ips(&fixed),
    ) {
        Err(IpamError::Conflict { owner, .. }) => {
            println!("default/intruder: refused, 10.16.0.100 belongs to {owner}")
        }
        other => println!("unexpected: {other:?}"),
    }

    // A named pool (Kube-OVN IPPool): pool pods come from it, other pods never do.
    ipam.add_or_update_pool(
        "ovn-default",
        &PoolSpec::new(
            "batch",
            ["10.16.200.0/30", "fd00:10:16::200..fd00:10:16::203"],
        ),
    )?;
    let job = ipam.allocate(
        "ovn-default",
        &AllocRequest::new("batch/job-0", "eth0").pool("batch"),
    )?;
    println!("batch/job-0: {:?} {:?} from pool batch", job.v4, job.v6);

    // Release, and the statistics Kube-OVN shows in the subnet status.
    ipam.release("ovn-default", "default/web-0", "eth0")?;
    let st = ipam.stats("ovn-default")?;
    println!(
        "v4 using {} ({}), available {}",
        st.v4.using, st.v4.using_range, st.v4.available
    );
    for p in &st.pools {
        println!(
            "pool {}: v4 available {} ({})",
            p.name, p.v4.available, p.v4.available_range
        );
    }

    // Persist and reload, as a CNI plugin does around each call.
    let json = serde_json::to_string(&ipam.snapshot())?;
    println!("snapshot: {} bytes of JSON", json.len());
    let mut reloaded = Ipam::from_snapshot(&serde_json::from_str(&json)?)?;
    assert_eq!(reloaded.snapshot(), ipam.snapshot());

    // A controller restarting rebuilds from every source it has; contradictions are reported, not applied.
    let mut fresh = Ipam::with_seed(1);
    fresh.add_or_update_subnet(&spec)?;
    let records: Vec<Allocation> = reloaded
        .subnet("ovn-default")
        .into_iter()
        .flat_map(|s| {
            s.iter()
                .map(|n| Allocation::new("ovn-default", n.pod, n.nic, n.addrs))
                .collect::<Vec<_>>()
        })
        .chain([Allocation {
            subnet: "ovn-default".into(),
            pod: "stale/pod".into(),
            nic: "eth0".into(),
            v4: db.v4,
            ..Default::default()
        }])
        .collect();
    let report = fresh.restore(records);
    println!(
        "restore: {} records applied, {} conflicts",
        report.restored,
        report.conflicts.len()
    );
    for c in &report.conflicts {
        println!("  {}/{}: {}", c.record.pod, c.record.nic, c.error);
    }

    // The reloaded state goes on exactly where it left off.
    let next = reloaded.allocate("ovn-default", &AllocRequest::new("default/web-2", "eth0"))?;
    println!("default/web-2 after reload: {:?}", next.v4);
    Ok(())
}
