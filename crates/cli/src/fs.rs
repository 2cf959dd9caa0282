//! The namespace commands: `ls`, `mkdir`, `rm`, `mv`, `touch`, `stat`,
//! `cat`, and the key/value ones. Every path operand may be a wildcard
//! pattern (`crate::paths::expand`), and most commands take several.

use crate::common::{coded, error_line, invalid, Code};
use crate::copy::{progress, read_full, STREAM};
use crate::paths::{base_name, expand, expand_all, norm};
use crate::walk::children;
use anyhow::Context;
use nodekernel_client::{BufferedWriter, Client, CreateOptions, ErrorCode, NodeInfo, NodeType};
use nodekernel_cluster::human;
use serde::Serialize;
use std::io::{Read, Write};

/// How `nk ls` shows what it lists.
#[derive(Debug, Clone, Copy, Default)]
pub struct LsOpts {
    /// Type, permissions, size and time before each name.
    pub long: bool,
    /// Containers' contents, all the way down.
    pub recursive: bool,
    /// Sizes in KiB, MiB, ... instead of bytes.
    pub human: bool,
    /// Containers themselves, not their contents.
    pub directory: bool,
    pub json: bool,
}

/// A node type as JSON shows it: its name.
fn type_name<S: serde::Serializer>(ty: &NodeType, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(ty.name())
}

/// Permission bits as JSON shows them: four octal digits.
fn octal_mode<S: serde::Serializer>(mode: &u32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{mode:04o}"))
}

#[derive(Serialize)]
struct LsEntry {
    name: String,
    path: String,
    #[serde(rename = "type", serialize_with = "type_name")]
    ty: NodeType,
    /// Bytes (data nodes) or children (containers).
    size: u64,
    /// Permission bits, in octal.
    #[serde(serialize_with = "octal_mode")]
    mode: u32,
    /// Modification time, nanoseconds since the Unix epoch.
    mtime_ns: u64,
}

impl LsEntry {
    fn new(name: String, path: String, i: &NodeInfo) -> LsEntry {
        LsEntry {
            name,
            path,
            ty: i.ty,
            size: i.size,
            mode: i.mode,
            mtime_ns: i.mtime,
        }
    }

    fn line(&self, opts: LsOpts) -> String {
        if !opts.long {
            return printable(&self.name).into_owned();
        }
        let size = if self.ty.is_container() {
            format!("{} items", self.size)
        } else if opts.human {
            human(self.size)
        } else {
            self.size.to_string()
        };
        format!(
            "{:<9} {} {:>12}  {}  {}",
            self.ty.name(),
            symbolic_mode(self.mode),
            size,
            &utc(self.mtime_ns)[..16],
            printable(&self.name)
        )
    }
}

/// `rwxr-xr-x` for 0o755.
fn symbolic_mode(mode: u32) -> String {
    (0..9)
        .map(|i| {
            if mode & (0o400 >> i) == 0 {
                '-'
            } else {
                ['r', 'w', 'x'][i % 3]
            }
        })
        .collect()
}

