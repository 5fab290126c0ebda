//! An address with a prefix length, as CNI writes it ("10.1.0.5/16").

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// An IP address and prefix length; the address keeps its host bits ("10.1.0.5/16" is not "10.1.0.0/16").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpCidr {
    /// The address.
    pub addr: IpAddr,
    /// The prefix length (at most 32 for IPv4, 128 for IPv6).
    pub prefix: u8,
}

impl IpCidr {
    /// An address and prefix; `None` when the prefix is too long for the family.
    pub fn new(addr: IpAddr, prefix: u8) -> Option<IpCidr> {
        (prefix <= max_prefix(addr)).then_some(IpCidr { addr, prefix })
    }

    /// Whether this is IPv4.
    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }

    /// The network address (host bits cleared).
    pub fn network(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V4((u32::from(a) & mask).into())
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V6((u128::from(a) & mask).into())
            }
        }
    }

    /// Whether `ip` is inside this prefix.
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.addr.is_ipv4()
            && IpCidr {
                addr: ip,
                prefix: self.prefix,
            }
            .network()
                == self.network()
    }
}

fn max_prefix(addr: IpAddr) -> u8 {
    if addr.is_ipv4() {
        32
    } else {
        128
    }
}

/// Why a string is not an address with a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseCidrError(String);

impl std::fmt::Display for ParseCidrError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid CIDR address {:?}", self.0)
    }
}

impl std::error::Error for ParseCidrError {}

impl std::str::FromStr for IpCidr {
    type Err = ParseCidrError;
    fn from_str(s: &str) -> Result<IpCidr, ParseCidrError> {
        let err = || ParseCidrError(s.to_owned());
        let (a, p) = s.split_once('/').ok_or_else(err)?;
        let addr: IpAddr = a.parse().map_err(|_| err())?;
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        let prefix: u8 = p.parse().map_err(|_| err())?;
        IpCidr::new(addr, prefix).ok_or_else(err)
    }
}

impl std::fmt::Display for IpCidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Serialize for IpCidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for IpCidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<IpCidr, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_display() {
        let c: IpCidr = "10.1.0.5/16".parse().unwrap();
        assert_eq!(c.to_string(), "10.1.0.5/16");
        assert_eq!(c.network().to_string(), "10.1.0.0");
        assert!(c.contains("10.1.255.255".parse().unwrap()));
        assert!(!c.contains("10.2.0.1".parse().unwrap()));
        let z: IpCidr = "0.0.0.0/0".parse().unwrap();
        assert!(z.contains("1.2.3.4".parse().unwrap()));
        assert!(!z.contains("::1".parse().unwrap()));
        let v6: IpCidr = "fd00:88::5/112".parse().unwrap();
        assert_eq!(v6.network().to_string(), "fd00:88::");
        for bad in [
            "10.1.0.5",
            "10.1.0.5/33",
            "x/1",
            "10.0.0.1/",
            "10.0.0.1/+1",
            "::/129",
            "1.2.3.4/0001",
        ] {
            assert!(bad.parse::<IpCidr>().is_err(), "{bad}");
        }
    }
}
