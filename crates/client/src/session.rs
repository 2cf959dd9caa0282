//! Sessions (`docs/lifecycle.md`, *Sessions*): a client opens one with a
//! lease that a background task renews, and nodes created bound to it
//! ([`CreateOptions::session`](crate::CreateOptions)) are removed, each
//! with its subtree, when the session is closed or its lease lapses: the
//! process died, hung or was cut off. ZooKeeper's ephemeral nodes work the
//! same way.
//!
//! A session is open in every metadata partition (a node is bound in the
//! partition that owns its path), with one random secret that proves the
//! holder to each. Costs: per session one task, asleep between renewals,
//! and one `SessionRenew` per partition a few times per lease; on each
//! metadata server about 100 bytes.

use nodekernel_proto::meta::{MetaReply, MetaRequest, SessionRef};
use nodekernel_proto::{Error, ErrorCode, Result};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How a session sends a request to a metadata partition: the client's
/// metadata call, given by the client that opens it (so this module needs
/// no `Client`, as the lease keeper needs none).
pub(crate) type Send = Arc<
    dyn Fn(
            usize,
            MetaRequest,
        ) -> Pin<Box<dyn Future<Output = Result<MetaReply>> + std::marker::Send>>
        + std::marker::Send
        + Sync,
>;

/// The lease a session gets unless asked otherwise: a client that stops
/// renewing (it died) loses what it bound within about this long.
pub const DEFAULT_SESSION_LEASE: Duration = Duration::from_secs(10);

/// Renewals per lease: a client that stalls for up to two thirds of a
/// lease keeps its session.
const RENEWS_PER_LEASE: u32 = 3;

/// An open session. Cheap to clone; the session ends when
/// [`Session::close`] is called, or when the last handle is dropped (then
/// in the background, as the process exits, its lease lapses if the close
/// did not get out).
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

struct Inner {
    send: Send,
    /// Which client opened it (its identity, for [`Session::owner`]).
    owner: usize,
    secret: u128,
    /// The session's id in each partition.
    ids: Vec<u64>,
    lease: Duration,
    /// Known to have ended: closed, or a metadata server said it lapsed.
    ended: AtomicBool,
    renewer: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("ids", &self.inner.ids)
            .field("lease", &self.inner.lease)
            .field("ended", &self.has_ended())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Opens a session with a lease of `lease` in each of `partitions`,
    /// sending through `send`, and renews it from now on (within a Tokio
    /// runtime). `owner` names the client that opens it.
    pub(crate) async fn open(
        send: Send,
        owner: usize,
        partitions: usize,
        lease: Duration,
    ) -> Result<Session> {
        let mut secret = [0u8; 16];
        nodekernel_rpc::random_bytes(&mut secret)
            .map_err(|e| Error::internal(format!("no random bytes for a session's secret: {e}")))?;
        let secret = u128::from_le_bytes(secret);
        let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        let req = MetaRequest::SessionOpen { secret, lease_ms };
        let opened = futures::future::join_all((0..partitions).map(|p| send(p, req.clone()))).await;
        let mut ids = Vec::with_capacity(partitions);
        let mut granted = Duration::MAX;
        let mut failed = None;
        for r in opened {
            match r {
                Ok(MetaReply::Session { id, lease_ms }) => {
                    ids.push(id);
                    granted = granted.min(Duration::from_millis(lease_ms));
                }
                Ok(other) => {
                    failed = Some(Error::protocol(format!(
                        "a session's open was answered with {other:?}"
                    )))
                }
                Err(e) => failed = Some(e),
            }
        }
        if let Some(e) = failed {
            // Leave nothing open behind.
            let _ = close_in(&send, secret, &ids).await;
            return Err(e);
        }
        let inner = Arc::new_cyclic(|weak: &Weak<Inner>| Inner {
            send,
            owner,
            secret,
            ids,
            lease: granted,
            ended: AtomicBool::new(false),
            renewer: tokio::spawn(keep(weak.clone(), granted / RENEWS_PER_LEASE)),
        });
        Ok(Session { inner })
    }
}

