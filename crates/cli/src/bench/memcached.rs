//! The memcached side of `nk bench --vs memcached`: a `memcached` started
//! for the run and measured by the driver in this file (Debian packages no
//! memcached load generator that reports latency percentiles).
//!
//! The driver runs the way the NodeKernel side does (`bench::run_clients`):
//! one tokio task per client on the same runtime, each with its own TCP
//! connection, its warm-up, then measured operations (one in flight) timed
//! one by one into an HDR histogram; the clients start measuring together,
//! and throughput is all measured operations over the measured phase (first
//! client's start to last client's end, `bench::Phase`). It speaks the text protocol: `set <key> 0 0 <n>` + data, answered
//! by `STORED`; `get <key>`, answered by `VALUE <key> 0 <n>` + data + `END`.
//! Every reply is bounded before it is read: a reply line over
//! [`LINE_MAX`] bytes, a value of another size than the one stored, or
//! bytes after the reply are errors, and nothing is allocated from a
//! length the server sent.

use super::redis::PeerReport;
use super::{new_histogram, BenchArgs, Latency, Mode, Phase, Report};
use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest reply line accepted: `VALUE <key> <flags> <bytes>` (keys here
/// are short; memcached allows 250 bytes) or an error line.
const LINE_MAX: usize = 512;
/// The end of a `get` reply after the value's bytes.
const VALUE_END: &[u8] = b"\r\nEND\r\n";
/// How long memcached may take to accept connections once started.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one request may take before the run fails (a hang is an error).
const OP_TIMEOUT: Duration = Duration::from_secs(30);
/// Worker threads of the memcached started for the run, at most (its
/// default); fewer on a machine with fewer cores.
const THREADS_MAX: usize = 4;
/// Bytes of memcached memory allowed per stored value beyond its data
/// (item header, key, slab rounding), and the fixed part on top.
const ITEM_OVERHEAD: u64 = 1024;
const MEMORY_BASE_MIB: u64 = 64;

/// The two requests the driver sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmd {
    Get,
    Set,
}

impl Cmd {
    fn name(self) -> &'static str {
        match self {
            Cmd::Get => "GET",
            Cmd::Set => "SET",
        }
    }
}

/// What the bytes received so far for one request hold.
#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    /// A whole, well-formed reply of this many bytes.
    Done(usize),
    /// The start of one: read more.
    Partial,
}

/// Parses the reply to `cmd` on `key` at the start of `buf`; a `get` must
/// return a value of exactly `size` bytes.
fn parse_reply(cmd: Cmd, key: &[u8], size: usize, buf: &[u8]) -> anyhow::Result<Parsed> {
    let scan = &buf[..buf.len().min(LINE_MAX)];
    let Some(eol) = scan.windows(2).position(|w| w == b"\r\n") else {
        if buf.len() >= LINE_MAX {
            bail!("memcached sent a reply line longer than {LINE_MAX} bytes");
        }
        return Ok(Parsed::Partial);
    };
    let line = &buf[..eol];
    let data = eol + 2;
    match cmd {
        Cmd::Set if line == b"STORED" => Ok(Parsed::Done(data)),
        Cmd::Get if line.starts_with(b"VALUE ") => {
            let len = value_len(line, key)?;
            if len != size {
                bail!("memcached returned a value of {len} bytes, expected {size}");
            }
            let end = data + len + VALUE_END.len();
            if buf.len() < end {
                return Ok(Parsed::Partial);
            }
            if &buf[data + len..end] != VALUE_END {
                bail!("memcached's value is not followed by END");
            }
            Ok(Parsed::Done(end))
        }
        Cmd::Get if line == b"END" => bail!(
            "memcached has no value for {} (evicted? -m too small)",
            String::from_utf8_lossy(key)
        ),
        _ => bail!(
            "memcached answered {} with {:?}",
            cmd.name(),
            String::from_utf8_lossy(line)
        ),
    }
}

