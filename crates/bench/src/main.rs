//! `nk-file-bench`: the file tier (io_uring + O_DIRECT) against plain
//! buffered pread/pwrite, printed as Markdown. See `docs/benchmarks.md`.

use clap::Parser;
use nodekernel_bench::file_tier::{self, Config, Engine};
use std::path::PathBuf;
use std::time::Duration;

/// Compares NodeKernel's file tier with plain buffered pread/pwrite:
/// sequential writes and reads in whole-block requests and random small
/// reads, each at several requests in flight.
#[derive(Parser, Debug)]
#[command(name = "nk-file-bench", version)]
struct Args {
    /// Directory for the benchmark files (they are removed afterwards).
    #[arg(long, default_value_os_t = std::env::temp_dir().join("nk-file-bench"))]
    dir: PathBuf,
    /// Bytes per sequential pass, e.g. 1GiB, 256MiB.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    size: u64,
    /// Request size of the sequential passes (the block size).
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    block_size: u64,
    /// Request size of the random reads.
    #[arg(long, default_value = "4KiB", value_parser = parse_size)]
    rand_size: u64,
    /// Requests in flight to try.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    depths: Vec<usize>,
    /// Seconds each random-read run lasts.
    #[arg(long, default_value_t = 2.0)]
    rand_secs: f64,
    /// Runs of everything; each number reported is the median run.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Engines to compare.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "uring-direct,baseline"
    )]
    engines: Vec<Engine>,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let mul: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        u => return Err(format!("unknown unit {u:?} (use KiB, MiB or GiB)")),
    };
    n.checked_mul(mul)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("nk-file-bench: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), String> {
    let block_size = u32::try_from(args.block_size)
        .ok()
        .filter(|b| b.is_power_of_two() && *b >= 4096)
        .ok_or("--block-size must be a power of two from 4KiB to 2GiB")?;
    let rand_size = u32::try_from(args.rand_size)
        .ok()
        .filter(|r| *r > 0 && block_size % r == 0)
        .ok_or("--rand-size must divide the block size")?;
    if !(args.rand_secs > 0.0 && args.rand_secs.is_finite()) {
        return Err("--rand-secs must be positive".into());
    }
    let cfg = Config {
        dir: args.dir.clone(),
        size: args.size,
        block_size,
        rand_size,
        depths: args.depths.clone(),
        rand_time: Duration::from_secs_f64(args.rand_secs),
        engines: args.engines.clone(),
    };
    println!("{}", machine(&args.dir));
    println!(
        "command: `{}`\n",
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    for &e in &args.engines {
        if let Some(mode) = file_tier::detect(e, &args.dir).map_err(|e| e.to_string())? {
            println!("engine {e:?} runs as {mode}");
        }
    }
    println!();
    let mut runs = Vec::new();
    for i in 0..args.repeat.max(1) {
        let rows = file_tier::run(&cfg, |r| {
            eprintln!(
                "run {}: {:>22} {:>24} depth {:>3}: {:>8.0} MB/s {:>9.0} ops/s ({:.2} s)",
                i + 1,
                r.engine,
                r.workload,
                r.depth,
                r.mb_per_s(),
                r.ops_per_s(),
                r.secs
            )
        })
        .map_err(|e| e.to_string())?;
        runs.push(rows);
    }
    let rows = file_tier::median(&runs);
    if runs.len() > 1 {
        println!("medians of {} runs\n", runs.len());
    }
    println!("{}", file_tier::comparison(&rows));
    println!("{}", file_tier::markdown(&rows));
    Ok(())
}

/// nproc, memory, kernel, file system of `dir`, and today's date (UTC).
fn machine(dir: &std::path::Path) -> String {
    let nproc = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map(|kib| format!("{:.1} GiB", kib as f64 / (1u64 << 20) as f64))
        .unwrap_or_else(|| "?".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    let _ = std::fs::create_dir_all(dir);
    let fs = fs_type(dir);
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0) as i64;
    let (y, m, d) = civil(days);
    format!(
        "date: {y:04}-{m:02}-{d:02}; machine: {nproc} CPUs, {mem} RAM, Linux {kernel}; {} on {fs}",
        dir.display()
    )
}

fn fs_type(dir: &std::path::Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return "?".into();
    };
    // SAFETY: `statfs` fills the zeroed struct; the path is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return "?".into();
    }
    match st.f_type as i64 {
        0xEF53 => "ext4".into(),
        0x0102_1994 => "tmpfs".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x794C_7630 => "overlayfs".into(),
        other => format!("fs type {other:#x}"),
    }
}

/// Days since 1970-01-01 to (year, month, day) (proleptic Gregorian).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_dates() {
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("123"), Ok(123));
        assert!(parse_size("1TB").is_err());
        assert!(parse_size("x").is_err());
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(19_723), (2024, 1, 1));
        assert_eq!(civil(11_016), (2000, 2, 29));
    }
}
