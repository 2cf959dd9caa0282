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
    /// Directory for the file tier's block file
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// DRAM tier size (0 disables it), e.g. 512MiB
    #[arg(long, value_parser = crate::parse_size)]
    dram: Option<ByteSize>,
    /// File tier size (0 disables it), e.g. 8GiB
    #[arg(long, value_parser = crate::parse_size)]
    file: Option<ByteSize>,
}

#[derive(Args)]
pub struct MetaArgs {
    /// Address to listen on [default: meta.listen, 127.0.0.1:9060]
    #[arg(long)]
    listen: Option<String>,
}

#[derive(Args)]
pub struct StoreArgs {
    /// Storage class (0 = fastest); with this flag the store is defined by flags instead of [[store]]
    #[arg(long)]
    class: Option<u8>,
    #[arg(long, default_value = "dram")]
    class_name: String,
    /// dram or file
    #[arg(long, default_value = "dram")]
    medium: String,
    #[arg(long, value_parser = crate::parse_size, default_value = "512MiB")]
    size: ByteSize,
    /// Backing file (file medium)
    #[arg(long)]
    path: Option<PathBuf>,
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Address to register with the metadata server (default: the bound address)
    #[arg(long)]
    advertise: Option<String>,
    /// Location class (default: host name)
    #[arg(long)]
    location: Option<String>,
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
        cfg.up.data_dir = d.clone();
    }
    if let Some(s) = a.dram {
        cfg.up.dram = s;
    }
    if let Some(s) = a.file {
        cfg.up.file = s;
    }
    cfg.validate()?;
    let stores = cfg.up_stores();
    let cluster = LocalCluster::start(cfg).await?;
    let addr = cluster.meta_addr();
    println!("NodeKernel is up: metadata server at {addr}");
    for (s, srv) in stores.iter().zip(&cluster.stores) {
        println!(
            "  storage class {} ({}): {} {} at {}",
            s.class,
            s.class_name,
            human(s.size.0),
            match s.medium {
                Medium::Dram => "DRAM".to_string(),
                Medium::File => "file".to_string(),
            },
            srv.local_addr()
        );
    }
    println!("export NK_META={addr}   # then try: nk status");
    let sig = wait_for_signal().await?;
    println!("{sig}: stopping NodeKernel");
    cluster.shutdown();
    remove_block_files(&cluster.config, &stores);
    Ok(())
}

/// Without persistence a file tier's blocks are unreachable after shutdown:
/// remove the block files rather than leave gigabytes behind.
fn remove_block_files(cfg: &Config, stores: &[StoreSection]) {
    for (i, s) in stores.iter().enumerate() {
        if let Ok(sc) = cfg.store_config(i, s, Vec::new()) {
            if let nodekernel_store::MediumKind::File { path } = sc.medium {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

pub async fn meta(mut cfg: Config, a: &MetaArgs) -> anyhow::Result<()> {
    if let Some(l) = &a.listen {
        cfg.meta.listen = l.clone();
    }
    cfg.validate()?;
    let server = MetaServer::start(cfg.meta_config()).await?;
    println!("metadata server listening on {}", server.local_addr());
    let sig = wait_for_signal().await?;
    println!("{sig}: stopping the metadata server");
    server.shutdown();
    Ok(())
}

pub async fn store(mut cfg: Config, metas: Vec<String>, a: &StoreArgs) -> anyhow::Result<()> {
    if let Some(class) = a.class {
        let medium = match a.medium.as_str() {
            "dram" => Medium::Dram,
            "file" => Medium::File,
            other => anyhow::bail!("--medium {other}: expected dram or file"),
        };
        cfg.store = vec![StoreSection {
            class,
            class_name: a.class_name.clone(),
            medium,
            size: a.size,
            path: a.path.clone(),
            listen: a.listen.clone(),
            advertise: a.advertise.clone(),
            location: a.location.clone().unwrap_or_default(),
            ..StoreSection::default()
        }];
    }
    if cfg.store.is_empty() {
        anyhow::bail!("no storage server defined: pass --class (and --medium, --size) or list [[store]] in the config");
    }
    cfg.validate()?;
    let mut servers = Vec::new();
    for (i, s) in cfg.store.iter().enumerate() {
        let sc = cfg.store_config(i, s, metas.clone())?;
        let srv = StorageServer::start(sc)
            .await
            .with_context(|| format!("starting storage server {i} ({})", s.class_name))?;
        println!(
            "storage server {i}: class {} ({}), {} at {}",
            s.class,
            s.class_name,
            human(s.size.0),
            srv.local_addr()
        );
        servers.push(srv);
    }
    let sig = wait_for_signal().await?;
    println!("{sig}: stopping storage servers");
    for s in &servers {
        s.shutdown();
    }
    Ok(())
}
