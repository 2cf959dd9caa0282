//! Client settings from the `[client]` section of the configuration file,
//! and the discovery order every front end shares (`nk`, Python, Java):
//! an explicit metadata address, then `NK_META`, then the config file
//! (explicit, or `NK_CONFIG`), then [`DEFAULT_META`].

use crate::config::ClientConfig;
use crate::crypt::EncryptionKey;
use nodekernel_proto::tenant::{Rights, Tenant, MAX_TENANTS};
use nodekernel_proto::{Error, Result};
use nodekernel_rpc::auth::MAX_TOKEN_LEN;
use nodekernel_rpc::{LocalPeers, Security, Tls, TlsFiles, Token};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
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
    /// Small puts reserved ahead of their keys, per partition and piece
    /// size (0: none).
    pub reserved_puts: u32,
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
            reserved_puts: 32,
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
        c.reserved_puts = self.reserved_puts;
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
        Ok(load_sections(path)?.0)
    }
}

/// The `[client]` and `[security]` sections of a configuration file.
fn load_sections(path: &Path) -> Result<(ClientSection, SecuritySection)> {
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
    parse_sections(&text, path)
}

/// The `[client]` and `[security]` sections of configuration text (the
/// other sections belong to the servers and are not checked here);
/// `origin` names the text in errors. Reads no file: the token files are
/// read by [`SecuritySection::token`].
pub fn parse_sections(text: &str, origin: &Path) -> Result<(ClientSection, SecuritySection)> {
    let bad = |m: String| Error::invalid_argument(format!("{}: {m}", origin.display()));
    let mut table: toml::Table = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
    let client = match table.remove("client") {
        None => ClientSection::default(),
        Some(v) => v
            .try_into()
            .map_err(|e: toml::de::Error| bad(format!("[client]: {e}")))?,
    };
    let security = match table.remove("security") {
        None => SecuritySection::default(),
        Some(v) => v
            .try_into()
            .map_err(|e: toml::de::Error| bad(format!("[security]: {e}")))?,
    };
    Ok((client, security))
}

/// The `[security]` section of the configuration file, read by every role
/// (`docs/security.md`). Unknown keys are rejected, naming the key.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecuritySection {
    /// The cluster token itself (prefer `token_file`: a configuration file
    /// is often readable by more people than a secret should be).
    pub token: Option<String>,
    /// A file holding the cluster token (surrounding whitespace ignored).
    pub token_file: Option<PathBuf>,
    /// A file holding the previous token, still accepted from peers while
    /// a new one is rolled out.
    pub previous_token_file: Option<PathBuf>,
    /// A group (name or number) whose members may also use the servers'
    /// Unix sockets; by default only the servers' user and root may.
    pub unix_group: Option<String>,
    /// A file holding the secret clients derive their encryption key from
    /// (`nk key new`; `docs/encryption.md`). Read by clients only: servers
    /// never see it.
    pub encryption_key_file: Option<PathBuf>,
    /// TLS on every TCP connection (`[security.tls]`).
    pub tls: Option<TlsSection>,
    /// Servers only: run without a cluster token, trusting every peer
    /// that reaches a port. Without a token and without this, `nk meta`
    /// and `nk store` refuse to start, and `nk up` makes a token of its
    /// own (`docs/security.md`, *Secure by default*).
    pub insecure: bool,
    /// Servers only: the tenants (`[[security.tenant]]`,
    /// `docs/security.md`, *Tenants*). A client that is a tenant needs
    /// none of this: it proves its tenant's token as its `token_file`.
    pub tenant: Vec<TenantSection>,
}

/// One `[[security.tenant]]` entry: a credential whose connections see
/// only the namespace below `root` (as their `/`), with `rights`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenantSection {
    /// The tenant's name (in logs, metrics and refusals).
    pub name: String,
    /// A file holding the tenant's own token (`nk token new FILE`).
    pub token_file: Option<PathBuf>,
    /// The path its connections see as `/`; the metadata server makes the
    /// directory (and its parents) at start if it is missing.
    pub root: String,
    /// Any of `read`, `write`, `admin` (quotas below its root).
    pub rights: Vec<String>,
}

