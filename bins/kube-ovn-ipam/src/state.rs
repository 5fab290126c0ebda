//! The on-disk form of one network's state: `kubeovn-ipam`'s [`SubnetSnapshot`] written compactly, plus a
//! journal of the allocations and releases made since, so a call appends one line instead of rewriting
//! every allocation.
//!
//! `state` (replaced atomically at compaction):
//! ```text
//! {"v":1,"gen":7,"snapshot":{"spec":{..},"released":"..","rng":..,"allocations":[]},"free":".."}
//! <container id> <ifname> <IPv4 or -> <IPv6 or -> <MAC, 12 hex digits> [s: shared on purpose]
//! ...
//! ```
//! `journal` (appended per change, fdatasync'ed with `"fsync": true`, reset at compaction):
//! ```text
//! gen 7
//! + <container id> <ifname> <IPv4 or -> <IPv6 or -> <MAC>
//! - <container id> <ifname>
//! ```
//! The journal applies only to the state of the same generation: a crash between the rename of a new
//! state and the journal's reset leaves a journal of the old generation, which is ignored. An incomplete
//! last journal line (a crash during an append that was never acknowledged) is ignored and cut off.

use std::net::{Ipv4Addr, Ipv6Addr};

use kubeovn_ipam::{
    Addresses, AllocRequest, IpamError, Mac, SnapshotEntry, Subnet, SubnetSnapshot,
};
use serde::{Deserialize, Serialize};

/// The state file's format version.
const FORMAT: u32 = 1;

/// Compact the journal into the state once it holds this many changes (replaying one costs a few µs).
pub const COMPACT_AFTER: usize = 64;

#[derive(Serialize, Deserialize)]
struct Header {
    v: u32,
    gen: u64,
    snapshot: SubnetSnapshot,
    /// The never-used addresses when the state was written (`IpRangeList` text), so an `ADD` can pick the
    /// next free address from the header and the journal without reading every allocation. Absent in
    /// older states: the full path serves them until the next compaction writes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    free: Option<String>,
}

/// A state file's first line: what an `ADD` needs besides the allocations.
pub struct Head {
    /// The state's generation.
    pub gen: u64,
    /// The snapshot, without its allocations.
    pub snapshot: SubnetSnapshot,
    /// The never-used addresses, when the writer recorded them.
    pub free: Option<String>,
}

/// Why a state or journal could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The header line is not what we write.
    #[error("bad header: {0}")]
    Header(#[from] serde_json::Error),
    /// A format version we do not know.
    #[error("unknown state format version {0}")]
    Version(u32),
    /// A line does not parse.
    #[error("line {line}: {reason}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The allocator refused the snapshot or a journal entry.
    #[error("inconsistent state: {0}")]
    Ipam(#[from] IpamError),
}

/// One journal entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// An allocation.
    Add(SnapshotEntry),
    /// A release.
    Del {
        /// The container id.
        pod: String,
        /// The interface.
        nic: String,
    },
}

fn hex_mac(m: &Mac, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in m.0 {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 15)] as char);
    }
}

fn parse_mac(s: &str) -> Option<Mac> {
    let b = s.as_bytes();
    if b.len() != 12 {
        return None;
    }
    let mut m = [0u8; 6];
    for (i, o) in m.iter_mut().enumerate() {
        let h = (b[2 * i] as char).to_digit(16)?;
        let l = (b[2 * i + 1] as char).to_digit(16)?;
        *o = (h << 4 | l) as u8;
    }
    Some(Mac(m))
}

fn push_entry(e: &SnapshotEntry, out: &mut String) {
    use std::fmt::Write;
    out.push_str(&e.pod);
    out.push(' ');
    out.push_str(&e.nic);
    out.push(' ');
    let _ = match e.v4 {
        Some(a) => write!(out, "{a} "),
        None => write!(out, "- "),
    };
    let _ = match e.v6 {
        Some(a) => write!(out, "{a} "),
        None => write!(out, "- "),
    };
    hex_mac(&e.mac, out);
    if e.shared {
        out.push_str(" s");
    }
    out.push('\n');
}

