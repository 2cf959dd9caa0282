//! Handing out nodes: create, open, lookup, `mkdir`, and whole values
//! (`put`, `get`, and the batched `put_many`, `get_many`, `delete_many`),
//! whose unfinished puts abort themselves; the requests of reserved puts
//! (`crate::reserve` keeps their books).

use crate::client::{leaf, Client};
use crate::config::{now_ns, CreateOptions, Ttl};
use crate::node::Node;
use crate::reserve::{PoolKey, Reserved, FAILED_FOR, UNFIT_FOR};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use nodekernel_proto::meta::{MetaReply, MetaRequest};
use nodekernel_proto::store::TAG_LEN;
use nodekernel_proto::{path, Error, ErrorCode, NodeInfo, NodeType, Result, NO_CLASS};
use std::collections::hash_map::{Entry, HashMap};
use std::future::Future;
use std::time::{Duration, Instant};

impl Client {
    /// Creates a node. File and KeyValue handles come back open for writing
    /// (the caller holds the write lease until [`Node::close`]).
    pub async fn create(&self, p: &str, ty: NodeType, opts: CreateOptions) -> Result<Node> {
        self.create_or_open(p, ty, opts, false).await
    }

    /// Opens the File at `p` for appending (as [`Client::open_write`]),
    /// creating it with `opts` if there is none: one metadata call either
    /// way. `opts` are ignored for an existing File. Another node type at
    /// `p` is `AlreadyExists`; an existing File being written is `Busy`.
    pub async fn open_append(&self, p: &str, opts: CreateOptions) -> Result<Node> {
        self.create_or_open(p, NodeType::File, opts, true).await
    }

    async fn create_or_open(
        &self,
        p: &str,
        ty: NodeType,
        opts: CreateOptions,
        open_existing: bool,
    ) -> Result<Node> {
        path::components(p)?;
        let idx = self.partition(p);
        let session = match &opts.session {
            Some(s) if s.owner() != self.owner() => {
                return Err(Error::invalid_argument(
                    "the session was opened by another client: bind nodes with the client that opened it",
                ))
            }
            Some(s) => Some(s.in_partition(idx)?),
            None => None,
        };
        let req = MetaRequest::Create {
            path: p.to_string(),
            ty,
            storage_class: opts.storage_class.unwrap_or(NO_CLASS),
            location: if opts.local {
                self.inner.cfg.location.clone()
            } else {
                String::new()
            },
            enumerable: opts.enumerable,
            size_hint: opts.size_hint,
            pinned: opts.pinned,
            mode: opts.mode.unwrap_or(ty.default_mode()),
            mtime: opts.mtime.unwrap_or_else(now_ns),
            open_existing,
            ttl_ms: opts.ttl.map_or(0, Ttl::wire_ms),
            child_ttl_ms: opts.child_ttl.map_or(0, crate::config::ttl_ms),
            session,
        };
        let info = self.node_reply(idx, &req).await?;
        if let Some(rec) = &info.record {
            self.write_record(idx, rec, ty, leaf(p)).await;
        }
        Ok(Node::new(self.clone(), p.to_string(), idx, info))
    }

