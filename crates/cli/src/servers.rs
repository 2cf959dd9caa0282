//! `nk up`, `nk meta`, `nk store`: long-running server commands.

use anyhow::Context;
use clap::Args;
use nodekernel_cluster::{human, ByteSize, Config, LocalCluster, Medium, StoreSection};
use nodekernel_meta::MetaServer;
use nodekernel_store::StorageServer;
use std::path::PathBuf;

#[derive(Args)]
pub struct UpArgs {
    /// Metadata server port (storage servers pick free ports)
    #[arg(long)]
    port: Option<u16>,
    /// Address to bind (default 127.0.0.1)
    #[arg(long)]
    host: Option<String>,
    /// Data directory: DIR/LOCK, DIR/meta (the operation log, with meta.persistence) and DIR/store-N (LOCK, identity, blocks) per storage server [default: a fresh private directory, removed at shutdown]
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// DRAM tier size (0 disables it), e.g. 512MiB
    #[arg(long, value_parser = crate::common::parse_size)]
    dram: Option<ByteSize>,
    /// File tier size (0 disables it), e.g. 8GiB
    #[arg(long, value_parser = crate::common::parse_size)]
    file: Option<ByteSize>,
    /// The metadata server's admin HTTP endpoint (metrics, status, dashboard); "" turns it off [default: meta.admin, 127.0.0.1:0]
    #[arg(long, value_name = "ADDR")]
    admin: Option<String>,
    /// Run without a cluster token, trusting every peer that reaches a port (`[security] insecure`) [default: the configured token, else a new one in DIR/token]
    #[arg(long)]
    insecure: bool,
}

#[derive(Args)]
pub struct MetaArgs {
    /// Address to listen on; with --meta A,B,... (the metadata servers in partition order) its place in that list is this server's partition [default: meta.listen, 127.0.0.1:9060]
    #[arg(long)]
    listen: Option<String>,
    /// Keep the namespace in DIR across restarts (an operation log; turns on meta.persistence) [default: meta.data_dir when meta.persistence is set]
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// This server's partition, its index (from 0) in the metadata servers' list (--meta / NK_META, else `[client] meta`); with it, --listen may be a wildcard address such as 0.0.0.0:9060 (as in a Kubernetes pod, whose index gives it) [default: the place of --listen in --meta, else meta.partition]
    #[arg(long, value_name = "N")]
    partition: Option<u32>,
    /// Admin HTTP endpoint (metrics, status, dashboard); "" turns it off [default: meta.admin, 127.0.0.1:0]
    #[arg(long, value_name = "ADDR")]
    admin: Option<String>,
    /// Run without a cluster token, trusting every peer that reaches a port (`[security] insecure`); without a token and without this, the server refuses to start
    #[arg(long)]
    insecure: bool,
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct StoreArgs {
    #[command(subcommand)]
    pub action: Option<crate::resize::StoreAction>,
    /// Storage class (0 = fastest); with this flag the store is defined by flags instead of [[store]]
    #[arg(long)]
    class: Option<u8>,
    /// The class's name, shown by `nk status`
    #[arg(long, default_value = "dram")]
    class_name: String,
    /// dram or file
    #[arg(long, default_value = "dram")]
    medium: String,
    /// Capacity to export, e.g. 512MiB or 8GiB
    #[arg(long, value_parser = crate::common::parse_size, default_value = "512MiB")]
    size: ByteSize,
    /// Data directory of the server: LOCK, identity, and a file medium's block file [default: none for DRAM; a fresh private directory, removed at shutdown, for a file medium without --path]
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Block file of a file medium [default: blocks in the data directory; a relative path is taken under it]
    #[arg(long, value_name = "FILE")]
    path: Option<PathBuf>,
    /// Address the data port listens on (port 0: any free one)
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Address to register with the metadata server (default: the bound address)
    #[arg(long)]
    advertise: Option<String>,
    /// Location class (default: host name)
    #[arg(long)]
    location: Option<String>,
    /// Keep the blocks across restarts of this server (needs --data-dir; docs/persistence.md)
    #[arg(long)]
    persistent: bool,
    /// DRAM only: follow the memory available to this server (the host's, or its container's memory limit, whichever is less), exporting between --min-size and --size and leaving --reserve free (docs/tiering.md, "Dynamic capacity")
    #[arg(long)]
    dynamic: bool,
    /// With --dynamic: the least it exports
    #[arg(long, value_parser = crate::common::parse_size, default_value = "0", requires = "dynamic")]
    min_size: ByteSize,
    /// With --dynamic: memory left free to everything else
    #[arg(long, value_parser = crate::common::parse_size, default_value = "1GiB", requires = "dynamic")]
    reserve: ByteSize,
    /// Admin HTTP endpoint (metrics, status, dashboard) of every server started; "" turns it off [default: the section's admin, 127.0.0.1:0]
    #[arg(long, value_name = "ADDR")]
    admin: Option<String>,
    /// Run without a cluster token, trusting every peer that reaches a port (`[security] insecure`); without a token and without this, the server refuses to start
    #[arg(long)]
    insecure: bool,
}

async fn wait_for_signal() -> anyhow::Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => { r.context("waiting for SIGINT")?; Ok("SIGINT") }
        _ = term.recv() => Ok("SIGTERM"),
    }
}

