//! Human byte sizes: `4096`, `64KiB`, `512MiB`, `8GiB`, `1.5GiB`, `10MB`.

use serde::{de, Deserialize, Deserializer};
use std::fmt;

/// A size in bytes, written in config files and flags with a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn parse(s: &str) -> Result<ByteSize, String> {
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let unit = unit.trim();
        let mult: u64 = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" => 1 << 10,
            "m" | "mib" => 1 << 20,
            "g" | "gib" => 1 << 30,
            "t" | "tib" => 1 << 40,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            "tb" => 1_000_000_000_000,
            _ => {
                return Err(format!(
                    "invalid size {s:?}: unknown unit {unit:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"
                ))
            }
        };
        let value: f64 = num.parse().map_err(|_| {
            format!("invalid size {s:?}: expected a number followed by a unit, like 512MiB")
        })?;
        let bytes = value * mult as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            return Err(format!("invalid size {s:?}: out of range"));
        }
        Ok(ByteSize(bytes as u64))
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
        assert_eq!(ByteSize::parse("4096").unwrap().0, 4096);
        assert_eq!(ByteSize::parse("64KiB").unwrap().0, 64 << 10);
        assert_eq!(ByteSize::parse("512MiB").unwrap().0, 512 << 20);
        assert_eq!(ByteSize::parse("8GiB").unwrap().0, 8 << 30);
        assert_eq!(ByteSize::parse("1.5 GiB").unwrap().0, 3 << 29);
        assert_eq!(ByteSize::parse("10MB").unwrap().0, 10_000_000);
        assert!(ByteSize::parse("12XB")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(ByteSize::parse("MiB").is_err());
        assert!(ByteSize::parse("").is_err());
        assert_eq!(human(3 << 29), "1.5 GiB");
        assert_eq!(human(100), "100 B");
    }
}
