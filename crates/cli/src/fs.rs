//! File-system, key/value and status commands.

use anyhow::{bail, Context};
use futures::stream::{self, StreamExt};
use indicatif::{ProgressBar, ProgressStyle};
use nodekernel_client::{
    BufferedReader, BufferedWriter, Client, CreateOptions, NodeType, StreamOptions,
};
use nodekernel_cluster::human;
use serde::Serialize;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;

/// Buffered streams of put/get: 4 slices of 4 MiB in flight. With the
/// default 1 MiB blocks, each slice moves its 4 blocks in parallel, so some
/// 16 blocks stay in flight while the local file is read or written.
const STREAM: StreamOptions = StreamOptions {
    buffer_size: 16 << 20,
    slice_size: 4 << 20,
};

/// Accepts `/a/b/` for `/a/b` (the core refuses empty components).
pub fn norm(path: &str) -> String {
    if path.len() > 1 && path.ends_with('/') {
        path.trim_end_matches('/').to_string()
    } else {
        path.to_string()
    }
}

/// A progress bar on stderr (drawn only on a terminal) for a copy of
/// `total` bytes; with no total (stdin), the bytes so far and the rate
/// only: no bar, total or time left it cannot know.
fn progress(total: Option<u64>, what: &str) -> ProgressBar {
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
    pb.set_message(what.to_string());
    pb
}

fn rate(bytes: u64, secs: f64) -> String {
    if secs <= 0.0 {
        return "-".into();
    }
    format!("{}/s", human((bytes as f64 / secs) as u64))
}

#[derive(Serialize)]
struct Entry {
    name: String,
    path: String,
    #[serde(rename = "type")]
    ty: String,
    size: u64,
}

