//! The manifest: what a snapshot holds, checked whole before a restore
//! creates anything (`docs/snapshots.md` has the layout).

use super::*;

/// One node in a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestEntry {
    /// Relative to the snapshot's root ("" for the root).
    pub path: String,
    pub ty: NodeType,
    pub enumerable: bool,
    pub storage_class: u8,
    /// Data bytes (0 for containers).
    pub size: u64,
    /// Where the bytes are: pack file number and offset in it.
    pub pack: u32,
    pub offset: u64,
    /// CRC-32 (IEEE) of the bytes.
    pub crc: u32,
}

/// A snapshot's manifest (`docs/snapshots.md` has the layout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Milliseconds since the Unix epoch when the snapshot began.
    pub created_ms: u64,
    /// The path the snapshot was taken of.
    pub source: String,
    /// The cluster's block size then.
    pub block_size: u32,
    /// Length of each pack file, header included.
    pub packs: Vec<u64>,
    /// Parents before children; the root first.
    pub entries: Vec<ManifestEntry>,
}

impl Manifest {
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = bytes::BytesMut::new();
        let e = &mut Enc(&mut buf);
        for b in MANIFEST_MAGIC {
            e.u8(b);
        }
        e.u16(FORMAT_VERSION)
            .u16(0)
            .u64(self.created_ms)
            .u32(self.block_size)
            .str(&self.source)
            .u32(self.packs.len() as u32);
        for p in &self.packs {
            e.u64(*p);
        }
        e.u32(self.entries.len() as u32);
        for en in &self.entries {
            e.u8(en.ty as u8)
                .bool(en.enumerable)
                .u8(en.storage_class)
                .str(&en.path)
                .u64(en.size)
                .u32(en.pack)
                .u64(en.offset)
                .u32(en.crc);
        }
        let crc = crc32fast::hash(&buf);
        Enc(&mut buf).u32(crc);
        buf.to_vec()
    }

    /// Decodes and checks a manifest read from `file`: checksum, version,
    /// every count against the bytes present, every path by the path
    /// rules, every parent listed before its children and accepting them,
    /// every node's bytes inside its pack. Errors name `file`.
    pub fn decode(bytes: &[u8], file: &Path) -> Result<Manifest> {
        let damaged = |why: String| {
            Error::data_lost(format!(
                "snapshot manifest {} is damaged: {why}",
                file.display()
            ))
        };
        if bytes.len() < MANIFEST_MAGIC.len() + 2 + 4 || bytes[..8] != MANIFEST_MAGIC {
            return Err(damaged(
                "it does not start like a NodeKernel snapshot manifest".into(),
            ));
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if version != FORMAT_VERSION {
            return Err(Error::invalid_argument(format!(
                "snapshot manifest {} has format version {version}; this build reads version {FORMAT_VERSION}",
                file.display()
            )));
        }
        let (body, tail) = bytes.split_at(bytes.len() - 4);
        let stored = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
        if crc32fast::hash(body) != stored {
            return Err(damaged("its checksum does not match its bytes".into()));
        }
        let mut dec = Dec::new(&body[10..], "snapshot manifest");
        let d = &mut dec;
        let m = (|| -> Result<Manifest> {
            let _flags = d.u16()?;
            let created_ms = d.u64()?;
            let block_size = d.u32()?;
            let source = d.string()?;
            path::components(&source)?;
            let np = d.count(8)?;
            if np > MAX_PACKS {
                return Err(Error::invalid_argument(format!(
                    "{np} pack files, the limit is {MAX_PACKS}"
                )));
            }
            let mut packs = Vec::with_capacity(np);
            for i in 0..np {
                let len = d.u64()?;
                if len < PACK_HEADER_LEN {
                    return Err(Error::invalid_argument(format!(
                        "{} is {len} bytes, shorter than its header",
                        pack_name(i as u32)
                    )));
                }
                packs.push(len);
            }
            let ne = d.count(ENTRY_MIN_LEN)?;
            let mut entries = Vec::with_capacity(ne);
            for _ in 0..ne {
                let ty = NodeType::from_u8(d.u8()?)?;
                let enumerable = d.bool()?;
                let storage_class = d.u8()?;
                let path = d.string()?;
                let size = d.u64()?;
                let pack = d.u32()?;
                let offset = d.u64()?;
                let crc = d.u32()?;
                entries.push(ManifestEntry {
                    path,
                    ty,
                    enumerable,
                    storage_class,
                    size,
                    pack,
                    offset,
                    crc,
                });
            }
            check_entries(&entries, &packs)?;
            Ok(Manifest {
                created_ms,
                source,
                block_size,
                packs,
                entries,
            })
        })()
        .map_err(|e| damaged(e.message))?;
        dec.finish().map_err(|e| damaged(e.message))?;
        Ok(m)
    }
}

