//! Puts in one exchange (`docs/small-values.md`, *Puts in one exchange*).
//!
//! A small put used to cost two exchanges with its metadata server: the
//! create that hands out its piece, and the close that makes it the value
//! at its key. A client now keeps a few puts reserved ahead of their keys
//! (`MetaRequest::Reserve`: each a node with its piece and write lease),
//! per metadata partition and piece size; a small put writes its value
//! into a reserved piece and closes it at its key with one
//! `MetaRequest::Link`. Reserving happens in the background, never on a
//! put's path: a put that finds no reservation ready goes the usual way
//! and asks for some, so the first put of a size is as before and the
//! ones after it take one exchange.
//!
//! A reservation lasts one write lease on the metadata server, which drops
//! an unused one with its piece when the lease lapses (as it drops any put
//! whose client went away); a client uses one only within half of that,
//! so it never writes into a lapsed one. A link the metadata server
//! refuses changes nothing: the reservation goes back to its pool and the
//! put goes the usual way (which reports what is wrong with the key). A
//! table whose values go to another storage class than reservations (the
//! root's) is remembered, and its puts go the usual way; a partition that
//! reserves nothing (encrypted classes, sizes its pieces do not take)
//! rests that pool for a while.
//!
//! A pool starts reserving at the second of two puts less than
//! [`STREAM_GAP`] apart, so a program that puts one value reserves
//! nothing. A put that finds no space gives back this client's unused
//! reservations in its partition and tries again, so they never make a
//! put fail; other clients' unused ones hold their pieces until they use
//! them or their leases lapse.
//!
//! This file is the bookkeeping, plain data (`Reservations`, given the
//! time); `open.rs` sends the requests.
//!
//! Costs: at most `ClientConfig::reserved_puts` reservations per client,
//! in all (about 250 bytes each here, and each a piece on the cluster
//! until used or lapsed; a client dropped gives its unused ones back),
//! in pools per (partition, piece size) it puts to, each with at most one
//! `Reserve` request in flight.

use nodekernel_proto::store::piece_size_for;
use nodekernel_proto::{sync, NodeInfo};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Reservations asked for at first, then twice as many each time a pool
/// was found empty, up to `ClientConfig::reserved_puts`.
const FIRST_BATCH: u32 = 4;
/// Bytes of pieces a pool asks for at once, at most: a pool of small
/// values holds up to `reserved_puts` of them, one of 16 KiB values four,
/// and values above it are not reserved.
const BATCH_BYTES: u32 = 64 << 10;
/// A pool reserves only for puts that follow one another this closely: a
/// program that puts one value (`nk kv put`) reserves nothing.
pub(crate) const STREAM_GAP: Duration = Duration::from_secs(1);
/// How long a pool whose partition reserves nothing for it (or that gave
/// its reservations back for lack of space) rests, and one whose
/// request failed otherwise.
pub(crate) const UNFIT_FOR: Duration = Duration::from_secs(30);
pub(crate) const FAILED_FOR: Duration = Duration::from_secs(1);

/// A block size larger than any cluster's: the piece sizes below its
/// quarter are the same for every block size (a cluster with smaller
/// blocks refuses the larger ones, and that pool rests).
const ANY_BLOCK: u32 = 1 << 30;

/// Most tables [`Reservations::elsewhere`] remembers (forgotten all at
/// once past it: their puts then try a reservation again, once each).
const MAX_ELSEWHERE: usize = 1024;

/// A reservation: the reserved put, and when it must be used by.
pub(crate) type Reserved = (NodeInfo, Instant);

/// A pool: a metadata partition and a piece size.
pub(crate) type PoolKey = (usize, u32);

/// The reserved puts of one client.
#[derive(Default)]
pub(crate) struct Reservations {
    pools: Mutex<HashMap<PoolKey, Pool>>,
    /// Tables whose values go elsewhere than reservations do (another
    /// storage class): their puts go the usual way.
    elsewhere: Mutex<HashSet<String>>,
}

