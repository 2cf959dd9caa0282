//! Human byte sizes: `4096`, `64KiB`, `512MiB`, `8GiB`, `1.5GiB`, `10MB`.

use serde::{de, Deserialize, Deserializer};
use std::fmt;

/// A size in bytes, written in config files and flags with a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// Parses `4096`, `64KiB`, `1.5GiB`, `10MB`, ... (the one size
    /// syntax of flags, config files and `nk policy set`:
    /// [`nodekernel_proto::size::parse_bytes`]).
    pub fn parse(s: &str) -> Result<ByteSize, String> {
        nodekernel_proto::size::parse_bytes(s).map(ByteSize)
    }
}

impl std::str::FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ByteSize::parse(s)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&human(self.0))
    }
}

/// Formats a byte count with a binary unit (`1.5 GiB`).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size such as 4096, \"64KiB\" or \"8GiB\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("invalid size {v}: must not be negative")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                ByteSize::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(ByteSize::parse("512MiB").unwrap().0, 512 << 20);
        assert!(ByteSize::parse("12XB")
            .unwrap_err()
            .contains("unknown unit"));
        assert_eq!(human(3 << 29), "1.5 GiB");
        assert_eq!(human(100), "100 B");
    }
}