pub async fn up(mut cfg: Config, a: &UpArgs) -> anyhow::Result<()> {
    let host = a.host.clone().unwrap_or_else(|| "127.0.0.1".into());
    if let Some(p) = a.port {
        cfg.meta.listen = format!("{host}:{p}");
    } else if a.host.is_some() {
        let port = cfg
            .meta
            .listen
            .rsplit(':')
            .next()
            .unwrap_or("9060")
            .to_string();
        cfg.meta.listen = format!("{host}:{port}");
    }
    if let Some(d) = &a.data_dir {
        cfg.up.data_dir = Some(d.clone());
    }
    if let Some(s) = a.dram {
        cfg.up.dram = s;
    }
    if let Some(s) = a.file {
        cfg.up.file = s;
    }
    if let Some(admin) = &a.admin {
        cfg.meta.admin = admin.clone();
    }
    cfg.security.insecure |= a.insecure;
    // Clients of this user on this host find the token by the address.
    cfg.up.publish_token = true;
    let stores = cfg.up_stores();
    let cluster = LocalCluster::start(cfg).await?;
    let addr = cluster.meta_addr();
    println!("NodeKernel is up: metadata server at {addr}");
    if let Some(url) = cluster.admin_url() {
        println!("  admin endpoint and dashboard at {url}");
    }
    for (s, srv) in stores.iter().zip(&cluster.stores) {
        println!(
            "  storage class {} ({}): {} {} at {}, identity {}{}{}",
            s.class,
            s.class_name,
            human(s.size.0),
            match s.medium {
                Medium::Dram => "DRAM".to_string(),
                Medium::File => "file".to_string(),
            },
            srv.local_addr(),
            srv.identity(),
            kept_text(srv),
            admin_text(srv.admin_addr()),
        );
    }
    let persistent = cluster.config.meta.persistence;
    println!(
        "  data directory {} ({})",
        cluster.data_dir().display(),
        if cluster.data_dir_is_private() {
            "private, removed at shutdown"
        } else if persistent {
            "persistent: the namespace and the blocks are kept across restarts"
        } else {
            "kept at shutdown, block files removed"
        }
    );
    println!(
        "  {}",
        token_text(cluster.has_token(), cluster.token_file().as_deref())
    );
    for t in cluster.tenants() {
        println!(
            "  tenant {}: sees {} as / ({}; its clients prove its own token)",
            t.name,
            t.root,
            t.rights.names().join(", ")
        );
    }
    println!("export NK_META={addr}   # then try: nk status");
    let sig = wait_for_signal().await?;
    println!("{sig}: stopping NodeKernel");
    // A volatile store removes its block file, a persistent one syncs and
    // keeps it; a private data directory goes entirely.
    cluster.shutdown();
    Ok(())
}

/// The start-up line about the cluster token.
fn token_text(has_token: bool, token_file: Option<&std::path::Path>) -> String {
    match token_file {
        _ if !has_token => {
            "no cluster token: every peer that reaches a port is trusted (--insecure)".into()
        }
        None => "cluster token from [security] token (clients need it too)".into(),
        Some(f) => format!(
            "cluster token in {} (clients of this user on this host find it; others need it \
             as NK_TOKEN_FILE or [security] token_file)",
            f.display()
        ),
    }
}

