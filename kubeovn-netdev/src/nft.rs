//! nftables over netlink (`NETLINK_NETFILTER`, subsystem `NFNL_SUBSYS_NFTABLES`), encoded by hand: the few
//! messages and expressions a NAT table needs ([`Rule`]: address prefix matches and a verdict), one batch that
//! replaces tables atomically ([`replace_tables`]), and the reading of the kernel's answers ([`read_answers`]).
//!
//! The layout follows `linux/netfilter/nfnetlink.h` and `linux/netfilter/nf_tables.h`: every message is a
//! `nlmsghdr`, a `struct nfgenmsg` and attributes; nftables' integers are big-endian, netlink's own header and
//! attribute headers are in host order. A prefix match is compiled the way `nft` compiles one (`nft --debug=netlink`):
//! `payload load` of the address into register 1, `bitwise` with the mask (not for a full-length prefix), `cmp eq`.

use std::fmt;
use std::net::IpAddr;

use ipnetwork::IpNetwork;

// linux/netlink.h
const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_HDRLEN: usize = 4;

// linux/netfilter/nfnetlink.h
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFNETLINK_V0: u8 = 0;
const AF_UNSPEC: u8 = 0;

// linux/netfilter.h
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
const NF_INET_POST_ROUTING: u32 = 4;
const NF_ACCEPT: u32 = 1;
/// `NF_IP_PRI_NAT_SRC` / `NF_IP6_PRI_NAT_SRC`: nft's `srcnat`.
const NF_PRI_NAT_SRC: i32 = 100;

// linux/netfilter/nf_tables.h
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFTA_BITWISE_SREG: u16 = 1;
const NFTA_BITWISE_DREG: u16 = 2;
const NFTA_BITWISE_LEN: u16 = 3;
const NFTA_BITWISE_MASK: u16 = 4;
const NFTA_BITWISE_XOR: u16 = 5;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_CMP_EQ: u32 = 0;
const NFT_REG_VERDICT: u32 = 0;
/// The first 16-byte register, as `nft` numbers it on the wire (it converts its 4-byte `reg 1` to `NFT_REG_1`).
const NFT_REG_1: u32 = 1;
const NFT_RETURN: i32 = -5;

/// The one chain of a NAT table.
pub(crate) const CHAIN: &str = "postrouting";

/// An nftables address family this crate writes tables in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Family {
    /// `ip`: IPv4.
    Ip,
    /// `ip6`: IPv6.
    Ip6,
}

impl Family {
    /// Both, in the order a batch handles them.
    pub(crate) const ALL: [Family; 2] = [Family::Ip, Family::Ip6];

    /// The family of a network.
    pub(crate) fn of(net: &IpNetwork) -> Family {
        match net {
            IpNetwork::V4(_) => Family::Ip,
            IpNetwork::V6(_) => Family::Ip6,
        }
    }

    /// nft's name for it (`ip`, `ip6`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
        }
    }

    fn nfproto(self) -> u8 {
        match self {
            Family::Ip => NFPROTO_IPV4,
            Family::Ip6 => NFPROTO_IPV6,
        }
    }

    /// Bytes of an address.
    fn addr_len(self) -> u32 {
        match self {
            Family::Ip => 4,
            Family::Ip6 => 16,
        }
    }

    /// Where `field` is in the network header: (offset, length).
    fn offset(self, field: Field) -> (u32, u32) {
        match (self, field) {
            (Family::Ip, Field::Saddr) => (12, 4),
            (Family::Ip, Field::Daddr) => (16, 4),
            (Family::Ip6, Field::Saddr) => (8, 16),
            (Family::Ip6, Field::Daddr) => (24, 16),
        }
    }
}

/// A header field a rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Field {
    /// The source address.
    Saddr,
    /// The destination address.
    Daddr,
}

/// `<family> saddr|daddr <prefix>`. The prefix is normalized (host bits cleared) and never `/0`: a match of
/// everything is no match at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Match {
    /// The field compared.
    pub(crate) field: Field,
    /// The prefix it must be in.
    pub(crate) net: IpNetwork,
}

