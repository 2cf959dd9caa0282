//! Taking a snapshot: its listing frozen by the metadata server, its
//! data read into pack files, the manifest written last.

use super::*;

/// A node of a running snapshot, as listed when it began.
#[derive(Debug, Clone)]
pub struct SnapshotNode {
    /// Which metadata partition (index) and snapshot id listed it.
    part: usize,
    id: u64,
    pub entry: SnapshotEntry,
}

/// A running snapshot: its listing is frozen and its blocks are pinned on
/// the metadata server(s) until [`Snapshot::write_to`] (or
/// [`Snapshot::end`]) ends it. A snapshot nobody touches for two minutes
/// ends by itself.
pub struct Snapshot {
    client: Client,
    path: String,
    /// (partition, snapshot id) of every partition taking part.
    ids: Vec<(usize, u64)>,
    nodes: Vec<SnapshotNode>,
    created_ms: u64,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("path", &self.path)
            .field("ids", &self.ids)
            .field("nodes", &self.nodes.len())
            .finish()
    }
}

impl Client {
    /// Begins a snapshot of the subtree at `p` (every partition for `/`)
    /// and fetches its listing. Nothing is read yet: see
    /// [`Snapshot::write_to`].
    pub async fn snapshot_begin(&self, p: &str) -> Result<Snapshot> {
        let comps = path::components(p)?;
        let parts: Vec<usize> = if comps.is_empty() {
            (0..self.inner.cfg.metas.len()).collect()
        } else {
            vec![self.partition(p)]
        };
        let mut snap = Snapshot {
            client: self.clone(),
            path: p.to_string(),
            ids: Vec::new(),
            nodes: Vec::new(),
            created_ms: now_ms(),
        };
        for &part in &parts {
            let req = MetaRequest::SnapshotBegin {
                path: p.to_string(),
            };
            match self.meta_at(part, &req).await {
                Ok(MetaReply::SnapshotBegun { id, .. }) => snap.ids.push((part, id)),
                Ok(other) => {
                    snap.end().await;
                    return Err(unexpected(other));
                }
                Err(e) => {
                    snap.end().await;
                    return Err(ctx(&format!("snapshot of {p}"), e));
                }
            }
        }
        for (part, id) in snap.ids.clone() {
            if let Err(e) = snap.list(part, id).await {
                snap.end().await;
                return Err(ctx(&format!("snapshot of {p}"), e));
            }
        }
        Ok(snap)
    }

    /// Takes a snapshot of the subtree at `p` into the directory `dir`
    /// (created if missing; it must be empty): [`Client::snapshot_begin`]
    /// then [`Snapshot::write_to`].
    pub async fn snapshot(
        &self,
        p: &str,
        dir: &Path,
        opts: &SnapshotOptions,
        progress: &dyn Progress,
    ) -> Result<SnapshotSummary> {
        prepare_dir(dir)?;
        self.snapshot_begin(p)
            .await?
            .write_to(dir, opts, progress)
            .await
    }
}

/// Mode of the files a snapshot writes (they hold the nodes' data), and of
/// the directories it creates: the owner's only, whatever the umask.
const FILE_MODE: u32 = 0o600;
const DIR_MODE: u32 = 0o700;

/// Creates `path` for writing with [`FILE_MODE`]; `new`: it must not
/// exist, else it is truncated.
fn create_private(path: &Path, new: bool) -> Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .create_new(new)
        .truncate(true)
        .mode(FILE_MODE)
        .open(path)
        .map_err(|e| io_err(path, e))
}

/// Creates `dir` if needed (with its missing parents, [`DIR_MODE`]);
/// refuses one that is not empty.
fn prepare_dir(dir: &Path) -> Result<()> {
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), DIR_MODE)
        .create(dir)
        .map_err(|e| io_err(dir, e))?;
    let mut it = std::fs::read_dir(dir).map_err(|e| io_err(dir, e))?;
    if it.next().is_some() {
        return Err(Error::already_exists(format!(
            "{} is not empty: a snapshot goes into a new or empty directory",
            dir.display()
        )));
    }
    Ok(())
}

impl Snapshot {
    /// The nodes listed, parents before children.
    pub fn nodes(&self) -> &[SnapshotNode] {
        &self.nodes
    }

    async fn list(&mut self, part: usize, id: u64) -> Result<()> {
        let first_part = self.nodes.is_empty();
        let (mut entry, mut block) = (0, 0);
        loop {
            let req = MetaRequest::SnapshotList { id, entry, block };
            let (entries, next_entry, next_block) = match self.client.meta_at(part, &req).await? {
                MetaReply::SnapshotPage {
                    entries,
                    next_entry,
                    next_block,
                } => (entries, next_entry, next_block),
                other => return Err(unexpected(other)),
            };
            if entries.is_empty() {
                return Ok(());
            }
            if (next_entry, next_block) <= (entry, block) {
                return Err(Error::protocol(format!(
                    "snapshot {id}: the listing does not advance past entry {entry}"
                )));
            }
            for e in entries {
                let continues = self
                    .nodes
                    .last()
                    .is_some_and(|n| n.part == part && n.entry.index == e.index);
                if continues {
                    if let Some(n) = self.nodes.last_mut() {
                        n.entry.blocks.extend(e.blocks);
                    }
                } else if e.path.is_empty() && !first_part {
                    // Every partition has a root: keep the first one.
                } else {
                    self.nodes.push(SnapshotNode { part, id, entry: e });
                }
            }
            (entry, block) = (next_entry, next_block);
        }
    }

