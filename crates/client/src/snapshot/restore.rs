//! Restoring a snapshot: every checksum checked before anything is
//! created, the tree built beside its target and moved into place whole.

use super::*;

/// Where a restore builds its tree before moving it into place: under
/// names of its own (`.nk-restore-…`) beside the target, so that a
/// restore that fails leaves nothing behind and an existing target is
/// replaced only once its replacement is whole.
struct Staging {
    /// For a target other than `/`: where the snapshot's root is built,
    /// in `moves[0].0` (which takes the place of the highest node on the
    /// way to the target that is missing, or of the target).
    root: Option<String>,
    /// Each staged node and the path it moves to at the end: one for a
    /// target other than `/`; for `/`, one per top-level name of the
    /// snapshot.
    moves: Vec<(String, String)>,
    /// For `/`: where each top-level name of the snapshot is built.
    tops: HashMap<String, String>,
    /// For `/` with overwrite: its names the snapshot does not have,
    /// removed once the new tree is in place.
    remove: Vec<String>,
    /// Tells this restore's names from any other's.
    key: u64,
}

impl Staging {
    /// Where the node at `rel` in the snapshot is built; `None` for the
    /// root of a restore to `/` (which exists).
    fn path(&self, rel: &str) -> Option<String> {
        if let Some(root) = &self.root {
            return Some(target(root, rel));
        }
        let (top, rest) = rel.split_once('/').unwrap_or((rel, ""));
        self.tops.get(top).map(|staged| target(staged, rest))
    }
}

impl Client {
    /// Restores the snapshot in `dir` to `dst` (`/` too). The manifest and
    /// every checksum are checked first; the tree is then built under a
    /// name of its own beside `dst` and moved into place once whole, so a
    /// restore that fails leaves nothing behind (missing parents of `dst`
    /// included). An existing `dst` (for `/`: one with children) is
    /// refused with `AlreadyExists` unless `opts.overwrite`; then it is
    /// replaced only once the new tree is in place.
    pub async fn restore(
        &self,
        dir: &Path,
        dst: &str,
        opts: &RestoreOptions,
        progress: &dyn Progress,
    ) -> Result<RestoreSummary> {
        path::components(dst)?;
        let m = read_manifest(dir)?;
        let mut summary = RestoreSummary {
            path: dst.to_string(),
            dir: dir.display().to_string(),
            ..RestoreSummary::default()
        };
        let root = &m.entries[0];
        if dst == "/" && root.ty != NodeType::Directory {
            return Err(Error::type_mismatch(format!(
                "the snapshot in {} is of a {}; only a Directory can be restored to /",
                dir.display(),
                root.ty
            )));
        }
        // Every target path must be valid before anything is created.
        for e in &m.entries {
            path::components(&target(dst, &e.path))
                .map_err(|err| ctx(&format!("restoring {:?} to {dst}", e.path), err))?;
        }
        let staging = self.staging(dst, &m, opts.overwrite).await?;
        let packs = open_packs(dir, &m)?;
        verify(dir, &m, &packs, progress)?;
        for e in &m.entries {
            summary.counts.add(e.ty, e.size);
        }
        let built = self
            .build(
                dir,
                dst,
                &m,
                &packs,
                &staging,
                opts,
                progress,
                &summary.counts,
            )
            .await;
        let placed = match built {
            Ok(()) => self.move_into_place(&staging, opts.overwrite).await,
            Err(e) => Err(e),
        };
        let aside = match placed {
            Ok(aside) => aside,
            Err(e) => {
                self.discard(&staging).await;
                return Err(e);
            }
        };
        for old in aside.iter().chain(&staging.remove) {
            match self.delete(old, true).await {
                Ok(()) => {}
                Err(e) if e.code == ErrorCode::NotFound => {}
                Err(e) => {
                    return Err(ctx(
                        &format!("restored {dst}, but could not remove the old {old}"),
                        e,
                    ))
                }
            }
        }
        Ok(summary)
    }

