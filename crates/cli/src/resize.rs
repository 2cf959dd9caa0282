//! `nk store resize ADDR SIZE`: dynamic capacity of a running storage
//! server.

use nodekernel_client::Client;
use nodekernel_cluster::{human, ByteSize};
use std::time::{Duration, Instant};

#[derive(clap::Subcommand)]
pub enum StoreAction {
    /// Make a running storage server export SIZE of its memory (at most
    /// its size): free blocks leave at once, blocks in use past the new
    /// size move to other servers first (readers and writers follow
    /// them). Waits until the server exports the new size, showing
    /// progress; interrupting it leaves the resize going.
    Resize {
        /// The server's data address, as `nk status` shows it
        addr: String,
        /// The new capacity, e.g. 1GiB (0 empties it)
        #[arg(value_parser = crate::common::parse_size)]
        size: ByteSize,
        /// Return once the server took the new size, without waiting
        #[arg(long)]
        no_wait: bool,
        /// Print a JSON summary
        #[arg(long)]
        json: bool,
        /// Give up waiting (exit status 1) after this many seconds
        #[arg(long, value_name = "SECS", default_value_t = 300)]
        timeout: u64,
    },
}

#[derive(serde::Serialize)]
struct Summary<'a> {
    server: &'a str,
    requested_bytes: u64,
    target_bytes: u64,
    exported_bytes: u64,
    used_bytes: u64,
    done: bool,
    seconds: f64,
}

/// (exported, used) bytes of the server at `addr`, summed over partitions.
async fn exported(client: &Client, addr: &str) -> anyhow::Result<(u64, u64)> {
    let st = client.status().await?;
    let s = st.servers.iter().find(|s| s.addr == addr).ok_or_else(|| {
        crate::common::coded(
            crate::common::Code::Wire(nodekernel_client::ErrorCode::NotFound),
            format!("no storage server at {addr} (`nk status` lists them)"),
        )
    })?;
    let bs = u64::from(s.block_size);
    Ok((s.capacity_blocks * bs, s.used_blocks * bs))
}

pub async fn run(client: &Client, action: StoreAction) -> anyhow::Result<()> {
    let StoreAction::Resize {
        addr,
        size,
        no_wait,
        json,
        timeout,
    } = action;
    let started = Instant::now();
    let target = client.resize_store(&addr, size.0).await?;
    let mut last = String::new();
    let (mut now, mut used) = exported(client, &addr).await?;
    while !no_wait && now != target {
        if started.elapsed() > Duration::from_secs(timeout) {
            return Err(crate::common::coded(
                crate::common::Code::Wire(nodekernel_client::ErrorCode::Timeout),
                format!(
                "{addr} still exports {} after {timeout} s (target {}, {} in use): its blocks may have nowhere else to go; the resize goes on",
                human(now),
                human(target),
                human(used)
            ),
            ));
        }
        let line = format!(
            "{addr}: exporting {} of a target {} ({} in use)",
            human(now),
            human(target),
            human(used)
        );
        if !json && line != last {
            eprintln!("{line}");
            last = line;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        (now, used) = exported(client, &addr).await?;
    }
    let s = Summary {
        server: &addr,
        requested_bytes: size.0,
        target_bytes: target,
        exported_bytes: now,
        used_bytes: used,
        done: now == target,
        seconds: started.elapsed().as_secs_f64(),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        println!(
            "{addr}: exports {} (asked {}, {} in use){}",
            human(now),
            human(size.0),
            human(used),
            if s.done { "" } else { "; still resizing" }
        );
    }
    Ok(())
}