    /// Ends the snapshot without writing it: its blocks may be reused.
    pub async fn end(&self) {
        for (part, id) in &self.ids {
            let req = MetaRequest::SnapshotEnd { id: *id };
            if let Err(e) = self.client.meta_at(*part, &req).await {
                tracing::debug!("ending snapshot {id} on metadata partition {part}: {e}");
            }
        }
    }

    /// Reads every listed node's bytes into pack files in `dir` (created
    /// if missing; it must be empty), writes the manifest last, and ends
    /// the snapshot (also when it fails).
    pub async fn write_to(
        self,
        dir: &Path,
        opts: &SnapshotOptions,
        progress: &dyn Progress,
    ) -> Result<SnapshotSummary> {
        // Reads that never meet a fence never call the metadata server:
        // keep the snapshot alive meanwhile.
        let renew = {
            let client = self.client.clone();
            let ids = self.ids.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(RENEW_EVERY).await;
                    for (part, id) in &ids {
                        // An empty page past the end: it only renews.
                        let req = MetaRequest::SnapshotList {
                            id: *id,
                            entry: u64::MAX,
                            block: 0,
                        };
                        let _ = client.meta_at(*part, &req).await;
                    }
                }
            })
        };
        let r = match prepare_dir(dir) {
            Ok(()) => self.write_inner(dir, opts, progress).await,
            Err(e) => Err(e),
        };
        renew.abort();
        self.end().await;
        r
    }

    async fn write_inner(
        &self,
        dir: &Path,
        opts: &SnapshotOptions,
        progress: &dyn Progress,
    ) -> Result<SnapshotSummary> {
        let mut summary = SnapshotSummary {
            path: self.path.clone(),
            dir: dir.display().to_string(),
            ..SnapshotSummary::default()
        };
        // One read per block holding published bytes, in listing order.
        let mut jobs = Vec::new();
        let mut chunks = Vec::with_capacity(self.nodes.len());
        for n in &self.nodes {
            let e = &n.entry;
            summary.counts.add(e.ty, e.size);
            if e.ty.is_container() {
                chunks.push(0);
                continue;
            }
            let bs = e.block_size.max(1) as u64;
            let count = e.size.div_ceil(bs);
            if (e.blocks.len() as u64) < count {
                return Err(Error::data_lost(format!(
                    "{}: {} bytes need {count} blocks, the listing has {}",
                    target(&self.path, &e.path),
                    e.size,
                    e.blocks.len()
                )));
            }
            for i in 0..count {
                let len = bs.min(e.size - i * bs) as usize;
                jobs.push((n, i, e.blocks[i as usize].clone(), len));
            }
            chunks.push(count);
        }
        progress.phase(
            Phase::Reading,
            self.nodes.len() as u64,
            summary.counts.bytes,
        );
        let client = &self.client;
        let base = &self.path;
        let mut reads = stream::iter(jobs)
            .map(|(n, index, loc, len)| async move {
                let at = SnapshotLocator {
                    client,
                    part: n.part,
                    id: n.id,
                    node: n.entry.node,
                    first: &loc,
                };
                let e = &n.entry;
                let seal = crate::crypt::Seal::of(
                    client.config().encryption_key.as_ref(),
                    e.encrypted,
                    e.node,
                    e.block_size,
                )
                .map_err(|err| ctx(&target(base, &e.path), err))?;
                client
                    .inner
                    .io
                    .read_untagged(&at, index, loc.clone(), seal, 0, len)
                    .await
                    .map_err(|err| ctx(&target(base, &e.path), err))
            })
            .buffered(opts.reads_in_flight.max(1));
        let mut packs = PackWriter::new(dir, opts.pack_bytes);
        let mut entries = Vec::with_capacity(self.nodes.len());
        for (n, count) in self.nodes.iter().zip(chunks) {
            let e = &n.entry;
            let (pack, offset) = if e.ty.is_container() {
                (0, 0)
            } else {
                packs.start_node()?
            };
            let mut crc = crc32fast::Hasher::new();
            for _ in 0..count {
                let bytes = reads
                    .next()
                    .await
                    .ok_or_else(|| Error::internal("a block read went missing"))??;
                crc.update(&bytes);
                packs.write(&bytes)?;
                progress.advance(0, bytes.len() as u64);
            }
            entries.push(ManifestEntry {
                path: e.path.clone(),
                ty: e.ty,
                enumerable: e.enumerable,
                storage_class: e.storage_class,
                size: e.size,
                pack,
                offset: if e.size == 0 { PACK_HEADER_LEN } else { offset },
                crc: crc.finalize(),
            });
            progress.advance(1, 0);
        }
        let pack_lens = packs.finish()?;
        summary.packs = pack_lens.len() as u32;
        let block_size = self.nodes.first().map_or(0, |n| n.entry.block_size);
        let manifest = Manifest {
            created_ms: self.created_ms,
            source: self.path.clone(),
            block_size,
            packs: pack_lens,
            entries,
        };
        write_durably(dir, &manifest.encode())?;
        Ok(summary)
    }
}