/// `, admin http://ADDR/` for a server's start-up line, if it has one.
fn admin_text(addr: Option<std::net::SocketAddr>) -> String {
    addr.map(|a| format!(", admin http://{a}/"))
        .unwrap_or_default()
}

/// What a storage server found of its blocks at start, for its line in
/// the start-up report: nothing for a volatile server.
fn kept_text(srv: &StorageServer) -> String {
    match srv.kept_blocks() {
        None => String::new(),
        Some(Ok(())) => ", persistent: blocks kept".into(),
        Some(Err(why)) => format!(", persistent: started empty ({why})"),
    }
}

/// `nk meta`; `metas` is the `--meta` / `NK_META` list, which gives this
/// server's partition (see [`partition_in`]).
pub async fn meta(mut cfg: Config, metas: Option<&str>, a: &MetaArgs) -> anyhow::Result<()> {
    if let Some(l) = &a.listen {
        cfg.meta.listen = l.clone();
    }
    let list = metas.map(nodekernel_client::settings::parse_meta_list);
    let place = match (a.partition, list) {
        (Some(p), list) => Some(partition_given(
            &cfg,
            p,
            list.as_deref().unwrap_or(&cfg.client.meta),
        )?),
        (None, Some(list)) => partition_in(&cfg, &list)?,
        (None, None) => None,
    };
    if let Some((partition, partitions)) = place {
        cfg.meta.partition = partition;
        cfg.meta.partitions = partitions;
    }
    if let Some(d) = &a.data_dir {
        cfg.meta.persistence = true;
        cfg.meta.data_dir = Some(d.clone());
    }
    if let Some(admin) = &a.admin {
        cfg.meta.admin = admin.clone();
    }
    cfg.security.insecure |= a.insecure;
    cfg.validate()?;
    cfg.require_token()?;
    cfg.check_meta_dir()?;
    // Clients of this user on this host find the token by the address:
    // told before the server listens at a fixed one, so that a client that
    // can connect finds it.
    let fixed = nodekernel_cluster::fixed_addr(&cfg.meta.listen);
    let mut published: Vec<_> = fixed
        .and_then(|a| nodekernel_cluster::publish(&cfg, a))
        .into_iter()
        .collect();
    let server = MetaServer::start(cfg.meta_config()?).await?;
    if published.is_empty() {
        published.extend(nodekernel_cluster::publish(&cfg, server.local_addr()));
    }
    println!("metadata server listening on {}", server.local_addr());
    println!(
        "{}",
        token_text(cfg.has_token()?, cfg.token_file().as_deref())
    );
    if let Some(a) = server.admin_addr() {
        println!("admin endpoint and dashboard at http://{a}/");
    }
    if let Some(p) = cfg.meta_persistence(None) {
        println!(
            "operation log in {} (fsync: {:?})",
            p.dir.join("journal").display(),
            p.fsync
        );
    }
    let sig = wait_for_signal().await?;
    println!("{sig}: stopping the metadata server");
    server.shutdown();
    drop(published);
    Ok(())
}

