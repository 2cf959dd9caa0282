//! TLS on the TCP transport (rustls, TLS 1.3 only, ring as the provider).
//!
//! TLS runs inside the handshake ([`crate::handshake`]): a TCP connection
//! first completes a TLS handshake, then the HELLO exchange (and the
//! cluster-token proof) runs inside it. Unix sockets and shared memory stay
//! plain: they only reach peers on the same host, whom TLS would not keep
//! out ([`crate::LocalPeers`] does).
//!
//! After the handshake the session stays on the connection's own socket
//! and runs in line (`tls_io.rs`): every read of the transport
//! decrypts what the socket has straight into the transport's buffers (or
//! a caller's), every write encrypts from the frames being sent, so busy
//! polling, replies received into callers' buffers and the server's
//! bounds all work as on a plain socket, with no relay task in between.
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
        let conn = rustls::ClientConnection::new(tls.client.clone(), name)
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
        let conn = rustls::ServerConnection::new(config.clone())
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
        let dir = tempfile::tempdir().unwrap();
        let g = generate(dir.path(), &["127.0.0.1".into()]).unwrap();
        let tls = Tls::load(&TlsFiles {
            ca_file: Some(&g.ca_file),
            cert_file: Some(&g.cert_file),
            key_file: Some(&g.key_file),
            ..TlsFiles::default()
        })
        .unwrap();
        let (ours, theirs) = tcp_pair().await;
        let name = tls.name_for("127.0.0.1:1").unwrap();
        let conn = rustls::ClientConnection::new(tls.client.clone(), name).unwrap();
        let peer = tokio::task::spawn_blocking(move || client(conn, theirs));
        let server = rustls::ServerConnection::new(tls.server.clone().unwrap()).unwrap();
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