#[derive(Default)]
struct Pool {
    ready: VecDeque<Reserved>,
    /// When the last put of this pool's size was.
    last_put: Option<Instant>,
    /// Reservations asked for by the request in flight (0: none).
    asking: u32,
    /// How many the next request asks for.
    batch: u32,
    /// Not refilled before this.
    rest_until: Option<Instant>,
}

/// What a put found in its pool ([`Reservations::take`]).
#[derive(Default)]
pub(crate) struct Taken {
    /// A reservation to put through.
    pub(crate) found: Option<Reserved>,
    /// Reservations to ask the pool's partition for now.
    pub(crate) ask: Option<(PoolKey, u32)>,
    /// Reservations too old to use, to give back.
    pub(crate) expired: Vec<NodeInfo>,
}

/// The table a put at `path` puts into (its parent's path).
fn table_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(table, _)| table)
}

/// The pool of a value of `len` bytes: its piece size, if it fits one.
fn piece_of(len: usize) -> Option<u32> {
    piece_size_for(ANY_BLOCK, len as u64)
}

impl Reservations {
    /// A put of `len` bytes at `path`, in partition `part`, at `now`, by a
    /// client that holds at most `most` reservations: a reservation to put
    /// it through if one is ready, and what to ask for or give back.
    pub(crate) fn take(
        &self,
        part: usize,
        path: &str,
        len: usize,
        most: u32,
        now: Instant,
    ) -> Taken {
        let Some(piece) = piece_of(len) else {
            return Taken::default();
        };
        let per_pool = most.min(BATCH_BYTES / piece);
        if per_pool == 0 || sync::lock(&self.elsewhere).contains(table_of(path)) {
            return Taken::default();
        }
        let mut pools = sync::lock(&self.pools);
        let held: u32 = pools
            .values()
            .map(|p| p.ready.len() as u32 + p.asking)
            .sum();
        let room = most.saturating_sub(held);
        let key = (part, piece);
        let pool = pools.entry(key).or_default();
        let mut expired = Vec::new();
        while let Some((info, _)) = pool.ready.pop_front_if(|(_, by)| *by <= now) {
            expired.push(info);
        }
        let found = pool.ready.pop_front();
        if found.is_none() {
            pool.batch = (pool.batch * 2).clamp(FIRST_BATCH.min(per_pool), per_pool);
        }
        let streaming = pool
            .last_put
            .replace(now)
            .is_some_and(|t| now.duration_since(t) < STREAM_GAP);
        let resting = pool.rest_until.is_some_and(|t| now < t);
        let low = pool.ready.len() <= pool.batch as usize / 2;
        let count = pool.batch.min(room + expired.len() as u32);
        let ask = streaming && low && pool.asking == 0 && !resting && count > 0;
        if ask {
            pool.asking = count;
        }
        Taken {
            found,
            ask: ask.then_some((key, count)),
            expired,
        }
    }

    /// The reserved puts asked for by `key`'s request came at `now`: kept,
    /// or, when the pool was given up meanwhile, returned to give back.
    pub(crate) fn filled(&self, key: PoolKey, puts: Vec<Reserved>, now: Instant) -> Vec<NodeInfo> {
        let mut pools = sync::lock(&self.pools);
        let pool = pools.entry(key).or_default();
        pool.asking = 0;
        if pool.rest_until.is_some_and(|t| now < t) {
            return puts.into_iter().map(|(info, _)| info).collect();
        }
        pool.ready.extend(puts);
        Vec::new()
    }

    /// `key`'s request failed at `now`: the pool rests for `time`.
    pub(crate) fn failed(&self, key: PoolKey, time: Duration, now: Instant) {
        let mut pools = sync::lock(&self.pools);
        let pool = pools.entry(key).or_default();
        pool.asking = 0;
        pool.rest_until = Some(now + time);
    }