fn parse_entry<'a>(mut f: impl Iterator<Item = &'a str>) -> Option<SnapshotEntry> {
    let pod = f.next()?.to_owned();
    let nic = f.next()?.to_owned();
    let v4 = match f.next()? {
        "-" => None,
        s => Some(s.parse::<Ipv4Addr>().ok()?),
    };
    let v6 = match f.next()? {
        "-" => None,
        s => Some(s.parse::<Ipv6Addr>().ok()?),
    };
    let mac = parse_mac(f.next()?)?;
    let shared = match f.next() {
        None => false,
        Some("s") => true,
        Some(_) => return None,
    };
    f.next().is_none().then_some(SnapshotEntry {
        pod,
        nic,
        v4,
        v6,
        mac,
        shared,
    })
}

/// Writes a subnet's snapshot in the state format; `free`: its never-used addresses.
pub fn encode_state(gen: u64, mut snapshot: SubnetSnapshot, free: Option<String>) -> String {
    let allocations = std::mem::take(&mut snapshot.allocations);
    let header = Header {
        v: FORMAT,
        gen,
        snapshot,
        free,
    };
    // Strings, numbers and lists always serialise.
    let mut out = serde_json::to_string(&header).unwrap_or_default();
    out.reserve(allocations.len() * 100 + 1);
    out.push('\n');
    for e in &allocations {
        push_entry(e, &mut out);
    }
    out
}

/// Reads a state file: its generation and snapshot.
pub fn decode_state(bytes: &[u8]) -> Result<(u64, SubnetSnapshot), FormatError> {
    let text = std::str::from_utf8(bytes).map_err(|e| FormatError::Line {
        line: 0,
        reason: e.to_string(),
    })?;
    let (head, body) = text.split_once('\n').unwrap_or((text, ""));
    let mut h: Header = serde_json::from_str(head)?;
    if h.v != FORMAT {
        return Err(FormatError::Version(h.v));
    }
    h.snapshot.allocations.reserve(body.len() / 90);
    for (i, line) in body.lines().enumerate() {
        let e = parse_entry(line.split(' ')).ok_or_else(|| FormatError::Line {
            line: i + 2,
            reason: format!("bad allocation {line:?}"),
        })?;
        h.snapshot.allocations.push(e);
    }
    Ok((h.gen, h.snapshot))
}

/// A state file's first line, decoded (the allocations are not read).
pub fn decode_head(bytes: &[u8]) -> Result<Head, FormatError> {
    let head = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
    let h: Header = serde_json::from_slice(head)?;
    if h.v != FORMAT {
        return Err(FormatError::Version(h.v));
    }
    Ok(Head {
        gen: h.gen,
        snapshot: h.snapshot,
        free: h.free,
    })
}

/// What one pass over a state file's allocation lines found for a fast `ADD`.
#[derive(Default)]
pub struct Scan<'a> {
    /// The entries of the attachments asked for that the list holds.
    pub entries: std::collections::HashMap<(&'a str, &'a str), SnapshotEntry>,
    /// Some entry holds the MAC asked for.
    pub mac_used: bool,
    /// Some entry shares its address or MAC on purpose.
    pub shared: bool,
}

/// Reads a state file's allocation lines once, parsing only those of `keys`; `None` if the file is not
/// UTF-8 or a line of `keys` does not parse.
pub fn scan<'a>(
    bytes: &'a [u8],
    keys: &std::collections::HashSet<(&str, &str)>,
    mac: &Mac,
) -> Option<Scan<'a>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let body = text.split_once('\n').map_or("", |(_, b)| b);
    let mut hex = String::with_capacity(12);
    hex_mac(mac, &mut hex);
    let mut out = Scan::default();
    for line in body.lines() {
        let mut f = line.splitn(3, ' ');
        let (Some(pod), Some(nic), Some(rest)) = (f.next(), f.next(), f.next()) else {
            return None;
        };
        let (rest, shared) = match rest.strip_suffix(" s") {
            Some(r) => (r, true),
            None => (rest, false),
        };
        out.shared |= shared;
        out.mac_used |= rest.ends_with(hex.as_str());
        if keys.contains(&(pod, nic)) {
            out.entries
                .insert((pod, nic), parse_entry(line.split(' '))?);
        }
    }
    Some(out)
}