impl Match {
    /// The match of `net` on `field`, `None` for a `/0` (everything matches).
    pub(crate) fn new(field: Field, net: IpNetwork) -> Option<Match> {
        if net.prefix() == 0 {
            return None;
        }
        let net = IpNetwork::new(net.network(), net.prefix()).unwrap_or(net);
        Some(Match { field, net })
    }
}

/// What a rule does when its matches hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Verdict {
    /// `masquerade`: source NAT to the outgoing interface's address.
    Masquerade,
    /// `return`: leave the chain (in a base chain, its policy applies: accept, no NAT).
    Return,
}

/// One rule of a chain: every match (all of the chain's family), then the verdict.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Rule {
    /// All must hold.
    pub(crate) matches: Vec<Match>,
    /// What happens then.
    pub(crate) verdict: Verdict,
}

/// nft's syntax: `ip saddr 10.16.0.0/16 ip daddr 10.96.0.1 masquerade` (a full-length prefix as an address).
impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for m in &self.matches {
            let field = match m.field {
                Field::Saddr => "saddr",
                Field::Daddr => "daddr",
            };
            write!(f, "{} {field} ", Family::of(&m.net).name())?;
            if u32::from(m.net.prefix()) == 8 * Family::of(&m.net).addr_len() {
                write!(f, "{} ", m.net.ip())?;
            } else {
                write!(f, "{} ", m.net)?;
            }
        }
        f.write_str(match self.verdict {
            Verdict::Masquerade => "masquerade",
            Verdict::Return => "return",
        })
    }
}

