//! Client settings from the `[client]` section of the configuration file,
//! and the discovery order every front end shares (`nk`, Python, Java):
//! an explicit metadata address, then `NK_META`, then the config file
//! (explicit, or `NK_CONFIG`), then [`DEFAULT_META`].

use crate::ClientConfig;
use nodekernel_proto::{Error, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Default metadata server address (clients fall back to it).
pub const DEFAULT_META: &str = "127.0.0.1:9060";

/// Largest configuration file a client reads.
const MAX_CONFIG_FILE: u64 = 1 << 20;

/// The `[client]` section of the configuration file. Unknown keys are
/// rejected, naming the key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientSection {
    /// Metadata servers in partition order.
    pub meta: Vec<String>,
    pub timeout_ms: u64,
    pub transfers_in_flight: usize,
    /// Empty: the host name.
    pub location: String,
    /// Map co-located DRAM storage servers' memory (zero-copy data path).
    pub shared_memory: bool,
    /// Reach metadata servers on this host over their Unix socket.
    pub unix_socket: bool,
    /// Busy-poll budget while waiting for a reply.
    pub poll_spin_us: Option<u64>,
}

impl Default for ClientSection {
    fn default() -> Self {
        ClientSection {
            meta: vec![DEFAULT_META.into()],
            timeout_ms: 5_000,
            transfers_in_flight: 16,
            location: String::new(),
            shared_memory: true,
            unix_socket: true,
            poll_spin_us: None,
        }
    }
}

impl ClientSection {
    /// The client configuration these settings describe.
    pub fn to_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new(self.meta.clone());
        c.timeout = Duration::from_millis(self.timeout_ms);
        c.transfers_in_flight = self.transfers_in_flight;
        c.shared_memory = self.shared_memory;
        c.unix_sockets = self.unix_socket;
        c.poll_spin = self
            .poll_spin_us
            .map(Duration::from_micros)
            .unwrap_or_else(nodekernel_rpc::default_call_spin);
        if !self.location.is_empty() {
            c.location = self.location.clone();
        }
        c
    }

    /// Reads the `[client]` section of a configuration file (the other
    /// sections belong to the servers and are not checked here).
    pub fn load(path: &Path) -> Result<ClientSection> {
        let bad = |m: String| Error::invalid_argument(format!("{}: {m}", path.display()));
        let file = std::fs::File::open(path).map_err(|e| bad(format!("cannot read: {e}")))?;
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut std::io::Read::take(file, MAX_CONFIG_FILE + 1),
            &mut text,
        )
        .map_err(|e| bad(format!("cannot read: {e}")))?;
        if text.len() as u64 > MAX_CONFIG_FILE {
            return Err(bad(format!("larger than {MAX_CONFIG_FILE} bytes")));
        }
        let mut table: toml::Table = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        match table.remove("client") {
            None => Ok(ClientSection::default()),
            Some(v) => v
                .try_into()
                .map_err(|e: toml::de::Error| bad(format!("[client]: {e}"))),
        }
    }
}

/// Splits a comma-separated list of metadata server addresses.
pub fn parse_meta_list(list: &str) -> Vec<String> {
    list.split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The client configuration for `meta` and `config_file`, in the order
/// every front end uses: `meta` (comma-separated addresses), else
/// `NK_META`; the settings of `config_file`, else of `NK_CONFIG`, else the
/// defaults; the metadata servers of that file if neither `meta` nor
/// `NK_META` named any, else [`DEFAULT_META`].
pub fn discover(meta: Option<&str>, config_file: Option<&Path>) -> Result<ClientConfig> {
    let env_file = std::env::var_os("NK_CONFIG").map(PathBuf::from);
    let file = config_file.map(Path::to_path_buf).or(env_file);
    let section = match &file {
        Some(f) => ClientSection::load(f)?,
        None => ClientSection::default(),
    };
    let mut c = section.to_config();
    let env_meta = std::env::var("NK_META").ok();
    if let Some(list) = meta.or(env_meta.as_deref()) {
        let metas = parse_meta_list(list);
        if metas.is_empty() {
            return Err(Error::invalid_argument(format!(
                "no metadata server address in {list:?}"
            )));
        }
        c.metas = metas;
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn section_of_a_full_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("nk.toml");
        std::fs::write(
            &f,
            "[meta]\nlisten = \"0.0.0.0:1\"\n[client]\nmeta = [\"h:1\", \"h:2\"]\ntimeout_ms = 7\n",
        )
        .unwrap();
        let s = ClientSection::load(&f).unwrap();
        assert_eq!(s.meta, ["h:1", "h:2"]);
        assert_eq!(s.to_config().timeout, Duration::from_millis(7));
        // An explicit address wins over the file's.
        let c = discover(Some("x:9, y:9"), Some(&f)).unwrap();
        assert_eq!(c.metas, ["x:9", "y:9"]);
        assert_eq!(c.timeout, Duration::from_millis(7));
    }

    #[test]
    fn bad_files_name_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("nk.toml");
        std::fs::write(&f, "[client]\nmeta_servers = 1\n").unwrap();
        let e = ClientSection::load(&f).unwrap_err();
        assert!(e.message.contains("meta_servers"), "{e}");
        let e = ClientSection::load(&dir.path().join("missing.toml")).unwrap_err();
        assert!(e.message.contains("missing.toml"), "{e}");
        assert!(discover(Some(" , "), None).is_err());
    }
}
