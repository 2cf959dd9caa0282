//! The default handshake on both ends ([`VersionHandshake`]): TLS first
//! on TCP when configured ([`crate::tls`]), one HELLO each way
//! ([`nodekernel_proto::hello`]) requiring the same wire version, and with
//! a cluster [`Token`] each end's proof of it ([`crate::auth`]). Built on
//! the handshake plug of [`crate::handshake`].

use crate::auth::{Proven, Token};
use crate::handshake::{ClientHandshake, HandshakeIo, PeerInfo, ServerHandshake};
use crate::tls::Tls;
use bytes::BytesMut;
use futures::future::BoxFuture;
use nodekernel_proto::frame::STATUS_OK;
use nodekernel_proto::hello::{
    Hello, Role, AUTH_KIND, HELLO_ID, HELLO_KIND, NONCE_LEN, WIRE_VERSION,
};
use nodekernel_proto::{Error, ErrorCode, Result};
use std::sync::Arc;

/// The default handshake on both ends: one HELLO each way and the same wire
/// version required of both; with a cluster [`Token`], each end also
/// proves the token to the other ([`crate::auth`]).
#[derive(Debug, Clone)]
pub struct VersionHandshake {
    role: Role,
    version: u16,
    token: Option<Arc<Token>>,
    tls: Option<Arc<Tls>>,
}

impl VersionHandshake {
    /// Speaks this build's [`WIRE_VERSION`] and introduces itself as `role`.
    pub fn new(role: Role) -> VersionHandshake {
        VersionHandshake {
            role,
            version: WIRE_VERSION,
            token: None,
            tls: None,
        }
    }

    /// Speaks `version` instead of [`WIRE_VERSION`] (to test how other
    /// versions are treated).
    #[doc(hidden)]
    pub fn speaking(role: Role, version: u16) -> VersionHandshake {
        VersionHandshake {
            version,
            ..VersionHandshake::new(role)
        }
    }

    /// This handshake proving `token` (and requiring the peer to prove it);
    /// `None` leaves it without one.
    pub fn with_token(mut self, token: Option<Arc<Token>>) -> VersionHandshake {
        self.token = token;
        self
    }

    /// This handshake starting TLS on TCP connections first (see
    /// [`crate::tls`]); `None` leaves them plain.
    pub fn with_tls(mut self, tls: Option<Arc<Tls>>) -> VersionHandshake {
        self.tls = tls;
        self
    }

    fn hello(&self, nonce: Option<[u8; NONCE_LEN]>) -> Result<BytesMut> {
        let mut hello = Hello {
            version: self.version,
            role: self.role,
            ext: Vec::new(),
        };
        if let Some(n) = nonce {
            hello = hello.with_nonce(n);
        }
        let mut b = BytesMut::new();
        hello.encode(&mut b)?;
        Ok(b)
    }

    async fn client(&self, io: &mut HandshakeIo) -> Result<PeerInfo> {
        if let Some(tls) = &self.tls {
            io.start_tls_client(tls).await?;
        }
        let ours = self.token.as_ref().map(|_| Token::nonce()).transpose()?;
        io.send(HELLO_ID, HELLO_KIND, &self.hello(ours)?).await?;
        let answer = io.recv().await?;
        let peer = io.peer().to_string();
        if answer.id != HELLO_ID {
            return Err(Error::protocol(format!(
                "the server at {peer} answered the HELLO with id {}",
                answer.id
            )));
        }
        if answer.kind != STATUS_OK {
            let e = Error::from_wire(answer.kind, &answer.payload);
            if e.code == ErrorCode::Protocol {
                // A server from before the handshake treats a HELLO as an
                // unknown request.
                return Err(Error::version_mismatch(format!(
                    "wire version mismatch: this client speaks NodeKernel wire version {}, \
                     the server at {peer} does not understand the version handshake \
                     (it is older than wire version 1?): {}",
                    self.version, e.message
                )));
            }
            return Err(refused(&peer, e));
        }
        let theirs = Hello::decode(&answer.payload).map_err(|e| {
            Error::protocol(format!(
                "the server at {peer} answered the HELLO with: {}",
                e.message
            ))
        })?;
        if theirs.version != self.version {
            return Err(Error::version_mismatch(format!(
                "wire version mismatch: this client speaks NodeKernel wire version {}, \
                 the server at {peer} speaks version {}",
                self.version, theirs.version
            )));
        }
        let info = PeerInfo {
            version: theirs.version,
            role: theirs.role,
            tenant: None,
        };
        let (Some(token), Some(ours)) = (&self.token, ours) else {
            return Ok(info);
        };
        let Some(nonce) = theirs.nonce()? else {
            return Err(Error::unauthenticated(format!(
                "the {} at {peer} does not authenticate connections (it has no cluster token \
                 configured) but this end has one, so it cannot tell the server belongs to \
                 the cluster: configure the same [security] token there",
                theirs.role
            )));
        };
        io.send(HELLO_ID, AUTH_KIND, &token.client_proof(&nonce, &ours))
            .await?;
        let answer = io.recv().await?;
        if answer.kind != STATUS_OK {
            return Err(refused(
                &peer,
                Error::from_wire(answer.kind, &answer.payload),
            ));
        }
        if !token.check_server(&ours, &nonce, &answer.payload) {
            return Err(Error::unauthenticated(format!(
                "the {} at {peer} did not prove the cluster token: it belongs to another \
                 cluster, or impersonates a member of this one",
                theirs.role
            )));
        }
        Ok(info)
    }