    /// Creates a File at `p`, replacing the File or KeyValue there (as
    /// `open(p, "wb")` does): deleted, then created again. Another writer
    /// may delete or replace it meanwhile (another process, or a cancelled
    /// open of the same path that runs to its end): a File already gone is
    /// simply created, and one created again in between is replaced again
    /// (at most [`REPLACE_ATTEMPTS`] times), so concurrent replacements end
    /// with one of them current instead of failing with `NotFound`; a
    /// writer whose File another replaced finds its handle `Stale`. Another
    /// node type at `p` is `TypeMismatch`.
    pub async fn create_replacing(&self, p: &str, opts: CreateOptions) -> Result<Node> {
        for _ in 0..REPLACE_ATTEMPTS {
            match self.create(p, NodeType::File, opts.clone()).await {
                Err(e) if e.code == ErrorCode::AlreadyExists => {}
                r => return r,
            }
            match self.lookup(p).await {
                Ok(old) if !matches!(old.info().ty, NodeType::File | NodeType::KeyValue) => {
                    return Err(Error::type_mismatch(format!(
                        "{p} is a {}, not a File or KeyValue",
                        old.info().ty.name().to_lowercase()
                    )));
                }
                Ok(_) => match self.delete(p, false).await {
                    Err(e) if e.code != ErrorCode::NotFound => return Err(e),
                    _ => {}
                },
                Err(e) if e.code == ErrorCode::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Err(Error::new(
            ErrorCode::AlreadyExists,
            format!("{p} was created again {REPLACE_ATTEMPTS} times while this create replaced it"),
        ))
    }

    /// Creates a Directory (and, with `parents`, its missing ancestors).
    pub async fn mkdir(&self, p: &str, parents: bool) -> Result<()> {
        if !parents {
            return self
                .create(p, NodeType::Directory, CreateOptions::default())
                .await
                .map(drop);
        }
        let comps = path::components(p)?;
        for i in 1..=comps.len() {
            let sub = format!("/{}", comps[..i].join("/"));
            match self
                .create(&sub, NodeType::Directory, CreateOptions::default())
                .await
            {
                Ok(_) => {}
                Err(e) if e.code == nodekernel_proto::ErrorCode::AlreadyExists => {
                    let n = self.lookup(&sub).await?;
                    if n.info().ty != NodeType::Directory {
                        return Err(Error::type_mismatch(format!(
                            "{sub} exists and is a {}, not a Directory",
                            n.info().ty
                        )));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Looks a node up; the handle can read (not write).
    pub async fn lookup(&self, p: &str) -> Result<Node> {
        path::components(p)?;
        let idx = self.partition(p);
        let info = self
            .node_reply(
                idx,
                &MetaRequest::Lookup {
                    path: p.to_string(),
                },
            )
            .await?;
        Ok(Node::new(self.clone(), p.to_string(), idx, info))
    }

    /// Opens an existing File or KeyValue for writing (append, overwrite).
    /// Fails with `Busy` while another writer holds the node.
    pub async fn open_write(&self, p: &str) -> Result<Node> {
        path::components(p)?;
        let idx = self.partition(p);
        let info = self
            .node_reply(
                idx,
                &MetaRequest::OpenWrite {
                    path: p.to_string(),
                },
            )
            .await?;
        Ok(Node::new(self.clone(), p.to_string(), idx, info))
    }

    /// KeyValue put: create (replacing any old value), append, close. A
    /// put that fails leaves nothing behind: the new value is dropped and
    /// its blocks freed at once (the old value, if any, stays).
    ///
    /// Cancel safe: a put whose future is dropped before it finished (a
    /// timeout, `select!`, a cancelled Python task) is aborted in the
    /// background on the current tokio runtime, the same way. A create
    /// still in flight is finished first, so even a put dropped before it
    /// learnt its node leaves nothing behind; the value's blocks are freed
    /// as soon as that abort is answered, not when the metadata server
    /// sweeps abandoned puts. A put dropped during its close either
    /// stored the whole new value or left the old one. The bytes of
    /// `value` are not used after the future is dropped.
    pub async fn put(&self, p: &str, value: &[u8]) -> Result<()> {
        self.put_with(p, value, CreateOptions::default()).await
    }

    /// [`Client::put`] with create options: a TTL, a storage class, a
    /// mode, pinning (`size_hint` is the value's length). A put with any
    /// of them makes its own create rather than take a put reserved
    /// ahead (which knows no options; it gets its Table's child TTL).
    pub async fn put_with(&self, p: &str, value: &[u8], opts: CreateOptions) -> Result<()> {
        path::components(p)?;
        let part = self.partition(p);
        let plain = opts.ttl.is_none()
            && opts.storage_class.is_none()
            && !opts.local
            && !opts.pinned
            && opts.mode.is_none()
            && opts.mtime.is_none()
            && opts.session.is_none();
        if let Some(r) = plain
            .then(|| self.take_reserved(part, p, value.len()))
            .flatten()
        {
            // One exchange with the metadata server (`crate::reserve`);
            // whatever stops it, the put goes the usual way below.
            match self.put_reserved(p, part, r, value).await {
                Ok(()) => return Ok(()),
                Err(e) => tracing::debug!("{p}: a reserved put did not link: {e}"),
            }
        }
        let opts = CreateOptions {
            size_hint: value.len() as u64,
            ..opts
        };
        match self.put_created(p, value, opts.clone()).await {
            // This client's unused reservations may hold the space.
            Err(e) if e.code == ErrorCode::NoSpace && self.give_up_reserved(part).await => {
                self.put_created(p, value, opts).await
            }
            r => r,
        }
    }

    /// [`Client::put`] through a create of its own.
    async fn put_created(&self, p: &str, value: &[u8], opts: CreateOptions) -> Result<()> {
        let mut put = UnfinishedPut::create(self, p, opts);
        let node = put.node().await?;
        let written = match node.append(value).await {
            Ok(()) => node.close_in_place().await,
            Err(e) => Err(e),
        };
        match written {
            Ok(()) => {
                put.finished();
                Ok(())
            }
            Err(e) => {
                // Awaited, so the space is free when the error is seen.
                if let Some(abort) = put.abort() {
                    let _ = abort.await;
                }
                Err(e)
            }
        }
    }

    /// A reservation to put a value of `len` bytes at `p` through, if one
    /// is ready (`crate::reserve`); asks for more, and gives back ones too
    /// old to use, in the background.
    fn take_reserved(&self, part: usize, p: &str, len: usize) -> Option<Reserved> {
        let most = self.inner.cfg.reserved_puts;
        let taken = self.inner.reserved.take(part, p, len, most, Instant::now());
        let rt = tokio::runtime::Handle::try_current();
        if let Some((key, count)) = taken.ask {
            match &rt {
                Ok(rt) => {
                    rt.spawn(self.clone().reserve(key, count));
                }
                Err(_) => self.inner.reserved.failed(key, FAILED_FOR, Instant::now()),
            }
        }
        if let (false, Ok(rt)) = (taken.expired.is_empty(), &rt) {
            let (client, expired) = (self.clone(), taken.expired);
            rt.spawn(async move { client.abort_reserved(part, expired).await });
        }
        taken.found
    }

    /// Asks pool `key`'s partition for `count` reservations and keeps them.
    async fn reserve(self, key: PoolKey, count: u32) {
        let (part, piece) = key;
        let asked = Instant::now();
        let req = MetaRequest::Reserve {
            size_hint: u64::from(piece - TAG_LEN),
            count,
            storage_class: NO_CLASS,
            location: String::new(),
        };
        let reserved = &self.inner.reserved;
        match self.meta_at(part, &req).await {
            Ok(MetaReply::Reserved { lease_ms, puts }) => {
                // Used within half a lease: never one that lapsed.
                let use_by = asked + Duration::from_millis(lease_ms / 2);
                let puts = puts.into_iter().map(|p| (p, use_by)).collect();
                let unwanted = reserved.filled(key, puts, Instant::now());
                self.abort_reserved(part, unwanted).await;
            }
            other => {
                tracing::debug!("reserving puts of {piece}-byte pieces: {other:?}");
                // Refused: this partition reserves no such puts.
                let refused = matches!(&other, Err(e) if e.code == ErrorCode::InvalidArgument);
                let rest = if refused { UNFIT_FOR } else { FAILED_FOR };
                reserved.failed(key, rest, Instant::now());
            }
        }
    }

    /// Gives back reservations `unused` of partition `part` (one that
    /// lapsed already is gone anyway).
    async fn abort_reserved(&self, part: usize, unused: Vec<NodeInfo>) {
        for info in unused {
            let abort = MetaRequest::Abort {
                node: info.id,
                lease: info.lease,
            };
            let _ = self.meta_at(part, &abort).await;
        }
    }

    /// Gives back every unused reservation of partition `part` (a put there
    /// found no space), and asks for none there for a while: whether there
    /// were any (a request in flight gives back what it brings).
    async fn give_up_reserved(&self, part: usize) -> bool {
        let reserved = &self.inner.reserved;
        let unused = reserved.drain(Some(part), Some(UNFIT_FOR), Instant::now());
        let mut any = !unused.is_empty();
        self.abort_reserved(part, unused.into_iter().map(|(_, info)| info).collect())
            .await;
        let until = Instant::now() + self.inner.cfg.timeout;
        while reserved.asking(part) && Instant::now() < until {
            any = true;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        any
    }

    /// Puts `value` at `p` through reservation `r`: written into its piece,
    /// then linked at `p`. A link refused for `p` changes nothing, and the
    /// reservation goes back to its pool; after any other failure it is
    /// given back.
    async fn put_reserved(&self, p: &str, part: usize, r: Reserved, value: &[u8]) -> Result<()> {
        let mut node = Node::new(self.clone(), p.to_string(), part, r.0.clone());
        let linked = match node.append(value).await {
            Ok(()) => node.link_in_place().await,
            Err(e) => Err(e),
        };
        let Err(e) = linked else {
            return Ok(());
        };
        let reserved = &self.inner.reserved;
        match e.code {
            // Refused for `p`: the reservation is as it was.
            ErrorCode::NotFound
            | ErrorCode::TypeMismatch
            | ErrorCode::AlreadyExists
            | ErrorCode::InvalidArgument => {
                if e.code == ErrorCode::InvalidArgument {
                    // Values at `p` go elsewhere than reservations do.
                    reserved.elsewhere(p);
                }
                drop(node);
                reserved.give_back(part, value.len(), r);
            }
            _ => {
                let _ = node.abort().await;
            }
        }
        Err(e)
    }

    /// KeyValue get (works for Files too): lookup, then read everything.
    /// If the value is replaced between the lookup and the read (the read
    /// gets `Stale`), the get looks the key up again, so it returns the
    /// current value rather than failing; after [`GET_ATTEMPTS`] replaced
    /// values in a row it gives up with `Stale`.
    pub async fn get(&self, p: &str) -> Result<Vec<u8>> {
        let mut attempt = 1;
        loop {
            let node = self.lookup(p).await?;
            let len = node.info().size;
            match node.read(0, len).await {
                Err(e) if e.code == ErrorCode::Stale && attempt < GET_ATTEMPTS => attempt += 1,
                r => return r,
            }
        }
    }

    /// Gets the values at `paths`, each as [`Client::get`], with up to
    /// `in_flight` gets outstanding: one result per path, in the order
    /// given, so a missing key is its own `NotFound` and fails none of the
    /// others (a reducer fetching the indexes of many map outputs). More
    /// than [`MAX_GET_MANY`] paths is `InvalidArgument`.
    pub async fn get_many<S: AsRef<str>>(
        &self,
        paths: &[S],
        in_flight: usize,
    ) -> Result<Vec<Result<Vec<u8>>>> {
        if paths.len() > MAX_GET_MANY {
            return Err(Error::invalid_argument(format!(
                "{} keys in one get; at most {MAX_GET_MANY}",
                paths.len()
            )));
        }
        Ok(futures::stream::iter(paths)
            .map(|p| self.get(p.as_ref()))
            .buffered(in_flight.max(1))
            .collect()
            .await)
    }

    /// Puts each `(path, value)` of `items`, each as [`Client::put`], with
    /// up to `in_flight` puts outstanding (0 counts as 1): one result per
    /// item, in the order given, so a failing key fails none of the others
    /// (a loader that should be limited by the network, not by round
    /// trips). Items naming the same path are put one after another in
    /// the order given, so the last of them wins, as it would in a loop of
    /// puts. More than [`MAX_PUT_MANY`] items is `InvalidArgument`, and
    /// nothing is put.
    ///
    /// Cancel safe like [`Client::put`]: dropping the future aborts, in the
    /// background, every put it had started and not finished (each leaves
    /// nothing behind), and starts no other; the puts that had finished
    /// stay. The bytes of the values are not used after the future is
    /// dropped.
    pub async fn put_many<S: AsRef<str>, V: AsRef<[u8]>>(
        &self,
        items: &[(S, V)],
        in_flight: usize,
    ) -> Result<Vec<Result<()>>> {
        if items.len() > MAX_PUT_MANY {
            return Err(Error::invalid_argument(format!(
                "{} values in one put; at most {MAX_PUT_MANY}",
                items.len()
            )));
        }
        let paths = items.iter().map(|(p, _)| p.as_ref());
        Ok(per_key(paths, in_flight, |i| {
            let (p, v) = &items[i];
            self.put(p.as_ref(), v.as_ref())
        })
        .await)
    }

    /// Deletes each of `paths`, each as [`Client::delete`] (with
    /// `recursive` for every one), with up to `in_flight` deletes
    /// outstanding (0 counts as 1): one result per path, in the order
    /// given, so a missing key is its own `NotFound` and fails none of the
    /// others. A path given twice is deleted once; its second result is
    /// `NotFound`, as in a loop of deletes. More than [`MAX_DELETE_MANY`]
    /// paths is `InvalidArgument`, and nothing is deleted. A dropped future
    /// starts no further delete; one already sent may still happen.
    pub async fn delete_many<S: AsRef<str>>(
        &self,
        paths: &[S],
        recursive: bool,
        in_flight: usize,
    ) -> Result<Vec<Result<()>>> {
        if paths.len() > MAX_DELETE_MANY {
            return Err(Error::invalid_argument(format!(
                "{} keys in one delete; at most {MAX_DELETE_MANY}",
                paths.len()
            )));
        }
        Ok(per_key(paths.iter().map(|p| p.as_ref()), in_flight, |i| {
            self.delete(paths[i].as_ref(), recursive)
        })
        .await)
    }
}

/// Runs `op(i)` for each of `keys`, up to `in_flight` at a time (0 counts
/// as 1), and answers `op(i)`'s result at `i`. Calls for the same key run
/// one after another in the order given (a batch behaves as a loop would);
/// the others in any order. Dropped, it drops the calls in flight (each
/// cleans up after itself) and starts no other.
async fn per_key<'k, T, F, Fut>(
    keys: impl Iterator<Item = &'k str>,
    in_flight: usize,
    op: F,
) -> Vec<Result<T>>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    // The items of each key, the keys in order of first appearance.
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut group_of: HashMap<&str, usize> = HashMap::new();
    for (i, k) in keys.enumerate() {
        match group_of.entry(k) {
            Entry::Occupied(g) => groups[*g.get()].push(i),
            Entry::Vacant(g) => {
                g.insert(groups.len());
                groups.push(vec![i]);
            }
        }
    }
    let n = groups.iter().map(Vec::len).sum();
    drop(group_of);
    let op = &op;
    let mut done = futures::stream::iter(groups)
        .map(|group| async move {
            let mut out = Vec::with_capacity(group.len());
            for i in group {
                out.push((i, op(i).await));
            }
            out
        })
        .buffer_unordered(in_flight.max(1));
    let mut results: Vec<Option<Result<T>>> = (0..n).map(|_| None).collect();
    while let Some(answered) = done.next().await {
        for (i, r) in answered {
            results[i] = Some(r);
        }
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Error::internal("a batched call lost an item's result"))))
        .collect()
}

/// A [`Client::put`] that has not finished: its create, boxed so that a
/// dropped put can finish it, or its node. Dropped before
/// [`UnfinishedPut::finished`], it aborts the put in the background.
struct UnfinishedPut {
    path: String,
    state: PutState,
}

enum PutState {
    Creating(BoxFuture<'static, Result<Node>>),
    Writing(Box<Node>),
    Done,
}

impl UnfinishedPut {
    /// Starts creating the new value (the create runs when awaited).
    fn create(client: &Client, p: &str, opts: CreateOptions) -> UnfinishedPut {
        let (client, path) = (client.clone(), p.to_string());
        UnfinishedPut {
            path: p.to_string(),
            state: PutState::Creating(
                async move { client.create(&path, NodeType::KeyValue, opts).await }.boxed(),
            ),
        }
    }

    /// The new value's node, once created. Cancel safe.
    async fn node(&mut self) -> Result<&mut Node> {
        if let PutState::Creating(create) = &mut self.state {
            match create.await {
                Ok(node) => self.state = PutState::Writing(Box::new(node)),
                Err(e) => {
                    // Nothing was created: nothing to abort.
                    self.state = PutState::Done;
                    return Err(e);
                }
            }
        }
        match &mut self.state {
            PutState::Writing(node) => Ok(node),
            _ => Err(Error::internal(format!(
                "{}: the put has no node to write",
                self.path
            ))),
        }
    }

    /// The put is closed: nothing to abort.
    fn finished(&mut self) {
        self.state = PutState::Done;
    }

    /// Aborts the put in a task of its own (so that it runs to its end
    /// whatever happens to the caller), finishing its create first; `None`
    /// if there is nothing to abort or no runtime to run it on (the
    /// metadata server then drops the value once its lease lapses).
    fn abort(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        let abort = match std::mem::replace(&mut self.state, PutState::Done) {
            PutState::Done => return None,
            PutState::Writing(node) => node.abort().boxed(),
            PutState::Creating(create) => async move {
                match create.await {
                    Ok(node) => node.abort().await,
                    // Never created: nothing to abort.
                    Err(_) => Ok(()),
                }
            }
            .boxed(),
        };
        let path = std::mem::take(&mut self.path);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::debug!("{path}: a put dropped outside a tokio runtime is left to the sweep");
            return None;
        };
        Some(rt.spawn(async move {
            if let Err(e) = abort.await {
                // The metadata server drops the put once its lease lapses.
                tracing::debug!("{path}: could not abort the unfinished put: {e}");
            }
        }))
    }
}

impl Drop for UnfinishedPut {
    fn drop(&mut self) {
        // Not awaited: the put's future is gone.
        drop(self.abort());
    }
}

/// Lookups a [`Client::get`] makes before giving up on a key that keeps
/// being replaced under it.
pub const GET_ATTEMPTS: u32 = 64;

/// Most times [`Client::create_replacing`] replaces a File that others
/// keep creating again.
pub const REPLACE_ATTEMPTS: usize = 16;

/// Most keys one [`Client::get_many`] takes.
pub const MAX_GET_MANY: usize = 1 << 16;

/// Most items one [`Client::put_many`] takes.
pub const MAX_PUT_MANY: usize = 1 << 16;

/// Most keys one [`Client::delete_many`] takes.
pub const MAX_DELETE_MANY: usize = 1 << 16;
