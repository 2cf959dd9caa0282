//! Copies: `nk put` (local to cluster), `nk get` (cluster to local) and
//! `nk cp` (either way, or inside the cluster), of one file or of whole
//! trees, several files at a time, under one progress bar.
//!
//! Every copy is whole or absent at its destination. A cluster File is
//! written under a hidden name beside its destination
//! (`.NAME.nk-copying-…`) and renamed into place once closed, as `hdfs dfs
//! -put` does with `_COPYING_`; a KeyValue is published by its close; a
//! local file is written beside its destination and linked (or, with
//! `-f`, renamed) into place. An existing destination is replaced only
//! with `-f`, atomically.

use crate::common::{coded, error_line, invalid, Code};
use crate::paths::{base_name, cluster_type, Loc};
use crate::walk::{walk, WalkOpts};
use anyhow::Context;
use futures::stream::{self, StreamExt};
use indicatif::{ProgressBar, ProgressStyle};
use nodekernel_client::{
    BufferedReader, BufferedWriter, Client, CreateOptions, ErrorCode, NodeType, StreamOptions,
};
use nodekernel_cluster::human;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

/// Buffered streams of a copy: 4 slices of 4 MiB in flight. With the
/// default 1 MiB blocks, each slice moves its 4 blocks in parallel, so some
/// 16 blocks stay in flight while the local file is read or written.
pub const STREAM: StreamOptions = StreamOptions {
    buffer_size: 16 << 20,
    slice_size: 4 << 20,
};

/// Files copied at once by default (`--parallel`).
pub const DEFAULT_PARALLEL: usize = 4;

/// Most files copied at once (`--parallel`): each may hold a stream's
/// buffers (16 MiB).
pub const MAX_PARALLEL: usize = 64;

#[derive(Debug, Clone)]
pub struct CopyOpts {
    /// Replace existing destination files.
    pub force: bool,
    /// Copy containers (directories) with everything in them.
    pub recursive: bool,
    /// Files copied at once.
    pub parallel: usize,
    /// How cluster destinations are created (class, placement, pinning).
    pub create: CreateOptions,
    /// A JSON summary on stdout, and errors as JSON on stderr.
    pub json: bool,
}

/// What `--json` prints once a copy is done.
#[derive(serde::Serialize)]
struct Summary {
    files: usize,
    directories: usize,
    bytes: u64,
    seconds: f64,
}

/// A file a copy reads or writes, and what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A container (cluster) or directory (local).
    Dir(NodeType),
    /// A File or KeyValue (cluster) or regular file (local), and its size.
    Data(NodeType, u64),
    /// stdin, stdout, a device or FIFO: read or written through.
    Stream,
}