/// The `[security.tls]` table: TLS on every TCP connection
/// (`docs/security.md`). A node with `cert_file` serves TLS; every node
/// with the table connects with it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsSection {
    /// The authority that signs the cluster's certificates (PEM).
    pub ca_file: Option<PathBuf>,
    /// This node's certificate chain (PEM).
    pub cert_file: Option<PathBuf>,
    /// Its private key (PEM).
    pub key_file: Option<PathBuf>,
    /// Servers refuse clients without a certificate from `ca_file`.
    pub require_client_cert: bool,
    /// The name servers' certificates must carry, instead of the host of
    /// each address.
    pub server_name: Option<String>,
}

/// Reads a secret from `path`, a `what` (`token file`, `encryption key
/// file`): at most [`MAX_TOKEN_LEN`] bytes, surrounding whitespace
/// removed. A file others may read is used with a warning.
fn read_secret(path: &Path, what: &str) -> Result<Vec<u8>> {
    use std::os::unix::fs::MetadataExt;
    let bad = |m: String| Error::invalid_argument(format!("{what} {}: {m}", path.display()));
    let limit = (MAX_TOKEN_LEN as u64) * 2;
    let file = std::fs::File::open(path).map_err(|e| bad(format!("cannot read: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| bad(format!("cannot read: {e}")))?;
    // Not a device, FIFO or directory: /dev/zero or a pipe would never end.
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    if open_to_others(meta.mode(), meta.gid(), &own_groups()) {
        tracing::warn!(
            "{what} {} may be read by other users (mode {:o}); chmod 600 it",
            path.display(),
            meta.mode() & 0o777
        );
    }
    // Bounded by what is read, not by the size the file reports.
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(file, limit + 1), &mut bytes)
        .map_err(|e| bad(format!("cannot read: {e}")))?;
    if bytes.len() as u64 > limit {
        return Err(bad(format!("larger than {limit} bytes")));
    }
    Ok(bytes.trim_ascii().to_vec())
}

/// Whether a secret file of `mode` and group `gid` is open to users other
/// than its owner and the members of `own` (this process's groups): any
/// bit for others, or a group bit for a group this process is not in. A
/// Kubernetes Secret volume is `0440` with the pod's `fsGroup`, the group
/// the pod's processes run in: no warning there.
fn open_to_others(mode: u32, gid: u32, own: &[u32]) -> bool {
    mode & 0o007 != 0 || (mode & 0o070 != 0 && !own.contains(&gid))
}

/// This process's effective group and its supplementary groups.
fn own_groups() -> Vec<u32> {
    // SAFETY: getegid has no preconditions; getgroups writes at most `n`
    // entries into a buffer of `n`.
    let mut groups = vec![unsafe { libc::getegid() }];
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    if n > 0 {
        let mut more = vec![0 as libc::gid_t; n as usize];
        let got = unsafe { libc::getgroups(n, more.as_mut_ptr()) };
        more.truncate(got.max(0) as usize);
        groups.extend(more);
    }
    groups
}

impl SecuritySection {
    /// The cluster token these settings name (`NK_TOKEN_FILE` wins over
    /// them, for servers and clients alike), if any: the files are read
    /// and the token checked here.
    pub fn token(&self) -> Result<Option<Arc<Token>>> {
        let env_file = std::env::var_os("NK_TOKEN_FILE").map(PathBuf::from);
        let current = match (&env_file, &self.token_file, &self.token) {
            (Some(f), _, _) => Some((
                read_secret(f, "token file")?,
                format!("token file {}", f.display()),
            )),
            (None, Some(_), Some(_)) => {
                return Err(Error::invalid_argument(
                    "[security]: give token or token_file, not both",
                ))
            }
            (None, Some(f), None) => Some((
                read_secret(f, "token file")?,
                format!("token file {}", f.display()),
            )),
            (None, None, Some(t)) => {
                Some((t.trim().as_bytes().to_vec(), "[security] token".into()))
            }
            (None, None, None) => None,
        };
        let Some((secret, what)) = current else {
            if self.previous_token_file.is_some() {
                return Err(Error::invalid_argument(
                    "[security]: previous_token_file needs a current token (token_file)",
                ));
            }
            return Ok(None);
        };
        let mut token = Token::new(&secret, &what)?;
        if let Some(f) = &self.previous_token_file {
            token = token.accepting(
                &read_secret(f, "token file")?,
                &format!("token file {}", f.display()),
            )?;
        }
        Ok(Some(Arc::new(token)))
    }

    /// The key this client encrypts node data with, if any:
    /// `NK_ENCRYPTION_KEY_FILE` wins over `encryption_key_file`. The file
    /// is read and the key derived here.
    pub fn encryption_key(&self) -> Result<Option<Arc<EncryptionKey>>> {
        let env_file = std::env::var_os("NK_ENCRYPTION_KEY_FILE").map(PathBuf::from);
        let Some(f) = env_file.as_ref().or(self.encryption_key_file.as_ref()) else {
            return Ok(None);
        };
        let what = "encryption key file";
        let secret = read_secret(f, what)?;
        let key = EncryptionKey::from_secret(&secret, &format!("{what} {}", f.display()))?;
        Ok(Some(Arc::new(key)))
    }

    /// Who may use the servers' Unix sockets: root, the servers' user and
    /// the members of `unix_group`.
    pub fn local_peers(&self) -> Result<LocalPeers> {
        let owner = LocalPeers::owner();
        let Some(g) = &self.unix_group else {
            return Ok(owner);
        };
        Ok(owner.with_group(Some(group_id(g)?)))
    }

    /// The TLS configuration of `[security.tls]`, if there is one.
    pub fn tls(&self) -> Result<Option<Arc<Tls>>> {
        let Some(t) = &self.tls else {
            return Ok(None);
        };
        Ok(Some(Arc::new(Tls::load(&TlsFiles {
            ca_file: t.ca_file.as_deref(),
            cert_file: t.cert_file.as_deref(),
            key_file: t.key_file.as_deref(),
            require_client_cert: t.require_client_cert,
            server_name: t.server_name.as_deref(),
        })?)))
    }

    /// All of them, for a server.
    pub fn load(&self) -> Result<Security> {
        let mut s = Security {
            token: self.token()?,
            local_peers: self.local_peers()?,
            tls: self.tls()?,
            tenants: Arc::new([]),
        };
        self.add_tenants(&mut s)?;
        Ok(s)
    }

    /// The tenants, their tokens added to the servers' token (they need
    /// one: a tenant is a credential narrower than the cluster token).
    fn add_tenants(&self, s: &mut Security) -> Result<()> {
        if self.tenant.is_empty() {
            return Ok(());
        }
        if self.tenant.len() > MAX_TENANTS {
            return Err(Error::invalid_argument(format!(
                "[[security.tenant]]: {} tenants, at most {MAX_TENANTS}",
                self.tenant.len()
            )));
        }
        let tenants = self.tenant_list()?;
        let Some(token) = &s.token else {
            if self.insecure {
                return Err(Error::invalid_argument(
                    "[[security.tenant]] needs a cluster token, and insecure = true runs without \
                     one: tenants are credentials narrower than the token, and a server without \
                     one lets everyone in",
                ));
            }
            // No server starts so (`nk meta` and `nk store` require a
            // token; `nk up` makes its own and loads these again with it).
            s.tenants = tenants.into();
            return Ok(());
        };
        let mut token = Token::clone(token);
        for (t, section) in tenants.iter().zip(&self.tenant) {
            let f = section.token_file.as_ref().expect("checked by tenant_list");
            let what = format!("tenant {}'s token file {}", t.name, f.display());
            token = token.with_tenant(&t.name, &read_secret(f, "token file")?, &what)?;
        }
        s.token = Some(Arc::new(token));
        s.tenants = tenants.into();
        Ok(())
    }

    /// The tenants' names, roots and rights, checked (their tokens are
    /// read by [`SecuritySection::load`]).
    fn tenant_list(&self) -> Result<Vec<Tenant>> {
        self.tenant
            .iter()
            .map(|t| {
                let bad = |m: String| Error::invalid_argument(format!("tenant {:?}: {m}", t.name));
                let rights = Rights::parse(&t.rights).map_err(|e| bad(e.message))?;
                if t.token_file.is_none() {
                    return Err(bad(
                        "no token_file (make one with `nk token new FILE`)".into()
                    ));
                }
                Tenant::new(&t.name, &t.root, rights)
            })
            .collect()
    }
}

/// The number of group `name` (a number is taken as it is).
fn group_id(name: &str) -> Result<u32> {
    if let Ok(n) = name.parse::<u32>() {
        return Ok(n);
    }
    let bad = || Error::invalid_argument(format!("[security] unix_group: no group named {name:?}"));
    let c = std::ffi::CString::new(name).map_err(|_| bad())?;
    // SAFETY: `group` is plain C data (integers and pointers), for which
    // all zeros is a valid value; getgrnam_r overwrites it.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: getgrnam_r writes the entry into `grp` and its strings into
    // `buf` (of the length given), and a pointer to `grp` or null into `out`.
    let rc =
        unsafe { libc::getgrnam_r(c.as_ptr(), &mut grp, buf.as_mut_ptr(), buf.len(), &mut out) };
    if rc != 0 || out.is_null() {
        return Err(bad());
    }
    Ok(grp.gr_gid)
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
    let (section, security) = match &file {
        Some(f) => load_sections(f)?,
        None => Default::default(),
    };
    let mut c = section.to_config();
    c.token = security.token()?;
    c.tls = security.tls()?;
    c.encryption_key = security.encryption_key()?;
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

/// Writes 32 fresh random bytes in hex to `file`, created with mode 0600
/// and never overwritten: a cluster token or an encryption key.
pub fn write_new_secret(file: &Path) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut raw = [0u8; 32];
    nodekernel_rpc::random_bytes(&mut raw)?;
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)?;
    f.write_all(format!("{hex}\n").as_bytes())?;
    f.sync_all()
}

/// The directory where servers publish, for clients of the same user on
/// this host, which token file guards the cluster at an address:
/// `NK_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/nodekernel`, else
/// `$HOME/.nodekernel/run`; `None` when none of them is set.
pub fn runtime_dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("NK_RUNTIME_DIR")
        .or_else(|| env("XDG_RUNTIME_DIR").map(|d| d.join("nodekernel")))
        .or_else(|| env("HOME").map(|d| d.join(".nodekernel").join("run")))
}

