//! MAC addresses and the small PRNG that generates them.

use std::fmt;
use std::str::FromStr;

use crate::IpamError;

/// A MAC address; text form `aa:bb:cc:dd:ee:ff` (also accepts `-` separators and upper case).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    /// True for a unicast address (I/G bit clear).
    pub fn is_unicast(&self) -> bool {
        self.0[0] & 1 == 0
    }

    /// True for a locally administered address (U/L bit set).
    pub fn is_local(&self) -> bool {
        self.0[0] & 2 != 0
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Debug for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Mac {
    type Err = IpamError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || IpamError::InvalidMac { text: s.to_owned() };
        let b = s.as_bytes();
        if b.len() != 17 {
            return Err(bad());
        }
        let sep = b[2];
        if sep != b':' && sep != b'-' {
            return Err(bad());
        }
        let mut out = [0u8; 6];
        for (i, o) in out.iter_mut().enumerate() {
            let at = i * 3;
            if i > 0 && b[at - 1] != sep {
                return Err(bad());
            }
            let hex = |c: u8| (c as char).to_digit(16).ok_or_else(bad);
            *o = (hex(b[at])? << 4 | hex(b[at + 1])?) as u8;
        }
        Ok(Mac(out))
    }
}

impl serde::Serialize for Mac {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Mac {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// splitmix64: tiny, fast, good enough for MACs that are checked for uniqueness anyway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn from_entropy() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x6b75_6265_6f76_6e21);
        Rng(h.finish())
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A random locally administered unicast MAC.
    pub(crate) fn mac(&mut self) -> Mac {
        let x = self.next_u64().to_le_bytes();
        let mut m = [x[0], x[1], x[2], x[3], x[4], x[5]];
        m[0] = (m[0] | 0x02) & 0xfe;
        Mac(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_format() {
        let m: Mac = "AA-bb-cc-00-11-22".parse().unwrap();
        assert_eq!(m.to_string(), "aa:bb:cc:00:11:22");
        assert_eq!(m.to_string().parse::<Mac>().unwrap(), m);
        for bad in [
            "",
            "aa:bb:cc:00:11",
            "aa:bb:cc:00:11:2g",
            "aa:bb-cc:00:11:22",
            "aa:bb:cc:00:11:22:",
        ] {
            assert!(bad.parse::<Mac>().is_err(), "{bad}");
        }
        let j = serde_json::to_string(&m).unwrap();
        assert_eq!(j, "\"aa:bb:cc:00:11:22\"");
        assert_eq!(serde_json::from_str::<Mac>(&j).unwrap(), m);
    }

    #[test]
    fn random_macs_are_local_unicast() {
        let mut r = Rng(1);
        for _ in 0..1000 {
            let m = r.mac();
            assert!(m.is_local() && m.is_unicast(), "{m}");
        }
    }
}
