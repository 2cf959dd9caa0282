//! Co-located storage servers: mapping their DRAM for zero-copy access.
//!
//! For each storage server address, the client learns once whether it can
//! map that server's memory: it asks `SHM_INFO` on the data port, connects
//! to the abstract Unix socket named in the reply (which only works from
//! the same host and network namespace), receives and validates the memfd
//! and maps it (see `nodekernel_shm`). Any failure (a file-medium or
//! non-sharing server, another host, an older server, a bad header) leaves
//! the address on the network path for the life of the client, logged at
//! debug level.
//!
//! A mapping stops being used when its server marks the region closed (a
//! clean shutdown, checked before every access) or when the hand-over
//! connection closes (the server died; a small task per mapping watches
//! it). The address is then probed again at its next access, so a
//! restarted server is mapped afresh, and a dead one fails like on the
//! network path.

use crate::client::DataPathStats;
use nodekernel_proto::store::{decode_shm_info, op as store_op};
use nodekernel_proto::{ErrorCode, Result};
use nodekernel_rpc::ConnectionPool;
use nodekernel_shm::Region;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::sync::OnceCell;
use tokio::task::AbortHandle;

/// A mapped storage server.
pub(crate) struct Mapped {
    region: Region,
    /// Set by the watcher when the hand-over connection closes.
    gone: Arc<AtomicBool>,
    watcher: AbortHandle,
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // Ends the watcher, which closes our end of the connection.
        self.watcher.abort();
    }
}

impl Mapped {
    /// Whether the server still serves this region.
    fn usable(&self) -> bool {
        !self.gone.load(Ordering::Acquire) && !self.region.is_closed()
    }

    pub(crate) fn region(&self) -> &Region {
        &self.region
    }
}

/// What is known about one address: nothing yet (probe running or not
/// started), mapped, or network only (`None`).
type Slot = Arc<OnceCell<Option<Arc<Mapped>>>>;

/// Mappings by storage server address, and data-path counters.
#[derive(Default)]
pub(crate) struct Local {
    slots: Mutex<HashMap<String, Slot>>,
    pub(crate) mapped_reads: AtomicU64,
    pub(crate) mapped_writes: AtomicU64,
    pub(crate) network_reads: AtomicU64,
    pub(crate) network_writes: AtomicU64,
}

impl Local {
    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The mapping of `addr`'s memory, probing on first use; `None` for the
    /// network path. Fails only when the server cannot be reached at all
    /// (then the network path would fail the same way).
    pub(crate) async fn mapping(
        &self,
        pool: &ConnectionPool,
        addr: &str,
        timeout: Duration,
    ) -> Result<Option<Arc<Mapped>>> {
        for _ in 0..2 {
            let slot = self.slots().entry(addr.to_string()).or_default().clone();
            let known = slot.get_or_try_init(|| probe(pool, addr, timeout)).await?;
            match known {
                None => return Ok(None),
                Some(m) if m.usable() => return Ok(Some(m.clone())),
                Some(_) => {
                    tracing::debug!("{addr}: shared memory gone (server stopped); probing again");
                    let mut slots = self.slots();
                    if slots.get(addr).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
                        slots.remove(addr);
                    }
                }
            }
        }
        // Mapped again, and gone again at once: use the network this time.
        Ok(None)
    }

    /// Whether `addr`'s memory is mapped and in use.
    pub(crate) fn is_mapped(&self, addr: &str) -> bool {
        self.slots()
            .get(addr)
            .and_then(|s| s.get())
            .is_some_and(|m| m.as_ref().is_some_and(|m| m.usable()))
    }

    pub(crate) fn stats(&self) -> DataPathStats {
        DataPathStats {
            mapped_reads: self.mapped_reads.load(Ordering::Relaxed),
            mapped_writes: self.mapped_writes.load(Ordering::Relaxed),
            network_reads: self.network_reads.load(Ordering::Relaxed),
            network_writes: self.network_writes.load(Ordering::Relaxed),
        }
    }
}

/// Finds out whether `addr`'s memory can be mapped, and maps it.
async fn probe(
    pool: &ConnectionPool,
    addr: &str,
    timeout: Duration,
) -> Result<Option<Arc<Mapped>>> {
    let name = match pool.call(addr, store_op::SHM_INFO, &[]).await {
        Ok(reply) => match decode_shm_info(&reply) {
            Ok(name) => name,
            Err(e) => {
                tracing::debug!("{addr}: bad shared-memory info, using the network: {e}");
                return Ok(None);
            }
        },
        // Unreachable: no verdict yet, the caller fails as the network path would.
        Err(e) if matches!(e.code, ErrorCode::Unavailable | ErrorCode::Timeout) => return Err(e),
        Err(e) => {
            tracing::debug!("{addr}: no shared-memory info, using the network: {e}");
            return Ok(None);
        }
    };
    if name.is_empty() {
        tracing::debug!("{addr}: memory not shared, using the network");
        return Ok(None);
    }
    let attempt = tokio::task::spawn_blocking({
        let name = name.clone();
        move || connect(&name, timeout)
    })
    .await;
    let (region, sock) = match attempt {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            tracing::debug!("{addr}: cannot map shared memory @{name} (not co-located?), using the network: {e}");
            return Ok(None);
        }
        Err(e) => {
            tracing::debug!("{addr}: shared-memory set-up task failed, using the network: {e}");
            return Ok(None);
        }
    };
    let watch = sock
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UnixStream::from_std(sock));
    let sock = match watch {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(
                "{addr}: cannot watch the shared-memory socket, using the network: {e}"
            );
            return Ok(None);
        }
    };
    let gone = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn(watch_socket(sock, gone.clone())).abort_handle();
    tracing::debug!(
        "{addr}: co-located, mapped {} blocks of {} bytes from @{name}",
        region.num_blocks(),
        region.block_size()
    );
    Ok(Some(Arc::new(Mapped {
        region,
        gone,
        watcher,
    })))
}

/// Connects to the abstract socket `name` and receives the region
/// (blocking, each step bounded by `timeout`).
fn connect(
    name: &str,
    timeout: Duration,
) -> std::io::Result<(Region, std::os::unix::net::UnixStream)> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let sock = std::os::unix::net::UnixStream::connect_addr(&addr)?;
    sock.set_read_timeout(Some(timeout))?;
    sock.set_write_timeout(Some(timeout))?;
    let region = nodekernel_shm::receive_region(&sock)?;
    Ok((region, sock))
}

/// Marks the mapping gone once the server closes the connection.
async fn watch_socket(mut sock: tokio::net::UnixStream, gone: Arc<AtomicBool>) {
    let mut buf = [0u8; 64];
    while let Ok(n) = sock.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
    gone.store(true, Ordering::Release);
}