/// Largest entry of the runtime directory a client reads.
const MAX_ENTRY_LEN: u64 = 8 << 10;

/// The file name of `addr`'s entry in the runtime directory.
fn entry_name(addr: &str) -> String {
    let safe: String = addr
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("cluster-{safe}.toml")
}

/// One published entry: which process published it and its token file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    pid: u32,
    token_file: PathBuf,
}

/// The token a server of this host published for one of `addrs`
/// ([`publish_token`]), if its process still runs and its token file can
/// be read (by this user: the runtime directory and the file are the
/// publisher's own).
pub(crate) fn published_token(addrs: &[String]) -> Option<Arc<Token>> {
    let dir = runtime_dir()?;
    addrs.iter().find_map(|a| published_token_in(&dir, a))
}

/// [`published_token`] from runtime directory `dir`.
fn published_token_in(dir: &Path, addr: &str) -> Option<Arc<Token>> {
    let path = dir.join(entry_name(addr));
    let file = std::fs::File::open(&path).ok()?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, MAX_ENTRY_LEN), &mut text).ok()?;
    let entry: Entry = toml::from_str(&text).ok()?;
    if !process_runs(entry.pid) {
        // Left behind by a server that was killed.
        let _ = std::fs::remove_file(&path);
        return None;
    }
    let read = read_secret(&entry.token_file, "token file").and_then(|secret| {
        Token::new(
            &secret,
            &format!("token file {}", entry.token_file.display()),
        )
    });
    match read {
        Ok(t) => Some(Arc::new(t)),
        Err(e) => {
            tracing::warn!("the cluster at {addr} published its token, but it cannot be used: {e}");
            None
        }
    }
}