/// The byte count of a `VALUE <key> <flags> <bytes>` line for `key`.
fn value_len(line: &[u8], key: &[u8]) -> anyhow::Result<usize> {
    let text = std::str::from_utf8(line).context("memcached sent a VALUE line that is not text")?;
    let mut fields = text.split(' ');
    let (_, got, flags, bytes, rest) = (
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
    );
    let (Some(got), Some(flags), Some(bytes), None) = (got, flags, bytes, rest) else {
        bail!("memcached sent a malformed VALUE line {text:?}");
    };
    if got.as_bytes() != key {
        bail!(
            "memcached returned key {got:?} for {:?}",
            String::from_utf8_lossy(key)
        );
    }
    flags
        .parse::<u32>()
        .with_context(|| format!("bad flags in VALUE line {text:?}"))?;
    bytes
        .parse::<usize>()
        .with_context(|| format!("bad length in VALUE line {text:?}"))
}

/// One client's connection, with its request buffer and a reply buffer
/// that holds exactly the longest reply the driver accepts.
struct Conn {
    stream: TcpStream,
    req: Vec<u8>,
    reply: Vec<u8>,
}

impl Conn {
    async fn open(port: u16, size: usize) -> anyhow::Result<Conn> {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .context("connecting to memcached")?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            req: Vec::with_capacity(LINE_MAX + size + 2),
            reply: vec![0; LINE_MAX + size + VALUE_END.len()],
        })
    }

    /// Sends one request and reads its whole reply.
    async fn call(&mut self, cmd: Cmd, key: &[u8], value: &[u8]) -> anyhow::Result<()> {
        self.req.clear();
        match cmd {
            Cmd::Get => {
                self.req.extend_from_slice(b"get ");
                self.req.extend_from_slice(key);
            }
            Cmd::Set => {
                self.req.extend_from_slice(b"set ");
                self.req.extend_from_slice(key);
                self.req
                    .extend_from_slice(format!(" 0 0 {}\r\n", value.len()).as_bytes());
                self.req.extend_from_slice(value);
            }
        }
        self.req.extend_from_slice(b"\r\n");
        self.stream.write_all(&self.req).await?;
        let mut filled = 0;
        loop {
            match parse_reply(cmd, key, value.len(), &self.reply[..filled])? {
                Parsed::Done(n) if n == filled => return Ok(()),
                Parsed::Done(n) => bail!("memcached sent {} bytes after a reply", filled - n),
                Parsed::Partial => {}
            }
            if filled == self.reply.len() {
                bail!("memcached's reply is longer than {} bytes", filled);
            }
            let n = self.stream.read(&mut self.reply[filled..]).await?;
            if n == 0 {
                bail!("memcached closed the connection");
            }
            filled += n;
        }
    }

    /// [`Conn::call`], failing after [`OP_TIMEOUT`].
    async fn call_bounded(&mut self, cmd: Cmd, key: &[u8], value: &[u8]) -> anyhow::Result<()> {
        tokio::time::timeout(OP_TIMEOUT, self.call(cmd, key, value))
            .await
            .with_context(|| format!("memcached {} took over {OP_TIMEOUT:?}", cmd.name()))?
    }
}

/// What every driver client does.
struct Plan {
    cmd: Cmd,
    warmup: u64,
    total: u64,
    /// Keys each client cycles through.
    keys: u64,
    value: Vec<u8>,
}

fn key(client: u64, i: u64) -> Vec<u8> {
    format!("nk:{client}:{i}").into_bytes()
}

/// The request that stands for `mode`, if memcached can be compared with
/// it and is installed (checked before the NodeKernel side runs).
pub fn check(mode: Mode) -> anyhow::Result<Cmd> {
    let cmd = match mode {
        Mode::Putkey => Cmd::Set,
        Mode::Getkey | Mode::Lookup => Cmd::Get,
        other => bail!("--vs memcached compares putkey, getkey and lookup, not {other:?}"),
    };
    if !installed() {
        bail!("--vs memcached needs `memcached` on PATH: install it with `apt-get install -y memcached`");
    }
    Ok(cmd)
}

