//! Node-side source NAT, what Kube-OVN's daemon does for a Subnet with `natOutgoing: true`: pods' traffic leaving
//! the cluster through the node is masqueraded to the node's address. [`NatRules`] says what; [`compile`] turns
//! it into the rules of one nftables family, [`batch`] into the netlink batch replacing the table in both
//! families, and [`commit`] sends it on a `NETLINK_NETFILTER` socket of the calling thread's namespace (see
//! [`crate::Netdev::set_nat`]).
//!
//! The ruleset of a family (IPv4 shown), table `<table>`, chain `postrouting` (type nat, hook postrouting,
//! priority srcnat, policy accept):
//!
//! ```text
//! ip daddr <cluster CIDR> return                                      each cluster CIDR
//! ip saddr <source> [ip saddr <src>] [ip daddr <dst>] masquerade|return  each policy rule of each source
//! ip saddr <source> masquerade                                       each source
//! ```

use std::sync::atomic::{AtomicU32, Ordering};
use std::{fmt, io};

use ipnetwork::IpNetwork;
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};

use crate::error::{Error, Result};
use crate::nft::{self, Answer, Batch, Family, Field, Match, Rule, Verdict};

/// What a node masquerades: pods' traffic from `sources` to anywhere but `cluster`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatRules {
    /// Destinations never masqueraded (the cluster's own CIDRs: pod subnets, join subnet, service CIDRs).
    pub cluster: Vec<IpNetwork>,
    /// Sources masqueraded when they leave for elsewhere, in order.
    pub sources: Vec<NatSource>,
}

/// One masqueraded source CIDR (a Subnet with natOutgoing) and its policy rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatSource {
    /// The Subnet's CIDR: traffic from it is masqueraded unless a policy rule says otherwise.
    pub cidr: IpNetwork,
    /// The Subnet's `natOutgoingPolicyRules`, in order: the first that matches decides.
    pub rules: Vec<NatPolicyRule>,
}

/// Kube-OVN's natOutgoingPolicyRules entry: first match wins; no match: masquerade.
///
/// A list with entries of the other address family only never matches in this family (the rule is left out of
/// its table); an empty list matches anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatPolicyRule {
    /// Source CIDRs, any of which matches (empty: any source).
    pub src: Vec<IpNetwork>,
    /// Destination CIDRs, any of which matches (empty: any destination).
    pub dst: Vec<IpNetwork>,
    /// What a matching packet gets.
    pub action: NatAction,
}

/// What a policy rule does to the packets it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NatAction {
    /// Masquerade: the source becomes the node's address on the outgoing interface.
    Masquerade,
    /// Forward: leave the source address as it is.
    Forward,
}

/// The longest table name nftables takes (`NFT_NAME_MAXLEN - 1`).
pub(crate) const MAX_TABLE_NAME: usize = 255;

/// Checks an nftables table name: not empty, at most 255 bytes, no NUL.
pub(crate) fn validate_table_name(name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        "empty"
    } else if name.len() > MAX_TABLE_NAME {
        "longer than 255 bytes"
    } else if name.contains('\0') {
        "holds a NUL byte"
    } else {
        return Ok(());
    };
    Err(Error::InvalidTableName {
        name: name.to_string(),
        reason,
    })
}

/// The entries of `list` in `family` as alternatives: `[None]` (anything) for an empty list, no alternative at
/// all when the list only holds the other family. A `/0` is anything.
fn alternatives(list: &[IpNetwork], family: Family, field: Field) -> Vec<Option<Match>> {
    if list.is_empty() {
        return vec![None];
    }
    list.iter()
        .filter(|n| Family::of(n) == family)
        .map(|n| Match::new(field, *n))
        .collect()
}