/// The generation of a state file, from its first line only.
pub fn state_generation(bytes: &[u8]) -> Result<u64, FormatError> {
    #[derive(Deserialize)]
    struct Gen {
        v: u32,
        gen: u64,
    }
    let head = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
    let g: Gen = serde_json::from_slice(head)?;
    if g.v != FORMAT {
        return Err(FormatError::Version(g.v));
    }
    Ok(g.gen)
}

/// Whether the allocation list of a state file holds (`container`, `ifname`), without decoding it.
pub fn state_has(bytes: &[u8], container: &str, ifname: &str) -> bool {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return false;
    };
    text.split_once('\n').is_some_and(|(_, body)| {
        body.lines().any(|l| {
            l.strip_prefix(container)
                .and_then(|r| r.strip_prefix(' '))
                .and_then(|r| r.strip_prefix(ifname))
                .is_some_and(|r| r.starts_with(' '))
        })
    })
}

/// The journal's first line.
pub fn journal_header(gen: u64) -> String {
    format!("gen {gen}\n")
}

/// A journal line.
pub fn encode_change(c: &Change) -> String {
    let mut out = String::with_capacity(128);
    match c {
        Change::Add(e) => {
            out.push_str("+ ");
            push_entry(e, &mut out);
        }
        Change::Del { pod, nic } => {
            out.push_str("- ");
            out.push_str(pod);
            out.push(' ');
            out.push_str(nic);
            out.push('\n');
        }
    }
    out
}

/// A journal's changes, if it belongs to generation `gen` (otherwise none), and the length of its complete
/// lines (anything after is an interrupted append).
pub fn decode_journal(bytes: &[u8], gen: u64) -> Result<(Vec<Change>, usize), FormatError> {
    let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1);
    let text = std::str::from_utf8(&bytes[..complete]).map_err(|e| FormatError::Line {
        line: 0,
        reason: e.to_string(),
    })?;
    let mut lines = text.lines();
    if lines.next() != Some(journal_header(gen).trim_end()) {
        return Ok((Vec::new(), complete));
    }
    let mut out = Vec::new();
    for (i, line) in lines.enumerate() {
        let bad = || FormatError::Line {
            line: i + 2,
            reason: format!("bad journal entry {line:?}"),
        };
        let mut f = line.split(' ');
        let c = match f.next() {
            Some("+") => Change::Add(parse_entry(f).ok_or_else(bad)?),
            Some("-") => {
                let (Some(pod), Some(nic), None) = (f.next(), f.next(), f.next()) else {
                    return Err(bad());
                };
                Change::Del {
                    pod: pod.to_owned(),
                    nic: nic.to_owned(),
                }
            }
            _ => return Err(bad()),
        };
        out.push(c);
    }
    Ok((out, complete))
}