/// Runs the memcached counterpart of `a`'s workload and compares it with
/// `ours`.
pub async fn compare(a: &BenchArgs, ours: &Report) -> anyhow::Result<PeerReport> {
    let cmd = check(a.mode)?;
    let size = usize::try_from(a.size.0).context("size too large")?;
    let total = a.warmup + a.count;
    let keys = match cmd {
        Cmd::Set if a.new_keys => total,
        Cmd::Set => a.keys.max(1),
        Cmd::Get => a.keys.max(1).min(total),
    };
    let plan = Arc::new(Plan {
        cmd,
        warmup: a.warmup,
        total,
        keys,
        value: vec![0x5Au8; size],
    });
    let server = Memcached::start(size as u64, a.clients * keys, a.clients).await?;
    let result = drive(server.port, a.clients, plan).await;
    server.stop().await;
    let (hist, secs) = result?;
    let lat = Latency::of(&hist);
    let ops_per_sec = hist.len() as f64 / secs;
    Ok(PeerReport {
        name: "memcached".into(),
        op: cmd.name().into(),
        ops_per_sec,
        p50_us: lat.p50,
        p99_us: lat.p99,
        max_us: lat.max,
        p50_ratio: ours.latency_us.p50 / lat.p50,
        throughput_ratio: ours.ops_per_sec / ops_per_sec,
    })
}

/// The driver: stores the values a `get` run reads, then runs the clients
/// and returns their merged histogram and the measured phase's seconds.
async fn drive(port: u16, clients: u64, plan: Arc<Plan>) -> anyhow::Result<(Histogram<u64>, f64)> {
    if plan.cmd == Cmd::Get {
        let mut setup = Conn::open(port, plan.value.len()).await?;
        for c in 0..clients {
            for i in 0..plan.keys {
                setup
                    .call_bounded(Cmd::Set, &key(c, i), &plan.value)
                    .await?;
            }
        }
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(clients as usize));
    // Dropping the set (on the first error) stops the other clients, which
    // would otherwise wait at the barrier for ever.
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let conn = Conn::open(port, plan.value.len()).await?;
        tasks.spawn(one_client(conn, c, plan.clone(), barrier.clone()));
    }
    let mut hist = new_histogram();
    let mut phase = Phase::default();
    while let Some(done) = tasks.join_next().await {
        let (h, measured) = done.context("memcached client task")??;
        hist.add(&h).context("merging histograms")?;
        phase.add(measured);
    }
    Ok((hist, phase.seconds()))
}

async fn one_client(
    mut conn: Conn,
    c: u64,
    plan: Arc<Plan>,
    barrier: Arc<tokio::sync::Barrier>,
) -> anyhow::Result<(Histogram<u64>, std::ops::Range<Instant>)> {
    let keys: Vec<Vec<u8>> = (0..plan.keys).map(|i| key(c, i)).collect();
    let mut hist = new_histogram();
    let mut started = Instant::now();
    for i in 0..plan.total {
        if i == plan.warmup {
            barrier.wait().await;
            started = Instant::now();
        }
        let k = &keys[(i % plan.keys) as usize];
        let t = Instant::now();
        conn.call_bounded(plan.cmd, k, &plan.value).await?;
        if i >= plan.warmup {
            let _ = hist.record(t.elapsed().as_nanos().max(1) as u64);
        }
    }
    Ok((hist, started..Instant::now()))
}

/// Whether `memcached` is on PATH.
fn installed() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("memcached").is_file()))
}

/// A `memcached` process started for the run, on a free loopback port.
struct Memcached {
    child: tokio::process::Child,
    port: u16,
}