/// Writes the manifest: to a temporary file, synced, renamed into place,
/// and the directory synced — the snapshot's commit point.
fn write_durably(dir: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(MANIFEST_TMP);
    let fin = dir.join(MANIFEST);
    let mut f = create_private(&tmp, false)?;
    f.write_all(bytes).map_err(|e| io_err(&tmp, e))?;
    f.sync_all().map_err(|e| io_err(&tmp, e))?;
    std::fs::rename(&tmp, &fin).map_err(|e| io_err(&fin, e))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err(dir, e))
}

/// Pack files being written, one after another.
struct PackWriter {
    dir: PathBuf,
    limit: u64,
    /// Finished packs' lengths.
    done: Vec<u64>,
    current: Option<(std::io::BufWriter<std::fs::File>, u64)>,
}

impl PackWriter {
    fn new(dir: &Path, limit: u64) -> Self {
        PackWriter {
            dir: dir.to_path_buf(),
            limit: limit.max(1),
            done: Vec::new(),
            current: None,
        }
    }

    fn file(&self, i: usize) -> PathBuf {
        self.dir.join(pack_name(i as u32))
    }

    /// Where the next node's bytes go (a new pack once the current one is
    /// full).
    fn start_node(&mut self) -> Result<(u32, u64)> {
        if self
            .current
            .as_ref()
            .is_some_and(|(_, len)| *len >= self.limit)
        {
            self.close_current()?;
        }
        if self.current.is_none() {
            let i = self.done.len();
            if i >= MAX_PACKS {
                return Err(Error::invalid_argument(format!(
                    "the snapshot needs more than {MAX_PACKS} pack files: use bigger ones"
                )));
            }
            let path = self.file(i);
            let f = create_private(&path, true)?;
            let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
            w.write_all(&pack_header(i as u32))
                .map_err(|e| io_err(&path, e))?;
            self.current = Some((w, PACK_HEADER_LEN));
        }
        let len = self.current.as_ref().map_or(PACK_HEADER_LEN, |(_, l)| *l);
        Ok((self.done.len() as u32, len))
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let path = self.file(self.done.len());
        let (w, len) = self
            .current
            .as_mut()
            .ok_or_else(|| Error::internal("no pack file open"))?;
        w.write_all(bytes).map_err(|e| io_err(&path, e))?;
        *len += bytes.len() as u64;
        Ok(())
    }

    fn close_current(&mut self) -> Result<()> {
        if let Some((w, len)) = self.current.take() {
            let path = self.file(self.done.len());
            let f = w.into_inner().map_err(|e| io_err(&path, e.into_error()))?;
            f.sync_all().map_err(|e| io_err(&path, e))?;
            self.done.push(len);
        }
        Ok(())
    }

    /// Closes the last pack (one is always written, maybe empty); the
    /// lengths of all.
    fn finish(mut self) -> Result<Vec<u64>> {
        if self.current.is_none() && self.done.is_empty() {
            self.start_node()?;
        }
        self.close_current()?;
        Ok(self.done)
    }
}

/// Finds a snapshot's block again after `Stale` (fenced, freed and held,
/// moved): asks the metadata server where that block is now.
struct SnapshotLocator<'a> {
    client: &'a Client,
    part: usize,
    id: u64,
    node: u64,
    /// The block's location when the snapshot began.
    first: &'a BlockLoc,
}

impl Locate for SnapshotLocator<'_> {
    async fn relocate(&self, index: u64, _err: Error) -> Result<BlockLoc> {
        let req = MetaRequest::SnapshotLocate {
            id: self.id,
            node: self.node,
            index,
            server: self.first.server,
            block: self.first.block,
        };
        match self.client.meta_at(self.part, &req).await? {
            MetaReply::Located(loc) => Ok(BlockLoc {
                offset: self.first.offset,
                tag: 0,
                ..loc
            }),
            other => Err(unexpected(other)),
        }
    }

    async fn replace(&self, index: u64, _lost: &BlockLoc) -> Result<BlockLoc> {
        Err(Error::internal(format!(
            "snapshot reads never write (block {index})"
        )))
    }
}
