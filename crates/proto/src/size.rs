//! Byte sizes as people write them: `4096`, `64KiB`, `512MiB`, `1.5GiB`,
//! `10MB`. The one parser of sizes in flags, config files and runtime
//! policy changes (`nk policy set move_rate 64MiB`).

/// Parses a size: a number (a fraction allowed) and an optional unit,
/// binary (`K`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB`) or decimal (`KB`,
/// `MB`, `GB`, `TB`), case-insensitive; the error names the text and says
/// what would do.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
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
    Ok(bytes as u64)
}
/// A size as people read it: `512 B`, `64 KiB`, `1.5 GiB` (binary
/// units, one decimal when not whole).
pub fn format_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    while unit + 1 < UNITS.len() && n >= 1u64 << (10 * (unit + 1)) {
        unit += 1;
    }
    if unit == 0 {
        return format!("{n} B");
    }
    let v = n as f64 / (1u64 << (10 * unit)) as f64;
    if n.is_multiple_of(1u64 << (10 * unit)) {
        format!("{v:.0} {}", UNITS[unit])
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::{format_bytes, parse_bytes};

    #[test]
    fn formats_sizes() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(64 << 10), "64 KiB");
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
        assert_eq!(format_bytes(50 << 30), "50 GiB");
    }

    #[test]
    fn parses_units() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64KiB"), Ok(64 << 10));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("64m"), Ok(64 << 20));
        assert_eq!(parse_bytes("8GiB"), Ok(8 << 30));
        assert_eq!(parse_bytes("1.5 GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("10MB"), Ok(10_000_000));
        assert!(parse_bytes("12XB").unwrap_err().contains("unknown unit"));
        assert!(parse_bytes("MiB").is_err());
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("-1").is_err());
    }
}