/// Applies a journal entry to a subnet, reproducing the recorded addresses and MAC exactly (an entry marked
/// shared was taken with conflict checking off, so it is replayed that way).
pub fn apply(subnet: &mut Subnet, c: &Change) -> Result<(), IpamError> {
    match c {
        Change::Add(e) => {
            let ips: Vec<std::net::IpAddr> =
                e.v4.map(Into::into)
                    .into_iter()
                    .chain(e.v6.map(Into::into))
                    .collect();
            let got = subnet.allocate(
                &AllocRequest::new(&e.pod, &e.nic)
                    .static_ips(&ips)
                    .mac(e.mac)
                    .check_conflict(!e.shared),
            )?;
            if got
                != (Addresses {
                    v4: e.v4,
                    v6: e.v6,
                    mac: e.mac,
                })
            {
                return Err(IpamError::Conflict {
                    subnet: subnet.name().to_owned(),
                    address: format!("{:?}", (e.v4, e.v6)),
                    owner: format!("{}/{} (journal replay gave {:?})", e.pod, e.nic, got),
                });
            }
        }
        Change::Del { pod, nic } => {
            subnet.release(pod, nic);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeovn_ipam::SubnetSpec;

    fn subnet() -> Subnet {
        Subnet::new(
            &SubnetSpec::new("n", "10.0.0.0/24,fd00::/120", "10.0.0.1,fd00::1"),
            1,
        )
        .unwrap()
    }

    #[test]
    fn state_round_trip_and_replay() {
        let mut s = subnet();
        for i in 0..5 {
            s.allocate(&AllocRequest::new(&format!("c{i}"), "eth0"))
                .unwrap();
        }
        s.release("c1", "eth0");
        let text = encode_state(3, s.snapshot(), None);
        let (gen, snap) = decode_state(text.as_bytes()).unwrap();
        assert_eq!((gen, &snap), (3, &s.snapshot()));

        // Journal: changes made after the state was written, replayed onto the written state.
        let mut live = Subnet::from_snapshot(&snap).unwrap();
        let mut journal = journal_header(3);
        for i in 5..8 {
            let a = live
                .allocate(&AllocRequest::new(&format!("c{i}"), "eth0"))
                .unwrap();
            let e = SnapshotEntry {
                pod: format!("c{i}"),
                nic: "eth0".into(),
                v4: a.v4,
                v6: a.v6,
                mac: a.mac,
                shared: false,
            };
            journal.push_str(&encode_change(&Change::Add(e)));
        }
        live.release("c2", "eth0");
        journal.push_str(&encode_change(&Change::Del {
            pod: "c2".into(),
            nic: "eth0".into(),
        }));
        journal.push_str("+ c9 eth0 10.0"); // an interrupted append
        let (changes, complete) = decode_journal(journal.as_bytes(), 3).unwrap();
        assert_eq!(changes.len(), 4);
        assert_eq!(complete, journal.len() - "+ c9 eth0 10.0".len());
        let mut replayed = Subnet::from_snapshot(&snap).unwrap();
        for c in &changes {
            apply(&mut replayed, c).unwrap();
        }
        let (a, b) = (replayed.snapshot(), live.snapshot());
        assert_eq!((a.allocations, a.released), (b.allocations, b.released));
        // The next allocation is the same either way.
        let x = replayed
            .allocate(&AllocRequest::new("next", "eth0"))
            .unwrap();
        let y = live.allocate(&AllocRequest::new("next", "eth0")).unwrap();
        assert_eq!((x.v4, x.v6), (y.v4, y.v6));
        assert_eq!(state_generation(text.as_bytes()).unwrap(), 3);
        assert!(state_has(text.as_bytes(), "c0", "eth0"));
        assert!(!state_has(text.as_bytes(), "c1", "eth0"), "released");
        assert!(!state_has(text.as_bytes(), "c", "eth0"), "whole names only");
        // A journal of another generation is ignored.
        assert!(decode_journal(journal.as_bytes(), 4).unwrap().0.is_empty());
    }

    #[test]
    fn entry_round_trip() {
        for shared in [false, true] {
            let e = SnapshotEntry {
                pod: "c".into(),
                nic: "eth0".into(),
                v4: Some("10.0.0.2".parse().unwrap()),
                v6: None,
                mac: Mac([0, 1, 2, 0xab, 0xcd, 0xef]),
                shared,
            };
            let mut line = String::new();
            push_entry(&e, &mut line);
            assert_eq!(parse_entry(line.trim_end().split(' ')), Some(e));
        }
    }

    #[test]
    fn bad_input_is_an_error() {
        for bad in ["", "{}", "{\"v\":2,\"gen\":0,\"snapshot\":{}}"] {
            assert!(decode_state(bad.as_bytes()).is_err(), "{bad:?}");
        }
        let good = encode_state(0, subnet().snapshot(), None);
        assert!(
            decode_state(format!("{good}c1 eth0 10.0.0.300 - 000000000000\n").as_bytes()).is_err()
        );
        assert!(decode_state(format!("{good}c1 eth0 - - 0000000000\n").as_bytes()).is_err());
        assert!(decode_journal(b"gen 0\n* x y\n", 0).is_err());
        assert!(decode_journal(b"gen 0\n- x\n", 0).is_err());
        assert!(decode_journal(b"gen 0\n- x y z\n", 0).is_err());
    }
}