/// `nk ls`: for each operand (wildcards expanded), a data node's own line,
/// or a container's children (with `-d`: the container's line); with
/// `-R`, every container below too, each under a `PATH:` heading. With
/// several operands, data nodes come first, then each container under its
/// heading, as `ls` does.
pub async fn ls(client: &Client, operands: &[String], opts: LsOpts) -> anyhow::Result<()> {
    let operands = if operands.is_empty() {
        vec!["/".to_string()]
    } else {
        operands.to_vec()
    };
    let paths = expand_all(client, &operands).await?;
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    for p in paths {
        let node = client.lookup(&p).await?;
        let i = node.info().clone();
        if i.ty.is_container() && !opts.directory {
            dirs.push(p);
        } else {
            // A data node is shown by the path it was named by, as `ls`
            // shows a file operand.
            files.push(LsEntry::new(p.clone(), p, &i));
        }
    }
    let mut json_out = Vec::new();
    let mut out = std::io::stdout().lock();
    for e in &files {
        if !opts.json {
            writeln!(out, "{}", e.line(opts))?;
        }
    }
    let headings = opts.recursive || dirs.len() + files.len() > 1;
    let mut first = files.is_empty();
    json_out.extend(files);
    for d in dirs {
        // Each container's children under its heading, then (with -R) each
        // child container's, depth first, as `ls -R` does.
        let mut pending = vec![d];
        while let Some(dir) = pending.pop() {
            let kids = children(client, &dir, "", 1, true).await?;
            if !opts.json && headings {
                let sep = if first { "" } else { "\n" };
                writeln!(out, "{sep}{}:", printable(&dir))?;
            }
            first = false;
            let mut below = Vec::new();
            for k in kids {
                let Some(info) = k.info.as_ref() else {
                    continue;
                };
                let entry = LsEntry::new(base_name(&k.path).to_string(), k.path.clone(), info);
                if opts.json {
                    json_out.push(entry);
                } else {
                    writeln!(out, "{}", entry.line(opts))?;
                }
                if opts.recursive && k.ty.is_container() {
                    below.push(k.path);
                }
            }
            pending.extend(below.into_iter().rev());
        }
    }
    if opts.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&json_out)?)?;
    }
    Ok(())
}

/// A name as it is safe to print on a terminal: control characters
/// (newlines, escape sequences) are shown escaped, like `\n` or `\u{1b}`.
pub fn printable(name: &str) -> std::borrow::Cow<'_, str> {
    if !name.chars().any(char::is_control) {
        return name.into();
    }
    name.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

/// Keys of a table (sorted).
pub async fn kv_ls(client: &Client, table: &str, json: bool) -> anyhow::Result<()> {
    let table = norm(table);
    let node = client.lookup(&table).await?;
    if node.info().ty != NodeType::Table {
        return Err(not_a(&table, node.info().ty, "Table"));
    }
    let mut keys = client.enumerate(&table).await?;
    keys.sort();
    if json {
        println!("{}", serde_json::to_string_pretty(&keys)?);
    } else if keys.is_empty() && !node.info().enumerable {
        eprintln!("{table} is non-enumerable: its keys are not listed");
    } else {
        for k in keys {
            println!("{}", printable(&k));
        }
    }
    Ok(())
}

/// `TypeMismatch: PATH is a TYPE, not a WANTED`.
pub fn not_a(path: &str, ty: NodeType, wanted: &str) -> anyhow::Error {
    coded(
        Code::Wire(ErrorCode::TypeMismatch),
        format!("{path} is a {ty}, not a {wanted}"),
    )
}

pub async fn kv_rm(client: &Client, key: &str) -> anyhow::Result<()> {
    let key = norm(key);
    let node = client.lookup(&key).await?;
    if node.info().ty != NodeType::KeyValue {
        return Err(not_a(&key, node.info().ty, "KeyValue"));
    }
    Ok(client.delete(&key, false).await?)
}

/// Prints data nodes, and Bags' Files as one stream, one after another.
pub async fn cat(
    client: &Client,
    operands: &[String],
    reads_in_flight: usize,
) -> anyhow::Result<()> {
    for path in expand_all(client, operands).await? {
        let ty = client.lookup(&path).await?.info().ty;
        if ty.is_container() && ty != NodeType::Bag {
            return Err(not_a(&path, ty, "File, KeyValue or Bag"));
        }
        if ty != NodeType::Bag {
            let dest = crate::paths::Loc::Local("-".into());
            let opts = crate::copy::CopyOpts {
                force: false,
                recursive: false,
                parallel: 1,
                create: CreateOptions::default(),
                json: false,
            };
            let src = [crate::paths::Loc::Cluster(path)];
            crate::copy::copy(client, "get", &src, "-", dest, &opts).await?;
            continue;
        }
        let mut bag = client.read_bag(&path, reads_in_flight).await?;
        let mut out = std::io::stdout().lock();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = bag.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n])?;
        }
        out.flush()?;
    }
    Ok(())
}

/// What `nk mkdir` makes.
#[derive(Debug, Clone)]
pub struct MkdirOpts {
    pub parents: bool,
    pub ty: String,
    pub non_enumerable: bool,
    pub class: Option<u8>,
    pub ttl: Option<nodekernel_client::Ttl>,
    pub child_ttl: Option<std::time::Duration>,
}

