//! [`Security`]: who a server lets in and how a node's connections prove
//! themselves, bundled: the cluster [`Token`] ([`crate::auth`]), the
//! [`LocalPeers`] of its Unix sockets and its TLS settings ([`crate::tls`]),
//! from which every role's handshakes and pools are built.

use crate::auth::Token;
use crate::client::{ConnOptions, ConnectionPool};
use crate::hello::VersionHandshake;
use crate::tls::Tls;
use crate::transport::LocalPeers;
use nodekernel_proto::hello::Role;
use nodekernel_proto::tenant::Tenant;
use std::sync::Arc;

/// Who a server lets in: peers proving its cluster token (when it has
/// one), and over its Unix sockets only [`LocalPeers`]. The default: no
/// token, local peers of the server's own user.
#[derive(Debug, Clone)]
pub struct Security {
    pub token: Option<Arc<Token>>,
    pub local_peers: LocalPeers,
    /// TLS on TCP connections, made and (with a certificate) served.
    pub tls: Option<Arc<Tls>>,
    /// The tenants (`[[security.tenant]]`, `docs/security.md`,
    /// *Tenants*): their tokens are in `token`, accepted as theirs; what
    /// each may see and do is its metadata server's business.
    pub tenants: Arc<[Tenant]>,
}

impl Default for Security {
    fn default() -> Self {
        Security {
            token: None,
            local_peers: LocalPeers::owner(),
            tls: None,
            tenants: Arc::new([]),
        }
    }
}

impl Security {
    /// The handshake of a connection made or served as `role`.
    pub fn handshake(&self, role: Role) -> Arc<VersionHandshake> {
        Arc::new(
            VersionHandshake::new(role)
                .with_token(self.token.clone())
                .with_tls(self.tls.clone()),
        )
    }

    /// A pool whose connections introduce themselves as `role` and prove
    /// the token.
    pub fn pool(&self, role: Role, opts: ConnOptions) -> ConnectionPool {
        ConnectionPool::with_handshake(opts, self.handshake(role))
    }
}