/// Whether process `pid` exists (it may belong to another user).
fn process_runs(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists and may be
    // signalled; nothing is sent.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Entries in the runtime directory that tell clients of this user on
/// this host which token file guards a cluster; removed when dropped.
#[derive(Debug, Default)]
pub struct PublishedToken {
    entries: Vec<PathBuf>,
}

impl PublishedToken {
    /// Removes the entries now (also done on drop).
    pub fn withdraw(&mut self) {
        for e in self.entries.drain(..) {
            let _ = std::fs::remove_file(e);
        }
    }
}

impl Drop for PublishedToken {
    fn drop(&mut self) {
        self.withdraw();
    }
}

/// Tells clients of this user on this host that the cluster whose
/// metadata server listens on `addr` takes the token in `token_file`, so
/// that [`discover`] finds it without a setting: one entry per name a
/// local client may use for `addr` (a wildcard or loopback address is
/// also published as `127.0.0.1` and `localhost`). The runtime directory
/// ([`runtime_dir`]) is created with mode 0700 and each entry with 0600;
/// entries of processes that no longer run are ignored by clients.
pub fn publish_token(
    addr: std::net::SocketAddr,
    token_file: &Path,
) -> std::io::Result<PublishedToken> {
    let dir = runtime_dir().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "none of NK_RUNTIME_DIR, XDG_RUNTIME_DIR and HOME is set",
        )
    })?;
    publish_token_in(&dir, addr, token_file)
}