impl Session {
    /// The lease the metadata servers gave.
    pub fn lease(&self) -> Duration {
        self.inner.lease
    }

    /// Whether the session is known to have ended (closed, or its lease
    /// lapsed: what was bound to it is gone).
    pub fn has_ended(&self) -> bool {
        self.inner.ended.load(Ordering::Relaxed)
    }

    /// The session as a create in partition `part` names it.
    pub(crate) fn in_partition(&self, part: usize) -> Result<SessionRef> {
        if self.has_ended() {
            return Err(Error::not_found(
                "the session has ended (closed, or its lease lapsed): nothing more is bound to it",
            ));
        }
        let id = *self
            .inner
            .ids
            .get(part)
            .ok_or_else(|| Error::invalid_argument("the session is another client's"))?;
        Ok(SessionRef {
            id,
            secret: self.inner.secret,
        })
    }

    /// Binds the existing node at `p` to the session, as a create with
    /// it would have: it is removed, with its subtree, when the session
    /// ends (`nk mount` binds the files it hides while they are open).
    pub async fn bind_existing(&self, p: &str) -> Result<()> {
        nodekernel_proto::path::components(p)?;
        let part = nodekernel_proto::path::partition_of(p, self.inner.ids.len());
        let SessionRef { id, secret } = self.in_partition(part)?;
        let req = MetaRequest::SessionBind {
            id,
            secret,
            path: p.to_string(),
        };
        (self.inner.send)(part, req).await.map(drop)
    }

    /// The client that opened it (see [`Session::open`]).
    pub(crate) fn owner(&self) -> usize {
        self.inner.owner
    }

    /// Ends the session: everything bound to it is removed (with its
    /// subtree) before any later request sees it. Closing an ended
    /// session is not an error.
    pub async fn close(&self) -> Result<()> {
        if self.inner.ended.swap(true, Ordering::Relaxed) {
            return Ok(());
        }
        self.inner.renewer.abort();
        close_in(&self.inner.send, self.inner.secret, &self.inner.ids).await
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.renewer.abort();
        if self.ended.load(Ordering::Relaxed) {
            return;
        }
        // The last handle is gone without a close: close in the
        // background if a runtime is still running; else the lease lapses.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (send, secret, ids) = (self.send.clone(), self.secret, self.ids.clone());
        rt.spawn(async move {
            let _ = close_in(&send, secret, &ids).await;
        });
    }
}

/// Closes the session (`ids`, one per partition) everywhere; the first
/// failure is returned once every partition was asked. One that lapsed
/// already is no failure: what it bound is gone either way.
async fn close_in(send: &Send, secret: u128, ids: &[u64]) -> Result<()> {
    let mut first_err = None;
    for (part, id) in ids.iter().enumerate() {
        match send(part, MetaRequest::SessionClose { id: *id, secret }).await {
            Err(e) if e.code != ErrorCode::NotFound => {
                first_err.get_or_insert(e);
            }
            _ => {}
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// Renews the session behind `weak` every `period` while it exists. A
/// renewal that fails is tried again the next period; one answered
/// `NotFound` means the session lapsed (this client was cut off for longer
/// than its lease) and what it bound is gone: it is renewed no more.
async fn keep(weak: Weak<Inner>, period: Duration) {
    loop {
        tokio::time::sleep(period).await;
        let Some(s) = weak.upgrade() else {
            return;
        };
        let renewals = s.ids.iter().enumerate().map(|(part, id)| {
            let req = MetaRequest::SessionRenew {
                id: *id,
                secret: s.secret,
            };
            let send = &s.send;
            async move { (part, send(part, req).await) }
        });
        for (part, r) in futures::future::join_all(renewals).await {
            match r {
                Ok(_) => {}
                Err(e) if e.code == ErrorCode::NotFound => {
                    tracing::warn!(
                        "session {} lapsed in metadata partition {part}: what it bound is removed",
                        s.ids[part]
                    );
                    s.ended.store(true, Ordering::Relaxed);
                    return;
                }
                Err(e) => tracing::debug!("renewing session {} failed: {e}", s.ids[part]),
            }
        }
    }
}
