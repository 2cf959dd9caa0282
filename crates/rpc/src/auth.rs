//! The cluster token: a shared secret that every connection proves before
//! it carries a request, when one is configured (`[security]` in the
//! configuration, `docs/security.md`).
//!
//! The proof runs inside the HELLO exchange ([`crate::handshake`]) and
//! never sends the token:
//!
//! ```text
//! client                                        server
//!   HELLO { version, role, nonce_c }  ------->
//!                                     <-------  HELLO { version, role, nonce_s }
//!   AUTH  { mac(token, "client", nonce_s, nonce_c) } -->
//!                                     <-------  OK { mac(token, "server", nonce_c, nonce_s) }
//! ```
//!
//! Each end picks a fresh 32-byte random nonce per connection, so a
//! recorded proof is worthless on another connection (the other end's
//! nonce differs), and the labels keep a client's proof from passing as a
//! server's. The server checks the client's proof against every token it
//! accepts (the current one and, while a token is being rotated, the
//! previous one) and answers with a proof under the token that matched, so
//! the client also knows it reached a member of the cluster.
//!
//! A server with a token refuses a client that offers no nonce; a client
//! with a token refuses a server whose HELLO carries none (it cannot prove
//! it belongs to the cluster). Both refusals are `Unauthenticated`.

use nodekernel_proto::auth::{mac, verify, MAC_LEN};
use nodekernel_proto::hello::NONCE_LEN;
use nodekernel_proto::{Error, Result};

/// Fewest bytes a token may have: a shorter one could be guessed.
pub const MIN_TOKEN_LEN: usize = 16;
/// Most bytes a token may have.
pub const MAX_TOKEN_LEN: usize = 4096;

const CLIENT_LABEL: &[u8] = b"nodekernel token proof: client";
const SERVER_LABEL: &[u8] = b"nodekernel token proof: server";
const HANDOVER_LABEL: &[u8] = b"nodekernel token proof: shared-memory hand-over";

/// A cluster token: the one this end proves, and every one it accepts from
/// peers (the same one, and during a rotation the previous one too).
#[derive(Clone)]
pub struct Token {
    /// `keys[0]` is presented; all are accepted.
    keys: Vec<Vec<u8>>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token(<{} secret(s)>)", self.keys.len())
    }
}

fn check(secret: &[u8], what: &str) -> Result<()> {
    if secret.len() < MIN_TOKEN_LEN || secret.len() > MAX_TOKEN_LEN {
        return Err(Error::invalid_argument(format!(
            "{what} has {} bytes; a cluster token has {MIN_TOKEN_LEN} to {MAX_TOKEN_LEN} \
             (`nk token new` makes one)",
            secret.len()
        )));
    }
    Ok(())
}

impl Token {
    /// A token proving and accepting `secret` (`what` names its source in
    /// errors).
    pub fn new(secret: &[u8], what: &str) -> Result<Token> {
        check(secret, what)?;
        Ok(Token {
            keys: vec![secret.to_vec()],
        })
    }

    /// This token also accepting `previous` from peers (while a new token
    /// is rolled out).
    pub fn accepting(mut self, previous: &[u8], what: &str) -> Result<Token> {
        check(previous, what)?;
        self.keys.push(previous.to_vec());
        Ok(self)
    }

    /// A fresh random nonce.
    pub fn nonce() -> Result<[u8; NONCE_LEN]> {
        let mut n = [0; NONCE_LEN];
        crate::random::random_bytes(&mut n)
            .map_err(|e| Error::internal(format!("no random nonce from the kernel: {e}")))?;
        Ok(n)
    }

    /// The client's proof for the server's nonce `server` and its own
    /// `client`.
    pub(crate) fn client_proof(
        &self,
        server: &[u8; NONCE_LEN],
        client: &[u8; NONCE_LEN],
    ) -> [u8; MAC_LEN] {
        mac(&self.keys[0], CLIENT_LABEL, &[server, client])
    }

    /// Which accepted token, if any, made the client's `proof`.
    pub(crate) fn check_client(
        &self,
        server: &[u8; NONCE_LEN],
        client: &[u8; NONCE_LEN],
        proof: &[u8],
    ) -> Option<usize> {
        (proof.len() == MAC_LEN).then_some(())?;
        self.keys
            .iter()
            .position(|k| verify(k, CLIENT_LABEL, &[server, client], proof))
    }

    /// The server's proof under accepted token `key`.
    pub(crate) fn server_proof(
        &self,
        key: usize,
        client: &[u8; NONCE_LEN],
        server: &[u8; NONCE_LEN],
    ) -> [u8; MAC_LEN] {
        mac(&self.keys[key], SERVER_LABEL, &[client, server])
    }

    /// A client's proof for the shared-memory hand-over's `nonce`.
    pub fn handover_proof(&self, nonce: &[u8]) -> [u8; MAC_LEN] {
        mac(&self.keys[0], HANDOVER_LABEL, &[nonce])
    }

    /// Whether `proof` is a hand-over proof for `nonce` under an accepted
    /// token.
    pub fn check_handover(&self, nonce: &[u8], proof: &[u8]) -> bool {
        proof.len() == MAC_LEN
            && self
                .keys
                .iter()
                .any(|k| verify(k, HANDOVER_LABEL, &[nonce], proof))
    }

    /// Whether the server's `proof` was made with this end's token.
    pub(crate) fn check_server(
        &self,
        client: &[u8; NONCE_LEN],
        server: &[u8; NONCE_LEN],
        proof: &[u8],
    ) -> bool {
        proof.len() == MAC_LEN && verify(&self.keys[0], SERVER_LABEL, &[client, server], proof)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_tokens_are_refused_naming_their_source() {
        let e = Token::new(b"short", "/etc/nk/token").unwrap_err();
        assert!(
            e.message.contains("/etc/nk/token") && e.message.contains("5 bytes"),
            "{e}"
        );
        let t = Token::new(&[1; 16], "t").unwrap();
        assert!(t.accepting(&[2; 3], "old").is_err());
    }

    #[test]
    fn proofs_bind_both_nonces_and_the_role() {
        let t = Token::new(&[1; 32], "t").unwrap();
        let (c, s) = (Token::nonce().unwrap(), Token::nonce().unwrap());
        let p = t.client_proof(&s, &c);
        assert_eq!(t.check_client(&s, &c, &p), Some(0));
        // Another connection (another server nonce): worthless.
        assert_eq!(t.check_client(&Token::nonce().unwrap(), &c, &p), None);
        // A client's proof is no server's proof.
        assert!(!t.check_server(&c, &s, &p));
        assert!(t.check_server(&c, &s, &t.server_proof(0, &c, &s)));
        // Rotation: the previous token is accepted, and answered with.
        let old = Token::new(&[9; 32], "old").unwrap();
        let both = Token::new(&[1; 32], "new")
            .unwrap()
            .accepting(&[9; 32], "old")
            .unwrap();
        let p = old.client_proof(&s, &c);
        assert_eq!(both.check_client(&s, &c, &p), Some(1));
        assert!(old.check_server(&c, &s, &both.server_proof(1, &c, &s)));
        assert_eq!(
            Token::new(&[3; 32], "x").unwrap().check_client(&s, &c, &p),
            None
        );
    }
}