    /// Checks the target (an existing one is refused without
    /// `overwrite`) and names the nodes the restore is built under.
    async fn staging(&self, dst: &str, m: &Manifest, overwrite: bool) -> Result<Staging> {
        use std::hash::BuildHasher;
        let key = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
        let mut st = Staging {
            root: None,
            moves: Vec::new(),
            tops: HashMap::new(),
            remove: Vec::new(),
            key,
        };
        if dst == "/" {
            let existing = self.enumerate("/").await?;
            if !existing.is_empty() && !overwrite {
                return Err(Error::already_exists(format!(
                    "/ is not empty ({} entries): restore into an empty cluster, or ask to overwrite",
                    existing.len()
                )));
            }
            for e in m.entries.iter().skip(1).filter(|e| !e.path.contains('/')) {
                let top = format!("/{}", e.path);
                let staged = self.beside(&top, &format!("restore-{key:016x}-{}", st.moves.len()));
                st.tops.insert(e.path.clone(), staged.clone());
                st.moves.push((staged, top));
            }
            if overwrite {
                st.remove = existing
                    .into_iter()
                    .filter(|name| !st.tops.contains_key(name))
                    .map(|name| format!("/{name}"))
                    .collect();
            }
            return Ok(st);
        }
        // The restore creates the highest node on the way to `dst` that
        // is missing (missing parents become Directories), or replaces
        // `dst`.
        let mut missing = None;
        let mut at = String::new();
        for c in path::components(dst)? {
            at = format!("{at}/{c}");
            match self.lookup(&at).await {
                Ok(_) => {}
                Err(e) if e.code == ErrorCode::NotFound => {
                    missing = Some(at);
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        let top = match missing {
            Some(top) => top,
            None if overwrite => dst.to_string(),
            None => {
                return Err(Error::already_exists(format!(
                    "{dst} exists: restore to a new path, or ask to overwrite"
                )))
            }
        };
        let staged = self.beside(&top, &format!("restore-{key:016x}"));
        st.root = Some(format!("{staged}{}", dst.get(top.len()..).unwrap_or("")));
        st.moves.push((staged, top));
        Ok(st)
    }

    /// A name for the restore's own use (`.nk-{tag}-N`) beside `path`, on
    /// the metadata partition that owns `path`, so that moving between
    /// the two is never `CrossPartition`. A path's partition is that of
    /// its top-level name: beside a deeper path any name will do, beside a
    /// top-level one a few are tried (about as many as there are
    /// partitions).
    fn beside(&self, path: &str, tag: &str) -> String {
        let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
        let owner = self.partition(path);
        (0u64..)
            .map(|n| format!("{parent}/.nk-{tag}-{n}"))
            .find(|p| self.partition(p) == owner)
            .unwrap_or_default()
    }

    /// Creates the snapshot's nodes where `st` builds them: the containers
    /// in order, then the data nodes `opts.writes_in_flight` at a time.
    /// After a failure no more are started, and those being written are
    /// aborted.
    #[allow(clippy::too_many_arguments)]
    async fn build(
        &self,
        dir: &Path,
        dst: &str,
        m: &Manifest,
        packs: &[std::fs::File],
        st: &Staging,
        opts: &RestoreOptions,
        progress: &dyn Progress,
        counts: &NodeCounts,
    ) -> Result<()> {
        let staged = |e: &ManifestEntry| {
            st.path(&e.path)
                .ok_or_else(|| Error::internal(format!("restoring {:?}: no staging path", e.path)))
        };
        // The staging paths must be valid too before anything is created.
        for e in m.entries.iter().skip(usize::from(st.root.is_none())) {
            let p = staged(e)?;
            path::components(&p).map_err(|err| {
                ctx(
                    &format!("restoring {} (built at {p} first)", target(dst, &e.path)),
                    err,
                )
            })?;
        }
        progress.phase(Phase::Writing, counts.nodes, counts.bytes);
        if let (Some(root), Some((first, _))) = (&st.root, st.moves.first()) {
            if root != first {
                // Missing parents of the target.
                let (parent, _) = path::split_parent(root)?;
                self.mkdir(parent, true).await?;
            }
        }
        for e in m.entries.iter().filter(|e| e.ty.is_container()) {
            progress.advance(1, 0);
            if st.root.is_none() && e.path.is_empty() {
                continue;
            }
            let opts = CreateOptions {
                enumerable: e.enumerable,
                ..CreateOptions::default()
            };
            self.create(&staged(e)?, e.ty, opts)
                .await
                .map_err(|err| ctx(&format!("restoring {}", target(dst, &e.path)), err))?;
        }
        let failed = std::sync::atomic::AtomicBool::new(false);
        let failed = &failed;
        let data = m.entries.iter().filter(|e| !e.ty.is_container());
        stream::iter(data)
            .map(|e| async move {
                if failed.load(std::sync::atomic::Ordering::Relaxed) {
                    return Ok(());
                }
                let written = match staged(e) {
                    Ok(p) => self.restore_node(dir, packs, e, &p).await,
                    Err(err) => Err(err),
                };
                match written {
                    Ok(()) => progress.advance(1, e.size),
                    Err(_) => failed.store(true, std::sync::atomic::Ordering::Relaxed),
                }
                written.map_err(|err| ctx(&format!("restoring {}", target(dst, &e.path)), err))
            })
            .buffer_unordered(opts.writes_in_flight.max(1))
            .fold(Ok(()), |first, r| async move { first.and(r) })
            .await
    }

    /// Moves every staged node to its target; with `overwrite`, an
    /// existing target is first moved aside (beside it), to be put back
    /// should a later move fail. The paths moved aside, to be removed.
    async fn move_into_place(&self, st: &Staging, overwrite: bool) -> Result<Vec<String>> {
        let mut done: Vec<(&str, &str, Option<String>)> = Vec::new();
        for (i, (staged, to)) in st.moves.iter().enumerate() {
            let tag = format!("replaced-{:016x}-{i}", st.key);
            match self.move_one(staged, to, overwrite, &tag).await {
                Ok(aside) => done.push((staged, to, aside)),
                Err(e) => {
                    for (staged, to, aside) in done.into_iter().rev() {
                        self.move_back(staged, to, aside).await;
                    }
                    return Err(e);
                }
            }
        }
        Ok(done.into_iter().filter_map(|(_, _, aside)| aside).collect())
    }

    async fn move_one(
        &self,
        staged: &str,
        to: &str,
        overwrite: bool,
        tag: &str,
    ) -> Result<Option<String>> {
        let mut aside = None;
        if overwrite {
            let a = self.beside(to, tag);
            match self.rename(to, &a).await {
                Ok(()) => aside = Some(a),
                Err(e) if e.code == ErrorCode::NotFound => {}
                Err(e) => return Err(ctx(&format!("moving {to} aside"), e)),
            }
        }
        if let Err(e) = self.rename(staged, to).await {
            if let Some(a) = &aside {
                if let Err(b) = self.rename(a, to).await {
                    tracing::warn!("could not put {to} back from {a}: {b}");
                }
            }
            return Err(ctx(&format!("moving the restored tree to {to}"), e));
        }
        Ok(aside)
    }

    /// Undoes a move after a later one failed: the restored node goes back
    /// to where it was built (to be discarded), the old one to its place.
    async fn move_back(&self, staged: &str, to: &str, aside: Option<String>) {
        if let Err(e) = self.rename(to, staged).await {
            tracing::warn!("could not move the restored {to} back to {staged}: {e}");
            return;
        }
        if let Some(a) = aside {
            if let Err(e) = self.rename(&a, to).await {
                tracing::warn!("could not put {to} back from {a}: {e}");
            }
        }
    }

    /// Removes what a failed restore built.
    async fn discard(&self, st: &Staging) {
        for (staged, _) in &st.moves {
            match self.delete(staged, true).await {
                Ok(()) => {}
                Err(e) if e.code == ErrorCode::NotFound => {}
                Err(e) => tracing::warn!("could not remove the partial restore at {staged}: {e}"),
            }
        }
    }

    /// Creates one data node with its bytes, checking them again on the
    /// way (the pack could have changed since it was verified); a value
    /// whose bytes do not match is aborted, never published.
    async fn restore_node(
        &self,
        dir: &Path,
        packs: &[std::fs::File],
        e: &ManifestEntry,
        p: &str,
    ) -> Result<()> {
        let opts = CreateOptions {
            size_hint: if e.ty == NodeType::KeyValue {
                e.size
            } else {
                0
            },
            ..CreateOptions::default()
        };
        let mut node = self.create(p, e.ty, opts).await?;
        let mut crc = crc32fast::Hasher::new();
        let mut at = 0;
        let written = async {
            while at < e.size {
                let len = CHUNK.min(e.size - at);
                let buf = read_pack(dir, packs, e.pack, e.offset + at, len)?;
                crc.update(&buf);
                node.append(&buf).await?;
                at += len;
            }
            if crc.clone().finalize() != e.crc {
                return Err(damaged_node(dir, e));
            }
            Ok(())
        }
        .await;
        match written {
            Ok(()) => node.close().await,
            Err(err) => {
                let _ = node.abort().await;
                Err(err)
            }
        }
    }
}

fn damaged_node(dir: &Path, e: &ManifestEntry) -> Error {
    Error::data_lost(format!(
        "snapshot {}: {}: the bytes of node {:?} ({} bytes at offset {}) do not match their checksum: the snapshot is damaged",
        dir.display(),
        pack_name(e.pack),
        e.path,
        e.size,
        e.offset
    ))
}

/// Opens every pack and checks its header and length.
fn open_packs(dir: &Path, m: &Manifest) -> Result<Vec<std::fs::File>> {
    let mut out = Vec::with_capacity(m.packs.len());
    for (i, len) in m.packs.iter().enumerate() {
        let path = dir.join(pack_name(i as u32));
        let (f, actual) = open_regular(&path, "snapshot pack file", |e| {
            Error::data_lost(format!(
                "snapshot {}: {}: {e}",
                dir.display(),
                pack_name(i as u32)
            ))
        })?;
        let mut h = [0u8; PACK_HEADER_LEN as usize];
        let header_ok = actual >= PACK_HEADER_LEN
            && f.read_exact_at(&mut h, 0).is_ok()
            && h == pack_header(i as u32);
        if actual != *len || !header_ok {
            return Err(Error::data_lost(format!(
                "snapshot pack file {} is damaged: {}",
                path.display(),
                if actual != *len {
                    format!("{actual} bytes, the manifest says {len}")
                } else {
                    "its header is wrong".into()
                }
            )));
        }
        out.push(f);
    }
    Ok(out)
}

fn read_pack(dir: &Path, packs: &[std::fs::File], pack: u32, at: u64, len: u64) -> Result<Vec<u8>> {
    let f = packs
        .get(pack as usize)
        .ok_or_else(|| Error::invalid_argument(format!("no pack {pack}")))?;
    // `len` is at most CHUNK.
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, at)
        .map_err(|e| io_err(&dir.join(pack_name(pack)), e))?;
    Ok(buf)
}

/// Checks every node's bytes against its checksum.
fn verify(
    dir: &Path,
    m: &Manifest,
    packs: &[std::fs::File],
    progress: &dyn Progress,
) -> Result<()> {
    let data: Vec<&ManifestEntry> = m.entries.iter().filter(|e| !e.ty.is_container()).collect();
    let bytes = data.iter().map(|e| e.size).sum();
    progress.phase(Phase::Verifying, data.len() as u64, bytes);
    for e in data {
        let mut crc = crc32fast::Hasher::new();
        let mut at = 0;
        while at < e.size {
            let len = CHUNK.min(e.size - at);
            let buf = read_pack(dir, packs, e.pack, e.offset + at, len)?;
            crc.update(&buf);
            at += len;
            progress.advance(0, len);
        }
        if crc.finalize() != e.crc {
            return Err(damaged_node(dir, e));
        }
        progress.advance(1, 0);
    }
    Ok(())
}
