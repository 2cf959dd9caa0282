//! TLS on the TCP transport (rustls, TLS 1.3 only, ring as the provider).
//!
//! TLS runs inside the handshake ([`crate::handshake`]): a TCP connection
//! first completes a TLS handshake, then the HELLO exchange (and the
//! cluster-token proof) runs inside it. Unix sockets and shared memory stay
//! plain: they only reach peers on the same host, whom TLS would not keep
//! out ([`crate::LocalPeers`] does).
//!
//! After the handshake the session stays on the connection's own socket
//! and runs in line (`tls_io.rs`, rustls's unbuffered API): every read of
//! the transport has rustls decrypt what the socket brought in place in
//! the session's receive stage and copies it into the transport's buffers
//! (or a caller's), every write encrypts from the frames being sent into
//! one send buffer, so busy polling, replies received into callers'
//! buffers and the server's bounds all work as on a plain socket, with no
//! relay task in between. The handshake is the same state machine driven
//! to its end before the HELLO exchange starts.
//!
//! Either end names its mistake clearly: a plain server answers a TLS
//! client by closing (the client says TLS may not be configured there), a
//! TLS server answers a plain client with an error frame saying TLS is
//! required, and a certificate not signed by the configured authority is
//! refused naming the reason rustls gives.

use crate::handshake::HandshakeIo;
use crate::tls_io::TlsSession;
use crate::transport::Stream;
use nodekernel_proto::hello::HELLO_ID;
use nodekernel_proto::{Error, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

/// Largest PEM file read (certificates, keys).
const MAX_PEM_FILE: u64 = 1 << 20;

/// Where a node's TLS settings come from (`[security.tls]`, see
/// `docs/security.md`).
#[derive(Debug, Clone, Default)]
pub struct TlsFiles<'a> {
    /// PEM certificates of the authorities that sign the cluster's
    /// certificates: servers are checked against them, and clients too when
    /// `require_client_cert` is set.
    pub ca_file: Option<&'a Path>,
    /// This node's certificate chain (PEM): served by its servers, and
    /// presented by its clients when a server asks.
    pub cert_file: Option<&'a Path>,
    /// The private key of `cert_file` (PEM).
    pub key_file: Option<&'a Path>,
    /// Servers refuse clients without a certificate signed by `ca_file`.
    pub require_client_cert: bool,
    /// The name a server's certificate must carry; by default the host of
    /// the address connected to (an IP address or a DNS name).
    pub server_name: Option<&'a str>,
}

/// A node's TLS configuration: how its clients connect, and (when it has a
/// certificate) how its servers accept.
pub struct Tls {
    client: Arc<rustls::ClientConfig>,
    server: Option<Arc<rustls::ServerConfig>>,
    server_name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("serves", &self.server.is_some())
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

fn bad(what: &str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::invalid_argument(format!("[security.tls] {what} {}: {e}", path.display()))
}

/// Reads a PEM file of at most [`MAX_PEM_FILE`] bytes.
fn read_pem(what: &str, path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| bad(what, path, e))?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| bad(what, path, e))?;
    if bytes.len() as u64 > MAX_PEM_FILE {
        return Err(bad(what, path, format!("larger than {MAX_PEM_FILE} bytes")));
    }
    Ok(bytes)
}