/// `nk mkdir`: each path in turn; stops at the first that fails.
pub async fn mkdir(client: &Client, paths: &[String], o: &MkdirOpts) -> anyhow::Result<()> {
    let ty = NodeType::parse(&o.ty)
        .filter(|t| t.is_container())
        .ok_or_else(|| invalid(format!("--type {}: expected dir, table or bag", o.ty)))?;
    if o.non_enumerable && ty != NodeType::Table {
        return Err(invalid("--non-enumerable only applies to tables"));
    }
    for path in paths {
        let path = norm(path);
        // Check the whole path before creating any parent.
        nodekernel_proto::path::components(&path)?;
        if o.parents {
            if let Some((parent, _)) = path.rsplit_once('/').filter(|(p, _)| !p.is_empty()) {
                client.mkdir(parent, true).await?;
            }
        }
        let opts = CreateOptions {
            storage_class: o.class,
            local: false,
            enumerable: !o.non_enumerable,
            ttl: o.ttl,
            child_ttl: o.child_ttl,
            ..CreateOptions::default()
        };
        match client.create(&path, ty, opts).await {
            Err(e) if o.parents && e.code == ErrorCode::AlreadyExists => {
                // `mkdir -p` of an existing container is fine; of a File not.
                let t = client.lookup(&path).await?.info().ty;
                if !t.is_container() {
                    return Err(not_a(&path, t, "container"));
                }
            }
            r => {
                r?;
            }
        }
    }
    Ok(())
}

/// `nk rm`: removes every path (wildcards expanded); with `force`, a
/// missing one (or a pattern that matches nothing) is no error. Goes on
/// past a failure; one failure is the command's error, several are
/// printed and counted.
pub async fn rm(
    client: &Client,
    operands: &[String],
    recursive: bool,
    force: bool,
) -> anyhow::Result<()> {
    let mut errors = Vec::new();
    for o in operands {
        let paths = match expand(client, o).await {
            Ok(p) => p,
            Err(e) if force && crate::common::code_of(&e) == Code::Wire(ErrorCode::NotFound) => {
                continue
            }
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        for p in paths {
            match client.delete(&p, recursive).await {
                Ok(()) => {}
                Err(e) if force && e.code == ErrorCode::NotFound => {}
                Err(e) if e.code == ErrorCode::NotEmpty && !recursive => errors.push(coded(
                    Code::Wire(ErrorCode::NotEmpty),
                    format!("{}: use -r to remove it with everything in it", e.message),
                )),
                Err(e) => errors.push(e.into()),
            }
        }
    }
    several_or_one("rm", errors)
}

/// Ok without errors; the error itself if there is one; else each printed
/// and a summary with the first one's code.
pub fn several_or_one(verb: &str, mut errors: Vec<anyhow::Error>) -> anyhow::Result<()> {
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        n => {
            for e in &errors {
                eprintln!("{}", error_line(e, false));
            }
            Err(coded(
                crate::common::code_of(&errors[0]),
                format!("{verb}: {n} failed"),
            ))
        }
    }
}

/// `nk mv SRC... DST`: each source moved atomically; into DST if it is a
/// container (several sources need one), else to DST, which must not
/// exist unless `force` (then an existing File or KeyValue, or an empty
/// container of the same type, is replaced in the same step).
pub async fn mv(
    client: &Client,
    sources: &[String],
    dest_arg: &str,
    force: bool,
) -> anyhow::Result<()> {
    let sources = expand_all(client, sources).await?;
    let dest = norm(dest_arg);
    let into = match crate::paths::cluster_type(client, &dest).await? {
        Some(t) if t.is_container() => true,
        Some(t) if sources.len() > 1 || dest_arg.ends_with('/') => {
            return Err(not_a(&dest, t, "container to move into"))
        }
        None if sources.len() > 1 || (dest_arg.ends_with('/') && dest_arg.len() > 1) => {
            return Err(coded(
                Code::Wire(ErrorCode::NotFound),
                format!("{dest}: no such container to move into"),
            ))
        }
        _ => false,
    };
    for src in sources {
        let target = if into {
            nodekernel_proto::path::join(&dest, base_name(&src))
        } else {
            dest.clone()
        };
        match client.rename_with(&src, &target, force).await {
            Err(e) if e.code == ErrorCode::AlreadyExists && !force => {
                return Err(coded(
                    Code::Wire(ErrorCode::AlreadyExists),
                    format!("cannot move {src} to {target}: it exists (use -f to replace it)"),
                ))
            }
            r => r?,
        }
    }
    Ok(())
}