    async fn server(&self, io: &mut HandshakeIo) -> Result<PeerInfo> {
        if let Some(tls) = &self.tls {
            io.start_tls_server(tls).await?;
        }
        let first = io.recv().await?;
        if first.kind != HELLO_KIND || first.id != HELLO_ID {
            return Err(Error::protocol(format!(
                "the first frame of a connection must be a HELLO (kind {HELLO_KIND:#x}, id \
                 {HELLO_ID}), not kind {} with id {}: this server speaks NodeKernel wire \
                 version {} and expects the version handshake first",
                first.kind, first.id, self.version
            )));
        }
        let theirs = Hello::decode(&first.payload)?;
        let same_version = theirs.version == self.version;
        let peer_nonce = if same_version { theirs.nonce()? } else { None };
        if self.token.is_some() && same_version && peer_nonce.is_none() {
            tracing::warn!(
                "refused a connection from {} ({}): it offered no proof of the cluster token",
                io.peer(),
                theirs.role
            );
            // Not answered here: the transport answers the HELLO with this.
            return Err(Error::unauthenticated(
                "this server requires the cluster token: give the client the cluster's token \
                 ([security] token_file in its configuration, or NK_TOKEN_FILE; `nk up` keeps \
                 its own in DIR/token of its data directory and prints where)",
            ));
        }
        let ours = self.token.as_ref().map(|_| Token::nonce()).transpose()?;
        // Answered with our version even when it differs: the client then
        // names both versions in its own error.
        io.send(HELLO_ID, STATUS_OK, &self.hello(ours)?).await?;
        if !same_version {
            tracing::warn!(
                "refused a connection from {} ({}): it speaks NodeKernel wire version {}, \
                 this server speaks version {}",
                io.peer(),
                theirs.role,
                theirs.version,
                self.version
            );
            return Err(Error::version_mismatch(format!(
                "wire version mismatch: the {} at {} speaks NodeKernel wire version {}, \
                 this server speaks version {}",
                theirs.role,
                io.peer(),
                theirs.version,
                self.version
            )));
        }
        let mut tenant = None;
        if let (Some(token), Some(ours), Some(theirs_nonce)) = (&self.token, ours, peer_nonce) {
            let proof = io.recv().await?;
            if proof.kind != AUTH_KIND || proof.id != HELLO_ID {
                return Err(Error::protocol(format!(
                    "expected the proof of the cluster token (kind {AUTH_KIND:#x}, id \
                     {HELLO_ID}) after the HELLO, not kind {} with id {}",
                    proof.kind, proof.id
                )));
            }
            let Some(who) = token.check_client(&ours, &theirs_nonce, &proof.payload) else {
                tracing::warn!(
                    "refused a connection from {} ({}): wrong cluster token",
                    io.peer(),
                    theirs.role
                );
                return Err(Error::unauthenticated(
                    "wrong cluster token: this server does not accept the token the client \
                     proved",
                ));
            };
            io.send(
                HELLO_ID,
                STATUS_OK,
                &token.server_proof(who, &theirs_nonce, &ours),
            )
            .await?;
            if let Proven::Tenant(i) = who {
                tenant = Some(token.tenant_name(i));
            }
        }
        Ok(PeerInfo {
            version: theirs.version,
            role: theirs.role,
            tenant,
        })
    }
}

/// A server's refusal `e`, as the client reports it.
fn refused(peer: &str, e: Error) -> Error {
    Error::new(
        e.code,
        format!("the server at {peer} refused the connection: {}", e.message),
    )
}

impl ClientHandshake for VersionHandshake {
    fn connect<'a>(&'a self, io: &'a mut HandshakeIo) -> BoxFuture<'a, Result<PeerInfo>> {
        Box::pin(self.client(io))
    }
}

impl ServerHandshake for VersionHandshake {
    fn accept<'a>(&'a self, io: &'a mut HandshakeIo) -> BoxFuture<'a, Result<PeerInfo>> {
        Box::pin(self.server(io))
    }
}
