//! `nk quota set|clear|show` and `nk du -s`: quotas on containers' subtrees
//! and disk usage from the metadata servers' accounting
//! (`docs/lifecycle.md`, *Quotas* and *Disk usage*): one request per path,
//! whatever the subtree's size.

use crate::fs::printable;
use crate::paths::expand_all;
use nodekernel_client::{Client, Quota, UsageInfo, NO_LIMIT, RETIRED_CLASS};
use nodekernel_cluster::human;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::Write;

#[derive(clap::Subcommand)]
pub enum QuotaCmd {
    /// Set the quota of a Directory, Table or Bag: limits on the storage
    /// its subtree holds and on the nodes below it. A limit not given is
    /// kept; `none` removes it. A write or create past a limit fails with
    /// QuotaExceeded and changes nothing
    #[command(after_help = crate::examples::QUOTA_SET)]
    Set {
        /// The container
        #[arg(value_name = "PATH")]
        path: String,
        /// Storage its subtree may hold (blocks and small values' pieces):
        /// 50GiB, 512MiB, 10GB; or none
        #[arg(long, value_name = "SIZE", value_parser = parse_byte_limit)]
        bytes: Option<Limit>,
        /// Nodes it may hold below it: 1000, 500K, 1M (thousands and
        /// millions), 2G; or none
        #[arg(long, value_name = "COUNT", value_parser = parse_count_limit)]
        nodes: Option<Limit>,
        /// Remove both limits (the same as nk quota clear)
        #[arg(long, conflicts_with_all = ["bytes", "nodes"])]
        clear: bool,
        /// Print the container's usage and quota as JSON
        #[arg(long)]
        json: bool,
    },
    /// Remove the quota of a container
    Clear {
        /// The container
        #[arg(value_name = "PATH")]
        path: String,
        /// Print the container's usage as JSON
        #[arg(long)]
        json: bool,
    },
    /// Show every quota of the cluster (or those of PATHs) with its usage
    Show {
        /// Containers to show (wildcards allowed) [default: every quota]
        #[arg(value_name = "PATH")]
        paths: Vec<String>,
        /// Print a JSON array (as nk du -s --json, one per quota)
        #[arg(long)]
        json: bool,
    },
}

/// A limit as `--bytes` and `--nodes` take it: a number, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    At(u64),
    None,
}

impl Limit {
    fn wire(self) -> Option<u64> {
        match self {
            Limit::At(n) => Some(n),
            Limit::None => None,
        }
    }
}

fn parse_byte_limit(s: &str) -> Result<Limit, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(Limit::None);
    }
    let n = nodekernel_proto::size::parse_bytes(s)?;
    below_marker(n, s)
}

/// A count: a whole number with an optional decimal suffix (`K`
/// thousands, `M` millions, `G` billions), or none.
pub fn parse_count_limit(s: &str) -> Result<Limit, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("none") {
        return Ok(Limit::None);
    }
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let mult: u64 = match c.to_ascii_lowercase() {
                'k' => 1_000,
                'm' => 1_000_000,
                'g' => 1_000_000_000,
                _ => {
                    return Err(format!(
                        "invalid count {s:?}: unknown suffix {c:?} (use K, M or G, or none)"
                    ))
                }
            };
            (&t[..i], mult)
        }
        _ => (t, 1),
    };
    let n: u64 = num.parse().map_err(|_| {
        format!("invalid count {s:?}: expected a whole number like 1000 or 1M, or none")
    })?;
    let n = n
        .checked_mul(mult)
        .ok_or_else(|| format!("invalid count {s:?}: out of range"))?;
    below_marker(n, s)
}

fn below_marker(n: u64, s: &str) -> Result<Limit, String> {
    if n == NO_LIMIT {
        return Err(format!(
            "invalid limit {s:?}: out of range (none: no limit)"
        ));
    }
    Ok(Limit::At(n))
}

pub async fn run(client: &Client, cmd: QuotaCmd) -> anyhow::Result<()> {
    match cmd {
        QuotaCmd::Set {
            path,
            bytes,
            nodes,
            clear,
            json,
        } => {
            let path = crate::paths::norm(&path);
            if !clear && bytes.is_none() && nodes.is_none() {
                return Err(crate::common::invalid(
                    "nk quota set needs --bytes, --nodes or --clear",
                ));
            }
            // A limit not given keeps its value.
            let old = if clear {
                None
            } else {
                client.quota(&path).await?
            };
            let keep = |l: Option<Limit>, old: Option<u64>| match l {
                Some(l) => l.wire(),
                None => old.filter(|&v| v != NO_LIMIT),
            };
            let b = keep(bytes, old.map(|q| q.bytes));
            let n = keep(nodes, old.map(|q| q.nodes));
            let u = client.set_quota(&path, b, n).await?;
            print_one(&u, json)
        }
        QuotaCmd::Clear { path, json } => {
            let u = client.clear_quota(&crate::paths::norm(&path)).await?;
            print_one(&u, json)
        }
        QuotaCmd::Show { paths, json } => {
            let all = if paths.is_empty() {
                client.quotas().await?
            } else {
                let mut v = Vec::new();
                for p in expand_all(client, &paths).await? {
                    v.push(client.du(&p).await?);
                }
                v
            };
            let names = class_names(client).await;
            let mut out = std::io::stdout().lock();
            if json {
                let v: Vec<Value> = all.iter().map(|u| usage_json(u, &names)).collect();
                writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
                return Ok(());
            }
            if all.is_empty() {
                writeln!(out, "no quotas")?;
            }
            for u in &all {
                writeln!(out, "{}", quota_line(u))?;
            }
            Ok(())
        }
    }
}