fn certificates(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let pem = read_pem(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad(what, path, e))?;
    if certs.is_empty() {
        return Err(bad(what, path, "no PEM certificate in it"));
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(&read_pem("key_file", path)?)
        .map_err(|e| bad("key_file", path, e))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Tls {
    /// Loads the files `files` names. A client needs `ca_file`; a server
    /// needs `cert_file` and `key_file` as well. Every problem names the
    /// file and the setting.
    pub fn load(files: &TlsFiles<'_>) -> Result<Tls> {
        let tls_err = |e: rustls::Error| Error::invalid_argument(format!("[security.tls]: {e}"));
        let ca = files.ca_file.ok_or_else(|| {
            Error::invalid_argument(
                "[security.tls] needs ca_file: the certificate authority that signs the \
                 cluster's certificates",
            )
        })?;
        let mut roots = rustls::RootCertStore::empty();
        for c in certificates("ca_file", ca)? {
            roots.add(c).map_err(|e| bad("ca_file", ca, e))?;
        }
        let roots = Arc::new(roots);
        let identity = match (files.cert_file, files.key_file) {
            (Some(c), Some(k)) => Some((certificates("cert_file", c)?, private_key(k)?)),
            (None, None) => None,
            _ => {
                return Err(Error::invalid_argument(
                    "[security.tls]: give cert_file and key_file together",
                ))
            }
        };
        let versions: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .map_err(tls_err)?
            .with_root_certificates(roots.clone());
        let client = match &identity {
            Some((certs, key)) => client
                .with_client_auth_cert(certs.clone(), key.clone_key())
                .map_err(tls_err)?,
            None => client.with_no_client_auth(),
        };
        let server = match identity {
            Some((certs, key)) => {
                let builder = rustls::ServerConfig::builder_with_provider(provider())
                    .with_protocol_versions(versions)
                    .map_err(tls_err)?;
                let builder = if files.require_client_cert {
                    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                        roots,
                        provider(),
                    )
                    .build()
                    .map_err(|e| Error::invalid_argument(format!("[security.tls]: {e}")))?;
                    builder.with_client_cert_verifier(verifier)
                } else {
                    builder.with_no_client_auth()
                };
                let config = builder.with_single_cert(certs, key).map_err(tls_err)?;
                Some(Arc::new(config))
            }
            None if files.require_client_cert => {
                return Err(Error::invalid_argument(
                    "[security.tls] require_client_cert needs this node's own cert_file and \
                     key_file",
                ))
            }
            None => None,
        };
        let server_name = files
            .server_name
            .map(|n| {
                ServerName::try_from(n.to_string()).map_err(|e| {
                    Error::invalid_argument(format!("[security.tls] server_name {n:?}: {e}"))
                })
            })
            .transpose()?;
        Ok(Tls {
            client: Arc::new(client),
            server,
            server_name,
        })
    }

    /// The name `addr`'s certificate must carry.
    fn name_for(&self, addr: &str) -> Result<ServerName<'static>> {
        if let Some(n) = &self.server_name {
            return Ok(n.clone());
        }
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        ServerName::try_from(host.to_string()).map_err(|e| {
            Error::invalid_argument(format!(
                "{addr}: {host:?} is no name a certificate can carry ({e}); set [security.tls] \
                 server_name"
            ))
        })
    }
}

/// The client's message for a failed TLS handshake with `peer`.
fn client_failure(peer: &str, e: std::io::Error) -> Error {
    let hint = match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidCertificate(_)) => {
            "this client does not trust the server's certificate: it must be signed by the \
             authority in [security.tls] ca_file and name the address connected to (or \
             server_name)"
        }
        Some(rustls::Error::AlertReceived(_)) => "the server refused this client's TLS handshake",
        _ if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            "the server closed the connection: is TLS configured on it ([security.tls] with \
             cert_file)? A plain server closes on a TLS client"
        }
        _ => "is TLS configured on that server ([security.tls])?",
    };
    Error::unauthenticated(format!("TLS handshake with {peer} failed: {e}; {hint}"))
}

impl HandshakeIo {
    /// On a TCP socket, runs the client side of a TLS handshake and keeps
    /// the session on the socket; other sockets stay as they are.
    pub(crate) async fn start_tls_client(&mut self, tls: &Tls) -> Result<()> {
        if !self.stream.is_plain_tcp() {
            return Ok(());
        }
        let peer = self.peer().to_string();
        let name = tls.name_for(&peer)?;
        let conn = rustls::client::UnbufferedClientConnection::new(tls.client.clone(), name)
            .map_err(|e| Error::invalid_argument(format!("[security.tls]: {e}")))?;
        let Stream::Tcp(tcp, session) = &mut self.stream else {
            return Ok(());
        };
        let tls = Arc::new(TlsSession::new(conn.into(), tcp.as_raw_fd()));
        tls.handshake(tcp)
            .await
            .map_err(|e| client_failure(&peer, e))?;
        *session = Some(tls);
        Ok(())
    }