    /// Gives back a reservation whose link was refused for its key (the
    /// refusal changed nothing).
    pub(crate) fn give_back(&self, part: usize, len: usize, r: Reserved) {
        if let Some(piece) = piece_of(len) {
            let mut pools = sync::lock(&self.pools);
            pools.entry((part, piece)).or_default().ready.push_front(r);
        }
    }

    /// The table of `path` keeps its values elsewhere than reservations
    /// do: its puts go the usual way.
    pub(crate) fn elsewhere(&self, path: &str) {
        let mut tables = sync::lock(&self.elsewhere);
        if tables.len() >= MAX_ELSEWHERE {
            tables.clear();
        }
        tables.insert(table_of(path).to_string());
    }

    /// Every unused reservation of partition `part` (all of them with
    /// `None`: the client is gone), with its partition; with `rest`, the
    /// partition's pools rest that long from `now`.
    pub(crate) fn drain(
        &self,
        part: Option<usize>,
        rest: Option<Duration>,
        now: Instant,
    ) -> Vec<(usize, NodeInfo)> {
        let mut pools = sync::lock(&self.pools);
        let mut out = Vec::new();
        for ((p, _), pool) in pools.iter_mut() {
            if part.is_some_and(|part| part != *p) {
                continue;
            }
            if let Some(rest) = rest {
                pool.rest_until = Some(now + rest);
            }
            out.extend(pool.ready.drain(..).map(|(info, _)| (*p, info)));
        }
        out
    }

    /// Reservations ready to use, over every pool.
    pub(crate) fn ready(&self) -> u64 {
        sync::lock(&self.pools)
            .values()
            .map(|pool| pool.ready.len() as u64)
            .sum()
    }

