//! What every subcommand shares: size flags, and the one error format
//! (`nk: Code: message`, or JSON on stderr for a command given `--json`).

use nodekernel_client::ErrorCode;
use nodekernel_cluster::ByteSize;
use serde::Serialize;

/// Parses a size flag like `512MiB` (the config file's sizes, and `nk
/// policy set`'s, take the same forms).
pub fn parse_size(s: &str) -> Result<ByteSize, String> {
    ByteSize::parse(s)
}

/// The code an error is printed with: the wire code of a cluster error
/// (`docs/cli.md` lists them), or `Io` for a local file that could not be
/// read or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Wire(ErrorCode),
    Io,
}

impl Code {
    pub fn name(self) -> &'static str {
        match self {
            Code::Wire(c) => c.name(),
            Code::Io => "Io",
        }
    }
}

/// An error of the command line itself, with the code it is printed with.
#[derive(Debug)]
pub struct Coded {
    pub code: Code,
    pub message: String,
}

impl std::fmt::Display for Coded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Coded {}

/// An error with `code` and `message`.
pub fn coded(code: Code, message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Coded {
        code,
        message: message.into(),
    })
}

/// `InvalidArgument`, the code of a request the command line refuses.
pub fn invalid(message: impl Into<String>) -> anyhow::Error {
    coded(Code::Wire(ErrorCode::InvalidArgument), message)
}

/// The code of `e`: the first coded cause in its chain (a cluster error's
/// wire code, a local I/O error's kind), else `Internal`.
pub fn code_of(e: &anyhow::Error) -> Code {
    for cause in e.chain() {
        if let Some(c) = cause.downcast_ref::<Coded>() {
            return c.code;
        }
        if let Some(c) = cause.downcast_ref::<nodekernel_client::Error>() {
            return Code::Wire(c.code);
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::NotFound => Code::Wire(ErrorCode::NotFound),
                std::io::ErrorKind::AlreadyExists => Code::Wire(ErrorCode::AlreadyExists),
                std::io::ErrorKind::StorageFull => Code::Wire(ErrorCode::NoSpace),
                _ => Code::Io,
            };
        }
    }
    Code::Wire(ErrorCode::Internal)
}