pub async fn ls(client: &Client, path: &str, json: bool) -> anyhow::Result<()> {
    let path = norm(path);
    let node = client.lookup(&path).await?;
    let entries: Vec<Entry> = if node.info().ty.is_container() {
        let mut names = client.enumerate(&path).await?;
        names.sort();
        let lookups = names.into_iter().map(|name| {
            let child = nodekernel_proto::path::join(&path, &name);
            async move {
                // A child removed between enumerate and lookup is skipped.
                client.lookup(&child).await.ok().map(|n| Entry {
                    name,
                    path: child,
                    ty: n.info().ty.name().to_string(),
                    size: n.info().size,
                })
            }
        });
        stream::iter(lookups)
            .buffered(32)
            .filter_map(|e| async { e })
            .collect()
            .await
    } else {
        let name = path.rsplit('/').next().unwrap_or_default().to_string();
        vec![Entry {
            name,
            path: path.clone(),
            ty: node.info().ty.name().to_string(),
            size: node.info().size,
        }]
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&entries)?);
    } else {
        for e in &entries {
            let size = if matches!(e.ty.as_str(), "File" | "KeyValue") {
                human(e.size)
            } else {
                format!("{} items", e.size)
            };
            println!("{:<9} {:>12}  {}", e.ty, size, printable(&e.name));
        }
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
        bail!("{table} is a {}, not a Table", node.info().ty);
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

pub async fn kv_rm(client: &Client, key: &str) -> anyhow::Result<()> {
    let key = norm(key);
    let node = client.lookup(&key).await?;
    if node.info().ty != NodeType::KeyValue {
        bail!("{key} is a {}, not a KeyValue", node.info().ty);
    }
    Ok(client.delete(&key, false).await?)
}

/// Prints a data node, or a Bag's Files as one stream.
pub async fn cat(client: &Client, path: &str, reads_in_flight: usize) -> anyhow::Result<()> {
    let path = norm(path);
    if client.lookup(&path).await?.info().ty != NodeType::Bag {
        return get(client, &path, Path::new("-")).await;
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
    Ok(())
}

pub async fn mkdir(
    client: &Client,
    path: &str,
    parents: bool,
    ty: &str,
    non_enumerable: bool,
    class: Option<u8>,
) -> anyhow::Result<()> {
    let path = norm(path);
    let ty = NodeType::parse(ty)
        .filter(|t| t.is_container())
        .with_context(|| format!("--type {ty}: expected dir, table or bag"))?;
    if non_enumerable && ty != NodeType::Table {
        bail!("--non-enumerable only applies to tables");
    }
    // Check the whole path before creating any parent.
    nodekernel_proto::path::components(&path)?;
    if parents {
        if let Some((parent, _)) = path.rsplit_once('/').filter(|(p, _)| !p.is_empty()) {
            client.mkdir(parent, true).await?;
        }
    }
    let opts = CreateOptions {
        storage_class: class,
        local: false,
        enumerable: !non_enumerable,
        ..CreateOptions::default()
    };
    match client.create(&path, ty, opts).await {
        Err(e) if parents && e.code == nodekernel_client::ErrorCode::AlreadyExists => Ok(()),
        r => r.map(drop).map_err(Into::into),
    }
}

pub async fn put(
    client: &Client,
    local: &Path,
    path: &str,
    opts: CreateOptions,
) -> anyhow::Result<()> {
    let path = norm(path);
    let start = Instant::now();
    let (mut input, total): (Box<dyn Read>, Option<u64>) = if local == Path::new("-") {
        (Box::new(std::io::stdin().lock()), None)
    } else {
        let f = std::fs::File::open(local)
            .with_context(|| format!("cannot open {}", local.display()))?;
        let len = f.metadata().map(|m| m.len()).ok();
        (Box::new(f), len)
    };
    let node = client.create(&path, NodeType::File, opts).await?;
    let pb = progress(total, "put");
    let copied = async {
        let mut out = BufferedWriter::new(node, STREAM)?;
        let mut buf = vec![0u8; STREAM.slice_size];
        let n = copy_in(&mut out, &mut input, &mut buf, 0, local, &pb).await?;
        out.close().await?;
        anyhow::Ok(n)
    }
    .await;
    pb.finish_and_clear();
    let written = match copied {
        Ok(n) => n,
        Err(e) => {
            // A put that fails leaves nothing behind: the file this put
            // created goes, and its blocks are freed at once.
            if let Err(d) = client.delete(&path, false).await {
                eprintln!("nk: could not remove the partial {path}: {d}");
            }
            return Err(e);
        }
    };
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "put {} -> {path}: {} in {secs:.3} s ({})",
        local.display(),
        human(written),
        rate(written, secs)
    );
    Ok(())
}

/// Streams into `out` the `filled` bytes already in `buf`, then the rest of
/// `input` (read into `buf`, a slice at a time); returns the bytes taken.
async fn copy_in(
    out: &mut BufferedWriter,
    input: &mut dyn Read,
    buf: &mut [u8],
    filled: usize,
    local: &Path,
    pb: &ProgressBar,
) -> anyhow::Result<u64> {
    // The slices already taken are written in the background while the
    // next piece is read.
    let mut n = filled;
    let mut written = 0u64;
    loop {
        out.write_all(&buf[..n]).await?;
        written += n as u64;
        pb.set_position(written);
        n = read_full(input, buf).with_context(|| format!("reading {}", local.display()))?;
        if n == 0 {
            return Ok(written);
        }
    }
}

/// Reads until `buf` is full or the input ends.
fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
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

/// Copies a node to a local file (or stdout with `-`). The result is one
/// whole version of the node or nothing: a file is written under a
/// temporary name beside it and renamed on success; stdout gets the bytes
/// only once all of them were read (spooled to an unlinked temporary
/// file). A value replaced during the copy is read again, like
/// [`Client::get`].
pub async fn get(client: &Client, path: &str, local: &Path) -> anyhow::Result<()> {
    let path = norm(path);
    let start = Instant::now();
    let to_stdout = local == Path::new("-");
    // A device, FIFO or socket is written through, never replaced by a
    // renamed file (`nk get KEY /dev/null` as root must leave /dev/null).
    let special = std::fs::metadata(local).is_ok_and(|m| !m.is_file() && !m.is_dir());
    let (mut spool, tmp) = if to_stdout || special {
        (Spool::anonymous()?, None)
    } else {
        let (f, tmp) = Spool::beside(local)?;
        (f, Some(tmp))
    };
    let fetched = fetch(client, &path, &mut spool, !to_stdout).await;
    let size = match fetched {
        Ok(size) => size,
        Err(e) => {
            if let Some(tmp) = &tmp {
                let _ = std::fs::remove_file(tmp);
            }
            return Err(e);
        }
    };
    if let Some(tmp) = tmp {
        let done = spool
            .file
            .sync_all()
            .and_then(|()| std::fs::rename(&tmp, local));
        if let Err(e) = done {
            let _ = std::fs::remove_file(&tmp);
            return Err(e).with_context(|| format!("cannot write {}", local.display()));
        }
        let secs = start.elapsed().as_secs_f64();
        eprintln!(
            "get {path} -> {}: {} in {secs:.3} s ({})",
            local.display(),
            human(size),
            rate(size, secs)
        );
    } else {
        use std::io::Seek;
        spool.file.rewind()?;
        let mut out: Box<dyn Write> = if special {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(local)
                .with_context(|| format!("cannot write {}", local.display()))?;
            Box::new(f)
        } else {
            Box::new(std::io::stdout().lock())
        };
        std::io::copy(&mut spool.file, &mut out)
            .and_then(|_| out.flush())
            .with_context(|| format!("cannot write {}", local.display()))?;
    }
    Ok(())
}

/// A local file a get writes into before the result is made visible.
struct Spool {
    file: std::fs::File,
}

impl Spool {
    /// An unlinked file in the temporary directory, readable only by us.
    fn anonymous() -> anyhow::Result<Spool> {
        let dir = std::env::temp_dir();
        let (file, p) = create_unique(&dir, "nk-get")?;
        let _ = std::fs::remove_file(&p);
        Ok(Spool { file })
    }

    /// A new file beside `local` (same file system, so the rename is
    /// atomic), and its path.
    fn beside(local: &Path) -> anyhow::Result<(Spool, std::path::PathBuf)> {
        let dir = match local.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        };
        let name = local
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "get".into());
        let (file, p) = create_unique(&dir, &format!(".{name}.nk-part"))
            .with_context(|| format!("cannot create {}", local.display()))?;
        Ok((Spool { file }, p))
    }

    fn reset(&mut self) -> std::io::Result<()> {
        use std::io::Seek;
        self.file.set_len(0)?;
        self.file.rewind().map(drop)
    }
}