    /// Whether a request of partition `part` is in flight.
    pub(crate) fn asking(&self, part: usize) -> bool {
        sync::lock(&self.pools)
            .iter()
            .any(|((p, _), pool)| *p == part && pool.asking > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u64) -> NodeInfo {
        NodeInfo {
            id,
            ty: nodekernel_proto::NodeType::KeyValue,
            size: 0,
            block_size: 104,
            storage_class: 0,
            location: String::new(),
            enumerable: true,
            mode: 0,
            mtime: 0,
            lease: id + 100,
            encrypted: false,
            first_block: None,
            record: None,
            stored: 0,
            expires_ms: 0,
            child_ttl_ms: 0,
        }
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn values_of_one_piece_size_share_a_pool_and_empty_or_large_ones_have_none() {
        assert_eq!(piece_of(0), None);
        assert_eq!(piece_of(100), Some(112));
        assert_eq!(piece_of(104), Some(112));
        assert_eq!(piece_of(105), Some(128));
        assert_eq!(piece_of(1000), piece_size_for(1 << 20, 1000));
        assert_eq!(piece_of(ANY_BLOCK as usize), None);
        assert_eq!(table_of("/t/k"), "/t");
        assert_eq!(table_of("/a/t/k"), "/a/t");
    }

    /// One put asks for nothing; the second within a second asks for
    /// four; a pool found empty doubles its next request; what it holds
    /// is handed out in order until it is too old, then given back.
    #[test]
    fn a_pool_fills_for_puts_that_follow_one_another_and_hands_out_fresh_ones() {
        let r = Reservations::default();
        let t0 = Instant::now();
        let first = r.take(0, "/t/a", 100, 32, t0);
        assert!(
            first.found.is_none() && first.ask.is_none(),
            "one put reserves nothing"
        );
        let late = r.take(0, "/t/b", 100, 32, t0 + STREAM_GAP + MS);
        assert!(late.ask.is_none(), "two puts far apart neither");
        let second = r.take(0, "/t/c", 100, 32, t0 + STREAM_GAP + 2 * MS);
        // Three puts found the pool empty: 4, 8, 16.
        assert_eq!(second.ask, Some(((0, 112), 16)), "asked for");
        assert!(r.asking(0) && !r.asking(1));
        // No second request while one is in flight.
        assert!(r
            .take(0, "/t/d", 100, 32, t0 + STREAM_GAP + 3 * MS)
            .ask
            .is_none());
        let by = t0 + 10 * STREAM_GAP;
        let puts = (1..=16).map(|i| (node(i), by)).collect();
        assert!(r
            .filled((0, 112), puts, t0 + STREAM_GAP + 4 * MS)
            .is_empty());
        let now = t0 + STREAM_GAP + 5 * MS;
        let got: Vec<u64> = (0..3)
            .map(|i| r.take(0, "/t/x", 100, 32, now + i * MS).found.unwrap().0.id)
            .collect();
        assert_eq!(got, [1, 2, 3]);
        // A value of another piece size has a pool of its own.
        assert!(r.take(0, "/t/x", 500, 32, now).found.is_none());
        // Too old: given back, and not handed out.
        let old = r.take(0, "/t/x", 100, 32, by);
        assert!(old.found.is_none());
        let expired: Vec<u64> = old.expired.iter().map(|n| n.id).collect();
        assert_eq!(expired, (4..=16).collect::<Vec<_>>());
    }

    /// A client holds `most` reservations in all, over every pool.
    #[test]
    fn every_pool_together_holds_at_most_what_the_client_allows() {
        let r = Reservations::default();
        let t0 = Instant::now();
        let mut asked = 0;
        for (i, len) in [100usize, 200, 300, 400, 500, 600].iter().enumerate() {
            let at = t0 + (i as u32 * 2) * MS;
            r.take(0, "/t/k", *len, 10, at);
            if let Some((key, n)) = r.take(0, "/t/k", *len, 10, at + MS).ask {
                asked += n;
                let puts = (0..n)
                    .map(|j| (node(j as u64), t0 + STREAM_GAP * 100))
                    .collect();
                r.filled(key, puts, at + MS);
            }
        }
        assert_eq!(asked, 10, "4 + 4 + 2, then no room");
        assert_eq!(r.drain(None, None, t0).len(), 10);
        // With none held, 0 allowed asks for none.
        r.take(0, "/t/k", 100, 0, t0 + STREAM_GAP * 2);
        assert!(r
            .take(0, "/t/k", 100, 0, t0 + STREAM_GAP * 2 + MS)
            .ask
            .is_none());
    }

    /// A pool given up (a put found no space) rests: it asks for nothing
    /// meanwhile, and what its request in flight brings is given back.
    /// A table whose values go elsewhere takes no reservation.
    #[test]
    fn a_resting_pool_asks_for_nothing_and_gives_back_what_arrives() {
        let r = Reservations::default();
        let t0 = Instant::now();
        r.take(1, "/t/a", 100, 32, t0);
        let (key, n) = r.take(1, "/t/b", 100, 32, t0 + MS).ask.unwrap();
        assert_eq!(r.drain(Some(1), Some(UNFIT_FOR), t0 + 2 * MS).len(), 0);
        let puts = (0..n)
            .map(|j| (node(j as u64), t0 + UNFIT_FOR * 2))
            .collect();
        assert_eq!(
            r.filled(key, puts, t0 + 3 * MS).len(),
            n as usize,
            "given back"
        );
        assert!(!r.asking(1));
        assert!(
            r.take(1, "/t/c", 100, 32, t0 + 4 * MS).ask.is_none(),
            "resting"
        );
        let later = t0 + UNFIT_FOR + 5 * MS;
        r.take(1, "/t/c", 100, 32, later);
        assert!(
            r.take(1, "/t/c", 100, 32, later + MS).ask.is_some(),
            "rested"
        );

        r.elsewhere("/f/k");
        assert!(r.take(1, "/f/other", 100, 32, later + 2 * MS).ask.is_none());
        r.failed(key, FAILED_FOR, later + 3 * MS);
        assert!(!r.asking(1));
    }
}
