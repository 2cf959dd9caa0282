//! The co-located zero-copy data path: a DRAM storage server's memory,
//! shared with clients on the same host.
//!
//! This is the NodeKernel analogue of RDMA one-sided operations. A DRAM
//! storage server keeps its blocks *and* the authoritative per-block state
//! (generation, writers in flight) in one memfd ([`Region`], layout in
//! [`layout`]). A client on the same host receives that memfd over an
//! abstract Unix socket ([`handover`]), maps it, and reads and writes blocks
//! with plain memory copies: the server's CPU does no work per operation.
//! The server's own network path (`read`/`write` requests) runs the very
//! same protocol on the very same atomics, so mapped clients, network
//! clients and the metadata server's claims interoperate.
//!
//! # The protocol
//!
//! Each block has a 64-bit **generation word** and a 32-bit **writer
//! counter** in shared memory. Generations are below 2^63; bit 63 of the
//! word ([`SETTLING`]) marks a claim still waiting for older writers.
//!
//! **Read**(block, gen, off, len):
//! 1. `w1 = word.load(Acquire)`; if `w1 != gen`: `Stale` (reused by a newer
//!    owner, a new owner that has not written yet, or a claim settling);
//! 2. copy the bytes out with `ptr::copy_nonoverlapping`;
//! 3. `fence(Acquire)`; `w2 = word.load()`; if `w2 != gen`: `Stale`, and the
//!    copy is discarded (a caller's buffer is zeroed again).
//!
//! The copy races with a claimer that may already be writing the new
//! owner's bytes; that is acceptable because its result is only used when
//! the generation was the same before and after it (a seqlock read). Every
//! writer issues `fence(Release)` after it has taken the block and before
//! it copies, which pairs with the reader's acquire fence: a copy that saw
//! any byte of a newer owner also sees that owner's generation in step 3.
//!
//! **Write**(block, gen, off, data):
//! 1. `counter.fetch_add(1, SeqCst)` (register as a writer);
//! 2. `w = word.load(SeqCst)`, `current = w & !SETTLING`:
//!    * `current > gen`: leave, `Stale` (the block belongs to a newer owner);
//!    * `current < gen`: **claim**: `compare_exchange(w, gen | SETTLING)`
//!      (on failure re-read and decide again), then wait until the counter
//!      is 1 (only us): writers of the old generation that registered
//!      before the exchange finish their copy. Spin, then yield; after
//!      [`CLAIM_WAIT`] (100 ms) a writer is presumed dead (its process
//!      killed mid-copy): log a warning, forgive its count and go on. If a
//!      newer claim replaces the word meanwhile, leave with `Stale`.
//!      Finally `compare_exchange(gen | SETTLING, gen)`;
//!    * `current == gen` with `SETTLING` set: another writer of our
//!      generation is still claiming. Leave (so its wait can end), wait for
//!      the bit to clear, and start over. This keeps a concurrent writer of
//!      the new owner from writing while an old writer still may;
//!    * `current == gen`: go on;
//! 3. `fence(Release)`, copy the bytes in, leave (a release decrement that
//!    never goes below zero).
//!
//! Writers that register after a claim's exchange see the newer generation
//! and back off, and the claim waits for every writer that registered
//! before it, so **an old owner never overwrites a new owner's bytes**
//! (short of a writer stalled for longer than `CLAIM_WAIT`, which is
//! presumed dead). A zero-length write with a newer generation is a pure
//! claim: the metadata server uses it to invalidate freed blocks and to
//! claim container blocks. Readers take no part in the counter, so reads
//! never write shared memory.
//!
//! Requests whose generation has bit 63 set are refused with
//! `InvalidArgument` on every path.
//!
//! # Liveness
//!
//! The header is followed by a state word that the server sets to *closed*
//! when it stops; clients check it before every access. A server that dies
//! without stopping closes its end of the hand-over socket, which the
//! client watches.

pub mod handover;
pub mod layout;
mod region;

pub use handover::{receive_region, send_region, NAME_PREFIX};
pub use layout::{Layout, LayoutError, HEADER_LEN};
pub use region::{
    check_generation, check_range, stale_read, stale_write, Region, CLAIM_WAIT, SETTLING,
};

#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;