pub async fn store(mut cfg: Config, metas: Vec<String>, a: &StoreArgs) -> anyhow::Result<()> {
    if let Some(class) = a.class {
        let medium = match a.medium.as_str() {
            "dram" => Medium::Dram,
            "file" => Medium::File,
            other => {
                return Err(crate::common::invalid(format!(
                    "--medium {other}: expected dram or file"
                )))
            }
        };
        cfg.store = vec![StoreSection {
            class,
            class_name: a.class_name.clone(),
            medium,
            size: a.size,
            data_dir: a.data_dir.clone(),
            path: a.path.clone(),
            listen: a.listen.clone(),
            advertise: a.advertise.clone(),
            location: a.location.clone().unwrap_or_default(),
            persistent: Some(a.persistent),
            dynamic: a.dynamic,
            min_size: a.min_size,
            reserve: a.reserve,
            ..StoreSection::default()
        }];
    }
    if cfg.store.is_empty() {
        return Err(crate::common::invalid("no storage server defined: pass --class (and --medium, --size) or list [[store]] in the config"));
    }
    if let Some(admin) = &a.admin {
        for s in &mut cfg.store {
            s.admin = admin.clone();
        }
    }
    cfg.security.insecure |= a.insecure;
    cfg.validate()?;
    cfg.require_token()?;
    let mut servers: Vec<StorageServer> = Vec::new();
    for (i, s) in cfg.store.iter().enumerate() {
        let started = match cfg.store_config(i, s, metas.clone()) {
            Ok(sc) => StorageServer::start(sc)
                .await
                .with_context(|| format!("starting storage server {i} ({})", s.class_name)),
            Err(e) => Err(e.into()),
        };
        let srv = match started {
            Ok(srv) => srv,
            Err(e) => {
                // Leave nothing behind: undo the servers started before.
                for srv in servers {
                    srv.discard();
                }
                return Err(e);
            }
        };
        println!(
            "storage server {i}: class {} ({}), {}, identity {}{}{}, at {}",
            s.class,
            s.class_name,
            human(s.size.0),
            srv.identity(),
            match srv.data_dir() {
                Some(d) => format!(", data directory {}", d.display()),
                None => String::new(),
            },
            kept_text(&srv),
            srv.local_addr(),
        );
        // A line of its own: scripts take the address from the end of the
        // line above.
        if let Some(a) = srv.admin_addr() {
            println!("storage server {i}: admin endpoint and dashboard at http://{a}/");
        }
        servers.push(srv);
    }
    let sig = wait_for_signal().await?;
    println!("{sig}: stopping storage servers");
    for s in &servers {
        s.shutdown();
    }
    Ok(())
}

/// This metadata server's place in `list`, the metadata servers in
/// partition order (`--meta A,B,…`, as clients list them): `(partition,
/// partitions)`. `None` for a list of one address (any lone server is
/// partition 0 of 1; the config decides) ; an error when the list has
/// several and the listen address is not one of them, or when the config
/// gives this server another place (`meta.partition`, `meta.partitions`).
fn partition_in(cfg: &Config, list: &[String]) -> anyhow::Result<Option<(u32, u32)>> {
    if list.len() < 2 {
        return Ok(None);
    }
    let listen = cfg.meta.listen.as_str();
    let Some(i) = place_in(listen, list) else {
        return Err(crate::common::invalid(format!(
            "the metadata servers are listed as {} (--meta / NK_META, in partition order), \
             but this one listens on {listen}, which is not in that list (or matches more \
             than one entry): give --listen as the list names this server, or leave \
             --meta out and set meta.partition and meta.partitions in the config",
            list.join(",")
        )));
    };
    agreed(
        cfg,
        i as u32,
        list.len() as u32,
        "--meta / NK_META lists it as",
    )
    .map(Some)
}

/// `--partition N`: this server is partition `n` of `list` (the metadata
/// servers in partition order), which must have it; the config, if it
/// says, must agree.
fn partition_given(cfg: &Config, n: u32, list: &[String]) -> anyhow::Result<(u32, u32)> {
    let partitions = u32::try_from(list.len()).unwrap_or(u32::MAX).max(1);
    if n >= partitions {
        return Err(crate::common::invalid(format!(
            "--partition {n} is not a partition: the metadata servers' list (--meta / \
             NK_META, else [client] meta) has {partitions}, numbered from 0"
        )));
    }
    agreed(cfg, n, partitions, "--partition makes it")
}

/// `(partition, partitions)`, unless the config gives this server another
/// place (`meta.partition`, `meta.partitions`); `how` says where the
/// place came from, for the error.
fn agreed(cfg: &Config, partition: u32, partitions: u32, how: &str) -> anyhow::Result<(u32, u32)> {
    let (p, n) = (cfg.meta.partition, cfg.meta.partitions);
    if (p, n) != (0, 1) && (p, n) != (partition, partitions) {
        return Err(crate::common::invalid(format!(
            "the config makes this metadata server partition {p} of {n} (meta.partition, \
             meta.partitions), but {how} partition {partition} of {partitions}: make them \
             agree, or leave one out"
        )));
    }
    Ok((partition, partitions))
}

