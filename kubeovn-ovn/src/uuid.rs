//! The OVSDB `uuid` atom: a 16-byte identifier with the usual `8-4-4-4-12` text form.

use std::fmt;
use std::str::FromStr;

/// A 128-bit UUID as OVSDB uses it for row identifiers and transaction ids.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Uuid([u8; 16]);

/// Why a string is not a UUID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid UUID {input:?}: expected 8-4-4-4-12 hexadecimal digits")]
pub struct UuidParseError {
    /// The rejected input (truncated to 64 bytes).
    pub input: String,
}

const DASHES: [usize; 4] = [8, 13, 18, 23];
/// Where each byte's two hex digits start in the text form.
const HEX_PAIRS: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];
/// Each ASCII byte's hex value, 0xff for a byte that is not a hex digit.
const HEX_VALUE: [u8; 256] = {
    let mut t = [0xffu8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

impl Uuid {
    /// The all-zero UUID.
    pub const NIL: Uuid = Uuid([0; 16]);

    /// A UUID from its 16 bytes, most significant first.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Uuid(bytes)
    }

    /// A UUID from a 128-bit integer (big-endian byte order).
    pub const fn from_u128(v: u128) -> Self {
        Uuid(v.to_be_bytes())
    }

    /// The 16 bytes, most significant first.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The UUID as a 128-bit integer.
    pub const fn as_u128(&self) -> u128 {
        u128::from_be_bytes(self.0)
    }

    /// Parses the `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` form (either case).
    pub fn parse(s: &str) -> Result<Self, UuidParseError> {
        let err = || UuidParseError {
            input: s.chars().take(64).collect(),
        };
        let b = s.as_bytes();
        if b.len() != 36 || DASHES.iter().any(|&i| b[i] != b'-') {
            return Err(err());
        }
        // Fixed positions and a table: the initial sync of a large database parses millions of UUIDs.
        let mut out = [0u8; 16];
        let mut bad = 0u8;
        for (o, &p) in out.iter_mut().zip(HEX_PAIRS.iter()) {
            let (h, l) = (HEX_VALUE[b[p] as usize], HEX_VALUE[b[p + 1] as usize]);
            bad |= h | l;
            *o = (h << 4) | (l & 0x0f);
        }
        if bad & 0xf0 != 0 {
            return Err(err());
        }
        Ok(Uuid(out))
    }

    /// Writes the 36-byte text form into `buf` and returns it as a `&str`.
    pub fn encode_lower<'a>(&self, buf: &'a mut [u8; 36]) -> &'a str {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut j = 0;
        for (i, byte) in self.0.iter().enumerate() {
            if i == 4 || i == 6 || i == 8 || i == 10 {
                buf[j] = b'-';
                j += 1;
            }
            buf[j] = HEX[(byte >> 4) as usize];
            buf[j + 1] = HEX[(byte & 0xf) as usize];
            j += 2;
        }
        // Only ASCII hex digits and dashes were written.
        std::str::from_utf8(buf).unwrap_or("")
    }
}

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; 36];
        f.write_str(self.encode_lower(&mut buf))
    }
}

impl fmt::Debug for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Uuid({self})")
    }
}

impl FromStr for Uuid {
    type Err = UuidParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse(s)
    }
}

impl serde::Serialize for Uuid {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut buf = [0u8; 36];
        s.serialize_str(self.encode_lower(&mut buf))
    }
}

impl<'de> serde::Deserialize<'de> for Uuid {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Uuid::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parse_and_display() {
        let s = "36a6e4b4-2b8b-4a3b-9c3d-0123456789ab";
        let u: Uuid = s.parse().unwrap();
        assert_eq!(u.to_string(), s);
        assert_eq!(Uuid::parse(&s.to_uppercase()).unwrap(), u);
        assert!(Uuid::parse("36a6e4b4-2b8b-4a3b-9c3d-0123456789a").is_err());
        assert!(Uuid::parse("36a6e4b4x2b8b-4a3b-9c3d-0123456789ab").is_err());
        assert!(Uuid::parse("36a6e4b4-2b8b-4a3b-9c3d-0123456789ag").is_err());
        assert_eq!(
            Uuid::NIL.to_string(),
            "00000000-0000-0000-0000-000000000000"
        );
    }

    proptest! {
        #[test]
        fn round_trip(v in any::<u128>()) {
            let u = Uuid::from_u128(v);
            prop_assert_eq!(Uuid::parse(&u.to_string()).unwrap(), u);
            prop_assert_eq!(u.as_u128(), v);
        }

        /// The table-driven parser accepts exactly what a plain reading of the grammar accepts.
        #[test]
        fn accepts_exactly_the_text_form(s in "[0-9a-fA-Fg-]{36}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9A-F]{4}-[0-9a-f]{4}-[0-9a-fG]{12}|\\PC{0,40}") {
            let b = s.as_bytes();
            let ok = b.len() == 36
                && b.iter().enumerate().all(|(i, c)| if DASHES.contains(&i) { *c == b'-' } else { c.is_ascii_hexdigit() });
            prop_assert_eq!(Uuid::parse(&s).is_ok(), ok);
            if ok {
                let hex: String = s.chars().filter(|c| *c != '-').collect();
                prop_assert_eq!(Uuid::parse(&s).unwrap().as_u128(), u128::from_str_radix(&hex, 16).unwrap());
            }
        }
    }
}