fn print_one(u: &UsageInfo, json: bool) -> anyhow::Result<()> {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&usage_json(u, &HashMap::new()))?
        );
    } else {
        println!("{}", quota_line(u));
    }
    Ok(())
}

/// `/q: 1.2 GiB of 50 GiB held, 1200 of 1000000 nodes` (a limit not set:
/// `no limit`).
fn quota_line(u: &UsageInfo) -> String {
    let q = u.quota.unwrap_or(Quota::NONE);
    let of = |limit: u64, f: &dyn Fn(u64) -> String| {
        if limit == NO_LIMIT {
            "no limit".to_string()
        } else {
            f(limit)
        }
    };
    format!(
        "{}: {} held (quota: {}), {} nodes (quota: {})",
        printable(&u.path),
        human(u.held),
        of(q.bytes, &human),
        u.nodes,
        of(q.nodes, &|n| n.to_string()),
    )
}

/// The storage classes' names, by class (empty if the status cannot be
/// read: the numbers are shown anyway).
async fn class_names(client: &Client) -> HashMap<u8, String> {
    match client.status().await {
        Ok(st) => st.classes.into_iter().map(|c| (c.class, c.name)).collect(),
        Err(_) => HashMap::new(),
    }
}

fn class_name(class: u8, names: &HashMap<u8, String>) -> String {
    if class == RETIRED_CLASS {
        return "retired".into();
    }
    names
        .get(&class)
        .cloned()
        .unwrap_or_else(|| format!("class {class}"))
}

/// A usage as `nk du -s --json` and `nk quota show --json` print it.
fn usage_json(u: &UsageInfo, names: &HashMap<u8, String>) -> Value {
    let limit = |v: u64| (v != NO_LIMIT).then_some(v);
    json!({
        "path": u.path,
        "type": u.ty.to_string(),
        "nodes": u.nodes,
        "bytes": u.bytes,
        "stored": u.held,
        "classes": u.classes.iter().map(|c| json!({
            "class": c.class,
            "name": class_name(c.class, names),
            "blocks": c.blocks,
            "piece_bytes": c.piece_bytes,
        })).collect::<Vec<_>>(),
        "quota": u.quota.map(|q| json!({
            "bytes": limit(q.bytes),
            "nodes": limit(q.nodes),
        })),
    })
}

/// `nk du -s`: each path's totals from the accounting: its bytes of data
/// (with `stored`, the storage it holds), and with `json`, its nodes,
/// blocks per class and quota.
pub async fn du_summary(
    client: &Client,
    operands: &[String],
    human_sizes: bool,
    stored: bool,
    json: bool,
) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for p in expand_all(client, operands).await? {
        rows.push(client.du(&p).await?);
    }
    let mut out = std::io::stdout().lock();
    if json {
        let names = class_names(client).await;
        let v: Vec<Value> = rows.iter().map(|u| usage_json(u, &names)).collect();
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(());
    }
    for u in rows {
        let n = if stored { u.held } else { u.bytes };
        let size = if human_sizes { human(n) } else { n.to_string() };
        writeln!(out, "{size}\t{}", printable(&u.path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_sizes_parse_with_none() {
        assert_eq!(parse_count_limit("1M"), Ok(Limit::At(1_000_000)));
        assert_eq!(parse_count_limit("500k"), Ok(Limit::At(500_000)));
        assert_eq!(parse_count_limit("42"), Ok(Limit::At(42)));
        assert_eq!(parse_count_limit("none"), Ok(Limit::None));
        assert!(parse_count_limit("1.5M").is_err());
        assert!(parse_count_limit("1X").is_err());
        assert!(parse_count_limit("99999999999G").is_err());
        assert_eq!(parse_byte_limit("50GiB"), Ok(Limit::At(50 << 30)));
        assert_eq!(parse_byte_limit("NONE"), Ok(Limit::None));
        assert!(parse_byte_limit("5 parsecs").is_err());
    }
}