/// The index of the entry of `list` that names the address `listen`: the
/// same text, the same socket address once resolved (`localhost:9060` and
/// `127.0.0.1:9060`), or, for a wildcard listen address (`0.0.0.0:9060`),
/// the one entry with its port. `None` when no entry, or more than one,
/// fits.
fn place_in(listen: &str, list: &[String]) -> Option<usize> {
    use std::net::{SocketAddr, ToSocketAddrs};
    let only = |fits: &dyn Fn(&str) -> bool| {
        let mut found = list.iter().enumerate().filter(|(_, a)| fits(a));
        match (found.next(), found.next()) {
            (Some((i, _)), None) => Some(i),
            _ => None,
        }
    };
    if let Some(i) = only(&|a| a == listen) {
        return Some(i);
    }
    let resolve = |a: &str| -> Vec<SocketAddr> {
        a.to_socket_addrs()
            .map(|it| it.collect())
            .unwrap_or_default()
    };
    let mine = resolve(listen);
    if let Some(wild) = mine.iter().find(|a| a.ip().is_unspecified()) {
        let port = wild.port();
        return only(&|a| resolve(a).iter().any(|r| r.port() == port));
    }
    only(&|a| resolve(a).iter().any(|r| mine.contains(r)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(a: &str) -> Vec<String> {
        nodekernel_client::settings::parse_meta_list(a)
    }

    #[test]
    fn a_server_finds_its_place_in_the_list() {
        let l = list("127.0.0.1:9060,127.0.0.1:9061,127.0.0.1:9062");
        assert_eq!(place_in("127.0.0.1:9061", &l), Some(1));
        assert_eq!(place_in("localhost:9062", &l), Some(2));
        assert_eq!(place_in("0.0.0.0:9060", &l), Some(0));
        assert_eq!(place_in("127.0.0.1:9063", &l), None);
        // A wildcard address whose port several entries share is no place.
        let hosts = list("10.0.0.1:9060,10.0.0.2:9060");
        assert_eq!(place_in("0.0.0.0:9060", &hosts), None);
        assert_eq!(place_in("10.0.0.2:9060", &hosts), Some(1));
    }

    #[test]
    fn the_list_gives_the_partition_or_a_way_out() {
        let mut cfg = Config::default();
        cfg.meta.listen = "127.0.0.1:9061".into();
        let l = list("127.0.0.1:9060,127.0.0.1:9061");
        assert_eq!(partition_in(&cfg, &l).unwrap(), Some((1, 2)));
        // One address: the config decides, as before.
        assert_eq!(partition_in(&cfg, &list("127.0.0.1:9060")).unwrap(), None);
        // Not in the list: refused, saying how.
        cfg.meta.listen = "127.0.0.1:9070".into();
        let e = partition_in(&cfg, &l).unwrap_err().to_string();
        assert!(
            e.contains("not in that list") && e.contains("meta.partition"),
            "{e}"
        );
        // The config agrees, or it is refused.
        cfg.meta.listen = "127.0.0.1:9061".into();
        (cfg.meta.partition, cfg.meta.partitions) = (1, 2);
        assert_eq!(partition_in(&cfg, &l).unwrap(), Some((1, 2)));
        (cfg.meta.partition, cfg.meta.partitions) = (0, 2);
        let e = partition_in(&cfg, &l).unwrap_err().to_string();
        assert!(
            e.contains("partition 0 of 2") && e.contains("partition 1 of 2"),
            "{e}"
        );
    }

    #[test]
    fn a_given_partition_needs_no_listen_address_in_the_list() {
        let mut cfg = Config::default();
        cfg.meta.listen = "0.0.0.0:9060".into();
        let l = list("nk-meta-0.nk:9060,nk-meta-1.nk:9060,nk-meta-2.nk:9060");
        assert_eq!(partition_given(&cfg, 2, &l).unwrap(), (2, 3));
        assert_eq!(partition_given(&cfg, 0, &list("a:9060")).unwrap(), (0, 1));
        let e = partition_given(&cfg, 3, &l).unwrap_err().to_string();
        assert!(e.contains("--partition 3") && e.contains("has 3"), "{e}");
        (cfg.meta.partition, cfg.meta.partitions) = (1, 3);
        let e = partition_given(&cfg, 2, &l).unwrap_err().to_string();
        assert!(
            e.contains("partition 1 of 3") && e.contains("--partition makes it partition 2"),
            "{e}"
        );
        assert_eq!(partition_given(&cfg, 1, &l).unwrap(), (1, 3));
    }
}
