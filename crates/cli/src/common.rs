//! What every subcommand shares: size flags and the one-line error text.

use nodekernel_cluster::ByteSize;

/// Parses a size flag like `512MiB`.
pub fn parse_size(s: &str) -> Result<ByteSize, String> {
    ByteSize::parse(s)
}

/// An error and its causes on one line, `a: b: c`, like `anyhow`'s `{:#}`,
/// but a cause whose text the line already contains is left out: many
/// errors repeat their cause in their own message (an OS error would
/// otherwise appear two or three times).
pub fn error_text<'a>(
    chain: impl Iterator<Item = &'a (dyn std::error::Error + 'static)>,
) -> String {
    let mut text = String::new();
    for e in chain {
        let part = e.to_string();
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

#[cfg(test)]
mod tests {
    use super::error_text;

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
}