/// `nk touch`: a missing path becomes an empty File (an empty KeyValue in
/// a Table); an existing node gets the current time as its modification
/// time. With `no_create`, missing paths are left alone.
pub async fn touch(client: &Client, operands: &[String], no_create: bool) -> anyhow::Result<()> {
    for o in operands {
        let paths = match expand(client, o).await {
            Ok(p) => p,
            Err(e) if crate::common::code_of(&e) == Code::Wire(ErrorCode::NotFound) => {
                if no_create || crate::paths::has_wildcard(o) {
                    continue;
                }
                vec![norm(o)]
            }
            Err(e) => return Err(e),
        };
        for p in paths {
            let now = nodekernel_client::now_ns();
            match client.set_attrs(&p, None, Some(now)).await {
                Ok(_) => continue,
                Err(e) if e.code == ErrorCode::NotFound && !no_create => {}
                Err(e) if e.code == ErrorCode::NotFound => continue,
                Err(e) => return Err(e.into()),
            }
            let (parent, _) = nodekernel_proto::path::split_parent(&p)?;
            let in_table =
                crate::paths::cluster_type(client, parent).await? == Some(NodeType::Table);
            if in_table {
                client.put(&p, b"").await?;
                continue;
            }
            match client
                .create(&p, NodeType::File, CreateOptions::default())
                .await
            {
                Ok(node) => node.close().await?,
                // Created by someone else meanwhile: touched either way.
                Err(e) if e.code == ErrorCode::AlreadyExists => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

#[derive(Serialize)]
struct StatOut {
    path: String,
    id: u64,
    #[serde(rename = "type", serialize_with = "type_name")]
    ty: NodeType,
    size: u64,
    block_size: u32,
    blocks: u64,
    /// Bytes of the cluster it takes (blocks, pieces, child records).
    stored: u64,
    storage_class: Option<u8>,
    location: String,
    enumerable: bool,
    /// Permission bits, in octal.
    #[serde(serialize_with = "octal_mode")]
    mode: u32,
    /// Modification time, nanoseconds since the Unix epoch.
    mtime_ns: u64,
    /// When it expires, milliseconds since the Unix epoch (the metadata
    /// server's clock); null: never.
    expires_ms: Option<u64>,
    /// A container's TTL for new children, in milliseconds; null: none.
    child_ttl_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    block_list: Option<Vec<BlockOut>>,
}

/// An expiry time (milliseconds since the Unix epoch) as `nk stat` and
/// `nk expire` print it: the time, and how far off it is by this
/// machine's clock.
fn expiry(ms: Option<u64>) -> String {
    let Some(ms) = ms else {
        return "never".to_string();
    };
    let now = now_ms();
    let when = utc(ms.saturating_mul(1_000_000));
    if ms > now {
        format!("{when} (in {})", crate::common::rough_duration(ms - now))
    } else {
        format!("{when} (due now)")
    }
}

fn now_ms() -> u64 {
    nodekernel_client::now_ns() / 1_000_000
}

/// Nodes' expiry as `nk expire --json` prints it.
#[derive(Serialize)]
struct ExpiryOut {
    path: String,
    /// Milliseconds since the Unix epoch; null: never.
    expires_ms: Option<u64>,
    /// Milliseconds; null: none.
    child_ttl_ms: Option<u64>,
}

/// `nk expire`: sets each node's expiry (or, with `child`, a container's
/// TTL for new children); stops at the first that fails.
pub async fn expire(
    client: &Client,
    paths: &[String],
    ttl: &str,
    child: bool,
    json: bool,
) -> anyhow::Result<()> {
    let paths = crate::paths::expand_all(client, paths).await?;
    let mut outs = Vec::new();
    for p in &paths {
        let info = if child {
            let ttl = match ttl.trim() {
                "never" | "none" => None,
                d => Some(crate::common::parse_duration(d)?),
            };
            client.set_child_ttl(p, ttl).await?
        } else {
            client.expire(p, crate::common::parse_ttl(ttl)?).await?
        };
        let out = ExpiryOut {
            path: p.clone(),
            expires_ms: (info.expires_ms != 0).then_some(info.expires_ms),
            child_ttl_ms: (info.child_ttl_ms != 0).then_some(info.child_ttl_ms),
        };
        if !json {
            match (child, out.child_ttl_ms) {
                (true, Some(ms)) => println!(
                    "{}: new children expire {} after their create",
                    printable(p),
                    crate::common::short_duration(ms)
                ),
                (true, None) => println!("{}: no child TTL", printable(p)),
                (false, _) => println!("{}: expires {}", printable(p), expiry(out.expires_ms)),
            }
        }
        outs.push(out);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&outs)?);
    }
    Ok(())
}

/// `ns` (since the Unix epoch) as a UTC date and time.
pub fn utc(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        ns / 1_000_000 % 1000
    )
}

#[derive(Serialize)]
struct BlockOut {
    index: usize,
    storage_class: u8,
    class_name: String,
    server: u32,
    addr: String,
    block: u32,
}

/// `nk stat`: each path's metadata (wildcards expanded); `--json` prints
/// an object for one path and an array for several.
pub async fn stat(
    client: &Client,
    operands: &[String],
    json: bool,
    blocks: bool,
) -> anyhow::Result<()> {
    let paths = expand_all(client, operands).await?;
    let several = paths.len() > 1 || operands.len() > 1;
    let mut outs = Vec::new();
    for p in &paths {
        outs.push(stat_one(client, p, blocks).await?);
    }
    if json {
        let text = if several {
            serde_json::to_string_pretty(&outs)?
        } else {
            serde_json::to_string_pretty(&outs[0])?
        };
        println!("{text}");
        return Ok(());
    }
    for (i, out) in outs.iter().enumerate() {
        if i > 0 {
            println!();
        }
        print_stat(out);
    }
    Ok(())
}

async fn stat_one(client: &Client, path: &str, blocks: bool) -> anyhow::Result<StatOut> {
    let node = client.lookup(path).await?;
    let block_list = if blocks {
        let names = client.status().await?.classes;
        let name = |c: u8| {
            names
                .iter()
                .find(|x| x.class == c)
                .map(|x| x.name.clone())
                .unwrap_or_default()
        };
        Some(
            node.block_locations()
                .await?
                .into_iter()
                .enumerate()
                .map(|(index, b)| BlockOut {
                    index,
                    storage_class: b.class,
                    class_name: name(b.class),
                    server: b.server,
                    addr: b.addr,
                    block: b.block,
                })
                .collect(),
        )
    } else {
        None
    };
    let i = node.info();
    let blocks = if i.ty.is_container() {
        0
    } else {
        i.size.div_ceil(i.block_size as u64)
    };
    Ok(StatOut {
        path: path.to_string(),
        id: i.id,
        ty: i.ty,
        size: i.size,
        block_size: i.block_size,
        blocks,
        stored: i.stored,
        storage_class: (i.storage_class != nodekernel_proto::NO_CLASS).then_some(i.storage_class),
        location: i.location.clone(),
        enumerable: i.enumerable,
        mode: i.mode,
        mtime_ns: i.mtime,
        expires_ms: (i.expires_ms != 0).then_some(i.expires_ms),
        child_ttl_ms: (i.child_ttl_ms != 0).then_some(i.child_ttl_ms),
        block_list,
    })
}

fn print_stat(out: &StatOut) {
    println!("path:          {}", printable(&out.path));
    println!("type:          {}", out.ty.name());
    if out.ty.is_container() {
        println!("children:      {}", out.size);
        println!("enumerable:    {}", out.enumerable);
    } else {
        println!("size:          {} ({} bytes)", human(out.size), out.size);
        println!(
            "blocks:        {} of {}",
            out.blocks,
            human(out.block_size as u64)
        );
    }
    println!(
        "stored:        {} ({} bytes)",
        human(out.stored),
        out.stored
    );
    let class = out
        .storage_class
        .map_or("any (highest with free space)".to_string(), |c| {
            c.to_string()
        });
    println!("storage class: {class}");
    if !out.location.is_empty() {
        println!("location:      {}", out.location);
    }
    println!("mode:          {:04o}", out.mode);
    println!("modified:      {}", utc(out.mtime_ns));
    println!("expires:       {}", expiry(out.expires_ms));
    if let Some(ms) = out.child_ttl_ms {
        println!("child TTL:     {}", crate::common::short_duration(ms));
    }
    println!("id:            {}", out.id);
    if let Some(list) = &out.block_list {
        println!(
            "{:>6}  {:<6} {:<10} {:<7} {:<22} {:>8}",
            "block", "class", "name", "server", "address", "index"
        );
        for b in list {
            println!(
                "{:>6}  {:<6} {:<10} {:<7} {:<22} {:>8}",
                b.index, b.storage_class, b.class_name, b.server, b.addr, b.block
            );
        }
    }
}

/// `nk kv put KEY [VALUE]`; without VALUE or with `-`, the value is
/// stdin, streamed (see [`kv_put_stream`]).
pub async fn kv_put(client: &Client, key: &str, value: Option<String>) -> anyhow::Result<()> {
    let key = norm(key);
    match value.as_deref() {
        Some("-") | None => kv_put_stream(client, &key, &mut std::io::stdin().lock()).await,
        Some(v) => Ok(client.put(&key, v.as_bytes()).await?),
    }
}

/// Puts all of `input` as the value of `key`, all or nothing, in bounded
/// memory. A value that ends within the first slice is put whole (its size
/// known, a small one shares a block with others); a longer one streams
/// into a new KeyValue that is published only by its close, so readers see
/// the old value until then. A put that fails is aborted; one interrupted
/// never closes, and the metadata server drops it when its lease lapses.
async fn kv_put_stream(client: &Client, key: &str, input: &mut dyn Read) -> anyhow::Result<()> {
    let mut buf = vec![0u8; STREAM.slice_size];
    let first = read_full(input, &mut buf).context("reading the value from stdin")?;
    if first < buf.len() {
        return Ok(client.put(key, &buf[..first]).await?);
    }
    let node = client
        .create(key, NodeType::KeyValue, CreateOptions::default())
        .await?;
    let mut out = BufferedWriter::new(node, STREAM)?;
    let pb = progress(None, "kv put", 1);
    let copied = async {
        let mut n = first;
        let mut written = 0u64;
        loop {
            out.write_all(&buf[..n]).await?;
            written += n as u64;
            pb.set_position(written);
            n = read_full(input, &mut buf).context("reading the value from stdin")?;
            if n == 0 {
                return anyhow::Ok(());
            }
        }
    }
    .await;
    pb.finish_and_clear();
    match copied {
        Ok(()) => Ok(out.close().await?),
        Err(e) => {
            if let Err(a) = out.abort().await {
                // The metadata server drops the put once its lease lapses.
                tracing::debug!("{key}: could not abort the failed put: {a}");
            }
            Err(e)
        }
    }
}

#[cfg(test)]
mod time_tests {
    #[test]
    fn utc_dates_match_known_instants() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00.000 UTC");
        // 2000-02-29 (a leap day of a century leap year) 12:34:56.789.
        assert_eq!(
            super::utc(951_827_696_789_000_000),
            "2000-02-29 12:34:56.789 UTC"
        );
        assert_eq!(
            super::utc(1_700_000_000_123_456_789),
            "2023-11-14 22:13:20.123 UTC"
        );
    }

    #[test]
    fn modes_read_like_ls() {
        assert_eq!(super::symbolic_mode(0o755), "rwxr-xr-x");
        assert_eq!(super::symbolic_mode(0o640), "rw-r-----");
        assert_eq!(super::symbolic_mode(0), "---------");
    }
}