/// The rules of `family`'s table for `rules`, in chain order. Empty (the table is removed) when no source is in
/// the family: there is nothing to masquerade.
///
/// Count: with `n(list)` the family's entries of a list, or 1 for an empty one, a family with sources has
/// `n_cluster + Σ_source (1 + Σ_policy n(src) · n(dst))` rules (`n_cluster` counting only the family's entries).
pub(crate) fn compile(rules: &NatRules, family: Family) -> Vec<Rule> {
    let sources: Vec<&NatSource> = rules
        .sources
        .iter()
        .filter(|s| Family::of(&s.cidr) == family)
        .collect();
    if sources.is_empty() {
        return Vec::new();
    }
    let rule = |matches: Vec<Option<Match>>, verdict| Rule {
        matches: matches.into_iter().flatten().collect(),
        verdict,
    };
    let mut out = Vec::new();
    for c in rules.cluster.iter().filter(|c| Family::of(c) == family) {
        out.push(rule(vec![Match::new(Field::Daddr, *c)], Verdict::Return));
    }
    for s in &sources {
        let from = Match::new(Field::Saddr, s.cidr);
        for r in &s.rules {
            let verdict = match r.action {
                NatAction::Masquerade => Verdict::Masquerade,
                NatAction::Forward => Verdict::Return,
            };
            let dsts = alternatives(&r.dst, family, Field::Daddr);
            for src in alternatives(&r.src, family, Field::Saddr) {
                for dst in &dsts {
                    out.push(rule(vec![from, src, *dst], verdict));
                }
            }
        }
    }
    for s in &sources {
        out.push(rule(
            vec![Match::new(Field::Saddr, s.cidr)],
            Verdict::Masquerade,
        ));
    }
    out
}

/// The batch replacing `table` in both families with what `rules` compiles to (validated name).
pub(crate) fn batch(table: &str, rules: &NatRules) -> Result<Batch> {
    validate_table_name(table)?;
    let tables: Vec<(Family, Vec<Rule>)> = Family::ALL
        .iter()
        .map(|f| (*f, compile(rules, *f)))
        .collect();
    // Sequence numbers tell this batch's answers apart (on a socket of its own); a new range for each batch
    // keeps traces readable.
    static SEQ: AtomicU32 = AtomicU32::new(1);
    let messages = 2 + tables.iter().map(|(_, r)| 4 + r.len()).sum::<usize>();
    let seq = SEQ.fetch_add(
        u32::try_from(messages).unwrap_or(u32::MAX),
        Ordering::Relaxed,
    );
    Ok(nft::replace_tables(table, &tables, seq))
}

/// Sends `batch` (from [`batch`] for `table`) on a new `NETLINK_NETFILTER` socket of the calling thread's
/// namespace and reads the answers to the commit or the first refusal. `netns` labels errors.
///
/// The kernel runs the whole batch inside our `send`, so its answers are queued when `send` returns: the socket is
/// non-blocking, and an empty queue before the acknowledgement is an error, never a hang.
pub(crate) fn commit(netns: &str, table: &str, batch: &Batch) -> Result<()> {
    let io_err = |op, e| Error::io(op, format!("table {table}"), netns, e);
    let mut sock =
        Socket::new(NETLINK_NETFILTER).map_err(|e| io_err("open netfilter netlink socket", e))?;
    sock.bind_auto()
        .and_then(|_| sock.set_non_blocking(true))
        .map_err(|e| io_err("bind netfilter netlink socket", e))?;
    // Errors without the refused message copied back: the sequence number names it. Best effort.
    let _ = sock.set_cap_ack(true);
    let sent = sock
        .send(&batch.bytes, 0)
        .map_err(|e| io_err("send nftables batch", e))?;
    if sent != batch.bytes.len() {
        return Err(io_err(
            "send nftables batch",
            io::Error::new(io::ErrorKind::WriteZero, "the batch was cut short"),
        ));
    }
    let mut buf = Vec::with_capacity(64 * 1024);
    loop {
        buf.clear();
        match sock.recv(&mut buf, 0) {
            Ok(_) => {}
            // Answers beyond the receive buffer were dropped; the ones queued before are still there, in order.
            Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ENOBUFS as i32) => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(io_err(
                    "read nftables answer",
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the kernel did not acknowledge the batch",
                    ),
                ));
            }
            Err(e) => return Err(io_err("read nftables answer", e)),
        }
        let answer = nft::read_answers(&buf, batch.ack_seq).map_err(|what| {
            io_err(
                "read nftables answer",
                io::Error::new(io::ErrorKind::InvalidData, what),
            )
        })?;
        match answer {
            None => {}
            Some(Answer::Committed) => return Ok(()),
            Some(Answer::Refused { seq, errno }) => {
                return Err(Error::Nftables {
                    op: batch.describe(seq),
                    table: table.to_string(),
                    netns: netns.to_string(),
                    errno,
                });
            }
        }
    }
}