fn create_unique(dir: &Path, prefix: &str) -> std::io::Result<(std::fs::File, std::path::PathBuf)> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut attempt = 0u32;
    loop {
        let p = dir.join(format!("{prefix}-{}-{attempt}", std::process::id()));
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
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

/// Reads the whole node at `path` into `spool`, looking it up again when
/// it is replaced meanwhile; returns its size.
async fn fetch(
    client: &Client,
    path: &str,
    spool: &mut Spool,
    show_progress: bool,
) -> anyhow::Result<u64> {
    let mut attempt = 1;
    loop {
        let node = client.lookup(path).await?;
        if node.info().ty.is_container() {
            bail!(
                "{path} is a {}; only File and KeyValue nodes hold data",
                node.info().ty
            );
        }
        let size = node.info().size;
        let pb = if show_progress {
            progress(Some(size), "get")
        } else {
            ProgressBar::hidden()
        };
        let copied = copy_out(node, spool, &pb).await;
        pb.finish_and_clear();
        match copied {
            Ok(()) => return Ok(size),
            Err(CopyError::Node(e))
                if e.code == nodekernel_client::ErrorCode::Stale
                    && attempt < nodekernel_client::GET_ATTEMPTS =>
            {
                attempt += 1;
                spool.reset()?;
            }
            Err(CopyError::Node(e)) => return Err(e.into()),
            Err(CopyError::Local(e)) => return Err(e.into()),
        }
    }
}

enum CopyError {
    Node(nodekernel_client::Error),
    Local(std::io::Error),
}

async fn copy_out(
    node: nodekernel_client::Node,
    spool: &mut Spool,
    pb: &ProgressBar,
) -> Result<(), CopyError> {
    let mut input = BufferedReader::new(node, 0, STREAM).map_err(CopyError::Node)?;
    // The next slices are read in the background while this one is written
    // to the local file, straight from the stream's buffer.
    loop {
        let slice = input.fill_buf().await.map_err(CopyError::Node)?;
        if slice.is_empty() {
            return Ok(());
        }
        spool.file.write_all(slice).map_err(CopyError::Local)?;
        let n = slice.len();
        input.consume(n);
        pb.set_position(input.position());
    }
}

#[derive(Serialize)]
struct StatOut<'a> {
    path: &'a str,
    id: u64,
    #[serde(rename = "type")]
    ty: &'a str,
    size: u64,
    block_size: u32,
    blocks: u64,
    storage_class: Option<u8>,
    location: &'a str,
    enumerable: bool,
    /// Permission bits, in octal.
    mode: String,
    /// Modification time, nanoseconds since the Unix epoch.
    mtime_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    block_list: Option<Vec<BlockOut>>,
}