impl Memcached {
    /// Starts memcached with room for `items` values of `size` bytes and
    /// `clients` connections, and waits until it accepts connections.
    async fn start(size: u64, items: u64, clients: u64) -> anyhow::Result<Memcached> {
        const MIB: u64 = 1 << 20;
        // The largest item: the value plus its header and key, in MiB.
        let item_mib = (size + ITEM_OVERHEAD).div_ceil(MIB).max(1);
        // memcached wants at least two of the largest items' pages.
        let memory_mib = (items * (size + ITEM_OVERHEAD) * 2)
            .div_ceil(MIB)
            .max(4 * item_mib)
            + MEMORY_BASE_MIB;
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(THREADS_MAX);
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut cmd = tokio::process::Command::new("memcached");
        cmd.args(["-l", "127.0.0.1", "-U", "0"])
            .args(["-p", &port.to_string()])
            .args(["-t", &threads.to_string()])
            .args(["-m", &memory_mib.to_string()])
            .args(["-I", &format!("{item_mib}m")])
            .args(["-c", &(clients + 64).max(1024).to_string()]);
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            // memcached refuses to run as root unless told which user to be.
            cmd.args(["-u", "root"]);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting memcached")?;
        let mut server = Memcached { child, port };
        let deadline = Instant::now() + START_TIMEOUT;
        while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            if let Some(status) = server.child.try_wait()? {
                let mut err = String::new();
                if let Some(mut e) = server.child.stderr.take() {
                    let _ = (&mut e).take(4096).read_to_string(&mut err).await;
                }
                bail!("memcached exited ({status}): {}", err.trim());
            }
            if Instant::now() > deadline {
                bail!("memcached did not start listening on port {port} within {START_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(server)
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_reply, Cmd, Parsed, LINE_MAX};

    #[test]
    fn parses_well_formed_replies() {
        let get = b"VALUE nk:0:7 0 4\r\nZZZZ\r\nEND\r\n";
        assert_eq!(
            parse_reply(Cmd::Get, b"nk:0:7", 4, get).unwrap(),
            Parsed::Done(get.len())
        );
        // Every prefix is a partial reply.
        for n in 0..get.len() {
            assert_eq!(
                parse_reply(Cmd::Get, b"nk:0:7", 4, &get[..n]).unwrap(),
                Parsed::Partial,
                "{n}"
            );
        }
        // A value may contain the line end.
        let crlf = b"VALUE k 0 2\r\n\r\n\r\nEND\r\n";
        assert_eq!(
            parse_reply(Cmd::Get, b"k", 2, crlf).unwrap(),
            Parsed::Done(crlf.len())
        );
        assert_eq!(
            parse_reply(Cmd::Set, b"k", 4, b"STORED\r\n").unwrap(),
            Parsed::Done(8)
        );
        assert_eq!(
            parse_reply(Cmd::Set, b"k", 4, b"STOR").unwrap(),
            Parsed::Partial
        );
    }

    #[test]
    fn rejects_malformed_replies() {
        let err =
            |cmd, size, buf: &[u8]| parse_reply(cmd, b"k", size, buf).unwrap_err().to_string();
        assert!(err(Cmd::Get, 4, b"END\r\n").contains("no value"));
        assert!(err(Cmd::Get, 4, b"VALUE k 0 5\r\n").contains("5 bytes, expected 4"));
        // A length the driver did not ask for is refused before any data.
        assert!(err(Cmd::Get, 4, b"VALUE k 0 99999999999\r\n").contains("expected 4"));
        assert!(err(Cmd::Get, 4, b"VALUE k 0 x\r\n").contains("bad length"));
        assert!(err(Cmd::Get, 4, b"VALUE k x 4\r\n").contains("bad flags"));
        assert!(err(Cmd::Get, 4, b"VALUE k 0\r\n").contains("malformed"));
        assert!(err(Cmd::Get, 4, b"VALUE other 0 4\r\n").contains("returned key"));
        assert!(
            err(Cmd::Get, 4, b"VALUE k 0 4\r\nZZZZ\r\nENDX\r\n").contains("not followed by END")
        );
        assert!(err(Cmd::Set, 4, b"SERVER_ERROR out of memory\r\n").contains("out of memory"));
        assert!(err(Cmd::Set, 4, b"ERROR\r\n").contains("ERROR"));
        // No line end within LINE_MAX bytes: an error, not more reading.
        let long = vec![b'V'; LINE_MAX];
        assert!(err(Cmd::Get, 4, &long).contains("longer than"));
        assert_eq!(
            parse_reply(Cmd::Get, b"k", 4, &long[..LINE_MAX - 1]).unwrap(),
            Parsed::Partial
        );
    }

    /// The whole driver against a real memcached, where one is installed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn drives_memcached() {
        if !super::installed() {
            eprintln!("memcached not installed: skipping");
            return;
        }
        for cmd in [Cmd::Set, Cmd::Get] {
            let plan = std::sync::Arc::new(super::Plan {
                cmd,
                warmup: 5,
                total: 55,
                keys: 3,
                value: vec![7; 1000],
            });
            let server = super::Memcached::start(1000, 3 * 4, 4).await.unwrap();
            let result = super::drive(server.port, 4, plan).await;
            server.stop().await;
            let (hist, secs) = result.unwrap();
            assert_eq!(hist.len(), 4 * 50, "{cmd:?}");
            assert!(secs > 0.0);
        }
    }
}
