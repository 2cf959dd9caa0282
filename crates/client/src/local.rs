//! Co-located storage servers: mapping their DRAM for zero-copy access.
//!
//! For each storage server address, the client learns once whether it can
//! map that server's memory: it asks `SHM_INFO` on the data port, connects
//! to the abstract Unix socket named in the reply (which only works from
//! the same host and network namespace), receives and validates the memfd
//! and maps it (see `nodekernel_shm`), after answering the server's
//! challenge with a proof of the cluster token when it has one. Any failure (a file-medium or
//! non-sharing server, another host, an older server, a bad header) leaves
//! the address on the network path for the life of the client, logged at
//! debug level.
//!
//! A mapping stops being used when its server marks the region closed (a
//! clean shutdown, checked before every access) or when the hand-over
//! connection closes (the server died; a small thread per mapping watches
//! it). The address is then probed again at its next access, so a
//! restarted server is mapped afresh, and a dead one fails like on the
//! network path.
//!
//! Mappings are shared by all clients of a process (keyed by the server's
//! socket name, unique per server instance): pages one client has mapped in
//! are mapped for all, and a large region's page tables exist once.

use nodekernel_proto::store::{decode_shm_info, op as store_op};
use nodekernel_proto::sync;
use nodekernel_proto::{ErrorCode, Result};
use nodekernel_rpc::{ConnectionPool, Token};
use nodekernel_shm::ClientRegion;
use std::collections::HashMap;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio::sync::OnceCell;

/// A mapped storage server.
pub(crate) struct Mapped {
    region: ClientRegion,
    /// Set by the watcher when the hand-over connection closes.
    gone: Arc<AtomicBool>,
    /// The hand-over connection (the watcher thread reads a clone of it).
    sock: std::os::unix::net::UnixStream,
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // Ends the watcher's read, and with it the thread.
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// Mappings of this process by server socket name (see the module docs).
fn process_mappings() -> std::sync::MutexGuard<'static, HashMap<String, Weak<Mapped>>> {
    static MAPPINGS: OnceLock<Mutex<HashMap<String, Weak<Mapped>>>> = OnceLock::new();
    sync::lock(MAPPINGS.get_or_init(Default::default))
}

impl Mapped {
    /// Whether the server still serves this region.
    fn usable(&self) -> bool {
        !self.gone.load(Ordering::Acquire) && !self.region.is_closed()
    }

    pub(crate) fn region(&self) -> &ClientRegion {
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
}

impl Local {
    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        sync::lock(&self.slots)
    }

    /// The mapping of `addr`'s memory, probing on first use; `None` for the
    /// network path. Fails only when the server cannot be reached at all
    /// (then the network path would fail the same way).
    pub(crate) async fn mapping(
        &self,
        pool: &ConnectionPool,
        addr: &str,
        timeout: Duration,
        token: Option<&Arc<Token>>,
    ) -> Result<Option<Arc<Mapped>>> {
        for _ in 0..2 {
            let slot = self.slots().entry(addr.to_string()).or_default().clone();
            let known = slot
                .get_or_try_init(|| probe(pool, addr, timeout, token))
                .await?;
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
}

/// Finds out whether `addr`'s memory can be mapped, and maps it.
async fn probe(
    pool: &ConnectionPool,
    addr: &str,
    timeout: Duration,
    token: Option<&Arc<Token>>,
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
    let existing = process_mappings().get(&name).and_then(Weak::upgrade);
    if let Some(m) = existing.filter(|m| m.usable()) {
        return Ok(Some(m));
    }
    let attempt = tokio::task::spawn_blocking({
        let name = name.clone();
        let token = token.cloned();
        move || connect(&name, timeout, token.as_deref())
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
    let mapped = Arc::new(Mapped {
        region,
        gone: Arc::new(AtomicBool::new(false)),
        sock,
    });
    if let Err(e) = watch(&mapped) {
        tracing::debug!("{addr}: cannot watch the shared-memory socket, using the network: {e}");
        return Ok(None);
    }
    tracing::debug!(
        "{addr}: co-located, mapped {} blocks of {} bytes from @{name}",
        mapped.region.num_blocks(),
        mapped.region.block_size()
    );
    let mut all = process_mappings();
    all.retain(|_, m| m.strong_count() > 0);
    all.insert(name, Arc::downgrade(&mapped));
    Ok(Some(mapped))
}

/// Connects to the abstract socket `name` and receives the region
/// (blocking, each step bounded by `timeout`).
fn connect(
    name: &str,
    timeout: Duration,
    token: Option<&Token>,
) -> std::io::Result<(ClientRegion, std::os::unix::net::UnixStream)> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let sock = std::os::unix::net::UnixStream::connect_addr(&addr)?;
    sock.set_read_timeout(Some(timeout))?;
    sock.set_write_timeout(Some(timeout))?;
    nodekernel_shm::answer_challenge(&sock, |nonce| token.map(|t| t.handover_proof(nonce)))?;
    let region = nodekernel_shm::receive_region(&sock)?;
    Ok((region, sock))
}

/// Starts the mapping's thread: it first maps the region's pages in ahead
/// of use ([`Region::prefault`], a chunk at a time, stopping early if the
/// mapping is dropped), then marks the mapping gone once the server closes
/// the connection (or the mapping is dropped). A thread rather than a task:
/// the mapping is shared by clients that may live on different runtimes.
fn watch(mapped: &Arc<Mapped>) -> std::io::Result<()> {
    let mut sock = mapped.sock.try_clone()?;
    sock.set_read_timeout(None)?;
    let gone = mapped.gone.clone();
    let weak = Arc::downgrade(mapped);
    std::thread::Builder::new()
        .name("nk-shm-watch".into())
        .spawn(move || {
            // Prefaulting is background work: only on otherwise idle CPU.
            let idle = libc::sched_param { sched_priority: 0 };
            // SAFETY: changes the policy of the calling thread only.
            unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &idle) };
            let mut next = Some(0);
            while let (Some(from), Some(m)) = (next, weak.upgrade()) {
                next = m.usable().then(|| m.region.prefault(from)).flatten();
            }
            let mut buf = [0u8; 64];
            loop {
                match sock.read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            gone.store(true, Ordering::Release);
        })?;
    Ok(())
}