    /// On a TCP socket, runs the server side of a TLS handshake and keeps
    /// the session on the socket. A peer whose first byte is no TLS
    /// handshake record is a plain client: it is told TLS is required.
    pub(crate) async fn start_tls_server(&mut self, tls: &Tls) -> Result<()> {
        let Some(config) = &tls.server else {
            return Ok(());
        };
        if !self.stream.is_plain_tcp() {
            return Ok(());
        }
        let peer = self.peer().to_string();
        let Stream::Tcp(tcp, session) = &mut self.stream else {
            return Ok(());
        };
        let mut first = [0u8; 1];
        let n = tcp
            .peek(&mut first)
            .await
            .map_err(|e| crate::sock::io_error(&format!("handshake with {peer}"), e))?;
        if n == 1 && first[0] != 0x16 {
            // A plain HELLO: answer it in the clear, where the client
            // can read why.
            self.mark_unanswered(HELLO_ID);
            tracing::warn!(
                "refused a connection from {peer}: it did not start TLS, which this server \
                 requires"
            );
            return Err(Error::unauthenticated(
                "this server requires TLS on its TCP ports: configure [security.tls] ca_file on \
                 the client (or connect over the server's Unix socket on its host)",
            ));
        }
        let conn = rustls::server::UnbufferedServerConnection::new(config.clone())
            .map_err(|e| Error::invalid_argument(format!("[security.tls]: {e}")))?;
        let tls = Arc::new(TlsSession::new(conn.into(), tcp.as_raw_fd()));
        tls.handshake(tcp).await.map_err(|e| {
            tracing::warn!("refused a connection from {peer}: TLS handshake failed: {e}");
            Error::unauthenticated(format!("TLS handshake failed: {e}"))
        })?;
        *session = Some(tls);
        Ok(())
    }
}

/// What [`generate`] wrote.
#[derive(Debug, Clone)]
pub struct Generated {
    pub ca_file: std::path::PathBuf,
    pub ca_key_file: std::path::PathBuf,
    pub cert_file: std::path::PathBuf,
    pub key_file: std::path::PathBuf,
}

