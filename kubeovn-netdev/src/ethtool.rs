//! TX checksum offload off (`ethtool -K IF tx off`) over ethtool's generic netlink family, no `ethtool` and no
//! ioctl: one `ETHTOOL_MSG_FEATURES_SET` on a generic netlink socket of the calling thread's namespace.
//!
//! Why: a veth hands its peer packets whose TCP/UDP checksum is only partial (the sender's kernel leaves it to
//! "hardware"). The kernel's own datapaths finish it, but the userspace datapath (ovs-vswitchd reading the host
//! end over a packet socket) forwards such packets as they are, and the receiver drops them: ICMP passes, TCP
//! and UDP do not. With TX checksumming off on the pod's end, the pod's kernel computes every checksum itself.
//!
//! The rust-netlink `ethtool` crate (0.3) reads features but cannot set them, so the few attributes are built
//! here with `netlink-packet-core`'s NLA types. The reply is synchronous: the kernel queues it during our
//! `sendmsg`, so the socket is non-blocking and an empty queue after the request is an error, never a hang.

use std::io;
use std::sync::OnceLock;

use netlink_sys::{protocols::NETLINK_GENERIC, Socket};
use rtnetlink::packet_core::{
    DefaultNla, Emitable, NetlinkBuffer, NetlinkDeserializable, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, NetlinkSerializable, NlasIterator, NLA_F_NESTED, NLM_F_ACK, NLM_F_REQUEST,
};

use crate::error::{Error, Result, ENODEV};

/// The features `ethtool -K IF tx off` turns off: every TX checksum a device may offload. A device without one
/// keeps it off; the kernel also drops TSO, which needs a TX checksum.
pub(crate) const TX_CHECKSUM_FEATURES: [&str; 5] = [
    "tx-checksum-ipv4",
    "tx-checksum-ip-generic",
    "tx-checksum-ipv6",
    "tx-checksum-fcoe-crc",
    "tx-checksum-sctp",
];

// linux/genetlink.h
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
// linux/ethtool_netlink.h
const ETHTOOL_GENL_NAME: &str = "ethtool";
const ETHTOOL_GENL_VERSION: u8 = 1;
const ETHTOOL_MSG_FEATURES_SET: u8 = 12;
const ETHTOOL_A_FEATURES_HEADER: u16 = 1;
const ETHTOOL_A_FEATURES_WANTED: u16 = 3;
const ETHTOOL_A_HEADER_DEV_NAME: u16 = 2;
const ETHTOOL_A_HEADER_FLAGS: u16 = 3;
const ETHTOOL_FLAG_OMIT_REPLY: u32 = 1 << 1;
const ETHTOOL_A_BITSET_BITS: u16 = 3;
const ETHTOOL_A_BITSET_BITS_BIT: u16 = 1;
const ETHTOOL_A_BITSET_BIT_NAME: u16 = 2;

/// A generic netlink message: family (the netlink message type), command, version and the encoded attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Genl {
    family: u16,
    cmd: u8,
    version: u8,
    attrs: Vec<u8>,
}

impl NetlinkSerializable for Genl {
    fn message_type(&self) -> u16 {
        self.family
    }

    fn buffer_len(&self) -> usize {
        4 + self.attrs.len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer[0] = self.cmd;
        buffer[1] = self.version;
        buffer[2..4].fill(0);
        buffer[4..].copy_from_slice(&self.attrs);
    }
}

impl NetlinkDeserializable for Genl {
    type Error = io::Error;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> io::Result<Self> {
        if payload.len() < 4 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "generic netlink message shorter than its header",
            ));
        }
        Ok(Genl {
            family: header.message_type,
            cmd: payload[0],
            version: payload[1],
            attrs: payload[4..].to_vec(),
        })
    }
}

/// Attributes, encoded (aligned, padded).
fn nlas(attrs: &[DefaultNla]) -> Vec<u8> {
    let mut buf = vec![0; attrs.buffer_len()];
    attrs.emit(&mut buf);
    buf
}

fn nested(kind: u16, children: &[DefaultNla]) -> DefaultNla {
    DefaultNla::new(kind | NLA_F_NESTED, nlas(children))
}

/// A string attribute, NUL-terminated as the kernel's `NLA_NUL_STRING` policy wants.
fn string(kind: u16, s: &str) -> DefaultNla {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    DefaultNla::new(kind, v)
}

fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Sends `msg` with an ACK requested and returns the replies before the ACK; a NACK is its errno.
fn transact(sock: &Socket, msg: Genl) -> io::Result<Vec<Genl>> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_ACK;
    header.sequence_number = 1;
    let mut req = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
    req.finalize();
    let mut out = vec![0; req.buffer_len()];
    req.serialize(&mut out);
    sock.send(&out, 0)?;
    let mut replies = Vec::new();
    let mut buf = Vec::with_capacity(32 * 1024);
    loop {
        buf.clear();
        // Non-blocking: the kernel answered during send; nothing queued means no answer is coming.
        sock.recv(&mut buf, 0).map_err(|e| {
            if e.kind() == io::ErrorKind::WouldBlock {
                io::Error::new(io::ErrorKind::TimedOut, "the kernel queued no answer")
            } else {
                e
            }
        })?;
        let mut rest = &buf[..];
        while !rest.is_empty() {
            let len = NetlinkBuffer::new_checked(rest)
                .map_err(|_| invalid("truncated netlink message"))?
                .length() as usize;
            let m = NetlinkMessage::<Genl>::deserialize(&rest[..len.min(rest.len())])
                .map_err(|_| invalid("undecodable netlink message"))?;
            rest = &rest[len.next_multiple_of(4).min(rest.len())..];
            match m.payload {
                NetlinkPayload::Error(e) => {
                    return match e.code {
                        None => Ok(replies),
                        Some(c) => Err(io::Error::from_raw_os_error(-c.get())),
                    };
                }
                NetlinkPayload::InnerMessage(g) => replies.push(g),
                _ => {}
            }
        }
    }
}

