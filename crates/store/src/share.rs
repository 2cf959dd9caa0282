//! Handing the DRAM region to co-located clients.
//!
//! A DRAM storage server listens on an abstract Unix socket
//! (`\0nodekernel-store-<64 random bits in hex>`), whose name it returns to
//! `SHM_INFO` requests on its data port. Abstract names exist only inside
//! the server's network namespace, so a client that can connect is on the
//! same host and in the same namespace: that is the co-location test. The
//! server also checks the peer's credentials (`SO_PEERCRED`) and hands its
//! memory only to processes of its own user (or root).
//!
//! On each accepted connection the server grants the client process a
//! writer slot ([`Region::lease_slot`]) and sends the region's header and
//! the slot with the memfd attached ([`nodekernel_shm::send_region`]); it
//! then keeps the connection open without traffic until the client closes
//! it or the server stops: a client watching it learns that the server is
//! gone even when it died without marking its region closed. When the
//! client's end closes (its process exited or was killed, or it dropped
//! the mapping), none of its copies can still run, and the server reclaims
//! the slot ([`nodekernel_shm::SlotLease::reclaim`]): claims that waited
//! for a write the dead process left in flight then go on. Liveness is
//! never judged by time.

use nodekernel_shm::Region;
use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, Interest};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::{JoinHandle, JoinSet};

/// The running hand-over listener. Dropping it stops it and closes every
/// hand-over connection.
pub(crate) struct Share {
    name: String,
    task: JoinHandle<()>,
}

impl Share {
    /// Binds a fresh abstract socket and starts serving `region` on it.
    pub(crate) fn start(region: Arc<Region>) -> io::Result<Share> {
        let (name, listener) = nodekernel_rpc::bind_abstract_unix(nodekernel_shm::NAME_PREFIX)?;
        let task = tokio::spawn(accept_loop(listener, region));
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

async fn accept_loop(listener: UnixListener, region: Arc<Region>) {
    // Owned here, so aborting this task drops every connection task too.
    let mut conns = JoinSet::new();
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    conns.spawn(hand_over(stream, region.clone(), uid));
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

async fn hand_over(mut stream: UnixStream, region: Arc<Region>, uid: libc::uid_t) {
    match stream.peer_cred() {
        Ok(c) if c.uid() == uid || c.uid() == 0 => {}
        Ok(c) => {
            tracing::debug!(
                "shared-memory socket: refusing a client of user {} (pid {:?}): not user {uid}",
                c.uid(),
                c.pid()
            );
            return;
        }
        Err(e) => {
            tracing::debug!("shared-memory socket: no peer credentials: {e}");
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