/// [`publish_token`] into runtime directory `dir`.
fn publish_token_in(
    dir: &Path,
    addr: std::net::SocketAddr,
    token_file: &Path,
) -> std::io::Result<PublishedToken> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let token_file = std::path::absolute(token_file)?;
    let port = addr.port();
    let mut names = vec![addr.to_string()];
    if addr.ip().is_unspecified() || addr.ip().is_loopback() {
        names.extend([format!("127.0.0.1:{port}"), format!("localhost:{port}")]);
    }
    names.dedup();
    let text = format!(
        "# written by the NodeKernel server with process id {pid}, removed when it stops\n\
         pid = {pid}\ntoken_file = {file}\n",
        pid = std::process::id(),
        file = toml::Value::String(token_file.to_string_lossy().into_owned()),
    );
    let mut published = PublishedToken::default();
    for name in names {
        let path = dir.join(entry_name(&name));
        let tmp = dir.join(format!(".{}.{}", entry_name(&name), std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        std::fs::rename(&tmp, &path)?;
        published.entries.push(path);
    }
    Ok(published)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_open_to_others_unless_only_its_owner_and_own_groups_read_it() {
        let own = [10001, 27];
        assert!(!open_to_others(0o100600, 0, &own), "owner only");
        assert!(
            !open_to_others(0o100440, 10001, &own),
            "a Secret volume's fsGroup"
        );
        assert!(!open_to_others(0o100640, 27, &own), "a supplementary group");
        assert!(
            open_to_others(0o100640, 100, &own),
            "a group this process is not in"
        );
        assert!(open_to_others(0o100444, 10001, &own), "everyone");
        assert!(open_to_others(0o100602, 0, &own), "writable by everyone");
        assert!(own_groups().contains(&unsafe { libc::getegid() }));
    }

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
    fn tenants_are_checked_when_servers_load_them() {
        let dir = tempfile::tempdir().unwrap();
        let secret = |name: &str| {
            let f = dir.path().join(name);
            write_new_secret(&f).unwrap();
            f.display().to_string()
        };
        let (cluster, a, b) = (secret("cluster"), secret("a"), secret("b"));
        let load = |text: &str| {
            let (_, s) = parse_sections(text, Path::new("nk.toml")).unwrap();
            s.load()
        };
        let tenant = |name: &str, file: &str, rights: &str| {
            format!(
                "[[security.tenant]]\nname = \"{name}\"\ntoken_file = \"{file}\"\n\
                 root = \"/tenants/{name}\"\nrights = [{rights}]\n"
            )
        };
        let head = format!("[security]\ntoken_file = \"{cluster}\"\n");
        let ok = load(&format!(
            "{head}{}{}",
            tenant("a", &a, "\"read\", \"write\""),
            tenant("b", &b, "\"read\"")
        ))
        .unwrap();
        assert_eq!(ok.tenants.len(), 2);
        assert_eq!(ok.tenants[1].root, "/tenants/b");
        assert!(ok.tenants[1].rights.read && !ok.tenants[1].rights.write);
        for (text, says) in [
            // The cluster's secret, or another tenant's, is no tenant's.
            (tenant("a", &cluster, "\"read\""), "the same secret"),
            (
                format!(
                    "{}{}",
                    tenant("a", &a, "\"read\""),
                    tenant("b", &a, "\"read\"")
                ),
                "the same secret",
            ),
            (tenant("a", &a, "\"everything\""), "unknown right"),
            (tenant("a", &a, ""), "at least one right"),
            (tenant("a b", &a, "\"read\""), "tenant name"),
            (
                "[[security.tenant]]\nname = \"a\"\nroot = \"/a\"\nrights = [\"read\"]\n".into(),
                "no token_file",
            ),
        ] {
            let e = load(&format!("{head}{text}")).unwrap_err();
            assert!(e.message.contains(says), "{says}: {e}");
        }
        // Without a cluster token: refused with insecure, otherwise left
        // for `nk up` to add its own (no server starts without one).
        let e = load(&format!(
            "[security]\ninsecure = true\n{}",
            tenant("a", &a, "\"read\"")
        ))
        .unwrap_err();
        assert!(e.message.contains("needs a cluster token"), "{e}");
        let s = load(&tenant("a", &a, "\"read\"")).unwrap();
        assert!(s.token.is_none() && s.tenants.len() == 1);
    }

    #[test]
    fn secret_files_must_be_regular_and_small() {
        let e = read_secret(Path::new("/dev/zero"), "token file").unwrap_err();
        assert!(e.message.contains("not a regular file"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'a'; MAX_TOKEN_LEN * 2 + 1]).unwrap();
        let e = read_secret(&big, "token file").unwrap_err();
        assert!(e.message.contains("larger than"), "{e}");
        let e = read_secret(dir.path(), "token file").unwrap_err();
        assert!(e.message.contains("not a regular file"), "{e}");
    }

    #[test]
    fn a_published_token_is_found_while_its_server_runs() {
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        write_new_secret(&token_file).unwrap();
        assert!(write_new_secret(&token_file).is_err(), "never overwrites");
        let want = Token::new(&read_secret(&token_file, "token file").unwrap(), "test").unwrap();
        let run = dir.path().join("run");
        let addr: std::net::SocketAddr = "0.0.0.0:4242".parse().unwrap();
        let mut published = publish_token_in(&run, addr, &token_file).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&run), 0o700);
        assert_eq!(mode(&token_file), 0o600);
        for name in ["0.0.0.0:4242", "127.0.0.1:4242", "localhost:4242"] {
            assert_eq!(mode(&run.join(entry_name(name))), 0o600);
            let found = published_token_in(&run, name).expect(name);
            assert_eq!(
                found.handover_proof(b"n"),
                want.handover_proof(b"n"),
                "{name}"
            );
        }
        assert!(published_token_in(&run, "127.0.0.1:4243").is_none());
        assert!(published_token_in(&run, "10.0.0.1:4242").is_none());
        published.withdraw();
        assert!(published_token_in(&run, "127.0.0.1:4242").is_none());
        // An entry of a process that is gone is ignored and removed.
        let published = publish_token_in(&run, addr, &token_file).unwrap();
        let entry = run.join(entry_name("127.0.0.1:4242"));
        let text = std::fs::read_to_string(&entry).unwrap();
        let gone = text.replace(
            &format!("pid = {}", std::process::id()),
            &format!("pid = {}", i32::MAX),
        );
        std::fs::write(&entry, gone).unwrap();
        assert!(published_token_in(&run, "127.0.0.1:4242").is_none());
        assert!(!entry.exists());
        drop(published);
        assert!(
            std::fs::read_dir(&run).unwrap().next().is_none(),
            "all withdrawn"
        );
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
