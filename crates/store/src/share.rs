//! Handing the DRAM region to co-located clients.
//!
//! A DRAM storage server listens on an abstract Unix socket
//! (`\0nodekernel-store-<64 random bits in hex>`), whose name it returns to
//! `SHM_INFO` requests on its data port. Abstract names exist only inside
//! the server's network namespace, so a client that can connect is on the
//! same host and in the same namespace: that is the co-location test. The
//! server also checks the peer's credentials (`SO_PEERCRED`) and hands its
//! memory only to processes of its own user (or root): a process that may
//! map the memory could also read the server's memory directly (ptrace,
//! `/proc/<pid>/mem`), so this gives away nothing more. With a cluster
//! token the client must also answer a challenge with a proof of it
//! ([`nodekernel_shm::Challenge`]).
//!
//! On each accepted connection the server grants the client process a
//! writer slot ([`ServerRegion::lease_slot`]) and sends the region's header and
//! the slot with the memfd attached ([`nodekernel_shm::send_region`]); it
//! then keeps the connection open without traffic until the client closes
//! it or the server stops: a client watching it learns that the server is
//! gone even when it died without marking its region closed. When the
//! client's end closes (its process exited or was killed, or it dropped
//! the mapping), none of its copies can still run, and the server reclaims
//! the slot ([`nodekernel_shm::SlotLease::reclaim`]): claims that waited
//! for a write the dead process left in flight then go on. Liveness is
//! never judged by time.

use nodekernel_rpc::Token;
use nodekernel_shm::handover::PROOF_LEN;
use nodekernel_shm::{Challenge, ServerRegion};
use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::{JoinHandle, JoinSet};

/// How long a client has to answer the hand-over challenge.
const CHALLENGE_TIMEOUT: std::time::Duration = nodekernel_rpc::limits::HANDSHAKE_TIMEOUT;

/// The running hand-over listener. Dropping it stops it and closes every
/// hand-over connection.
pub(crate) struct Share {
    name: String,
    task: JoinHandle<()>,
}

impl Share {
    /// Binds a fresh abstract socket and starts serving `region` on it.
    /// With a `token`, only clients proving it get the memory.
    pub(crate) fn start(region: Arc<ServerRegion>, token: Option<Arc<Token>>) -> io::Result<Share> {
        let (name, listener) = nodekernel_rpc::bind_abstract_unix(nodekernel_shm::NAME_PREFIX)?;
        let task = tokio::spawn(accept_loop(listener, region, token));
        Ok(Share { name, task })
    }

    /// The abstract socket name (without the leading NUL).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn accept_loop(listener: UnixListener, region: Arc<ServerRegion>, token: Option<Arc<Token>>) {
    // Owned here, so aborting this task drops every connection task too.
    let mut conns = JoinSet::new();
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    conns.spawn(hand_over(stream, region.clone(), uid, token.clone()));
                }
                Err(e) => {
                    tracing::warn!("shared-memory socket: accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn hand_over(
    mut stream: UnixStream,
    region: Arc<ServerRegion>,
    uid: libc::uid_t,
    token: Option<Arc<Token>>,
) {
    let pid = match stream.peer_cred() {
        Ok(c) if c.uid() == uid || c.uid() == 0 => c.pid(),
        Ok(c) => {
            tracing::warn!(
                "shared-memory socket: refused process {:?} of user {}: the memory goes only \
                 to user {uid} and root (it uses the network)",
                c.pid(),
                c.uid(),
            );
            return;
        }
        Err(e) => {
            tracing::warn!("shared-memory socket: refused a client with no peer credentials: {e}");
            return;
        }
    };
    let nonce = match Token::nonce() {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!("shared-memory socket: refused process {pid:?}: {e}");
            return;
        }
    };
    let challenge = Challenge {
        token_required: token.is_some(),
        nonce,
    };
    let answered = tokio::time::timeout(CHALLENGE_TIMEOUT, async {
        stream.write_all(&challenge.encode()).await?;
        let mut proof = [0u8; PROOF_LEN];
        stream.read_exact(&mut proof).await?;
        Ok::<_, io::Error>(proof)
    })
    .await;
    let proof = match answered {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            tracing::debug!("shared-memory socket: process {pid:?} left during the challenge: {e}");
            return;
        }
        Err(_) => {
            tracing::warn!(
                "shared-memory socket: process {pid:?} did not answer the challenge within \
                 {CHALLENGE_TIMEOUT:?}"
            );
            return;
        }
    };
    if let Some(t) = &token {
        if !t.check_handover(&challenge.nonce, &proof) {
            tracing::warn!(
                "shared-memory socket: refused process {pid:?}: it did not prove the cluster token"
            );
            return;
        }
    }
    // Dropped without reclaiming (this task aborted: the server stops),
    // the lease retires the slot.
    let lease = region.lease_slot();
    if lease.is_none() {
        tracing::warn!("shared-memory socket: no writer slot left; that client uses the network");
    }
    let slot = lease.as_ref().map(|l| l.slot());
    let sent = stream
        .async_io(Interest::WRITABLE, || {
            nodekernel_shm::send_region(stream.as_fd(), &region, slot)
        })
        .await;
    if let Err(e) = sent {
        tracing::debug!("shared-memory socket: could not hand the region over: {e}");
        // The client may have received it all the same: it holds the slot
        // until its end closes, so wait for that before reclaiming.
    }
    // Keep the connection until the client goes away (or we stop).
    let mut buf = [0u8; 64];
    while let Ok(n) = stream.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
    if let Some(lease) = lease {
        lease.reclaim().await;
    }
}