/// The rules [`crate::Netdev::set_nat`] writes, in nft syntax, one a line: the `ip` table's, then the `ip6` table's.
impl fmt::Display for NatRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for family in Family::ALL {
            for r in compile(self, family) {
                writeln!(f, "{r}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn net(s: &str) -> IpNetwork {
        s.parse().expect("cidr")
    }

    fn nets(list: &[&str]) -> Vec<IpNetwork> {
        list.iter().map(|s| net(s)).collect()
    }

    fn text(rules: &NatRules, family: Family) -> Vec<String> {
        compile(rules, family)
            .iter()
            .map(|r| r.to_string())
            .collect()
    }

    /// A dual-stack cluster: two natOutgoing subnets, one with policy rules.
    fn cluster() -> NatRules {
        NatRules {
            cluster: nets(&[
                "10.16.0.0/16",
                "100.64.0.0/16",
                "10.96.0.0/12",
                "fd00:10:16::/112",
            ]),
            sources: vec![
                NatSource {
                    cidr: net("10.16.0.0/16"),
                    rules: vec![
                        NatPolicyRule {
                            src: nets(&["10.16.0.10/32", "10.16.1.0/24"]),
                            dst: nets(&["192.168.0.0/16", "172.16.0.0/12"]),
                            action: NatAction::Forward,
                        },
                        NatPolicyRule {
                            src: vec![],
                            dst: nets(&["1.1.1.1/32", "fd00::1/128"]),
                            action: NatAction::Masquerade,
                        },
                        // IPv6 only: not in the ip table.
                        NatPolicyRule {
                            src: nets(&["fd00:10:16::5/128"]),
                            dst: vec![],
                            action: NatAction::Forward,
                        },
                    ],
                },
                NatSource {
                    cidr: net("10.17.0.9/16"),
                    rules: vec![],
                },
                NatSource {
                    cidr: net("fd00:10:16::/112"),
                    rules: vec![NatPolicyRule {
                        src: vec![],
                        dst: vec![],
                        action: NatAction::Forward,
                    }],
                },
            ],
        }
    }

    #[test]
    fn rules_compile_in_chain_order() {
        assert_eq!(
            text(&cluster(), Family::Ip),
            [
                "ip daddr 10.16.0.0/16 return",
                "ip daddr 100.64.0.0/16 return",
                "ip daddr 10.96.0.0/12 return",
                "ip saddr 10.16.0.0/16 ip saddr 10.16.0.10 ip daddr 192.168.0.0/16 return",
                "ip saddr 10.16.0.0/16 ip saddr 10.16.0.10 ip daddr 172.16.0.0/12 return",
                "ip saddr 10.16.0.0/16 ip saddr 10.16.1.0/24 ip daddr 192.168.0.0/16 return",
                "ip saddr 10.16.0.0/16 ip saddr 10.16.1.0/24 ip daddr 172.16.0.0/12 return",
                "ip saddr 10.16.0.0/16 ip daddr 1.1.1.1 masquerade",
                // Host bits of a source are cleared, as nft does.
                "ip saddr 10.16.0.0/16 masquerade",
                "ip saddr 10.17.0.0/16 masquerade",
            ]
        );
        assert_eq!(
            text(&cluster(), Family::Ip6),
            [
                "ip6 daddr fd00:10:16::/112 return",
                "ip6 saddr fd00:10:16::/112 return",
                "ip6 saddr fd00:10:16::/112 masquerade",
            ]
        );
        assert_eq!(cluster().to_string().lines().count(), 13);
    }

    #[test]
    fn a_family_without_sources_has_no_table() {
        let v4_only = NatRules {
            cluster: nets(&["10.16.0.0/16", "fd00::/64"]),
            sources: vec![NatSource {
                cidr: net("10.16.0.0/16"),
                rules: vec![],
            }],
        };
        assert!(compile(&v4_only, Family::Ip6).is_empty());
        assert_eq!(compile(&v4_only, Family::Ip).len(), 2);
        let none = NatRules {
            cluster: nets(&["10.16.0.0/16"]),
            sources: vec![],
        };
        assert!(compile(&none, Family::Ip).is_empty());
        assert!(compile(&NatRules::default(), Family::Ip).is_empty());
    }

    #[test]
    fn a_zero_prefix_matches_anything() {
        let rules = NatRules {
            cluster: nets(&["0.0.0.0/0"]),
            sources: vec![NatSource {
                cidr: net("0.0.0.0/0"),
                rules: vec![NatPolicyRule {
                    src: nets(&["0.0.0.0/0"]),
                    dst: nets(&["8.8.8.8/32"]),
                    action: NatAction::Forward,
                }],
            }],
        };
        assert_eq!(
            text(&rules, Family::Ip),
            ["return", "ip daddr 8.8.8.8 return", "masquerade"]
        );
    }

    #[test]
    fn table_names_are_checked() {
        assert!(validate_table_name("kube-ovn-nat").is_ok());
        assert!(validate_table_name(&"x".repeat(255)).is_ok());
        for bad in ["", "a\0b", &"x".repeat(256)] {
            let e = validate_table_name(bad).expect_err(bad);
            assert!(matches!(e, Error::InvalidTableName { .. }), "{e}");
        }
        assert!(matches!(
            batch("", &cluster()),
            Err(Error::InvalidTableName {
                reason: "empty",
                ..
            })
        ));
    }

    #[test]
    fn the_batch_holds_each_familys_rules() {
        let b = batch("kube-ovn", &cluster()).expect("batch");
        let rules = b
            .messages
            .iter()
            .filter(|(_, what)| what.starts_with("add rule"))
            .count();
        assert_eq!(rules, 13);
        assert_eq!(b.messages.len(), 2 + 2 * 4 + 13);
        // Nothing to masquerade: both tables go.
        let b = batch("kube-ovn", &NatRules::default()).expect("batch");
        let what: Vec<&str> = b.messages.iter().map(|(_, w)| w.as_str()).collect();
        assert_eq!(
            what,
            [
                "begin batch",
                "add table ip kube-ovn",
                "delete table ip kube-ovn",
                "add table ip6 kube-ovn",
                "delete table ip6 kube-ovn",
                "end batch"
            ]
        );
    }

    /// The sequence number and bytes of every message of a batch.
    fn split(bytes: &mut [u8]) -> Vec<(u32, &mut [u8])> {
        let mut out = Vec::new();
        let mut rest = bytes;
        while !rest.is_empty() {
            let len = u32::from_ne_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
            let (m, tail) = rest.split_at_mut(len);
            out.push((u32::from_ne_bytes(m[8..12].try_into().expect("4 bytes")), m));
            rest = tail;
        }
        out
    }

    #[test]
    fn root_a_refused_batch_names_the_message_and_changes_nothing() {
        if !crate::skip::is_root() {
            crate::skip::skip("not root: nftables needs CAP_NET_ADMIN");
            return;
        }
        let nft = crate::skip::installed("nft");
        // A thread in a network namespace of its own, gone with the thread.
        std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
            let rule_count = || {
                let out = std::process::Command::new("nft")
                    .args(["list", "table", "ip", "t"])
                    .output()
                    .expect("run nft");
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                text.lines()
                    .filter(|l| l.contains("return") || l.contains("masquerade"))
                    .count()
            };
            let good = batch("t", &cluster()).expect("batch");
            commit("test", "t", &good).expect("a good batch is committed");
            if nft {
                assert_eq!(rule_count(), 10);
            }
            let mut bad = batch(
                "t",
                &NatRules {
                    cluster: vec![],
                    sources: vec![NatSource {
                        cidr: net("10.99.0.0/16"),
                        rules: vec![],
                    }],
                },
            )
            .expect("batch");
            let (seq, _) = bad
                .messages
                .iter()
                .find(|(_, what)| what.starts_with("add rule 1 of ip t"))
                .cloned()
                .expect("a rule");
            // The rule names a chain that does not exist: the kernel refuses that message alone (ENOENT).
            for (s, m) in split(&mut bad.bytes) {
                if s == seq {
                    let at = m
                        .windows(12)
                        .position(|w| w == b"postrouting\0")
                        .expect("chain name");
                    m[at + 10] = b'X';
                }
            }
            let e = commit("test", "t", &bad).expect_err("refused");
            match &e {
                Error::Nftables {
                    op,
                    table,
                    netns,
                    errno,
                } => {
                    assert_eq!(
                        op,
                        "add rule 1 of ip t postrouting (ip saddr 10.99.0.0/16 masquerade)"
                    );
                    assert_eq!((table.as_str(), netns.as_str(), *errno), ("t", "test", 2));
                }
                e => panic!("not an nftables error: {e}"),
            }
            assert_eq!(e.errno(), Some(2));
            assert!(e.to_string().contains("No such file or directory"), "{e}");
            if nft {
                assert_eq!(rule_count(), 10, "the refused batch changed nothing");
            }
        })
        .join()
        .expect("test thread");
    }

    fn any_net() -> impl Strategy<Value = IpNetwork> {
        prop_oneof![
            (any::<u32>(), 0u8..=32).prop_map(|(a, p)| {
                IpNetwork::new(std::net::Ipv4Addr::from(a).into(), p).expect("prefix")
            }),
            (any::<u128>(), 0u8..=128).prop_map(|(a, p)| {
                IpNetwork::new(std::net::Ipv6Addr::from(a).into(), p).expect("prefix")
            }),
        ]
    }

    fn any_rules() -> impl Strategy<Value = NatRules> {
        let policy = (
            prop::collection::vec(any_net(), 0..3),
            prop::collection::vec(any_net(), 0..3),
            any::<bool>(),
        )
            .prop_map(|(src, dst, nat)| NatPolicyRule {
                src,
                dst,
                action: if nat {
                    NatAction::Masquerade
                } else {
                    NatAction::Forward
                },
            });
        let source = (any_net(), prop::collection::vec(policy, 0..4))
            .prop_map(|(cidr, rules)| NatSource { cidr, rules });
        (
            prop::collection::vec(any_net(), 0..5),
            prop::collection::vec(source, 0..4),
        )
            .prop_map(|(cluster, sources)| NatRules { cluster, sources })
    }

    /// The formula of [`compile`]'s count.
    fn expected_rules(rules: &NatRules, family: Family) -> usize {
        let n = |list: &[IpNetwork]| {
            if list.is_empty() {
                1
            } else {
                list.iter().filter(|x| Family::of(x) == family).count()
            }
        };
        let sources: Vec<&NatSource> = rules
            .sources
            .iter()
            .filter(|s| Family::of(&s.cidr) == family)
            .collect();
        if sources.is_empty() {
            return 0;
        }
        let cluster = rules
            .cluster
            .iter()
            .filter(|c| Family::of(c) == family)
            .count();
        cluster
            + sources
                .iter()
                .map(|s| 1 + s.rules.iter().map(|r| n(&r.src) * n(&r.dst)).sum::<usize>())
                .sum::<usize>()
    }

    /// Walks nested netlink attributes, checking every length stays inside its parent.
    fn check_attrs(mut b: &[u8]) {
        while !b.is_empty() {
            assert!(b.len() >= 4, "attribute header cut");
            let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
            let kind = u16::from_ne_bytes([b[2], b[3]]);
            assert!(
                len >= 4 && len <= b.len(),
                "attribute length {len} of {}",
                b.len()
            );
            if kind & 0x8000 != 0 {
                check_attrs(&b[4..len]);
            }
            b = &b[len.next_multiple_of(4).min(b.len())..];
        }
    }

    proptest! {
        #[test]
        fn any_rules_encode_and_count_as_the_formula_says(
            rules in any_rules(),
            name in "[a-zA-Z0-9_.-]{1,40}",
        ) {
            let b = batch(&name, &rules).expect("valid name");
            let mut per_family = std::collections::HashMap::new();
            let mut rest = &b.bytes[..];
            let mut count = 0;
            while !rest.is_empty() {
                let len = u32::from_ne_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
                prop_assert!(len >= 20 && len.is_multiple_of(4) && len <= rest.len());
                let kind = u16::from_ne_bytes([rest[4], rest[5]]);
                if kind == 0x0a06 {
                    *per_family.entry(rest[16]).or_insert(0usize) += 1;
                }
                check_attrs(&rest[20..len]);
                rest = &rest[len..];
                count += 1;
            }
            prop_assert_eq!(count, b.messages.len());
            let v4 = expected_rules(&rules, Family::Ip);
            let v6 = expected_rules(&rules, Family::Ip6);
            prop_assert_eq!(per_family.get(&2).copied().unwrap_or(0), v4);
            prop_assert_eq!(per_family.get(&10).copied().unwrap_or(0), v6);
            prop_assert_eq!(compile(&rules, Family::Ip).len(), v4);
            prop_assert_eq!(compile(&rules, Family::Ip6).len(), v6);
            // begin, end; per family add + delete, and add table + chain when it has rules.
            let tables = |n: usize| if n > 0 { 4 } else { 2 };
            prop_assert_eq!(b.messages.len(), 2 + tables(v4) + tables(v6) + v4 + v6);
        }
    }
}