async fn kind_of(client: &Client, loc: &Loc) -> anyhow::Result<Option<Kind>> {
    match loc {
        Loc::Cluster(p) => match client.lookup(p).await {
            Ok(n) if n.info().ty.is_container() => Ok(Some(Kind::Dir(n.info().ty))),
            Ok(n) => Ok(Some(Kind::Data(n.info().ty, n.info().size))),
            Err(e) if e.code == ErrorCode::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        },
        Loc::Local(p) if p == Path::new("-") => Ok(Some(Kind::Stream)),
        Loc::Local(p) => match std::fs::metadata(p) {
            Ok(m) if m.is_dir() => Ok(Some(Kind::Dir(NodeType::Directory))),
            Ok(m) if m.is_file() => Ok(Some(Kind::Data(NodeType::File, m.len()))),
            Ok(_) => Ok(Some(Kind::Stream)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(anyhow::Error::new(e).context(format!("cannot read {}", p.display()))),
        },
    }
}

fn child(loc: &Loc, name: &str) -> Loc {
    match loc {
        Loc::Cluster(p) => Loc::Cluster(nodekernel_proto::path::join(p, name)),
        Loc::Local(p) => Loc::Local(p.join(name)),
    }
}

fn name_of(loc: &Loc) -> Option<String> {
    match loc {
        Loc::Cluster(p) => Some(base_name(p).to_string()).filter(|n| !n.is_empty()),
        Loc::Local(p) if p == Path::new("-") => None,
        Loc::Local(p) => p.file_name().map(|n| n.to_string_lossy().into_owned()),
    }
}

/// One file to copy.
struct Job {
    src: Loc,
    dst: Loc,
    /// The source's size, if known before reading (not stdin).
    size: Option<u64>,
    /// For a cluster destination: File or KeyValue (in a Table).
    dst_ty: NodeType,
}

/// What a copy does: the containers to make (parents first) and the files.
#[derive(Default)]
struct Plan {
    dirs: Vec<(Loc, NodeType)>,
    jobs: Vec<Job>,
    /// Operands refused while planning (printed, counted as failures).
    refused: Vec<anyhow::Error>,
}

/// Copies `sources` to `dest` (`verb` names the command in messages).
/// With several sources, `dest` must be an existing container or
/// directory, and each goes into it under its own name, as with one source
/// and such a destination; a destination written with a trailing `/` must
/// be one. Failures of single files are printed as they happen and the
/// others go on; the command fails at the end if any did.
pub async fn copy(
    client: &Client,
    verb: &str,
    sources: &[Loc],
    dest_arg: &str,
    dest: Loc,
    opts: &CopyOpts,
) -> anyhow::Result<()> {
    if opts.parallel == 0 || opts.parallel > MAX_PARALLEL {
        return Err(invalid(format!(
            "--parallel {}: expected 1 to {MAX_PARALLEL}",
            opts.parallel
        )));
    }
    if sources.iter().all(Loc::is_local) && dest.is_local() {
        return Err(invalid(format!(
            "{verb}: {} and {dest} are both local; cluster paths start with /",
            sources[0]
        )));
    }
    let start = Instant::now();
    let dest_kind = kind_of(client, &dest).await?;
    let into = match dest_kind {
        Some(Kind::Dir(t)) => Some(t),
        _ => None,
    };
    let wants_dir = dest_arg.ends_with('/') && dest_arg.len() > 1;
    if into.is_none() && (sources.len() > 1 || wants_dir) {
        let why = match dest_kind {
            None => coded(
                Code::Wire(ErrorCode::NotFound),
                format!("{dest}: no such directory to {verb} into"),
            ),
            Some(_) => coded(
                Code::Wire(ErrorCode::TypeMismatch),
                format!("{dest} is not a directory to {verb} into"),
            ),
        };
        return Err(why);
    }
    if dest_kind == Some(Kind::Stream) && (sources.len() > 1 || opts.recursive) {
        return Err(invalid(format!(
            "{verb}: only one file can be written to {dest}"
        )));
    }
    let mut plan = Plan::default();
    for src in sources {
        if let Err(e) = plan_source(client, src, &dest, dest_kind, opts, &mut plan).await {
            plan.refused.push(e);
        }
    }
    run(client, verb, plan, &dest, opts, start).await
}

/// Adds the copy of `src` to `plan`.
/// `dest_kind` is what `dest` is (looked up once for every source).
async fn plan_source(
    client: &Client,
    src: &Loc,
    dest: &Loc,
    dest_kind: Option<Kind>,
    opts: &CopyOpts,
    plan: &mut Plan,
) -> anyhow::Result<()> {
    let into = match dest_kind {
        Some(Kind::Dir(t)) => Some(t),
        _ => None,
    };
    let Some(kind) = kind_of(client, src).await? else {
        return Err(coded(
            Code::Wire(ErrorCode::NotFound),
            format!("{src} does not exist"),
        ));
    };
    let (target, parent_ty) = match into {
        Some(t) => {
            let name = name_of(src).ok_or_else(|| {
                invalid(format!(
                    "{src} has no name to give it in {dest}: name the destination file"
                ))
            })?;
            (child(dest, &name), t)
        }
        None => (dest.clone(), parent_type(client, dest).await?),
    };
    match kind {
        Kind::Dir(ty) => {
            if !opts.recursive {
                return Err(invalid(format!(
                    "{src} is a {}: use -r to copy it with everything in it",
                    ty.name()
                )));
            }
            if let Loc::Cluster(s) = &target {
                if let Loc::Cluster(d) = src {
                    if s == d || s.starts_with(&format!("{}/", d.trim_end_matches('/'))) {
                        return Err(invalid(format!("cannot copy {src} into itself ({target})")));
                    }
                }
            }
            plan_tree(client, src, &target, opts, plan).await
        }
        Kind::Data(_, _) | Kind::Stream => {
            let size = match kind {
                Kind::Data(_, size) => Some(size),
                _ => None,
            };
            let dst_ty = data_type_in(parent_ty);
            match into {
                // The copy goes to `dest` itself, whose kind is known.
                None => check_existing(dest_kind, &target, dst_ty, opts)?,
                Some(_) => check_target(client, &target, dst_ty, opts).await?,
            }
            plan.jobs.push(Job {
                src: src.clone(),
                dst: target,
                size,
                dst_ty,
            });
            Ok(())
        }
    }
}

/// The type of the container that holds (or would hold) `loc`.
async fn parent_type(client: &Client, loc: &Loc) -> anyhow::Result<NodeType> {
    match loc {
        Loc::Cluster(p) => {
            let parent = nodekernel_proto::path::split_parent(p).map(|(d, _)| d.to_string())?;
            Ok(cluster_type(client, &parent)
                .await?
                .unwrap_or(NodeType::Directory))
        }
        Loc::Local(_) => Ok(NodeType::Directory),
    }
}

/// What a data node becomes in a container of type `parent`: a KeyValue
/// in a Table, a File elsewhere.
fn data_type_in(parent: NodeType) -> NodeType {
    if parent == NodeType::Table {
        NodeType::KeyValue
    } else {
        NodeType::File
    }
}

/// What a container becomes at the destination: its own type from the
/// cluster, a Directory from a local directory.
fn container_type(src: &Loc, ty: NodeType) -> NodeType {
    match src {
        Loc::Cluster(_) => ty,
        Loc::Local(_) => NodeType::Directory,
    }
}

/// Refuses a destination that exists, unless `-f` lets it be replaced (a
/// data node by a data node only).
async fn check_target(
    client: &Client,
    target: &Loc,
    ty: NodeType,
    opts: &CopyOpts,
) -> anyhow::Result<()> {
    check_existing(kind_of(client, target).await?, target, ty, opts)
}

/// [`check_target`] of a target whose kind is known (`existing`).
fn check_existing(
    existing: Option<Kind>,
    target: &Loc,
    ty: NodeType,
    opts: &CopyOpts,
) -> anyhow::Result<()> {
    match existing {
        None | Some(Kind::Stream) => Ok(()),
        Some(Kind::Dir(t)) => Err(coded(
            Code::Wire(ErrorCode::TypeMismatch),
            format!("{target} is a {}; a file cannot replace it", t.name()),
        )),
        Some(Kind::Data(t, _)) if opts.force => {
            if target.is_local() || t == ty {
                Ok(())
            } else {
                Err(coded(
                    Code::Wire(ErrorCode::TypeMismatch),
                    format!("{target} is a {}, not a {}", t.name(), ty.name()),
                ))
            }
        }
        Some(Kind::Data(_, _)) => Err(coded(
            Code::Wire(ErrorCode::AlreadyExists),
            format!("{target} exists (use -f to overwrite it)"),
        )),
    }
}

/// Adds a container (or local directory) `src` and everything below it.
async fn plan_tree(
    client: &Client,
    src: &Loc,
    target: &Loc,
    opts: &CopyOpts,
    plan: &mut Plan,
) -> anyhow::Result<()> {
    let existing = kind_of(client, target).await?;
    if let Some(Kind::Data(t, _)) = existing {
        return Err(coded(
            Code::Wire(ErrorCode::TypeMismatch),
            format!("{target} is a {}, not a directory", t.name()),
        ));
    }
    // Below a directory this copy makes, nothing exists to check.
    let fresh = existing.is_none();
    match src {
        Loc::Cluster(root) => {
            let mut found = Vec::new();
            let walked = walk(
                client,
                root,
                WalkOpts {
                    info: true,
                    max_depth: None,
                },
                |e| {
                    found.push(e);
                    Ok(())
                },
            )
            .await;
            walked?;
            // Containers come before their children, so each type is
            // known when its children's types are decided.
            let mut types: Vec<(String, NodeType)> = Vec::new();
            for e in found {
                let dst = if e.rel.is_empty() {
                    target.clone()
                } else {
                    rel_child(target, &e.rel)
                };
                let parent_rel = e.rel.rsplit_once('/').map_or("", |(p, _)| p);
                let parent_ty = types
                    .iter()
                    .rev()
                    .find(|(r, _)| r == parent_rel)
                    .map_or(NodeType::Directory, |(_, t)| *t);
                if e.ty.is_container() {
                    let t = container_type(src, e.ty);
                    types.push((e.rel.clone(), t));
                    plan.dirs.push((dst, t));
                } else {
                    let dst_ty = data_type_in(parent_ty);
                    if !fresh {
                        if let Err(err) = check_target(client, &dst, dst_ty, opts).await {
                            plan.refused.push(err);
                            continue;
                        }
                    }
                    plan.jobs.push(Job {
                        src: Loc::Cluster(e.path),
                        dst,
                        size: e.info.map(|i| i.size),
                        dst_ty,
                    });
                }
            }
            Ok(())
        }
        Loc::Local(root) => {
            plan.dirs.push((target.clone(), NodeType::Directory));
            let mut pending = vec![(root.clone(), target.clone())];
            while let Some((dir, dst)) = pending.pop() {
                let mut names: Vec<std::fs::DirEntry> = std::fs::read_dir(&dir)
                    .with_context(|| format!("cannot read {}", dir.display()))?
                    .collect::<Result<_, _>>()
                    .with_context(|| format!("cannot read {}", dir.display()))?;
                names.sort_by_key(|e| e.file_name());
                for e in names {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let path = e.path();
                    let to = child(&dst, &name);
                    // Links are not followed into directories (no loops);
                    // a link to a file is copied as the file.
                    let meta = match std::fs::symlink_metadata(&path) {
                        Ok(m) if m.file_type().is_symlink() => std::fs::metadata(&path),
                        m => m,
                    };
                    match meta {
                        Ok(m) if m.is_dir() && !e.file_type().is_ok_and(|t| t.is_symlink()) => {
                            plan.dirs.push((to.clone(), NodeType::Directory));
                            pending.push((path, to));
                        }
                        Ok(m) if m.is_file() => {
                            if !fresh {
                                let checked = check_target(client, &to, NodeType::File, opts).await;
                                if let Err(err) = checked {
                                    plan.refused.push(err);
                                    continue;
                                }
                            }
                            plan.jobs.push(Job {
                                src: Loc::Local(path),
                                dst: to,
                                size: Some(m.len()),
                                dst_ty: NodeType::File,
                            });
                        }
                        Ok(_) => eprintln!(
                            "nk: skipping {}: not a regular file or directory",
                            path.display()
                        ),
                        Err(err) => plan.refused.push(
                            anyhow::Error::new(err)
                                .context(format!("cannot read {}", path.display())),
                        ),
                    }
                }
            }
            Ok(())
        }
    }
}

fn rel_child(base: &Loc, rel: &str) -> Loc {
    rel.split('/').fold(base.clone(), |l, n| child(&l, n))
}

/// Makes the plan's containers, then copies its files, `opts.parallel` at
/// a time, under one progress bar.
async fn run(
    client: &Client,
    verb: &str,
    plan: Plan,
    dest: &Loc,
    opts: &CopyOpts,
    start: Instant,
) -> anyhow::Result<()> {
    let Plan {
        dirs,
        jobs,
        refused,
    } = plan;
    // One copy's failure is the command's error; with several, each is
    // printed as it happens and the command fails at the end.
    let quiet = jobs.len() + refused.len() == 1;
    let mut failed = refused.len();
    let mut first_error = None;
    for e in refused {
        if !quiet {
            eprintln!("{}", error_line(&e, opts.json));
        }
        first_error.get_or_insert(e);
    }
    for (d, ty) in &dirs {
        // Nothing can be copied below a container that cannot be made.
        make_dir(client, d, *ty, opts).await?;
    }
    let total: Option<u64> = jobs.iter().map(|j| j.size).sum();
    let files = jobs.len();
    let single = files == 1 && dirs.is_empty() && failed == 0;
    let pb = progress(total, verb, files);
    let done = AtomicU64::new(0);
    let finished = AtomicUsize::new(0);
    let results: Vec<(String, anyhow::Result<u64>)> = stream::iter(jobs)
        .map(|job| {
            let (done, finished, pb) = (&done, &finished, &pb);
            async move {
                let what = format!("{} -> {}", job.src, job.dst);
                let r = copy_one(client, &job, opts, done, pb).await;
                let n = finished.fetch_add(1, Ordering::Relaxed) + 1;
                if files > 1 {
                    pb.set_message(format!("{verb} {n}/{files} files"));
                }
                if let (Err(e), false) = (&r, quiet) {
                    pb.suspend(|| eprintln!("{}", error_line(e, opts.json)));
                }
                (what, r)
            }
        })
        .buffer_unordered(opts.parallel)
        .collect()
        .await;
    pb.finish_and_clear();
    let mut bytes = 0;
    let mut copied = 0;
    let mut last = String::new();
    for (what, r) in results {
        match r {
            Ok(n) => {
                bytes += n;
                copied += 1;
                last = what;
            }
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    if let Some(e) = first_error {
        if quiet {
            return Err(e);
        }
        let code = crate::common::code_of(&e);
        return Err(coded(
            code,
            format!(
                "{verb}: {failed} of {} failed (the first: {})",
                copied + failed,
                crate::common::error_text(e.chain())
            ),
        ));
    }
    if *dest == Loc::Local("-".into()) {
        // `nk cat`, `nk kv get`, `nk get PATH -`: the data is the output.
    } else if opts.json {
        let summary = Summary {
            files: copied,
            directories: dirs.len(),
            bytes,
            seconds: secs,
        };
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else if single {
        // (printed on stderr, like the progress)
        eprintln!(
            "{verb} {last}: {} in {secs:.3} s ({})",
            human(bytes),
            rate(bytes, secs)
        );
    } else {
        eprintln!(
            "{verb}: {copied} files ({}) and {} directories -> {dest} in {secs:.3} s ({})",
            human(bytes),
            dirs.len(),
            rate(bytes, secs)
        );
    }
    Ok(())
}

async fn make_dir(client: &Client, d: &Loc, ty: NodeType, opts: &CopyOpts) -> anyhow::Result<()> {
    match d {
        Loc::Local(p) => std::fs::create_dir_all(p)
            .with_context(|| format!("cannot create the directory {}", p.display())),
        Loc::Cluster(p) => {
            let create = CreateOptions {
                storage_class: opts.create.storage_class,
                local: opts.create.local,
                pinned: opts.create.pinned,
                ..CreateOptions::default()
            };
            match client.create(p, ty, create).await {
                Ok(_) => Ok(()),
                Err(e) if e.code == ErrorCode::AlreadyExists => {
                    match cluster_type(client, p).await? {
                        Some(t) if t.is_container() => Ok(()),
                        Some(t) => Err(coded(
                            Code::Wire(ErrorCode::TypeMismatch),
                            format!("{p} is a {}, not a directory", t.name()),
                        )),
                        None => Err(e.into()),
                    }
                }
                Err(e) => Err(e.into()),
            }
        }
    }
}

/// A progress bar on stderr (drawn only on a terminal) for a copy of
/// `total` bytes; without a total (stdin), the bytes so far and the rate
/// only: no bar, total or time left it cannot know.
pub fn progress(total: Option<u64>, verb: &str, files: usize) -> ProgressBar {
    let (pb, template) = match total {
        Some(t) => (
            ProgressBar::new(t),
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        ),
        None => (
            ProgressBar::new_spinner(),
            "{msg} {spinner} {bytes} {bytes_per_sec}",
        ),
    };
    pb.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(template)
        .expect("static template")
        .progress_chars("=> ");
    pb.set_style(style);
    pb.set_message(if files > 1 {
        format!("{verb} 0/{files} files")
    } else {
        verb.to_string()
    });
    pb
}

pub fn rate(bytes: u64, secs: f64) -> String {
    if secs <= 0.0 {
        return "-".into();
    }
    format!("{}/s", human((bytes as f64 / secs) as u64))
}

/// Copies one file, reading a cluster source again from its start when it
/// is replaced meanwhile (the copy is then of its newest version).
async fn copy_one(
    client: &Client,
    job: &Job,
    opts: &CopyOpts,
    done: &AtomicU64,
    pb: &ProgressBar,
) -> anyhow::Result<u64> {
    let mut attempt = 1;
    loop {
        let mut moved = 0;
        let r = copy_once(client, job, opts, done, pb, &mut moved).await;
        match r {
            Err(CopyError::Source(e))
                if e.code == ErrorCode::Stale && attempt < nodekernel_client::GET_ATTEMPTS =>
            {
                attempt += 1;
                done.fetch_sub(moved, Ordering::Relaxed);
                pb.set_position(done.load(Ordering::Relaxed));
            }
            Err(CopyError::Source(e)) => {
                return Err(anyhow::Error::new(e).context(format!("reading {}", job.src)))
            }
            Err(CopyError::Other(e)) => return Err(e),
            Ok(n) => return Ok(n),
        }
    }
}

enum CopyError {
    /// Reading a cluster source failed (`Stale`: it was replaced).
    Source(nodekernel_client::Error),
    Other(anyhow::Error),
}

impl From<anyhow::Error> for CopyError {
    fn from(e: anyhow::Error) -> Self {
        CopyError::Other(e)
    }
}

async fn copy_once(
    client: &Client,
    job: &Job,
    opts: &CopyOpts,
    done: &AtomicU64,
    pb: &ProgressBar,
    moved: &mut u64,
) -> Result<u64, CopyError> {
    let mut src = Source::open(client, &job.src).await?;
    let size = src.size().or(job.size);
    let mut dst = Dest::open(client, job, opts, size).await?;
    let copied = async {
        loop {
            let chunk = src.chunk().await?;
            if chunk.is_empty() {
                return Ok(());
            }
            let n = chunk.len();
            dst.write(chunk).await.map_err(CopyError::Other)?;
            src.consume(n);
            *moved += n as u64;
            pb.set_position(done.fetch_add(n as u64, Ordering::Relaxed) + n as u64);
        }
    }
    .await;
    match copied {
        Ok(()) => {
            dst.finish(client, opts.force).await?;
            Ok(*moved)
        }
        Err(e) => {
            dst.discard(client).await;
            Err(e)
        }
    }
}

/// Where a copy reads from.
enum Source {
    Local {
        input: Box<dyn Read + Send>,
        buf: Vec<u8>,
        size: Option<u64>,
        name: String,
    },
    Cluster(Box<BufferedReader>),
}

impl Source {
    async fn open(client: &Client, loc: &Loc) -> Result<Source, CopyError> {
        match loc {
            Loc::Local(p) if p == Path::new("-") => Ok(Source::Local {
                input: Box::new(std::io::stdin()),
                buf: vec![0; STREAM.slice_size],
                size: None,
                name: "stdin".into(),
            }),
            Loc::Local(p) => {
                let f = std::fs::File::open(p)
                    .with_context(|| format!("cannot open {}", p.display()))?;
                let size = f.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
                let cap = size.map_or(STREAM.slice_size, |s| {
                    (s as usize).clamp(1, STREAM.slice_size)
                });
                Ok(Source::Local {
                    input: Box::new(f),
                    buf: vec![0; cap],
                    size,
                    name: p.display().to_string(),
                })
            }
            Loc::Cluster(p) => {
                let node = client.lookup(p).await.map_err(CopyError::Source)?;
                if node.info().ty.is_container() {
                    return Err(CopyError::Other(coded(
                        Code::Wire(ErrorCode::TypeMismatch),
                        format!(
                            "{p} is a {}; only Files and KeyValues hold data",
                            node.info().ty
                        ),
                    )));
                }
                let r = BufferedReader::new(node, 0, STREAM).map_err(CopyError::Source)?;
                Ok(Source::Cluster(Box::new(r)))
            }
        }
    }

    fn size(&self) -> Option<u64> {
        match self {
            Source::Local { size, .. } => *size,
            Source::Cluster(r) => Some(r.node().size()),
        }
    }

    /// The next bytes (empty at the end), valid until [`Source::consume`].
    async fn chunk(&mut self) -> Result<&[u8], CopyError> {
        match self {
            Source::Local {
                input, buf, name, ..
            } => {
                let n =
                    read_full(input.as_mut(), buf).with_context(|| format!("reading {name}"))?;
                Ok(&buf[..n])
            }
            Source::Cluster(r) => r.fill_buf().await.map_err(CopyError::Source),
        }
    }

    fn consume(&mut self, n: usize) {
        if let Source::Cluster(r) = self {
            r.consume(n);
        }
    }
}

/// Reads until `buf` is full or the input ends.
pub fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Where a copy writes to, until it is finished or discarded.
enum Dest {
    /// A local file written beside its destination, or (stdout, a device)
    /// spooled to an unlinked file and written through once whole.
    Local {
        spool: std::fs::File,
        tmp: Option<PathBuf>,
        path: PathBuf,
    },
    /// A cluster File under a hidden name beside its destination, or a
    /// KeyValue published by its close (`tmp` None).
    Cluster {
        writer: Box<BufferedWriter>,
        tmp: Option<String>,
        path: String,
    },
}

impl Dest {
    async fn open(
        client: &Client,
        job: &Job,
        opts: &CopyOpts,
        size: Option<u64>,
    ) -> Result<Dest, CopyError> {
        match &job.dst {
            Loc::Local(p) => {
                let through = p == Path::new("-")
                    || std::fs::metadata(p).is_ok_and(|m| !m.is_file() && !m.is_dir());
                if through {
                    let spool = anonymous_spool()?;
                    return Ok(Dest::Local {
                        spool,
                        tmp: None,
                        path: p.clone(),
                    });
                }
                let (spool, tmp) = spool_beside(p)?;
                Ok(Dest::Local {
                    spool,
                    tmp: Some(tmp),
                    path: p.clone(),
                })
            }
            Loc::Cluster(p) => {
                let mut create = opts.create.clone();
                let (at, tmp) = if job.dst_ty == NodeType::KeyValue {
                    // A small value shares a block with others.
                    create.size_hint = size.unwrap_or(0);
                    (p.clone(), None)
                } else {
                    let t = hidden_sibling(p, client.config().metas.len());
                    (t.clone(), Some(t))
                };
                let node = client
                    .create(&at, job.dst_ty, create)
                    .await
                    .map_err(|e| anyhow::Error::new(e).context(format!("cannot create {p}")))?;
                let writer = match BufferedWriter::new(node, STREAM) {
                    Ok(w) => w,
                    Err(e) => {
                        if let Some(t) = &tmp {
                            let _ = client.delete(t, false).await;
                        }
                        return Err(CopyError::Other(e.into()));
                    }
                };
                Ok(Dest::Cluster {
                    writer: Box::new(writer),
                    tmp,
                    path: p.clone(),
                })
            }
        }
    }

    async fn write(&mut self, data: &[u8]) -> anyhow::Result<()> {
        match self {
            Dest::Local { spool, path, .. } => spool
                .write_all(data)
                .with_context(|| format!("cannot write {}", path.display())),
            Dest::Cluster { writer, path, .. } => writer
                .write_all(data)
                .await
                .with_context(|| format!("writing {path}")),
        }
    }

    /// Makes the copy visible at its destination, replacing what is there
    /// only with `force`.
    async fn finish(self, client: &Client, force: bool) -> anyhow::Result<()> {
        match self {
            Dest::Local {
                mut spool,
                tmp: None,
                path,
            } => {
                use std::io::Seek;
                spool.rewind()?;
                let mut out: Box<dyn Write> = if path == Path::new("-") {
                    Box::new(std::io::stdout().lock())
                } else {
                    Box::new(
                        std::fs::OpenOptions::new()
                            .write(true)
                            .open(&path)
                            .with_context(|| format!("cannot write {}", path.display()))?,
                    )
                };
                std::io::copy(&mut spool, &mut out)
                    .and_then(|_| out.flush())
                    .with_context(|| format!("cannot write {}", path.display()))?;
                Ok(())
            }
            Dest::Local {
                spool,
                tmp: Some(tmp),
                path,
            } => {
                let placed = spool.sync_all().and_then(|()| {
                    if force {
                        std::fs::rename(&tmp, &path)
                    } else {
                        // A link fails if the destination appeared meanwhile.
                        std::fs::hard_link(&tmp, &path).and_then(|()| std::fs::remove_file(&tmp))
                    }
                });
                placed.map_err(|e| {
                    let _ = std::fs::remove_file(&tmp);
                    if e.kind() == std::io::ErrorKind::AlreadyExists {
                        coded(
                            Code::Wire(ErrorCode::AlreadyExists),
                            format!("{} exists (use -f to overwrite it)", path.display()),
                        )
                    } else {
                        anyhow::Error::new(e).context(format!("cannot write {}", path.display()))
                    }
                })
            }
            Dest::Cluster {
                writer,
                tmp: None,
                path,
            } => writer
                .close()
                .await
                .with_context(|| format!("closing {path}")),
            Dest::Cluster {
                writer,
                tmp: Some(tmp),
                path,
            } => {
                if let Err(e) = writer.close().await {
                    let _ = client.delete(&tmp, false).await;
                    return Err(anyhow::Error::new(e).context(format!("closing {path}")));
                }
                match client.rename_with(&tmp, &path, force).await {
                    Ok(()) => Ok(()),
                    Err(e) => {
                        let _ = client.delete(&tmp, false).await;
                        if e.code == ErrorCode::AlreadyExists && !force {
                            Err(coded(
                                Code::Wire(ErrorCode::AlreadyExists),
                                format!("{path} exists (use -f to overwrite it)"),
                            ))
                        } else {
                            Err(anyhow::Error::new(e).context(format!("cannot create {path}")))
                        }
                    }
                }
            }
        }
    }

    /// Drops an unfinished copy: nothing of it stays.
    async fn discard(self, client: &Client) {
        match self {
            Dest::Local { tmp, .. } => {
                if let Some(t) = tmp {
                    let _ = std::fs::remove_file(t);
                }
            }
            Dest::Cluster { writer, tmp, path } => {
                if let Err(e) = writer.abort().await {
                    // The metadata server drops it once its lease lapses.
                    tracing::debug!("{path}: could not abort the failed copy: {e}");
                }
                if let Some(t) = tmp {
                    let _ = client.delete(&t, false).await;
                }
            }
        }
    }
}

/// A hidden name beside `path` (`.NAME.nk-copying-PID-N`) that the same
/// metadata partition owns (of `partitions`), so the copy can be renamed
/// onto `path`.
fn hidden_sibling(path: &str, partitions: usize) -> String {
    let (parent, name) = nodekernel_proto::path::split_parent(path).unwrap_or(("/", path));
    // Room for the decoration within a name's limit.
    let mut short = name.to_string();
    while short.len() > 200 {
        short.pop();
    }
    let want = nodekernel_proto::path::partition_of(path, partitions);
    let pid = std::process::id();
    let unique = rand::random::<u32>();
    let mut n = 0u64;
    loop {
        let t = nodekernel_proto::path::join(
            parent,
            &format!(".{short}.nk-copying-{pid}-{unique:08x}-{n}"),
        );
        if nodekernel_proto::path::partition_of(&t, partitions) == want {
            return t;
        }
        n += 1;
    }
}

/// An unlinked file in the temporary directory, readable only by us.
fn anonymous_spool() -> anyhow::Result<std::fs::File> {
    let dir = std::env::temp_dir();
    let (file, p) = create_unique(&dir, "nk-get", 0o600)
        .with_context(|| format!("cannot create a file in {}", dir.display()))?;
    let _ = std::fs::remove_file(&p);
    Ok(file)
}

/// A new file beside `local` (same file system, so the rename is atomic),
/// and its path.
fn spool_beside(local: &Path) -> anyhow::Result<(std::fs::File, PathBuf)> {
    let dir = match local.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = local
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "get".into());
    // The mode a new file gets (0666 less the umask), so the copy, once
    // in place, is like any other file its user makes.
    create_unique(&dir, &format!(".{name}.nk-part"), 0o666)
        .with_context(|| format!("cannot create {}", local.display()))
}

fn create_unique(dir: &Path, prefix: &str, mode: u32) -> std::io::Result<(std::fs::File, PathBuf)> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut attempt = 0u32;
    loop {
        let p = dir.join(format!("{prefix}-{}-{attempt}", std::process::id()));
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&p)
        {
            Ok(f) => return Ok((f, p)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 1000 => {
                attempt += 1
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_siblings_stay_in_their_partition_and_hidden() {
        for parts in 1..6 {
            for p in ["/a", "/jobs/x.parquet", "/t"] {
                let t = hidden_sibling(p, parts);
                assert_eq!(
                    nodekernel_proto::path::partition_of(&t, parts),
                    nodekernel_proto::path::partition_of(p, parts),
                    "{t}"
                );
                let (tp, tn) = nodekernel_proto::path::split_parent(&t).unwrap();
                assert_eq!(tp, nodekernel_proto::path::split_parent(p).unwrap().0);
                assert!(tn.starts_with('.') && tn.contains(".nk-copying-"), "{t}");
            }
        }
        let long = format!("/{}", "n".repeat(250));
        assert!(hidden_sibling(&long, 1).len() < 255 + 1);
    }

    #[test]
    fn data_in_a_table_is_a_keyvalue() {
        assert_eq!(data_type_in(NodeType::Table), NodeType::KeyValue);
        assert_eq!(data_type_in(NodeType::Directory), NodeType::File);
        assert_eq!(data_type_in(NodeType::Bag), NodeType::File);
    }
}

#[cfg(test)]
mod progress_tests {
    use nodekernel_proto::sync;
    use std::sync::{Arc, Mutex};

    /// A terminal that keeps what is drawn on it.
    #[derive(Debug, Default, Clone)]
    struct Screen(Arc<Mutex<String>>);

    impl indicatif::TermLike for Screen {
        fn width(&self) -> u16 {
            120
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> std::io::Result<()> {
            self.write_str(&format!("{s}\n"))
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            sync::lock(&self.0).push_str(s);
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What the progress of a copy of `total` bytes shows 3 MiB in.
    fn drawn(total: Option<u64>) -> String {
        let screen = Screen::default();
        let pb = super::progress(total, "put", 1);
        pb.set_draw_target(indicatif::ProgressDrawTarget::term_like(Box::new(
            screen.clone(),
        )));
        pb.set_position(3 << 20);
        pb.abandon();
        let shown = sync::lock(&screen.0).clone();
        shown
    }

    #[test]
    fn the_progress_of_stdin_does_not_pretend_to_know_its_size() {
        let known = drawn(Some(10 << 20));
        assert!(
            known.contains("3.00 MiB/10.00 MiB") && known.contains("eta"),
            "{known}"
        );
        let unknown = drawn(None);
        assert!(
            unknown.contains("put") && unknown.contains("3.00 MiB"),
            "{unknown}"
        );
        assert!(
            !unknown.contains("MiB/3") && !unknown.contains("eta") && !unknown.contains('['),
            "no total, time left or bar for a size not known: {unknown}"
        );
    }
}
