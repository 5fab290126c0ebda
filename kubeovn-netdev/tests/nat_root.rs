//! Root test of [`Netdev::set_nat`]: a client, a router that masquerades and a server, each in a network namespace
//! this test creates with the crate's own API (and removes in a Drop guard, also on panic), and real TCP in both
//! families: the peer address the server's `accept` sees tells whether the router masqueraded.
//!
//! The server has a route back to the client's subnet only in the cases that need one, so an un-NATed handshake
//! cannot complete while it has none. When `nft` is installed it checks the tables the router holds (`nft -j list
//! table`), run from a thread inside the router's namespace; without it, the TCP checks alone run. When not root,
//! the test says why it skips and returns (fails under CI).

use std::fs::File;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ipnetwork::IpNetwork;
use kubeovn_netdev::{
    Error, NatAction, NatPolicyRule, NatRules, NatSource, NetOp, Netdev, NetlinkNetdev, RouteSpec,
    VethSpec,
};
use nix::sched::{setns, CloneFlags};
use serde_json::Value;

mod common;

use kubeovn_test_support::skip;

use common::TestNs;

/// Returns from the test when it cannot run here ([`skip::skip`]: a failure under CI).
macro_rules! require_root {
    () => {
        if !skip::is_root() {
            skip::skip(
                "not root: network namespaces and nftables need CAP_SYS_ADMIN and CAP_NET_ADMIN",
            );
            return;
        }
    };
}

