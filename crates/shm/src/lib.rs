//! The co-located zero-copy data path: a DRAM storage server's memory,
//! shared with clients on the same host.
//!
//! This is the NodeKernel analogue of RDMA one-sided operations. A DRAM
//! storage server keeps its blocks *and* the authoritative per-block state
//! (generations, writes in progress) in one memfd ([`ServerRegion`], layout
//! in [`layout`]). A client process on the same host receives that memfd and
//! a writer slot over an abstract Unix socket ([`handover`]), maps it, and
//! reads and writes blocks with plain memory copies: the server's CPU does
//! no work per operation. The server's own network path (`read`/`write`
//! requests) runs the very same protocol on the very same atomics, so
//! mapped clients, network clients and the metadata server's claims
//! interoperate. `docs/shared-memory.md` is the reference for the bytes
//! and the protocol; [`protocol`] is its code.
//!
//! # The protocol in short
//!
//! Each block has a **generation word**: its owner's generation (below
//! 2^63), with [`SETTLING`] (bit 63) set while a claim waits for older
//! writers. Each writer process has a **slot** of a few **lanes**; a lane
//! names the block that one of its writes is copying into (or waiting to).
//!
//! * **Read**(block, gen): the word must be exactly `gen` before and after
//!   the copy (a seqlock read; a copy that raced with a new owner is
//!   discarded and the caller's buffer zeroed again). Readers never store
//!   to shared memory and never wait.
//! * **Write**(block, gen): publish the block in a free lane of our slot,
//!   fence, load the word. Newer: `Stale`. Ours and settled: copy, free the
//!   lane. Older (a **claim**) or ours and settling (**help** the claim):
//!   set `gen | SETTLING`, fence, and wait until no lane of any slot is
//!   writing the block; then clear `SETTLING` and write as above. A
//!   zero-length write with a newer generation is a pure claim.
//!
//! The store-then-fence-then-load on both sides (a Dekker pair) means a
//! writer either sees the claim and backs off, or the claim sees its lane
//! and waits for its copy: **an older generation's copy never overlaps a
//! newer owner's**, with no timeout anywhere.
//!
//! Waiting never blocks a task's thread, and never polls on a timer or
//! spins: [`Region::write`] is an `async fn` (for any executor) that is
//! pending until a lane changes (or a newer claim supersedes its own).
//! Whoever frees or changes a lane, in any process, or supersedes a
//! settling claim, moves a shared wake sequence and wakes its futex when some
//! operation waits; one thread per mapping, started at its first wait,
//! sleeps on that futex and wakes the waiting tasks (see [`protocol`]'s
//! *Waiting*).
//!
//! # Liveness
//!
//! A write waits only for copies that are really in flight: lanes are freed
//! when a copy ends, and the lanes of a process that died are freed by the
//! server when that process's hand-over connection closes (the kernel
//! closes it once all the process's threads are gone, so none of its
//! copies can still be running): [`SlotLease::reclaim`] clears the slot's
//! lanes and settles any claim it left half done, and only then is the
//! slot granted again. A process that is merely slow (descheduled,
//! stopped, paging) keeps its lanes, and a claim of a block it is writing
//! waits for it however long it takes. Nothing is presumed dead because of
//! time.
//!
//! The header is followed by a state word that the server sets to *closed*
//! when it stops; clients check it before every access. A server that dies
//! without stopping closes its end of the hand-over socket, which the
//! client watches.
//!
//! # Model check
//!
//! `tests/loom.rs` runs [`protocol`] itself under `loom` (`RUSTFLAGS="--cfg
//! loom" CARGO_TARGET_DIR=target/loom cargo test -p nodekernel-shm --release
//! --test loom`, part of `scripts/test.sh`), with block bytes as loom cells
//! and the futex as a loom condition variable, so loom's race detector
//! checks that no older-generation copy overlaps a newer owner's, and its
//! deadlock detector that no wait misses its wake-up: writer against
//! claimer (with a reader), two writers of one new generation against an
//! old writer, a writer that dies mid-copy and a claimer that dies
//! mid-claim (both reclaimed once their thread is gone), and a full slot.
//! Every scenario ends with every lane free, every count back at zero and
//! the block settled.

mod client;
pub mod handover;
pub mod layout;
mod notifier;
pub mod protocol;
mod region;
mod server;

pub use client::{Client, ClientRegion};
pub use handover::{
    answer_challenge, receive_region, send_region, Challenge, MESSAGE_LEN, NAME_PREFIX, NO_SLOT,
};
pub use layout::{Layout, LayoutError, HEADER_LEN};
pub use region::{check_generation, check_range, stale_read, stale_write, Region, Role, SETTLING};
pub use server::{InPlaceWrite, Server, ServerRegion, SlotLease};

#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;