/// The generic netlink id of the `ethtool` family. Family ids are global, not per namespace: resolved once.
fn ethtool_family(sock: &Socket) -> io::Result<u16> {
    static ID: OnceLock<u16> = OnceLock::new();
    if let Some(id) = ID.get() {
        return Ok(*id);
    }
    let replies = transact(
        sock,
        Genl {
            family: GENL_ID_CTRL,
            cmd: CTRL_CMD_GETFAMILY,
            version: 1,
            attrs: nlas(&[string(CTRL_ATTR_FAMILY_NAME, ETHTOOL_GENL_NAME)]),
        },
    )?;
    let id = replies
        .iter()
        .flat_map(|g| NlasIterator::new(&g.attrs[..]))
        .filter_map(|a| a.ok())
        .find(|a| a.kind() == CTRL_ATTR_FAMILY_ID && a.value().len() == 2)
        .map(|a| u16::from_ne_bytes([a.value()[0], a.value()[1]]))
        .ok_or_else(|| invalid("no family id in nlctrl's answer"))?;
    Ok(*ID.get_or_init(|| id))
}

/// The `ETHTOOL_MSG_FEATURES_SET` request turning `features` off on `link` (bits named, no reply wanted).
fn features_off(family: u16, link: &str, features: &[&str]) -> Genl {
    let bits: Vec<DefaultNla> = features
        .iter()
        // A bit without ETHTOOL_A_BITSET_BIT_VALUE is cleared; bits not named are left as they are.
        .map(|f| {
            nested(
                ETHTOOL_A_BITSET_BITS_BIT,
                &[string(ETHTOOL_A_BITSET_BIT_NAME, f)],
            )
        })
        .collect();
    let header = nested(
        ETHTOOL_A_FEATURES_HEADER,
        &[
            string(ETHTOOL_A_HEADER_DEV_NAME, link),
            DefaultNla::new(
                ETHTOOL_A_HEADER_FLAGS,
                ETHTOOL_FLAG_OMIT_REPLY.to_ne_bytes().to_vec(),
            ),
        ],
    );
    let wanted = nested(
        ETHTOOL_A_FEATURES_WANTED,
        &[nested(ETHTOOL_A_BITSET_BITS, &bits)],
    );
    Genl {
        family,
        cmd: ETHTOOL_MSG_FEATURES_SET,
        version: ETHTOOL_GENL_VERSION,
        attrs: nlas(&[header, wanted]),
    }
}

/// Turns TX checksum offload off on `link` in the calling thread's namespace (`netns` labels errors).
pub(crate) fn tx_checksum_off(netns: &str, link: &str) -> Result<()> {
    let io_err = |op, e| Error::io(op, link, netns, e);
    let mut sock = Socket::new(NETLINK_GENERIC).map_err(|e| io_err("open generic netlink", e))?;
    sock.bind_auto()
        .and_then(|_| sock.set_non_blocking(true))
        .map_err(|e| io_err("bind generic netlink", e))?;
    let family = ethtool_family(&sock).map_err(|e| io_err("resolve ethtool netlink family", e))?;
    match transact(&sock, features_off(family, link, &TX_CHECKSUM_FEATURES)) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(ENODEV) => Err(Error::LinkNotFound {
            link: link.to_string(),
            netns: netns.to_string(),
        }),
        Err(e) => Err(io_err("ethtool set features (tx checksum off)", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_set_request_is_laid_out_as_ethtool_sends_it() {
        let g = features_off(27, "eth0", &["tx-checksum-ip-generic"]);
        assert_eq!((g.family, g.cmd, g.version), (27, 12, 1));
        let top: Vec<_> = NlasIterator::new(&g.attrs[..])
            .map(|a| a.expect("nla"))
            .collect();
        assert_eq!(top.len(), 2);
        assert_eq!(top[0].kind(), ETHTOOL_A_FEATURES_HEADER);
        assert!(top[0].nested_flag());
        let hdr: Vec<_> = NlasIterator::new(top[0].value())
            .map(|a| a.expect("nla"))
            .collect();
        assert_eq!(hdr[0].kind(), ETHTOOL_A_HEADER_DEV_NAME);
        assert_eq!(hdr[0].value(), b"eth0\0");
        assert_eq!(hdr[1].value(), &2u32.to_ne_bytes());
        assert_eq!(top[1].kind(), ETHTOOL_A_FEATURES_WANTED);
        let bits = NlasIterator::new(top[1].value())
            .next()
            .expect("bits")
            .expect("nla");
        assert_eq!(bits.kind(), ETHTOOL_A_BITSET_BITS);
        let bit = NlasIterator::new(bits.value())
            .next()
            .expect("bit")
            .expect("nla");
        let name = NlasIterator::new(bit.value())
            .next()
            .expect("name")
            .expect("nla");
        assert_eq!(name.kind(), ETHTOOL_A_BITSET_BIT_NAME);
        assert_eq!(name.value(), b"tx-checksum-ip-generic\0");
        // The whole message: netlink header, genl header, attributes, every length a multiple of 4.
        let mut m = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(g));
        m.finalize();
        assert_eq!(m.buffer_len() % 4, 0);
        let mut buf = vec![0; m.buffer_len()];
        m.serialize(&mut buf);
        let back = NetlinkMessage::<Genl>::deserialize(&buf).expect("round trip");
        assert_eq!(back.payload, m.payload);
    }
}