/// Netlink attributes and messages, appended to one buffer.
#[derive(Default)]
struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn align(&mut self) {
        let padded = self.buf.len().next_multiple_of(4);
        self.buf.resize(padded, 0);
    }

    /// Writes `v` at `at` as a `u16` in host order (an attribute's length: bounded, no attribute here nears
    /// 64 KiB).
    fn patch_u16(&mut self, at: usize, v: usize) {
        let v = u16::try_from(v).unwrap_or(u16::MAX);
        self.buf[at..at + 2].copy_from_slice(&v.to_ne_bytes());
    }

    fn attr(&mut self, kind: u16, value: &[u8]) {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value);
        // The length without the padding.
        self.patch_u16(start, NLA_HDRLEN + value.len());
        self.align();
    }

    fn be32(&mut self, kind: u16, v: u32) {
        self.attr(kind, &v.to_be_bytes());
    }

    /// A string attribute, NUL-terminated as `nft` sends it.
    fn string(&mut self, kind: u16, s: &str) {
        let mut v = Vec::with_capacity(s.len() + 1);
        v.extend_from_slice(s.as_bytes());
        v.push(0);
        self.attr(kind, &v);
    }

    fn nested(&mut self, kind: u16, body: impl FnOnce(&mut Writer)) {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; NLA_HDRLEN]);
        body(self);
        self.align();
        self.patch_u16(start, self.buf.len() - start);
        self.buf[start + 2..start + 4].copy_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    }

    /// A netlink message with its `nfgenmsg`; the body writes the attributes.
    fn message(
        &mut self,
        kind: u16,
        flags: u16,
        seq: u32,
        family: u8,
        res_id: u16,
        body: impl FnOnce(&mut Writer),
    ) {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; 4]); // nlmsg_len, below
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid: the kernel
        self.buf.extend_from_slice(&[family, NFNETLINK_V0]);
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        body(self);
        self.align();
        let len = u32::try_from(self.buf.len() - start).unwrap_or(u32::MAX);
        self.buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
    }

    /// One expression of a rule: `NFTA_LIST_ELEM { NFTA_EXPR_NAME, NFTA_EXPR_DATA { .. } }`.
    fn expr(&mut self, name: &str, data: impl FnOnce(&mut Writer)) {
        self.nested(NFTA_LIST_ELEM, |w| {
            w.string(NFTA_EXPR_NAME, name);
            w.nested(NFTA_EXPR_DATA, data);
        });
    }

    /// `NFTA_*_DATA { NFTA_DATA_VALUE bytes }`.
    fn data_value(&mut self, kind: u16, value: &[u8]) {
        self.nested(kind, |w| w.attr(NFTA_DATA_VALUE, value));
    }

    fn prefix_match(&mut self, m: &Match) {
        let family = Family::of(&m.net);
        let (offset, len) = family.offset(m.field);
        self.expr("payload", |w| {
            w.be32(NFTA_PAYLOAD_DREG, NFT_REG_1);
            w.be32(NFTA_PAYLOAD_BASE, NFT_PAYLOAD_NETWORK_HEADER);
            w.be32(NFTA_PAYLOAD_OFFSET, offset);
            w.be32(NFTA_PAYLOAD_LEN, len);
        });
        if u32::from(m.net.prefix()) < 8 * len {
            let mask = octets(m.net.mask());
            self.expr("bitwise", |w| {
                w.be32(NFTA_BITWISE_SREG, NFT_REG_1);
                w.be32(NFTA_BITWISE_DREG, NFT_REG_1);
                w.be32(NFTA_BITWISE_LEN, len);
                w.data_value(NFTA_BITWISE_MASK, &mask);
                w.data_value(NFTA_BITWISE_XOR, &vec![0; mask.len()]);
            });
        }
        self.expr("cmp", |w| {
            w.be32(NFTA_CMP_SREG, NFT_REG_1);
            w.be32(NFTA_CMP_OP, NFT_CMP_EQ);
            w.data_value(NFTA_CMP_DATA, &octets(m.net.network()));
        });
    }

    fn rule(&mut self, table: &str, rule: &Rule) {
        self.string(NFTA_RULE_TABLE, table);
        self.string(NFTA_RULE_CHAIN, CHAIN);
        self.nested(NFTA_RULE_EXPRESSIONS, |w| {
            for m in &rule.matches {
                w.prefix_match(m);
            }
            match rule.verdict {
                // No attributes: the interface's primary address, any port (an empty NFTA_EXPR_DATA, as nft).
                Verdict::Masquerade => w.expr("masq", |_| {}),
                Verdict::Return => w.expr("immediate", |w| {
                    w.be32(NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT);
                    w.nested(NFTA_IMMEDIATE_DATA, |w| {
                        w.nested(NFTA_DATA_VERDICT, |w| {
                            w.be32(NFTA_VERDICT_CODE, NFT_RETURN as u32)
                        })
                    });
                }),
            }
        });
    }
}

fn octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    }
}

/// One encoded batch, ready for one `send`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Batch {
    /// The messages: `BATCH_BEGIN`, the changes, `BATCH_END`.
    pub(crate) bytes: Vec<u8>,
    /// Every message's sequence number and what it does, for errors (the first is the batch's begin, whose
    /// sequence number the kernel also answers a failed commit with).
    pub(crate) messages: Vec<(u32, String)>,
    /// The sequence number of the last change, the one message that asks for an acknowledgement.
    pub(crate) ack_seq: u32,
}

impl Batch {
    /// What the message with sequence number `seq` did, for an error.
    pub(crate) fn describe(&self, seq: u32) -> String {
        match self.messages.iter().position(|(s, _)| *s == seq) {
            Some(0) => "batch (begin or commit)".to_string(),
            Some(i) => self.messages[i].1.clone(),
            None => format!("message {seq} of the batch"),
        }
    }
}

