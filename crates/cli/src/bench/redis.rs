//! The Redis side of `nk bench --vs redis`: a `redis-server` started for the
//! run (no persistence) and measured with `redis-benchmark`, the reference
//! client, with the same number of clients, operations and value size.

use super::{Mode, Report};
use anyhow::{bail, Context};
use serde::Serialize;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Redis measured in the same run, and how NodeKernel compares.
#[derive(Serialize, Clone, Debug)]
pub struct PeerReport {
    pub name: String,
    /// Redis command measured (`GET` or `SET`).
    pub op: String,
    pub ops_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// NodeKernel p50 / Redis p50 (below 1: NodeKernel is faster).
    pub p50_ratio: f64,
    /// NodeKernel ops/s / Redis ops/s (above 1: NodeKernel is faster).
    pub throughput_ratio: f64,
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn need(tool: &str) -> anyhow::Result<()> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    if !found {
        bail!("--vs redis needs `{tool}` on PATH: install it with `apt-get install redis-server redis-tools`");
    }
    Ok(())
}

/// Runs the Redis counterpart of `mode` and compares it with `ours`.
pub async fn compare(
    mode: Mode,
    clients: u64,
    count: u64,
    size: u64,
    ours: &Report,
) -> anyhow::Result<PeerReport> {
    let op = match mode {
        Mode::Putkey => "SET",
        Mode::Getkey | Mode::Lookup => "GET",
        other => bail!("--vs redis compares putkey, getkey and lookup, not {other:?}"),
    };
    need("redis-server")?;
    need("redis-benchmark")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let _server = Server(
        Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting redis-server")?,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        if Instant::now() > deadline {
            bail!("redis-server did not start listening on port {port}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out = tokio::process::Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args([
            "-c",
            &clients.to_string(),
            "-n",
            &(count * clients).to_string(),
        ])
        .args([
            "-d",
            &size.max(1).to_string(),
            "-t",
            "set,get",
            "-P",
            "1",
            "--csv",
        ])
        .output()
        .await
        .context("running redis-benchmark")?;
    if !out.status.success() {
        bail!(
            "redis-benchmark failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let csv = String::from_utf8_lossy(&out.stdout);
    let row = parse_row(&csv, op)
        .with_context(|| format!("no {op} row in redis-benchmark output: {csv}"))?;
    Ok(PeerReport {
        name: "redis".into(),
        op: op.into(),
        ops_per_sec: row.0,
        p50_us: row.1,
        p99_us: row.2,
        max_us: row.3,
        p50_ratio: ours.latency_us.p50 / row.1,
        throughput_ratio: ours.ops_per_sec / row.0,
    })
}

/// (ops/s, p50 us, p99 us, max us) of the `op` row of redis-benchmark's
/// CSV output (`"test","rps","avg_latency_ms","min_latency_ms",
/// "p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"`).
fn parse_row(csv: &str, op: &str) -> Option<(f64, f64, f64, f64)> {
    for line in csv.lines() {
        let cols: Vec<&str> = line
            .split(',')
            .map(|c| c.trim().trim_matches('"'))
            .collect();
        if cols.len() >= 8 && cols[0] == op {
            let f = |i: usize| cols[i].parse::<f64>().ok();
            return Some((f(1)?, f(4)? * 1000.0, f(6)? * 1000.0, f(7)? * 1000.0));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_redis_benchmark_csv() {
        let csv = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\"SET\",\"13793.10\",\"0.068\",\"0.016\",\"0.039\",\"0.063\",\"0.855\",\"9.543\"\n\"GET\",\"11527.38\",\"0.083\",\"0.016\",\"0.047\",\"0.071\",\"1.783\",\"7.671\"\n";
        let (rps, p50, p99, max) = super::parse_row(csv, "GET").unwrap();
        assert_eq!(rps, 11527.38);
        assert!(
            (p50 - 47.0).abs() < 1e-9 && (p99 - 1783.0).abs() < 1e-9 && (max - 7671.0).abs() < 1e-9
        );
        assert!(super::parse_row(csv, "INCR").is_none());
    }
}