/// `ns` (since the Unix epoch) as a UTC date and time.
fn utc(ns: u64) -> String {
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

pub async fn stat(client: &Client, path: &str, json: bool, blocks: bool) -> anyhow::Result<()> {
    let path = norm(path);
    let node = client.lookup(&path).await?;
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
    let out = StatOut {
        path: &path,
        id: i.id,
        ty: i.ty.name(),
        size: i.size,
        block_size: i.block_size,
        blocks,
        storage_class: (i.storage_class != nodekernel_proto::NO_CLASS).then_some(i.storage_class),
        location: &i.location,
        enumerable: i.enumerable,
        mode: format!("{:04o}", i.mode),
        mtime_ns: i.mtime,
        block_list,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("path:          {}", out.path);
        println!("type:          {}", out.ty);
        if i.ty.is_container() {
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
        let class = out
            .storage_class
            .map_or("any (highest with free space)".to_string(), |c| {
                c.to_string()
            });
        println!("storage class: {class}");
        if !out.location.is_empty() {
            println!("location:      {}", out.location);
        }
        println!("mode:          {}", out.mode);
        println!("modified:      {}", utc(out.mtime_ns));
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
    Ok(())
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
    let what = Path::new("stdin");
    let mut buf = vec![0u8; STREAM.slice_size];
    let first = read_full(input, &mut buf).context("reading the value from stdin")?;
    if first < buf.len() {
        return Ok(client.put(key, &buf[..first]).await?);
    }
    let node = client
        .create(key, NodeType::KeyValue, CreateOptions::default())
        .await?;
    let mut out = BufferedWriter::new(node, STREAM)?;
    let pb = progress(None, "kv put");
    let copied = copy_in(&mut out, input, &mut buf, first, what, &pb).await;
    pb.finish_and_clear();
    match copied {
        Ok(_) => Ok(out.close().await?),
        Err(e) => {
            if let Err(a) = out.abort().await {
                // The metadata server drops the put once its lease lapses.
                tracing::debug!("{key}: could not abort the failed put: {a}");
            }
            Err(e)
        }
    }
}

use nodekernel_admin::status::StatusOut;
#[cfg(test)]
use nodekernel_admin::status::{PartitionOut, ServerOut};

/// The readiness line of `nk status`: more servers than expected (stores
/// started one by one) read as such, not as "2 of 1".
fn readiness_line(ready: bool, alive: usize, expected: u32) -> String {
    if ready {
        format!("ready: {alive} storage servers alive ({expected} expected)")
    } else {
        format!("NOT READY: {alive} of {expected} expected storage servers alive")
    }
}

/// Waits until the cluster is ready (the expected storage servers are
/// alive), polling status, for at most `timeout`.
pub async fn wait_ready(
    client: &Client,
    timeout: std::time::Duration,
) -> anyhow::Result<nodekernel_client::ClusterStatus> {
    let deadline = Instant::now() + timeout;
    let mut said = false;
    loop {
        let st = client.status().await?;
        if st.is_ready() && st.unreachable.is_empty() {
            return Ok(st);
        }
        let alive = st.servers.iter().filter(|s| s.alive).count();
        if Instant::now() >= deadline {
            if !st.unreachable.is_empty() {
                bail!(
                    "the cluster is not ready after {:?}: {}",
                    timeout,
                    unreachable_summary(&st.unreachable, client.config().metas.len())
                );
            }
            bail!(
                "the cluster is not ready after {:?}: {alive} of {} expected storage servers are alive",
                timeout,
                st.expected_servers
            );
        }
        if !said {
            eprintln!(
                "waiting for storage servers: {alive} of {} alive",
                st.expected_servers
            );
            said = true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// `1 of 2 metadata partitions unreachable: partition 1 at ADDR (error)`.
fn unreachable_summary(down: &[nodekernel_proto::types::PartitionDown], total: usize) -> String {
    format!(
        "{} of {total} metadata partitions unreachable: {}",
        down.len(),
        down.iter()
            .map(|d| format!("partition {} at {} ({})", d.partition, d.addr, d.error))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// `nk status`: prints the merged view of the metadata partitions that
/// answer, and a line for each that does not; fails (a nonzero exit
/// status, after the output) when any partition is unreachable.
pub async fn status(
    client: &Client,
    json: bool,
    wait: Option<std::time::Duration>,
) -> anyhow::Result<()> {
    let st = match wait {
        Some(t) => wait_ready(client, t).await?,
        None => client.status().await?,
    };
    let metas = &client.config().metas;
    let out = status_view(&st, metas);
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", status_text(&out));
    }
    if !st.unreachable.is_empty() {
        bail!("{}", unreachable_summary(&st.unreachable, metas.len()));
    }
    Ok(())
}

/// The JSON view of a status the client merged from the partitions
/// `metas` (what `nk status --json` prints; `nk top` shows it too).
pub fn status_view(st: &nodekernel_client::ClusterStatus, metas: &[String]) -> StatusOut {
    StatusOut::new(
        st,
        metas
            .iter()
            .enumerate()
            .map(|(i, addr)| (i as u32, addr.clone())),
    )
}

/// The human form of `nk status`.
fn status_text(out: &StatusOut) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    // Writing to a String cannot fail.
    macro_rules! say {
        ($($arg:tt)*) => {{ let _ = writeln!(t, $($arg)*); }};
    }
    say!(
        "block size {}, {} nodes, {} puts in progress, {} removed nodes being reclaimed",
        human(out.block_size as u64),
        out.nodes,
        out.puts_in_progress,
        out.reclaiming
    );
    if out.unreachable.is_empty() {
        say!(
            "{}",
            readiness_line(out.ready, out.alive_servers, out.expected_servers)
        );
    } else {
        say!(
            "NOT READY: {} of {} metadata partitions unreachable ({} storage servers alive in the others, {} expected)",
            out.unreachable.len(),
            out.partitions.len(),
            out.alive_servers,
            out.expected_servers
        );
    }
    // Every partition when there are several, and always one that did
    // not answer.
    if out.partitions.len() > 1 || !out.unreachable.is_empty() {
        say!(
            "metadata partitions: {} ({} unreachable)",
            out.partitions.len(),
            out.unreachable.len()
        );
        for p in &out.partitions {
            match &p.error {
                None => say!("  partition {} at {}: reachable", p.partition, p.addr),
                Some(e) => say!(
                    "  partition {} at {}: UNREACHABLE: {e}",
                    p.partition,
                    p.addr
                ),
            }
        }
    }
    if out.logs.is_empty() {
        say!("metadata: volatile (lost when the metadata server stops)");
    }
    for l in &out.logs {
        say!(
            "metadata partition {}: persistent, fsync {}; {} log records, {} since the checkpoint at record {}",
            l.partition,
            l.fsync,
            l.records,
            human(l.log_bytes),
            l.checkpoint
        );
    }
    say!(
        "{:<6} {:<10} {:>8} {:>12} {:>12} {:>12}",
        "class",
        "name",
        "servers",
        "capacity",
        "used",
        "free"
    );
    for c in &out.classes {
        say!(
            "{:<6} {:<10} {:>8} {:>12} {:>12} {:>12}",
            c.class,
            c.name,
            c.servers,
            human(c.capacity_bytes),
            human(c.used_bytes),
            human(c.free_bytes)
        );
    }
    say!();
    say!(
        "{:<4} {:<22} {:<6} {:<6} {:<12} {:>12} {:>12} {:<6}",
        "id",
        "address",
        "class",
        "medium",
        "location",
        "capacity",
        "used",
        "state"
    );
    for s in &out.servers {
        say!(
            "{:<4} {:<22} {:<6} {:<6} {:<12} {:>12} {:>12} {:<6}",
            s.id,
            s.addr,
            s.class,
            s.medium,
            s.location,
            human(s.capacity_bytes),
            human(s.used_bytes),
            match (s.alive, s.draining) {
                (true, false) => "alive",
                (true, true) => "alive, draining",
                (false, false) => "DEAD",
                (false, true) => "DEAD, draining",
            }
        );
    }
    t
}

#[cfg(test)]
mod status_tests {
    use super::*;

    fn server(id: u32, alive: bool, draining: bool) -> ServerOut {
        ServerOut {
            id,
            addr: format!("10.0.0.{id}:7001"),
            identity: format!("id{id}"),
            class: 0,
            class_name: "dram".into(),
            medium: "dram".into(),
            location: format!("host{id}"),
            alive,
            draining,
            last_seen_ms: 1,
            capacity_bytes: 4 << 20,
            used_bytes: 1 << 20,
            free_bytes: 3 << 20,
            blocks: 4,
            used_blocks: 1,
            ..ServerOut::default()
        }
    }

    fn out(down: bool) -> StatusOut {
        let partitions = vec![
            PartitionOut {
                partition: 0,
                addr: "10.0.0.1:7000".into(),
                reachable: true,
                error: None,
            },
            PartitionOut {
                partition: 1,
                addr: "10.0.0.2:7000".into(),
                reachable: !down,
                error: down.then(|| "Unavailable: connection refused".to_string()),
            },
        ];
        StatusOut {
            block_size: 1 << 20,
            nodes: 3,
            ready: !down,
            expected_servers: 1,
            alive_servers: 2,
            puts_in_progress: 0,
            reclaiming: 0,
            classes: Vec::new(),
            servers: vec![
                server(1, true, false),
                server(2, true, true),
                server(3, false, true),
            ],
            logs: Vec::new(),
            unreachable: partitions
                .iter()
                .filter(|p| !p.reachable)
                .cloned()
                .collect(),
            partitions,
        }
    }

    #[test]
    fn every_partition_is_shown_and_an_unreachable_one_is_named() {
        let t = status_text(&out(true));
        assert!(
            t.contains("NOT READY: 1 of 2 metadata partitions unreachable"),
            "{t}"
        );
        assert!(t.contains("partition 0 at 10.0.0.1:7000: reachable"), "{t}");
        assert!(
            t.contains(
                "partition 1 at 10.0.0.2:7000: UNREACHABLE: Unavailable: connection refused"
            ),
            "{t}"
        );
        let t = status_text(&out(false));
        assert!(t.contains("metadata partitions: 2 (0 unreachable)"), "{t}");
        assert!(t.contains("partition 1 at 10.0.0.2:7000: reachable"), "{t}");
        assert!(!t.contains("UNREACHABLE"), "{t}");
        let j = serde_json::to_value(out(true)).unwrap();
        assert_eq!(j["unreachable"][0]["partition"], 1);
        assert_eq!(j["unreachable"][0]["addr"], "10.0.0.2:7000");
        assert_eq!(j["partitions"][1]["reachable"], false);
        assert!(j["partitions"][0].get("error").is_none());
    }

    #[test]
    fn draining_servers_say_so() {
        let t = status_text(&out(false));
        let line = |id: &str| {
            t.lines()
                .find(|l| l.starts_with(id))
                .unwrap_or_else(|| panic!("no line for server {id}: {t}"))
                .to_string()
        };
        assert!(line("1 ").trim_end().ends_with("alive"), "{t}");
        assert!(line("2 ").contains("alive, draining"), "{t}");
        assert!(line("3 ").contains("DEAD, draining"), "{t}");
        let j = serde_json::to_value(out(false)).unwrap();
        assert_eq!(j["servers"][0]["draining"], false);
        assert_eq!(j["servers"][1]["draining"], true);
    }
}

#[cfg(test)]
mod readiness_tests {
    #[test]
    fn more_servers_than_expected_read_as_such() {
        assert_eq!(
            super::readiness_line(true, 2, 1),
            "ready: 2 storage servers alive (1 expected)"
        );
        assert_eq!(
            super::readiness_line(false, 0, 1),
            "NOT READY: 0 of 1 expected storage servers alive"
        );
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
        let pb = super::progress(total, "put");
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