/// The batch replacing table `table` in each family of `tables` with a `postrouting` NAT chain holding the
/// family's rules, or removing it when the family has none. Sequence numbers start at `seq`.
///
/// Per family: `NEWTABLE` (create, not exclusive: the table is there afterwards, old or new), `DELTABLE` (so
/// always valid), then with rules `NEWTABLE`, `NEWCHAIN` and one `NEWRULE` (appended) a rule, which is how
/// `nft -f` flushes. The kernel applies the batch all or nothing. Errors are answered for every failing
/// message anyway; only the last change asks for an acknowledgement, which the kernel sends after the
/// commit: receiving it means the batch is in force and every error would have come before it.
pub(crate) fn replace_tables(table: &str, tables: &[(Family, Vec<Rule>)], seq: u32) -> Batch {
    type Body<'a> = Box<dyn Fn(&mut Writer) + 'a>;
    /// A message to write: type, flags, nfgenmsg family and res_id, what it does, its attributes.
    struct Planned<'a>(u16, u16, u8, u16, String, Body<'a>);
    let ty = |msg: u16| (NFNL_SUBSYS_NFTABLES << 8) | msg;
    let mut plan = vec![Planned(
        NFNL_MSG_BATCH_BEGIN,
        NLM_F_REQUEST,
        AF_UNSPEC,
        NFNL_SUBSYS_NFTABLES,
        "begin batch".into(),
        Box::new(|_: &mut Writer| {}),
    )];
    for (family, rules) in tables {
        let f = family.nfproto();
        let name = family.name();
        let table_attr = move |w: &mut Writer| w.string(NFTA_TABLE_NAME, table);
        let create = NLM_F_REQUEST | NLM_F_CREATE;
        plan.push(Planned(
            ty(NFT_MSG_NEWTABLE),
            create,
            f,
            0,
            format!("add table {name} {table}"),
            Box::new(table_attr),
        ));
        plan.push(Planned(
            ty(NFT_MSG_DELTABLE),
            NLM_F_REQUEST,
            f,
            0,
            format!("delete table {name} {table}"),
            Box::new(table_attr),
        ));
        if rules.is_empty() {
            continue;
        }
        plan.push(Planned(
            ty(NFT_MSG_NEWTABLE),
            create,
            f,
            0,
            format!("add table {name} {table}"),
            Box::new(table_attr),
        ));
        plan.push(Planned(
            ty(NFT_MSG_NEWCHAIN),
            create,
            f,
            0,
            format!("add chain {name} {table} {CHAIN} (type nat hook postrouting priority srcnat)"),
            Box::new(move |w: &mut Writer| {
                w.string(NFTA_CHAIN_TABLE, table);
                w.string(NFTA_CHAIN_NAME, CHAIN);
                w.nested(NFTA_CHAIN_HOOK, |w| {
                    w.be32(NFTA_HOOK_HOOKNUM, NF_INET_POST_ROUTING);
                    w.be32(NFTA_HOOK_PRIORITY, NF_PRI_NAT_SRC as u32);
                });
                w.be32(NFTA_CHAIN_POLICY, NF_ACCEPT);
                w.string(NFTA_CHAIN_TYPE, "nat");
            }),
        ));
        for (i, rule) in rules.iter().enumerate() {
            plan.push(Planned(
                ty(NFT_MSG_NEWRULE),
                create | NLM_F_APPEND,
                f,
                0,
                format!("add rule {} of {name} {table} {CHAIN} ({rule})", i + 1),
                Box::new(move |w: &mut Writer| w.rule(table, rule)),
            ));
        }
    }
    // The last change asks for the acknowledgement (with no change at all, nothing would answer: callers always
    // name a family).
    debug_assert!(plan.len() > 1, "a batch without changes");
    let acked = plan.len() - 1;
    plan.push(Planned(
        NFNL_MSG_BATCH_END,
        NLM_F_REQUEST,
        AF_UNSPEC,
        NFNL_SUBSYS_NFTABLES,
        "end batch".into(),
        Box::new(|_: &mut Writer| {}),
    ));
    let mut w = Writer::default();
    let mut messages = Vec::with_capacity(plan.len());
    for (i, Planned(kind, flags, family, res_id, what, body)) in plan.into_iter().enumerate() {
        let s = seq.wrapping_add(i as u32);
        let flags = if i == acked { flags | NLM_F_ACK } else { flags };
        w.message(kind, flags, s, family, res_id, |w| body(w));
        messages.push((s, what));
    }
    Batch {
        bytes: w.buf,
        messages,
        ack_seq: seq.wrapping_add(acked as u32),
    }
}