/// Runs `f` on a new thread inside the namespace at `path` (sockets it opens and programs it starts live there).
fn in_netns<T: Send + 'static>(path: &Path, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = File::open(path).expect("open netns");
    std::thread::spawn(move || {
        setns(&ns, CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
    .join()
    .expect("thread in netns")
}

fn cidr(s: &str) -> IpNetwork {
    s.parse().expect("cidr")
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

/// One family's addressing: the client's subnet behind the router, the router's and the server's segment.
struct Plan {
    pods: IpNetwork,
    client: IpAddr,
    router_in: IpNetwork,
    router_out: IpNetwork,
    server: IpNetwork,
    /// Neither the pods nor the server: a destination policy rules name without matching the server.
    elsewhere: IpNetwork,
}

fn plans() -> [Plan; 2] {
    [
        Plan {
            pods: cidr("10.77.0.0/24"),
            client: ip("10.77.0.2"),
            router_in: cidr("10.77.0.1/24"),
            router_out: cidr("198.51.100.1/24"),
            server: cidr("198.51.100.2/24"),
            elsewhere: cidr("203.0.113.0/24"),
        },
        Plan {
            pods: cidr("fd77::/64"),
            client: ip("fd77::2"),
            router_in: cidr("fd77::1/64"),
            router_out: cidr("2001:db8:100::1/64"),
            server: cidr("2001:db8:100::2/64"),
            elsewhere: cidr("2001:db8:ffff::/48"),
        },
    ]
}

/// The server's segment as a network.
fn outside(p: &Plan) -> IpNetwork {
    IpNetwork::new(p.server.network(), p.server.prefix()).expect("network")
}

/// Opens a TCP connection from the client's namespace to the server's and returns the peer address the server's
/// `accept` saw, or `None` when no connection came (an un-NATed handshake without a route back).
fn tcp_peer(client: &Path, server: &Path, to: IpAddr) -> Option<IpAddr> {
    let (port_tx, port_rx) = std::sync::mpsc::channel();
    let server_path = server.to_owned();
    let srv = std::thread::spawn(move || {
        in_netns(&server_path, move || {
            let l = TcpListener::bind(SocketAddr::new(to, 0)).expect("listen");
            l.set_nonblocking(true).expect("nonblocking");
            port_tx
                .send(l.local_addr().expect("addr").port())
                .expect("port");
            let deadline = Instant::now() + Duration::from_secs(4);
            while Instant::now() < deadline {
                match l.accept() {
                    Ok((_, peer)) => return Some(peer.ip()),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            }
            None
        })
    });
    let port = port_rx.recv().expect("the server listens");
    let cli = in_netns(client, move || {
        TcpStream::connect_timeout(&SocketAddr::new(to, port), Duration::from_secs(3))
    });
    let seen = srv.join().expect("server thread");
    drop(cli);
    seen
}

/// The rules of `nft -j list table FAMILY TABLE` run inside `ns`, in nft syntax, or `None` when the table does not
/// exist. Also checks the chain is the NAT base chain `set_nat` makes.
fn nft_rules(ns: &Path, family: &'static str, table: &str) -> Option<Vec<String>> {
    let table = table.to_string();
    let out = in_netns(ns, move || {
        Command::new("nft")
            .args(["-j", "list", "table", family, &table])
            .output()
            .expect("run nft")
    });
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("No such file or directory"), "nft: {err}");
        return None;
    }
    let v: Value = serde_json::from_slice(&out.stdout).expect("nft -j output is JSON");
    let items = v["nftables"].as_array().expect("nftables array");
    let chains: Vec<&Value> = items.iter().filter_map(|i| i.get("chain")).collect();
    assert_eq!(chains.len(), 1, "one chain: {v}");
    let c = chains[0];
    assert_eq!(
        (&c["name"], &c["type"], &c["hook"], &c["prio"], &c["policy"]),
        (
            &Value::from("postrouting"),
            &Value::from("nat"),
            &Value::from("postrouting"),
            &Value::from(100),
            &Value::from("accept")
        ),
        "{c}"
    );
    let rules = items
        .iter()
        .filter_map(|i| i.get("rule"))
        .map(|r| {
            let words: Vec<String> = r["expr"]
                .as_array()
                .expect("expr")
                .iter()
                .map(|e| {
                    if let Some(m) = e.get("match") {
                        assert_eq!(m["op"], "==", "{e}");
                        let p = &m["left"]["payload"];
                        let right = match &m["right"] {
                            Value::String(a) => a.clone(),
                            r => format!(
                                "{}/{}",
                                r["prefix"]["addr"].as_str().expect("addr"),
                                r["prefix"]["len"]
                            ),
                        };
                        format!(
                            "{} {} {right}",
                            p["protocol"].as_str().expect("protocol"),
                            p["field"].as_str().expect("field")
                        )
                    } else if e.get("masquerade").is_some() {
                        "masquerade".into()
                    } else if e.get("return").is_some() {
                        "return".into()
                    } else {
                        panic!("unexpected expression {e}")
                    }
                })
                .collect();
            words.join(" ")
        })
        .collect();
    Some(rules)
}

#[tokio::test]
async fn root_set_nat_masquerades_leaving_traffic_over_real_tcp() {
    require_root!();
    let nft = skip::installed("nft");
    if !nft {
        // Not a skip (that fails under CI): the TCP checks stand on their own.
        let _ = std::io::stderr().write_all(
            b"NOTE: nft is not installed: the router's tables are checked over TCP only\n",
        );
    }
    let client_ns = TestNs::new("nat-c");
    let router_ns = TestNs::new("nat-r");
    let server_ns = TestNs::new("nat-s");
    let [v4, v6] = plans();
    let table = "kotest-nat";

    // The router: one veth to each neighbour, the far ends created directly in their namespaces.
    let router = NetlinkNetdev::open(&router_ns.path).expect("open router netns");
    for (name, ns) in [("to-client", &client_ns), ("to-server", &server_ns)] {
        router
            .create_veth(&VethSpec::new(name, "eth0", &ns.path).host_up())
            .await
            .expect("veth");
    }
    router
        .apply(&[
            NetOp::up("lo"),
            NetOp::sysctl("net.ipv4.ip_forward", "1"),
            NetOp::sysctl("net.ipv6.conf.all.forwarding", "1"),
            NetOp::address("to-client", v4.router_in),
            NetOp::address("to-server", v4.router_out),
            NetOp::address_no_dad("to-client", v6.router_in),
            NetOp::address_no_dad("to-server", v6.router_out),
        ])
        .await
        .expect("router");
    let client = NetlinkNetdev::open(&client_ns.path).expect("open client netns");
    client
        .apply(&[
            NetOp::up("lo"),
            NetOp::address("eth0", cidr("10.77.0.2/24")),
            NetOp::address_no_dad("eth0", cidr("fd77::2/64")),
            NetOp::up("eth0"),
            NetOp::AddRoute(RouteSpec::default_via(v4.router_in.ip())),
            NetOp::AddRoute(RouteSpec::default_via(v6.router_in.ip())),
        ])
        .await
        .expect("client");
    // The server: its own segment only, no route back to the client (yet).
    let server = NetlinkNetdev::open(&server_ns.path).expect("open server netns");
    server
        .apply(&[
            NetOp::up("lo"),
            NetOp::address("eth0", v4.server),
            NetOp::address_no_dad("eth0", v6.server),
            NetOp::up("eth0"),
        ])
        .await
        .expect("server");

    let source = |p: &Plan, rules: Vec<NatPolicyRule>| NatSource {
        cidr: p.pods,
        rules,
    };
    let peer = |p: &Plan| tcp_peer(&client_ns.path, &server_ns.path, p.server.ip());
    let listed = |family| {
        if nft {
            nft_rules(&router_ns.path, family, table)
        } else {
            None
        }
    };

    // Masquerade both subnets; twice, as a daemon resyncing does.
    let masq = NatRules {
        cluster: vec![v4.pods, v6.pods],
        sources: vec![source(&v4, vec![]), source(&v6, vec![])],
    };
    router.set_nat(table, &masq).await.expect("set nat");
    router.set_nat(table, &masq).await.expect("set nat again");
    if nft {
        assert_eq!(
            listed("ip").expect("ip table"),
            [
                "ip daddr 10.77.0.0/24 return",
                "ip saddr 10.77.0.0/24 masquerade"
            ]
        );
        assert_eq!(
            listed("ip6").expect("ip6 table"),
            [
                "ip6 daddr fd77::/64 return",
                "ip6 saddr fd77::/64 masquerade"
            ]
        );
    }
    for p in [&v4, &v6] {
        assert_eq!(
            peer(p),
            Some(p.router_out.ip()),
            "the server sees the router's address for {}",
            p.pods
        );
    }

    // From here on the server can answer the client directly: what it sees is what the router did.
    for p in [&v4, &v6] {
        server
            .add_route(&RouteSpec::via(p.pods, p.router_out.ip()))
            .await
            .expect("route back");
    }

    // A policy rule that does not match the server: still masqueraded.
    let miss = |p: &Plan| NatPolicyRule {
        src: vec![],
        dst: vec![p.elsewhere],
        action: NatAction::Forward,
    };
    let rules = NatRules {
        cluster: vec![v4.pods, v6.pods],
        sources: vec![source(&v4, vec![miss(&v4)]), source(&v6, vec![miss(&v6)])],
    };
    router.set_nat(table, &rules).await.expect("set nat");
    for p in [&v4, &v6] {
        assert_eq!(
            peer(p),
            Some(p.router_out.ip()),
            "no rule matched {}",
            p.pods
        );
    }

    // Forward toward the server's segment (first match wins over a later Masquerade for it): the client's own
    // address arrives.
    let forward = |p: &Plan| {
        vec![
            NatPolicyRule {
                src: vec![IpNetwork::from(p.client)],
                dst: vec![outside(p)],
                action: NatAction::Forward,
            },
            NatPolicyRule {
                src: vec![],
                dst: vec![outside(p)],
                action: NatAction::Masquerade,
            },
        ]
    };
    let rules = NatRules {
        cluster: vec![v4.pods, v6.pods],
        sources: vec![source(&v4, forward(&v4)), source(&v6, forward(&v6))],
    };
    router.set_nat(table, &rules).await.expect("set nat");
    if nft {
        assert_eq!(
            listed("ip").expect("ip table"),
            [
                "ip daddr 10.77.0.0/24 return",
                "ip saddr 10.77.0.0/24 ip saddr 10.77.0.2 ip daddr 198.51.100.0/24 return",
                "ip saddr 10.77.0.0/24 ip daddr 198.51.100.0/24 masquerade",
                "ip saddr 10.77.0.0/24 masquerade",
            ]
        );
        assert_eq!(
            listed("ip6").expect("ip6 table"),
            [
                "ip6 daddr fd77::/64 return",
                "ip6 saddr fd77::/64 ip6 saddr fd77::2 ip6 daddr 2001:db8:100::/64 return",
                "ip6 saddr fd77::/64 ip6 daddr 2001:db8:100::/64 masquerade",
                "ip6 saddr fd77::/64 masquerade",
            ]
        );
    }
    for p in [&v4, &v6] {
        assert_eq!(peer(p), Some(p.client), "forwarded as is from {}", p.client);
    }

    // The server's segment in the cluster's CIDRs: never masqueraded.
    let rules = NatRules {
        cluster: vec![v4.pods, outside(&v4), v6.pods, outside(&v6)],
        sources: vec![source(&v4, vec![]), source(&v6, vec![])],
    };
    router.set_nat(table, &rules).await.expect("set nat");
    for p in [&v4, &v6] {
        assert_eq!(peer(p), Some(p.client), "inside the cluster: {}", p.server);
    }

    // IPv4 only: the ip6 table goes.
    let rules = NatRules {
        cluster: vec![v4.pods, v6.pods],
        sources: vec![source(&v4, vec![])],
    };
    router.set_nat(table, &rules).await.expect("set nat");
    if nft {
        assert_eq!(listed("ip").expect("ip table").len(), 2);
        assert_eq!(listed("ip6"), None, "no IPv6 source, no ip6 table");
    }
    assert_eq!(peer(&v4), Some(v4.router_out.ip()));
    assert_eq!(peer(&v6), Some(v6.client));

    // Nothing: both tables go, and going again is success.
    router
        .set_nat(table, &NatRules::default())
        .await
        .expect("remove");
    router
        .set_nat(table, &NatRules::default())
        .await
        .expect("remove again");
    if nft {
        assert_eq!(listed("ip"), None, "the ip table is gone");
        assert_eq!(listed("ip6"), None, "the ip6 table is gone");
    }
    for p in [&v4, &v6] {
        assert_eq!(peer(p), Some(p.client), "no NAT left for {}", p.pods);
    }

    // A bad name is refused before anything is sent.
    let e = router.set_nat("", &masq).await.expect_err("empty name");
    assert!(matches!(e, Error::InvalidTableName { .. }), "{e}");
}