/// The rules a manifest's entries keep beyond their encoding, checked
/// whole before a restore touches anything: the root first (and only it
/// with an empty path); every path valid and listed once; every parent
/// listed before its children, a container accepting their type;
/// containers without bytes; the bytes of each data node inside its pack
/// and after those of the data node listed before it (a snapshot writes
/// them back to back, so no two nodes share bytes and a restore never
/// writes more than the packs hold).
fn check_entries(entries: &[ManifestEntry], packs: &[u64]) -> Result<()> {
    if entries.is_empty() {
        return Err(Error::invalid_argument("no entries (not even the root)"));
    }
    let mut types: HashMap<&str, NodeType> = HashMap::with_capacity(entries.len());
    // Where the bytes of the last data node end: (pack, offset).
    let mut end = (0, PACK_HEADER_LEN);
    for (i, e) in entries.iter().enumerate() {
        let (p, ty, size) = (e.path.as_str(), e.ty, e.size);
        if (i == 0) != p.is_empty() {
            return Err(Error::invalid_argument(format!(
                "entry {i} ({p:?}): only the first entry, the root, has an empty path"
            )));
        }
        if i > 0 {
            path::components(&format!("/{p}"))?;
            let parent = p.rsplit_once('/').map_or("", |(a, _)| a);
            match types.get(parent) {
                Some(pt) if pt.accepts(ty) => {}
                Some(pt) => {
                    return Err(Error::invalid_argument(format!(
                        "entry {p:?}: a {pt} cannot hold a {ty}"
                    )))
                }
                None => {
                    return Err(Error::invalid_argument(format!(
                        "entry {p:?}: its parent is not listed before it"
                    )))
                }
            }
        }
        if types.insert(p, ty).is_some() {
            return Err(Error::invalid_argument(format!("{p:?} is listed twice")));
        }
        if ty.is_container() {
            if size != 0 {
                return Err(Error::invalid_argument(format!(
                    "container {p:?} has {size} bytes of data"
                )));
            }
        } else if size > 0 {
            let len = packs.get(e.pack as usize).copied().ok_or_else(|| {
                Error::invalid_argument(format!(
                    "node {p:?} is in pack {}, of {}",
                    e.pack,
                    packs.len()
                ))
            })?;
            let stop = match e.offset.checked_add(size) {
                Some(stop) if e.offset >= PACK_HEADER_LEN && stop <= len => stop,
                _ => {
                    return Err(Error::invalid_argument(format!(
                        "node {p:?}: {size} bytes at {} are outside {} ({len} bytes)",
                        e.offset,
                        pack_name(e.pack)
                    )))
                }
            };
            if (e.pack, e.offset) < end {
                return Err(Error::invalid_argument(format!(
                    "node {p:?}: its {size} bytes at {} in {} overlap those of a node listed before it (a snapshot writes them back to back)",
                    e.offset,
                    pack_name(e.pack)
                )));
            }
            end = (e.pack, stop);
        }
    }
    Ok(())
}

/// Reads and checks the manifest of the snapshot in `dir`.
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    let file = dir.join(MANIFEST);
    match std::fs::symlink_metadata(&file) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let why = if dir.is_dir() {
                "the snapshot is incomplete (it was interrupted before its manifest was written) or this is not a snapshot directory"
            } else {
                "no such directory"
            };
            return Err(Error::invalid_argument(format!(
                "{} has no {MANIFEST}: {why}",
                dir.display()
            )));
        }
        Err(e) => return Err(io_err(&file, e)),
    }
    let (f, len) = open_regular(&file, "snapshot manifest", |e| io_err(&file, e))?;
    if len > MAX_MANIFEST_BYTES {
        return Err(Error::invalid_argument(format!(
            "snapshot manifest {} is {len} bytes, the limit is {MAX_MANIFEST_BYTES}",
            file.display(),
        )));
    }
    // No more than the length it had when opened (a file still growing
    // fails its checksum).
    let mut bytes = Vec::with_capacity(len as usize);
    f.take(len)
        .read_to_end(&mut bytes)
        .map_err(|e| io_err(&file, e))?;
    Manifest::decode(&bytes, &file)
}
