//! Helpers for tests of the generation protocol, here and in the storage
//! server (feature `testing`).

use crate::protocol::{self, Write};
use crate::region::Role;
use crate::{ClientRegion, Region, ServerRegion, SlotLease};
use nodekernel_proto::{Error, Result};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;

/// A second, independent mapping of `r`'s memfd, as a co-located client in
/// another process gets it, with a client slot of its own and the slot's
/// lease (reclaim it once the mapping is dropped, or drop it to retire the
/// slot).
pub fn mapping_with_lease(r: &Arc<ServerRegion>) -> (ClientRegion, SlotLease) {
    let lease = r.lease_slot().expect("a free client slot");
    let fd = OwnedFd::from(r.file().try_clone().expect("dup the memfd"));
    let m = ClientRegion::open(fd, &r.layout().encode(), Some(lease.slot())).expect("map again");
    assert_ne!(m.data_ptr(), r.data_ptr(), "a separate mapping");
    (m, lease)
}

/// A second mapping (see [`mapping_with_lease`]) whose slot is never
/// reclaimed.
pub fn second_mapping(r: &Arc<ServerRegion>) -> ClientRegion {
    mapping_with_lease(r).0
}

/// Runs `f` to completion on this thread, parking it while `f` waits.
pub use futures::executor::block_on;

/// Starts a thread running `op` until it returns false, and waits until it
/// has completed at least one successful iteration.
pub fn busy_thread(op: impl Fn() -> bool + Send + 'static) -> std::thread::JoinHandle<u32> {
    let started = Arc::new(AtomicBool::new(false));
    let flag = started.clone();
    let t = std::thread::spawn(move || {
        let mut n = 0;
        while op() {
            n += 1;
            flag.store(true, Ordering::Release);
        }
        flag.store(true, Ordering::Release);
        n
    });
    while !started.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    t
}

/// A write that has taken its lane and may copy, stopped in the middle of
/// its copy: a writer that is descheduled, stopped or paging. Claims of
/// its block wait for it, however long it stays.
pub struct StalledWrite<'a, R: Role> {
    region: &'a Region<R>,
    op: Write<'a, Region<R>>,
    block: u32,
}

/// Starts a write of `block` under `gen` through `r` and stops it where its
/// copy would begin. Waits (blocking the thread until a lane changes) while
/// the protocol says to; `Stale` if the block belongs to a newer
/// generation.
pub fn stall_write<R: Role>(r: &Region<R>, block: u32, gen: u64) -> Result<StalledWrite<'_, R>> {
    assert!(block < r.num_blocks());
    let lanes = r.lanes().expect("a mapping that can write");
    let mut op = Write::new(r, lanes, block, gen);
    match protocol::drive(r, lanes.slot, || op.poll()) {
        Ok(()) => Ok(StalledWrite {
            region: r,
            op,
            block,
        }),
        Err(current) => Err(crate::stale_write(block, gen, current)),
    }
}

impl<R: Role> StalledWrite<'_, R> {
    /// Resumes: copies `data` at `offset` (the late bytes) and finishes.
    pub fn land(self, offset: u32, data: &[u8]) {
        let bs = self.region.block_size() as usize;
        assert!(offset as usize + data.len() <= bs);
        // SAFETY: the range lies inside the block (asserted above) and
        // `data` is a separate buffer; the protocol gave this write the
        // block, as for `Region::write`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.region
                    .data_ptr()
                    .add(self.block as usize * bs + offset as usize),
                data.len(),
            );
        }
        self.op.finish();
    }

    /// Ends as a killed process would: the lane stays taken until the
    /// slot is reclaimed.
    pub fn die(self) {
        self.op.die();
    }
}

/// A claim started and left waiting (for writers of an older generation).
pub struct PendingClaim<'a, R: Role> {
    op: Write<'a, Region<R>>,
}

/// Starts a pure claim of `block` by `gen` through `r` and polls it once:
/// `Ok(None)` if it completed at once, `Ok(Some(_))` if it waits.
pub fn start_claim<R: Role>(
    r: &Region<R>,
    block: u32,
    gen: u64,
) -> Result<Option<PendingClaim<'_, R>>> {
    assert!(block < r.num_blocks());
    let lanes = r.lanes().expect("a mapping that can write");
    let mut op = Write::new(r, lanes, block, gen);
    match op.poll() {
        Poll::Ready(Ok(())) => {
            op.finish();
            Ok(None)
        }
        Poll::Ready(Err(current)) => Err(crate::stale_write(block, gen, current)),
        Poll::Pending => Ok(Some(PendingClaim { op })),
    }
}

impl<R: Role> PendingClaim<'_, R> {
    /// Polls again: `true` once the claim has completed.
    pub fn poll(&mut self) -> std::result::Result<bool, Error> {
        match self.op.poll() {
            Poll::Ready(Ok(())) => Ok(true),
            Poll::Ready(Err(current)) => Err(Error::stale(format!("superseded by {current}"))),
            Poll::Pending => Ok(false),
        }
    }

    /// Ends as a killed process would, mid-claim: its lane stays claiming
    /// and the block settling until the slot is reclaimed (or another
    /// writer of its generation settles it).
    pub fn die(self) {
        self.op.die();
    }
}
