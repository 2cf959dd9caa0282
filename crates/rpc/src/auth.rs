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
use std::sync::Arc;

/// Fewest bytes a token may have: a shorter one could be guessed.
pub const MIN_TOKEN_LEN: usize = 16;
/// Most bytes a token may have.
pub const MAX_TOKEN_LEN: usize = 4096;

const CLIENT_LABEL: &[u8] = b"nodekernel token proof: client";
const SERVER_LABEL: &[u8] = b"nodekernel token proof: server";
const HANDOVER_LABEL: &[u8] = b"nodekernel token proof: shared-memory hand-over";

/// A cluster token: the one this end proves, and every one it accepts from
/// peers (the same one, and during a rotation the previous one too); on a
/// server, also the tenants' tokens (`docs/security.md`, *Tenants*), each
/// accepted as that tenant and never as a member.
#[derive(Clone)]
pub struct Token {
    /// `keys[0]` is presented; all are accepted.
    keys: Vec<Vec<u8>>,
    /// Each tenant's name and token.
    tenants: Vec<(Arc<str>, Vec<u8>)>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Token(<{} secret(s)>, {} tenant(s))",
            self.keys.len(),
            self.tenants.len()
        )
    }
}

/// Whose token a client's proof was made with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Proven {
    /// An accepted cluster token (its index): a member of the cluster.
    Member(usize),
    /// A tenant's token (the tenant's index).
    Tenant(usize),
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
            tenants: Vec::new(),
        })
    }

    /// This token also accepting `previous` from peers (while a new token
    /// is rolled out).
    pub fn accepting(mut self, previous: &[u8], what: &str) -> Result<Token> {
        check(previous, what)?;
        self.keys.push(previous.to_vec());
        Ok(self)
    }

    /// This token also accepting tenant `name`'s `secret`: a connection
    /// proving it is that tenant's ([`crate::PeerInfo::tenant`]). A secret
    /// that is already accepted (the cluster token's, another tenant's) is
    /// refused: a proof must name one identity.
    pub fn with_tenant(mut self, name: &str, secret: &[u8], what: &str) -> Result<Token> {
        check(secret, what)?;
        let taken = self.keys.iter().any(|k| k == secret);
        if let Some(other) = taken.then_some("the cluster").or_else(|| {
            self.tenants
                .iter()
                .find(|(_, k)| k == secret)
                .map(|(n, _)| n.as_ref())
        }) {
            return Err(Error::invalid_argument(format!(
                "{what} holds the same secret as {other}'s token: give tenant {name} a token                  of its own (`nk token new FILE`)"
            )));
        }
        if self.tenants.iter().any(|(n, _)| n.as_ref() == name) {
            return Err(Error::invalid_argument(format!(
                "tenant {name} is configured twice"
            )));
        }
        self.tenants.push((name.into(), secret.to_vec()));
        Ok(self)
    }

    /// The name of tenant `i` (an index [`Token::check_client`] gave).
    pub(crate) fn tenant_name(&self, i: usize) -> Arc<str> {
        self.tenants[i].0.clone()
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

    /// Which accepted token, if any, made the client's `proof`: the
    /// cluster's first, then each tenant's (every one is tried: a
    /// connection costs one HMAC per token, bounded by
    /// [`nodekernel_proto::tenant::MAX_TENANTS`]).
    pub(crate) fn check_client(
        &self,
        server: &[u8; NONCE_LEN],
        client: &[u8; NONCE_LEN],
        proof: &[u8],
    ) -> Option<Proven> {
        (proof.len() == MAC_LEN).then_some(())?;
        let ok = |k: &Vec<u8>| verify(k, CLIENT_LABEL, &[server, client], proof);
        if let Some(i) = self.keys.iter().position(ok) {
            return Some(Proven::Member(i));
        }
        self.tenants
            .iter()
            .position(|(_, k)| ok(k))
            .map(Proven::Tenant)
    }

    /// The server's proof under the token that `who` proved.
    pub(crate) fn server_proof(
        &self,
        who: Proven,
        client: &[u8; NONCE_LEN],
        server: &[u8; NONCE_LEN],
    ) -> [u8; MAC_LEN] {
        let key = match who {
            Proven::Member(i) => &self.keys[i],
            Proven::Tenant(i) => &self.tenants[i].1,
        };
        mac(key, SERVER_LABEL, &[client, server])
    }

    /// A client's proof for the shared-memory hand-over's `nonce`.
    pub fn handover_proof(&self, nonce: &[u8]) -> [u8; MAC_LEN] {
        mac(&self.keys[0], HANDOVER_LABEL, &[nonce])
    }

    /// Whether `proof` is a hand-over proof for `nonce` under an accepted
    /// cluster token (never a tenant's: a mapped region holds every
    /// tenant's blocks).
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
        assert_eq!(t.check_client(&s, &c, &p), Some(Proven::Member(0)));
        // Another connection (another server nonce): worthless.
        assert_eq!(t.check_client(&Token::nonce().unwrap(), &c, &p), None);
        // A client's proof is no server's proof.
        assert!(!t.check_server(&c, &s, &p));
        assert!(t.check_server(&c, &s, &t.server_proof(Proven::Member(0), &c, &s)));
        // Rotation: the previous token is accepted, and answered with.
        let old = Token::new(&[9; 32], "old").unwrap();
        let both = Token::new(&[1; 32], "new")
            .unwrap()
            .accepting(&[9; 32], "old")
            .unwrap();
        let p = old.client_proof(&s, &c);
        assert_eq!(both.check_client(&s, &c, &p), Some(Proven::Member(1)));
        assert!(old.check_server(&c, &s, &both.server_proof(Proven::Member(1), &c, &s)));
        assert_eq!(
            Token::new(&[3; 32], "x").unwrap().check_client(&s, &c, &p),
            None
        );
    }

    #[test]
    fn a_tenants_proof_names_the_tenant_and_never_a_member() {
        let cluster = Token::new(&[1; 32], "cluster")
            .unwrap()
            .with_tenant("a", &[7; 32], "a's token")
            .unwrap();
        let (c, s) = (Token::nonce().unwrap(), Token::nonce().unwrap());
        let tenant = Token::new(&[7; 32], "a").unwrap();
        let p = tenant.client_proof(&s, &c);
        assert_eq!(cluster.check_client(&s, &c, &p), Some(Proven::Tenant(0)));
        assert_eq!(&*cluster.tenant_name(0), "a");
        // The tenant learns it reached the cluster: the answer is under its token.
        assert!(tenant.check_server(&c, &s, &cluster.server_proof(Proven::Tenant(0), &c, &s)));
        // No hand-over proof under a tenant's token is taken.
        assert!(!cluster.check_handover(&s, &tenant.handover_proof(&s)));
        // A tenant's token must be its own.
        let e = cluster
            .clone()
            .with_tenant("b", &[1; 32], "b's")
            .unwrap_err();
        assert!(e.message.contains("the cluster"), "{e}");
        let e = cluster
            .clone()
            .with_tenant("b", &[7; 32], "b's")
            .unwrap_err();
        assert!(e.message.contains("a's token"), "{e}");
        assert!(cluster.with_tenant("a", &[8; 32], "a2").is_err());
    }
}