/// What the answers read so far say about a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The acknowledgement of the last change: the batch is committed.
    Committed,
    /// The kernel refused the message with sequence number `seq` with `errno` (positive): nothing was applied.
    Refused {
        /// The refused message.
        seq: u32,
        /// The errno.
        errno: i32,
    },
}

/// Reads one datagram of the kernel's answers to a batch whose acknowledged message is `ack_seq`: the first
/// error, or the acknowledgement, or `None` when the datagram decides nothing (other acknowledgements).
pub(crate) fn read_answers(datagram: &[u8], ack_seq: u32) -> Result<Option<Answer>, &'static str> {
    let mut rest = datagram;
    while rest.len() >= NLMSG_HDRLEN {
        let u32_at = |b: &[u8], i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let len = u32_at(rest, 0) as usize;
        if len < NLMSG_HDRLEN || len > rest.len() {
            return Err("truncated netlink message");
        }
        let kind = u16::from_ne_bytes([rest[4], rest[5]]);
        let seq = u32_at(rest, 8);
        if kind == NLMSG_ERROR {
            if len < NLMSG_HDRLEN + 4 {
                return Err("truncated netlink error message");
            }
            let code = u32_at(rest, NLMSG_HDRLEN) as i32;
            if code != 0 {
                return Ok(Some(Answer::Refused {
                    seq,
                    errno: code.saturating_neg(),
                }));
            }
            if seq == ack_seq {
                return Ok(Some(Answer::Committed));
            }
        }
        rest = &rest[len.next_multiple_of(4).min(rest.len())..];
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNetwork {
        s.parse().expect("cidr")
    }

    fn rule(matches: &[(Field, &str)], verdict: Verdict) -> Rule {
        let matches: Vec<Match> = matches
            .iter()
            .filter_map(|(f, n)| Match::new(*f, net(n)))
            .collect();
        Rule { matches, verdict }
    }

    /// The netlink messages of a buffer: (type, flags, seq, nfgenmsg family, res_id, attributes).
    fn messages(buf: &[u8]) -> Vec<(u16, u16, u32, u8, u16, Vec<u8>)> {
        let mut out = Vec::new();
        let mut rest = buf;
        while !rest.is_empty() {
            let len = u32::from_ne_bytes(rest[0..4].try_into().unwrap()) as usize;
            assert_eq!(len % 4, 0, "every message is aligned");
            let m = &rest[..len];
            out.push((
                u16::from_ne_bytes([m[4], m[5]]),
                u16::from_ne_bytes([m[6], m[7]]),
                u32::from_ne_bytes(m[8..12].try_into().unwrap()),
                m[16],
                u16::from_be_bytes([m[18], m[19]]),
                m[20..].to_vec(),
            ));
            rest = &rest[len..];
        }
        out
    }

    #[test]
    fn display_is_nft_syntax() {
        let r = rule(
            &[
                (Field::Saddr, "10.16.0.5/16"),
                (Field::Daddr, "10.96.0.1/32"),
            ],
            Verdict::Masquerade,
        );
        assert_eq!(
            r.to_string(),
            "ip saddr 10.16.0.0/16 ip daddr 10.96.0.1 masquerade"
        );
        let r = rule(&[(Field::Daddr, "fd00:10:96::/112")], Verdict::Return);
        assert_eq!(r.to_string(), "ip6 daddr fd00:10:96::/112 return");
        assert_eq!(Match::new(Field::Saddr, net("0.0.0.0/0")), None);
        assert_eq!(Match::new(Field::Saddr, net("::/0")), None);
    }

    /// `nft --debug=mnl` (nftables 1.0.6) for `add rule ip t postrouting ip saddr 10.77.0.2 masquerade`, after
    /// the netlink header: this encoder writes the same bytes.
    #[test]
    fn a_rule_is_encoded_as_nft_encodes_it() {
        let mut w = Writer::default();
        let r = rule(&[(Field::Saddr, "10.77.0.2/32")], Verdict::Masquerade);
        w.message(
            (10 << 8) | 6,
            NLM_F_REQUEST | NLM_F_CREATE | NLM_F_APPEND,
            3,
            NFPROTO_IPV4,
            0,
            |w| w.rule("t", &r),
        );
        let h = |len: u16, kind: u16| {
            let mut v = len.to_ne_bytes().to_vec();
            v.extend_from_slice(&kind.to_ne_bytes());
            v
        };
        let n = NLA_F_NESTED;
        let mut want: Vec<u8> = Vec::new();
        want.extend_from_slice(&164u32.to_ne_bytes());
        want.extend_from_slice(&0x0a06u16.to_ne_bytes());
        want.extend_from_slice(&0x0c01u16.to_ne_bytes());
        want.extend_from_slice(&3u32.to_ne_bytes());
        want.extend_from_slice(&0u32.to_ne_bytes());
        want.extend_from_slice(&[2, 0, 0, 0]);
        for part in [
            h(6, 1),
            b"t\0\0\0".to_vec(),
            h(16, 2),
            b"postrouting\0".to_vec(),
            h(120, n | 4),
            // payload load 4b @ network header + 12 => reg 1
            h(52, n | 1),
            h(12, 1),
            b"payload\0".to_vec(),
            h(36, n | 2),
            h(8, 1),
            vec![0, 0, 0, 1],
            h(8, 2),
            vec![0, 0, 0, 1],
            h(8, 3),
            vec![0, 0, 0, 12],
            h(8, 4),
            vec![0, 0, 0, 4],
            // cmp eq reg 1 0x02004d0a
            h(44, n | 1),
            h(8, 1),
            b"cmp\0".to_vec(),
            h(32, n | 2),
            h(8, 1),
            vec![0, 0, 0, 1],
            h(8, 2),
            vec![0, 0, 0, 0],
            h(12, n | 3),
            h(8, 1),
            vec![10, 77, 0, 2],
            // masq
            h(20, n | 1),
            h(9, 1),
            b"masq\0\0\0\0".to_vec(),
            h(4, n | 2),
        ] {
            want.extend_from_slice(&part);
        }
        assert_eq!(w.buf, want);
    }

    #[test]
    fn a_prefix_is_masked_and_return_is_a_verdict() {
        let mut w = Writer::default();
        w.rule(
            "t",
            &rule(&[(Field::Daddr, "fd00:10:96::1/112")], Verdict::Return),
        );
        let b = &w.buf;
        let find = |needle: &[u8]| b.windows(needle.len()).any(|x| x == needle);
        // ip6 daddr: offset 24, 16 bytes.
        assert!(find(&[0, 0, 0, 24]));
        assert!(find(b"bitwise\0"));
        let mut mask = vec![0xff; 14];
        mask.extend_from_slice(&[0, 0]);
        assert!(find(&mask), "the /112 mask");
        let mut addr = vec![0xfd, 0, 0, 0x10, 0, 0x96];
        addr.extend_from_slice(&[0; 10]);
        assert!(find(&addr), "the network address, host bits cleared");
        assert!(find(b"immediate\0"));
        assert!(find(&(-5i32).to_be_bytes()), "NFT_RETURN");
        assert!(!find(b"masq\0"));
    }

    #[test]
    fn the_batch_flushes_like_nft_and_acks_its_last_change() {
        let rules = vec![rule(&[(Field::Saddr, "10.77.0.0/24")], Verdict::Masquerade)];
        let b = replace_tables(
            "kube-ovn",
            &[(Family::Ip, rules), (Family::Ip6, vec![])],
            100,
        );
        let msgs = messages(&b.bytes);
        let kinds: Vec<(u16, u8)> = msgs.iter().map(|m| (m.0, m.3)).collect();
        assert_eq!(
            kinds,
            [
                (0x10, 0),
                (0x0a00, 2),
                (0x0a02, 2),
                (0x0a00, 2),
                (0x0a03, 2),
                (0x0a06, 2),
                (0x0a00, 10),
                (0x0a02, 10),
                (0x11, 0),
            ]
        );
        let seqs: Vec<u32> = msgs.iter().map(|m| m.2).collect();
        assert_eq!(seqs, (100..109).collect::<Vec<_>>());
        // Batch begin and end: the nftables subsystem in res_id, big-endian.
        assert_eq!((msgs[0].4, msgs[8].4), (10, 10));
        assert_eq!(msgs[0].1, NLM_F_REQUEST);
        // Only the last change asks for an acknowledgement; adds create, rules append.
        let acked: Vec<u32> = msgs
            .iter()
            .filter(|m| m.1 & NLM_F_ACK != 0)
            .map(|m| m.2)
            .collect();
        assert_eq!(acked, [107]);
        assert_eq!(b.ack_seq, 107);
        assert_eq!(msgs[1].1, NLM_F_REQUEST | NLM_F_CREATE);
        assert_eq!(msgs[2].1, NLM_F_REQUEST);
        assert_eq!(msgs[5].1, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_APPEND);
        // The table's name, NUL-terminated.
        assert_eq!(
            &msgs[1].5[..],
            &[13, 0, 1, 0, b'k', b'u', b'b', b'e', b'-', b'o', b'v', b'n', 0, 0, 0, 0]
        );
        assert_eq!(b.describe(100), "batch (begin or commit)");
        assert_eq!(
            b.describe(105),
            "add rule 1 of ip kube-ovn postrouting (ip saddr 10.77.0.0/24 masquerade)"
        );
        assert_eq!(b.describe(107), "delete table ip6 kube-ovn");
    }

    #[test]
    fn the_chain_is_a_nat_base_chain_at_srcnat() {
        let rules = vec![rule(&[(Field::Saddr, "10.77.0.0/24")], Verdict::Masquerade)];
        let b = replace_tables("t", &[(Family::Ip, rules)], 1);
        let msgs = messages(&b.bytes);
        let chain = &msgs[4];
        assert_eq!(chain.0, 0x0a03);
        let h = |len: u16, kind: u16| {
            let mut v = len.to_ne_bytes().to_vec();
            v.extend_from_slice(&kind.to_ne_bytes());
            v
        };
        let mut want = Vec::new();
        for part in [
            h(6, 1),
            b"t\0\0\0".to_vec(),
            h(16, 3),
            b"postrouting\0".to_vec(),
            h(20, NLA_F_NESTED | 4),
            h(8, 1),
            vec![0, 0, 0, 4],
            h(8, 2),
            vec![0, 0, 0, 100],
            h(8, 5),
            vec![0, 0, 0, 1],
            h(8, 7),
            b"nat\0".to_vec(),
        ] {
            want.extend_from_slice(&part);
        }
        assert_eq!(chain.5, want);
    }

    fn answer(kind: u16, seq: u32, code: i32) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&36u32.to_ne_bytes());
        v.extend_from_slice(&kind.to_ne_bytes());
        v.extend_from_slice(&0x100u16.to_ne_bytes());
        v.extend_from_slice(&seq.to_ne_bytes());
        v.extend_from_slice(&7u32.to_ne_bytes());
        v.extend_from_slice(&code.to_ne_bytes());
        v.extend_from_slice(&[0; 16]);
        v
    }

    #[test]
    fn answers_are_read_to_the_first_error_or_the_acknowledgement() {
        assert_eq!(read_answers(&answer(2, 5, 0), 9), Ok(None));
        assert_eq!(
            read_answers(&answer(2, 9, 0), 9),
            Ok(Some(Answer::Committed))
        );
        let mut two = answer(2, 6, -2);
        two.extend(answer(2, 9, 0));
        assert_eq!(
            read_answers(&two, 9),
            Ok(Some(Answer::Refused { seq: 6, errno: 2 }))
        );
        assert_eq!(read_answers(&answer(3, 9, 0), 9), Ok(None), "NLMSG_DONE");
        assert!(read_answers(&answer(2, 9, 0)[..20], 9).is_err());
        assert_eq!(read_answers(&[], 9), Ok(None));
    }
}