/// `e` and its causes on one line (`a: b: c`) without codes: a cluster
/// error gives its message, and a cause whose text the line already
/// contains is left out (many errors repeat their cause in their own
/// message: an OS error would otherwise appear two or three times).
pub fn error_text<'a>(
    chain: impl Iterator<Item = &'a (dyn std::error::Error + 'static)>,
) -> String {
    let mut text = String::new();
    for e in chain {
        let part = match e.downcast_ref::<nodekernel_client::Error>() {
            Some(c) => c.message.clone(),
            None => e.to_string(),
        };
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

#[derive(Serialize)]
struct ErrorJson<'a> {
    code: &'a str,
    message: &'a str,
}

/// The line `nk` prints on stderr for a failed command: `nk: Code:
/// message`, or `{"error":{"code":..,"message":..}}` with `json`.
pub fn error_line(e: &anyhow::Error, json: bool) -> String {
    let code = code_of(e).name();
    let message = error_text(e.chain());
    if json {
        let body = ErrorJson {
            code,
            message: &message,
        };
        serde_json::json!({ "error": body }).to_string()
    } else {
        format!("nk: {code}: {message}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_text_prints_each_cause_once() {
        let os = std::io::Error::from_raw_os_error(libc::EADDRINUSE);
        let os_text = os.to_string();
        // A library error that repeats its source, with context on top.
        #[derive(Debug)]
        struct Bind(std::io::Error);
        impl std::fmt::Display for Bind {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "cannot listen on 127.0.0.1:1: {}", self.0)
            }
        }
        impl std::error::Error for Bind {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = anyhow::Error::new(Bind(os)).context("starting the server");
        let text = error_text(e.chain());
        assert_eq!(
            text,
            format!("starting the server: cannot listen on 127.0.0.1:1: {os_text}")
        );
        let e = anyhow::anyhow!("plain");
        assert_eq!(error_text(e.chain()), "plain");
    }

    #[test]
    fn every_error_prints_one_code_and_its_message() {
        let cluster = anyhow::Error::new(nodekernel_client::Error::new(
            ErrorCode::NotFound,
            "/a does not exist",
        ))
        .context("copying /a");
        assert_eq!(
            error_line(&cluster, false),
            "nk: NotFound: copying /a: /a does not exist"
        );
        let v: serde_json::Value = serde_json::from_str(&error_line(&cluster, true)).unwrap();
        assert_eq!(v["error"]["code"], "NotFound");
        assert_eq!(v["error"]["message"], "copying /a: /a does not exist");
        let local = anyhow::Error::new(std::io::Error::from_raw_os_error(libc::EISDIR))
            .context("cannot write ./x");
        assert!(error_line(&local, false).starts_with("nk: Io: cannot write ./x: "));
        let missing = anyhow::Error::new(std::io::Error::from_raw_os_error(libc::ENOENT));
        assert!(error_line(&missing, false).starts_with("nk: NotFound: "));
        assert_eq!(
            error_line(&invalid("--type x: expected dir"), false),
            "nk: InvalidArgument: --type x: expected dir"
        );
        assert_eq!(
            error_line(&anyhow::anyhow!("uncoded"), false),
            "nk: Internal: uncoded"
        );
    }
}

/// A duration as the CLI takes it (`--ttl`, `nk expire`): a number with a
/// unit, `ms`, `s`, `m`, `h` or `d` (`90s`, `30m`, `1.5h`); a bare number
/// is seconds.
pub fn parse_duration(s: &str) -> anyhow::Result<std::time::Duration> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale = match unit.trim() {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        u => {
            return Err(invalid(format!(
                "{s:?}: unknown unit {u:?} (give ms, s, m, h or d, as in 30m)"
            )))
        }
    };
    let n: f64 = num.parse().map_err(|_| {
        invalid(format!(
            "{s:?} is not a duration (as in 90s, 30m, 1h or 2d)"
        ))
    })?;
    let secs = n * scale;
    if !secs.is_finite() || secs <= 0.0 || secs > 3.16e9 {
        return Err(invalid(format!(
            "{s:?}: a duration is more than 0 and at most about 100 years"
        )));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// A TTL as the CLI takes it: a duration, or `never`.
pub fn parse_ttl(s: &str) -> anyhow::Result<nodekernel_client::Ttl> {
    if s.trim() == "never" {
        return Ok(nodekernel_client::Ttl::Never);
    }
    parse_duration(s).map(nodekernel_client::Ttl::After)
}

/// `ms` as a short duration (`90s`, `30m`, `2h`, `1d`, `1500ms`).
pub fn short_duration(ms: u64) -> String {
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    if ms >= 1000 {
        return format!("{:.1}s", ms as f64 / 1000.0);
    }
    format!("{ms}ms")
}

/// `ms` to the second, in its two largest units (`1h59m`, `3m20s`,
/// `2d4h`, `45s`).
pub fn rough_duration(ms: u64) -> String {
    let mut secs = ms.div_ceil(1000);
    let mut parts = Vec::new();
    for (unit, size) in [("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)] {
        if secs >= size || (unit == "s" && parts.is_empty()) {
            parts.push(format!("{}{unit}", secs / size));
            secs %= size;
        }
        if parts.len() == 2 {
            break;
        }
    }
    parts.join("")
}

#[cfg(test)]
mod duration_tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn durations_parse_with_units_and_bad_ones_are_refused() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("2d").unwrap(), Duration::from_secs(172_800));
        for bad in ["", "0", "-1s", "5x", "h", "1e400s", "200000d"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_ttl("never").unwrap(), nodekernel_client::Ttl::Never);
        assert_eq!(short_duration(1_800_000), "30m");
        assert_eq!(short_duration(1_500), "1.5s");
        assert_eq!(short_duration(250), "250ms");
        assert_eq!(rough_duration(7_199_000), "1h59m");
        assert_eq!(rough_duration(200_000), "3m20s");
        assert_eq!(rough_duration(1), "1s");
    }
}