/// Writes a new certificate authority (`ca.pem`, `ca.key`) and a node
/// certificate it signs (`node.pem`, `node.key`) for `hosts` (IP addresses
/// or DNS names) into `dir`, which must not hold any of them yet. Keys are
/// written with mode 0600. Meant for a cluster without a PKI of its own:
/// every node may share the one node certificate (`nk tls new`).
pub fn generate(dir: &Path, hosts: &[String]) -> Result<Generated> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let fail = |e: rcgen::Error| Error::invalid_argument(format!("generating certificates: {e}"));
    if hosts.is_empty() {
        return Err(Error::invalid_argument(
            "a certificate needs at least one host name or address",
        ));
    }
    let out = Generated {
        ca_file: dir.join("ca.pem"),
        ca_key_file: dir.join("ca.key"),
        cert_file: dir.join("node.pem"),
        key_file: dir.join("node.key"),
    };
    let ca_key = KeyPair::generate().map_err(fail)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "NodeKernel cluster authority");
    let ca_cert = ca.self_signed(&ca_key).map_err(fail)?;
    let issuer = Issuer::new(ca, ca_key);
    let node_key = KeyPair::generate().map_err(fail)?;
    let mut node = CertificateParams::new(hosts.to_vec()).map_err(fail)?;
    node.distinguished_name
        .push(DnType::CommonName, "NodeKernel node");
    let node_cert = node.signed_by(&node_key, &issuer).map_err(fail)?;
    let files = [
        (&out.ca_file, ca_cert.pem(), 0o644),
        (&out.ca_key_file, issuer.key().serialize_pem(), 0o600),
        (&out.cert_file, node_cert.pem(), 0o644),
        (&out.key_file, node_key.serialize_pem(), 0o600),
    ];
    if let Some((f, _, _)) = files.iter().find(|(f, _, _)| f.exists()) {
        return Err(Error::invalid_argument(format!(
            "{} exists: not overwriting certificates or keys",
            f.display()
        )));
    }
    for (path, text, mode) in files {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)
            .and_then(|mut f| f.write_all(text.as_bytes()));
        written.map_err(|e| Error::invalid_argument(format!("writing {}: {e}", path.display())))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::tls_io::TlsSession;

    #[test]
    fn no_handshake_frame_looks_like_tls() {
        use crate::limits::MAX_HANDSHAKE_PAYLOAD;
        use nodekernel_proto::HEADER_LEN;
        let smallest = u32::from_le_bytes([0x14, 3, 1, 0]) as usize;
        assert!(smallest > MAX_HANDSHAKE_PAYLOAD + HEADER_LEN);
        use crate::handshake::looks_like_tls;
        assert!(looks_like_tls(&[0x16, 3, 1, 2, 0]));
        assert!(!looks_like_tls(&[0x16, 3, 0, 0]));
        assert!(!looks_like_tls(&[0x16, 3]));
    }

    /// A connected pair of loopback TCP sockets: tokio's for the session
    /// under test, std's (blocking) for a peer driven by hand.
    async fn tcp_pair() -> (tokio::net::TcpStream, std::net::TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let peer = tokio::task::spawn_blocking(move || std::net::TcpStream::connect(addr).unwrap());
        let (ours, _) = l.accept().await.unwrap();
        (ours, peer.await.unwrap())
    }

    /// A server session on a socket whose client is a bare rustls
    /// connection run by `client` on a blocking socket (it sends what it
    /// likes, records cut short included); returns what the server's
    /// `recv` gave: the bytes, then how the stream ended.
    async fn serve_one(
        client: impl FnOnce(rustls::ClientConnection, std::net::TcpStream) + Send + 'static,
    ) -> (Vec<u8>, std::io::Result<()>) {
        use super::*;
        let (_dir, tls) = loopback_tls();
        let (ours, theirs) = tcp_pair().await;
        let name = tls.name_for("127.0.0.1:1").unwrap();
        let conn = rustls::ClientConnection::new(tls.client.clone(), name).unwrap();
        let peer = tokio::task::spawn_blocking(move || client(conn, theirs));
        let server =
            rustls::server::UnbufferedServerConnection::new(tls.server.clone().unwrap()).unwrap();
        let session = TlsSession::new(server.into(), ours.as_raw_fd());
        // Records right behind the client's last handshake message are
        // processed with it: a bad one may fail the handshake itself.
        let shaken = session.handshake(&ours).await;
        let mut got = Vec::new();
        let end = loop {
            if let Err(e) = shaken {
                break Err(e);
            }
            let mut buf = vec![0u8; 10_000];
            // SAFETY: `buf` is ours, of that length.
            match unsafe { session.recv(buf.as_mut_ptr(), buf.len()) } {
                Ok(Some(0)) => break Ok(()),
                Ok(Some(n)) => got.extend_from_slice(&buf[..n]),
                Ok(None) => ours.readable().await.unwrap(),
                Err(e) => break Err(e),
            }
        };
        // Our end closes before the peer is awaited: it reads to the end.
        drop(session);
        drop(ours);
        peer.await.unwrap();
        (got, end)
    }

    /// Runs `conn`'s handshake on `sock`, sends `data`, and writes the
    /// first `cut` bytes of the records (all if `None`), then closes
    /// (with `close_notify` when `notify`).
    fn send_records(
        mut conn: rustls::ClientConnection,
        mut sock: std::net::TcpStream,
        data: &[u8],
        cut: Option<usize>,
        notify: bool,
    ) {
        use std::io::Write;
        while conn.is_handshaking() {
            conn.complete_io(&mut sock).unwrap();
        }
        conn.set_buffer_limit(None);
        conn.writer().write_all(data).unwrap();
        if notify {
            conn.send_close_notify();
        }
        let mut records = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut records).unwrap();
        }
        let n = cut.unwrap_or(records.len());
        sock.write_all(&records[..n]).unwrap();
        drain(sock);
    }

    /// Ends the sending direction and reads what the server still sends
    /// (session tickets, alerts) until it closes, so no unread byte turns
    /// the close into a reset.
    fn drain(mut sock: std::net::TcpStream) {
        let _ = sock.shutdown(std::net::Shutdown::Write);
        let mut rest = Vec::new();
        let _ = std::io::Read::read_to_end(&mut sock, &mut rest);
    }

    /// A node's TLS settings for one loopback certificate, kept with the
    /// directory holding its files.
    fn loopback_tls() -> (tempfile::TempDir, super::Tls) {
        use super::*;
        let dir = tempfile::tempdir().unwrap();
        let g = generate(dir.path(), &["127.0.0.1".into()]).unwrap();
        let tls = Tls::load(&TlsFiles {
            ca_file: Some(&g.ca_file),
            cert_file: Some(&g.cert_file),
            key_file: Some(&g.key_file),
            ..TlsFiles::default()
        })
        .unwrap();
        (dir, tls)
    }

    /// Two sessions of ours, client and server, on a loopback pair, after
    /// their handshakes.
    async fn session_pair() -> (
        (tokio::net::TcpStream, crate::tls_io::TlsSession),
        (tokio::net::TcpStream, crate::tls_io::TlsSession),
    ) {
        use super::*;
        let (_dir, tls) = loopback_tls();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (a, b) = tokio::join!(tokio::net::TcpStream::connect(addr), l.accept());
        let (c, s) = (a.unwrap(), b.unwrap().0);
        let name = tls.name_for("127.0.0.1:1").unwrap();
        let client = rustls::client::UnbufferedClientConnection::new(tls.client.clone(), name);
        let client = TlsSession::new(client.unwrap().into(), c.as_raw_fd());
        let server = rustls::server::UnbufferedServerConnection::new(tls.server.clone().unwrap());
        let server = TlsSession::new(server.unwrap().into(), s.as_raw_fd());
        let (x, y) = tokio::join!(client.handshake(&c), server.handshake(&s));
        x.unwrap();
        y.unwrap();
        ((c, client), (s, server))
    }

    /// Writes all of `data` through `session`, then flushes it.
    async fn send_all(tcp: &tokio::net::TcpStream, session: &TlsSession, data: &[u8]) {
        use tokio::io::Interest;
        let mut off = 0;
        while off < data.len() {
            let slices = [std::io::IoSlice::new(&data[off..])];
            match tcp.try_io(Interest::WRITABLE, || session.send(&slices)) {
                Ok(n) => off += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    tcp.writable().await.unwrap()
                }
                Err(e) => panic!("{e}"),
            }
        }
        loop {
            match tcp.try_io(Interest::WRITABLE, || session.flush()) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    tcp.writable().await.unwrap()
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// Reads exactly `n` bytes from `session`, `chunk` at most per read,
    /// waiting for the socket only while the session holds no input.
    async fn recv_exact(
        tcp: &tokio::net::TcpStream,
        session: &TlsSession,
        n: usize,
        chunk: usize,
    ) -> Vec<u8> {
        use tokio::io::Interest;
        let mut got = Vec::with_capacity(n);
        while got.len() < n {
            let want = chunk.min(n - got.len());
            got.reserve(want);
            let spare = got.spare_capacity_mut();
            let mut read = || {
                // SAFETY: `spare` has room for `want` bytes.
                match unsafe { session.recv(spare.as_mut_ptr().cast(), want) } {
                    Ok(None) => Err(std::io::ErrorKind::WouldBlock.into()),
                    Ok(Some(0)) => Err(std::io::ErrorKind::UnexpectedEof.into()),
                    Ok(Some(k)) => Ok(k),
                    Err(e) => Err(e),
                }
            };
            let r = if session.has_input() {
                read()
            } else {
                tcp.try_io(Interest::READABLE, read)
            };
            match r {
                // SAFETY: `k` bytes were written into the spare capacity.
                Ok(k) => unsafe { got.set_len(got.len() + k) },
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    tcp.readable().await.unwrap()
                }
                Err(e) => panic!("after {} of {n} bytes: {e}", got.len()),
            }
        }
        got
    }

    #[tokio::test]
    async fn megabytes_cross_both_ways_at_once_intact() {
        let ((ct, client), (st, server)) = session_pair().await;
        let up: Vec<u8> = (0..5_000_003u32).map(|i| (i % 251) as u8).collect();
        let down: Vec<u8> = (0..4_000_037u32).map(|i| (i % 241) as u8).collect();
        // Both directions at once, so each side's writes meet the other's
        // records waiting in its stage.
        let (_, _, got_up, got_down) = tokio::join!(
            send_all(&ct, &client, &up),
            send_all(&st, &server, &down),
            recv_exact(&st, &server, up.len(), 1 << 20),
            recv_exact(&ct, &client, down.len(), 300_000),
        );
        assert!(got_up == up, "upstream differs");
        assert!(got_down == down, "downstream differs");
        // Nothing is left: a read finds nothing, after which neither
        // session claims input (readers wait for the socket again).
        for (tcp, session) in [(&ct, &client), (&st, &server)] {
            let mut b = [0u8; 16];
            let r = tcp.try_io(tokio::io::Interest::READABLE, || {
                // SAFETY: `b` is ours, of that length.
                match unsafe { session.recv(b.as_mut_ptr(), b.len()) } {
                    Ok(None) => Err(std::io::ErrorKind::WouldBlock.into()),
                    other => Ok(other),
                }
            });
            assert!(
                matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
                "{r:?}"
            );
            assert!(!session.has_input());
        }
    }

    #[tokio::test]
    async fn a_small_read_leaves_the_rest_of_a_record_readable_without_the_socket() {
        let ((ct, client), (st, server)) = session_pair().await;
        // One record of 10,000 bytes.
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
        send_all(&ct, &client, &data).await;
        let mut got = recv_exact(&st, &server, 100, 100).await;
        assert!(
            server.has_input(),
            "the rest of the record is in the session"
        );
        // No readiness from here on: the socket was drained into the
        // session; every read is served from it.
        while got.len() < data.len() {
            let mut b = vec![0u8; 777];
            // SAFETY: `b` is ours, of that length.
            let r = unsafe { server.recv(b.as_mut_ptr(), b.len()) };
            let n = r.unwrap().expect("served from the session");
            assert!(n > 0);
            got.extend_from_slice(&b[..n]);
        }
        assert!(got == data);
        let mut b = [0u8; 8];
        // SAFETY: `b` is ours, of that length.
        assert!(matches!(
            unsafe { server.recv(b.as_mut_ptr(), 8) },
            Ok(None)
        ));
        assert!(!server.has_input());
        drop((ct, client));
    }

    #[tokio::test]
    async fn closing_one_way_ends_that_way_and_the_other_goes_on() {
        let ((ct, client), (st, server)) = session_pair().await;
        send_all(&ct, &client, b"last words").await;
        client.close();
        assert_eq!(recv_exact(&st, &server, 10, 64).await, b"last words");
        let mut b = [0u8; 64];
        let end = loop {
            // SAFETY: `b` is ours, of that length.
            match unsafe { server.recv(b.as_mut_ptr(), b.len()) } {
                Ok(None) => st.readable().await.unwrap(),
                other => break other,
            }
        };
        assert!(matches!(end, Ok(Some(0))), "{end:?}");
        // The end stays the end, and needs no readiness.
        assert!(server.has_input());
        // SAFETY: as above.
        assert!(matches!(
            unsafe { server.recv(b.as_mut_ptr(), 64) },
            Ok(Some(0))
        ));
        // The client took nothing more to send...
        let e = client.send(&[std::io::IoSlice::new(b"more")]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe);
        // ...and still receives what the server sends, then its end.
        send_all(&st, &server, b"reply after close").await;
        server.close();
        assert_eq!(recv_exact(&ct, &client, 17, 64).await, b"reply after close");
        let end = loop {
            // SAFETY: as above.
            match unsafe { client.recv(b.as_mut_ptr(), b.len()) } {
                Ok(None) => ct.readable().await.unwrap(),
                other => break other,
            }
        };
        assert!(matches!(end, Ok(Some(0))), "{end:?}");
    }

    #[tokio::test]
    async fn records_in_between_and_close_notify_end_the_stream_cleanly() {
        let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let sent = data.clone();
        let (got, end) = serve_one(move |c, s| send_records(c, s, &sent, None, true)).await;
        end.unwrap();
        assert!(got == data, "{} of {} bytes", got.len(), data.len());
    }

    #[tokio::test]
    async fn a_record_cut_short_is_an_error_saying_so_after_the_whole_ones() {
        let data = vec![7u8; 100_000];
        // 40,000 bytes: two whole records (16 KiB and its overhead each)
        // and part of the third.
        let (got, end) =
            serve_one(move |c, s| send_records(c, s, &data, Some(40_000), false)).await;
        let e = end.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
        assert!(e.to_string().contains("close_notify"), "{e}");
        assert_eq!(got.len(), 2 * 16_384, "only whole records are delivered");
        assert!(got.iter().all(|&b| b == 7));
    }

    #[tokio::test]
    async fn close_notify_mid_stream_ends_it_and_what_follows_is_ignored() {
        let data: Vec<u8> = (0..50_000u32).map(|i| (i * 7) as u8).collect();
        let sent = data.clone();
        let (got, end) = serve_one(move |mut conn, mut sock| {
            use std::io::Write;
            while conn.is_handshaking() {
                conn.complete_io(&mut sock).unwrap();
            }
            conn.set_buffer_limit(None);
            conn.writer().write_all(&sent).unwrap();
            conn.send_close_notify();
            let mut records = Vec::new();
            while conn.wants_write() {
                conn.write_tls(&mut records).unwrap();
            }
            // Bytes after the close_notify, in the same write: TLS says
            // they are to be ignored.
            records.extend_from_slice(&[23, 3, 3, 0, 40]);
            records.extend_from_slice(&[0x5A; 40]);
            sock.write_all(&records).unwrap();
            drain(sock);
        })
        .await;
        end.unwrap();
        assert!(got == data, "{} of {} bytes", got.len(), data.len());
    }

    #[tokio::test]
    async fn a_key_update_from_the_peer_is_answered_and_traffic_goes_on_both_ways() {
        use super::*;
        use std::io::{Read, Write};
        let (_dir, tls) = loopback_tls();
        let (ours, mut theirs) = tcp_pair().await;
        let name = tls.name_for("127.0.0.1:1").unwrap();
        let mut peer = rustls::ClientConnection::new(tls.client.clone(), name).unwrap();
        let before: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let after: Vec<u8> = (0..100_000u32).map(|i| (i / 3) as u8).collect();
        let reply: Vec<u8> = (0..300_000u32).map(|i| (i / 5) as u8).collect();
        let (b, a, r) = (before.clone(), after.clone(), reply.clone());
        // A buffered rustls client: data, a key update (it asks us to
        // update ours too), more data; then it reads our reply, which
        // decrypts only if our answer to its update reached it first.
        let client = tokio::task::spawn_blocking(move || {
            while peer.is_handshaking() {
                peer.complete_io(&mut theirs).unwrap();
            }
            peer.set_buffer_limit(None);
            fn send(
                peer: &mut rustls::ClientConnection,
                sock: &mut std::net::TcpStream,
                data: &[u8],
            ) {
                peer.writer().write_all(data).unwrap();
                while peer.wants_write() {
                    peer.write_tls(sock).unwrap();
                }
            }
            send(&mut peer, &mut theirs, &b);
            peer.refresh_traffic_keys().unwrap();
            send(&mut peer, &mut theirs, &a);
            let mut got = Vec::new();
            let mut buf = vec![0u8; 65536];
            while got.len() < r.len() {
                if peer.read_tls(&mut theirs).unwrap() == 0 {
                    panic!("the server closed after {} bytes", got.len());
                }
                peer.process_new_packets().unwrap();
                loop {
                    match peer.reader().read(&mut buf) {
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            assert!(got == r, "the reply differs");
            // And once more the other way, after our answer.
            send(&mut peer, &mut theirs, b"still here");
            peer.send_close_notify();
            while peer.wants_write() {
                peer.write_tls(&mut theirs).unwrap();
            }
            drain(theirs);
        });
        let server = rustls::server::UnbufferedServerConnection::new(tls.server.clone().unwrap());
        let session = TlsSession::new(server.unwrap().into(), ours.as_raw_fd());
        session.handshake(&ours).await.unwrap();
        let got = recv_exact(&ours, &session, before.len() + after.len(), 1 << 16).await;
        assert!(got[..before.len()] == before[..], "before the update");
        assert!(got[before.len()..] == after[..], "after the update");
        send_all(&ours, &session, &reply).await;
        assert_eq!(recv_exact(&ours, &session, 10, 64).await, b"still here");
        session.close();
        let _ = session.flush();
        drop(session);
        drop(ours);
        client.await.unwrap();
    }

    #[tokio::test]
    async fn bytes_that_are_no_tls_record_fail_the_session_with_the_tls_error() {
        for garbage in [
            // A content type TLS does not have.
            vec![0x99; 64],
            // An application-data record longer than TLS allows.
            vec![23, 3, 3, 0xFF, 0xFF, 1, 2, 3],
            // A handshake record after the handshake, of nonsense.
            vec![22, 3, 3, 0, 4, 0xEE, 0xEE, 0xEE, 0xEE],
        ] {
            let (got, end) = serve_one(move |mut conn, mut sock| {
                use std::io::Write;
                while conn.is_handshaking() {
                    conn.complete_io(&mut sock).unwrap();
                }
                let _ = sock.write_all(&garbage);
                drain(sock);
            })
            .await;
            assert!(got.is_empty());
            let e = end.unwrap_err();
            let why = crate::tls_io::tls_failure(&e).expect("a TLS error");
            assert!(why.message.starts_with("TLS: "), "{why}");
        }
    }

    #[tokio::test]
    async fn garbage_after_the_handshake_fails_the_session_with_the_tls_error() {
        let (got, end) = serve_one(|mut conn, mut sock| {
            use std::io::Write;
            while conn.is_handshaking() {
                conn.complete_io(&mut sock).unwrap();
            }
            // An application-data record that does not decrypt.
            let _ = sock.write_all(&[23, 3, 3, 0, 32]);
            let _ = sock.write_all(&[0xAB; 32]);
            drain(sock);
        })
        .await;
        assert!(got.is_empty());
        let e = end.unwrap_err();
        let why = crate::tls_io::tls_failure(&e).expect("a TLS error");
        assert!(why.message.starts_with("TLS: "), "{why}");
    }
}
