//! `nk`: the NodeKernel command line.

mod bench;
mod common;
mod drain;
mod fs;
mod mount;
mod policy;
mod resize;
mod servers;
mod snapshot;
mod top;

use clap::{Parser, Subcommand};
use nodekernel_cluster::Config;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "nk",
    version,
    about = "NodeKernel: tiered storage for temporary data"
)]
struct Cli {
    /// Metadata server(s), comma-separated, in partition order
    /// [default: NK_META, then the config file, then 127.0.0.1:9060]
    #[arg(long, global = true, env = "NK_META", value_name = "HOST:PORT")]
    meta: Option<String>,
    /// TOML configuration file
    #[arg(long, global = true, env = "NK_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum TokenCmd {
    /// Write a new random cluster token (32 random bytes, in hex) to FILE,
    /// readable by its owner only; give the file to every server and
    /// client as `[security] token_file` or NK_TOKEN_FILE
    New {
        /// Where to write it; it must not exist yet
        file: PathBuf,
    },
}

#[derive(Subcommand)]
enum TlsCmd {
    /// Write a new certificate authority (ca.pem, ca.key) and a node
    /// certificate it signs (node.pem, node.key) for the given hosts into
    /// DIR; keys are readable by their owner only. Every node may share the
    /// node certificate: list every address clients use to reach the
    /// servers (`docs/security.md`)
    New {
        /// Directory to write into (created if missing); none of the four
        /// files may exist yet
        dir: PathBuf,
        /// A host name or IP address the certificate is valid for
        /// (repeatable) [default: 127.0.0.1, localhost and this host's name]
        #[arg(long = "host", value_name = "HOST")]
        hosts: Vec<String>,
    },
}

/// Writes a certificate authority and a node certificate into `dir`.
fn new_certificates(dir: &std::path::Path, hosts: &[String]) -> anyhow::Result<()> {
    let mut hosts = hosts.to_vec();
    if hosts.is_empty() {
        hosts = vec!["127.0.0.1".into(), "localhost".into()];
        if let Ok(name) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
            let name = name.trim();
            if !name.is_empty() && name != "localhost" {
                hosts.push(name.to_string());
            }
        }
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    let g = nodekernel_rpc::tls::generate(dir, &hosts)?;
    println!(
        "wrote a certificate authority ({}, key {}) and a node certificate for {} ({}, key {})",
        g.ca_file.display(),
        g.ca_key_file.display(),
        hosts.join(", "),
        g.cert_file.display(),
        g.key_file.display()
    );
    println!(
        "use them as:\n[security.tls]\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}",
        g.ca_file, g.cert_file, g.key_file
    );
    Ok(())
}

#[derive(Subcommand)]
enum KeyCmd {
    /// Write a new random encryption key (32 random bytes, in hex) to
    /// FILE, readable by its owner only; give the file to every client
    /// that reads or writes encrypted classes as `[security]
    /// encryption_key_file` or NK_ENCRYPTION_KEY_FILE (never to servers)
    New {
        /// Where to write it; it must not exist yet
        file: PathBuf,
    },
}

/// Writes 32 fresh random bytes in hex to `file` (created with mode 0600,
/// never overwritten): a cluster token, or an encryption key (`what`).
fn new_secret(file: &std::path::Path, what: &str) -> anyhow::Result<()> {
    nodekernel_client::settings::write_new_secret(file)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", file.display()))?;
    println!("wrote a new {what} to {}", file.display());
    Ok(())
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a whole one-machine cluster (metadata server, DRAM and file storage servers)
    Up(servers::UpArgs),
    /// Start a metadata server
    Meta(servers::MetaArgs),
    /// Start storage server(s) and register them with the metadata server
    Store(servers::StoreArgs),
    /// List a container (or show one node)
    Ls {
        #[arg(default_value = "/")]
        path: String,
        #[arg(long)]
        json: bool,
    },
    /// Create a Directory (or a Table or Bag with --type)
    Mkdir {
        path: String,
        /// Create missing parent directories too
        #[arg(short, long)]
        parents: bool,
        /// Node type: dir, table or bag
        #[arg(long = "type", default_value = "dir")]
        ty: String,
        /// For tables: keep no child records (listing shows nothing, creates are faster)
        #[arg(long)]
        non_enumerable: bool,
        /// Preferred storage class, inherited by children
        #[arg(long)]
        class: Option<u8>,
    },
    /// Copy a local file (or - for stdin) into a File
    Put {
        local: PathBuf,
        path: String,
        /// Preferred storage class
        #[arg(long)]
        class: Option<u8>,
        /// Prefer storage servers on this host
        #[arg(long)]
        local_placement: bool,
        /// Tier migration never moves its blocks (e.g. broadcast data
        /// that must stay in DRAM)
        #[arg(long)]
        pinned: bool,
    },
    /// Copy a File or KeyValue to a local file (or - for stdout)
    Get { path: String, local: PathBuf },
    /// Print a File or KeyValue, or a whole Bag as one stream, to stdout
    Cat {
        path: String,
        /// Bag reads in flight
        #[arg(long, default_value_t = nodekernel_client::DEFAULT_BAG_READS_IN_FLIGHT)]
        reads_in_flight: usize,
    },
    /// Remove a node (-r for a non-empty container)
    Rm {
        path: String,
        #[arg(short, long)]
        recursive: bool,
    },
    /// Move (rename) a node atomically
    Mv { src: String, dst: String },
    /// Show a node's metadata
    Stat {
        path: String,
        #[arg(long)]
        json: bool,
        /// List every block with its storage class and server
        #[arg(long)]
        blocks: bool,
    },
    /// Key/value commands on Tables
    #[command(subcommand)]
    Kv(KvCmd),
    /// Write a point-in-time copy of a subtree (or /), data and metadata,
    /// into a new or empty local directory
    Snapshot {
        path: String,
        dir: PathBuf,
        /// Print a JSON summary
        #[arg(long)]
        json: bool,
    },
    /// Load a snapshot directory into the cluster at PATH
    Restore {
        dir: PathBuf,
        path: String,
        /// Replace PATH if it exists (for /: everything in it), once the
        /// snapshot is restored whole beside it
        #[arg(long)]
        force: bool,
        /// Print a JSON summary
        #[arg(long)]
        json: bool,
    },
    /// Benchmark a cluster (create, putkey, getkey, lookup, enumerate)
    Bench(bench::BenchArgs),
    /// Move every block of a storage server to other servers (of its
    /// class, else the next class with room) while clients keep reading and
    /// writing, so it can be stopped; waits and shows progress until done.
    /// Interrupting the command leaves the drain running: run it again to
    /// follow it, or with --cancel to stop it.
    Drain {
        /// The server's identity or registered address (see `nk status`)
        server: String,
        /// Stop draining: the server takes new blocks again
        #[arg(long)]
        cancel: bool,
        /// Start the drain (or show its progress) and return at once
        #[arg(long)]
        no_wait: bool,
        /// Print a JSON summary
        #[arg(long)]
        json: bool,
        /// Give up waiting (exit status 1) after this many seconds without
        /// progress while moves fail (e.g. no room elsewhere) or only
        /// blocks a running snapshot reads are left; the drain goes on
        #[arg(long, value_name = "SECS", default_value_t = 30)]
        stuck_after: u64,
    },
    /// Mount a NodeKernel directory as a file system (FUSE), so unmodified
    /// programs keep their files in the cluster (`docs/fuse.md`)
    Mount(mount::MountArgs),
    /// Unmount what `nk mount` mounted
    Umount(mount::UmountArgs),
    /// Cluster tokens (`docs/security.md`)
    #[command(subcommand)]
    Token(TokenCmd),
    /// TLS certificates for a cluster without a PKI of its own
    /// (`docs/security.md`)
    #[command(subcommand)]
    Tls(TlsCmd),
    /// Client-side encryption keys (`docs/encryption.md`)
    #[command(subcommand)]
    Key(KeyCmd),
    /// Read or change the tiering and placement policy at runtime (every
    /// metadata partition; `docs/tiering.md`)
    #[command(subcommand)]
    Policy(policy::PolicyCmd),
    /// Show storage servers, classes, capacity and use, per metadata
    /// partition too; exits 1 (after printing) when a metadata partition
    /// is unreachable
    Status {
        #[arg(long)]
        json: bool,
        /// Wait until the expected storage servers are alive (for scripts
        /// that start `nk up &`); fails after --timeout
        #[arg(long)]
        wait: bool,
        /// Seconds --wait waits at most
        #[arg(long, default_value_t = 60, requires = "wait")]
        timeout: u64,
    },
    /// Live view of the cluster: capacity and use per class and server,
    /// read/write throughput and operations per second (Ctrl-C quits)
    Top {
        /// Seconds between refreshes (rates are measured over it)
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Print one frame (rates over one interval) and exit
        #[arg(long)]
        once: bool,
        /// Print frames as JSON (one line each; pretty with --once)
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum KvCmd {
    /// Store a value under TABLE/KEY (VALUE, or - / nothing for stdin, streamed);
    /// replaces any old value once the new one is whole
    Put { key: String, value: Option<String> },
    /// Print the value of TABLE/KEY
    Get { key: String },
    /// List the keys of a table
    Ls {
        table: String,
        #[arg(long)]
        json: bool,
    },
    /// Remove TABLE/KEY
    Rm { key: String },
}

impl Cli {
    fn load_config(&self) -> anyhow::Result<Config> {
        Ok(match &self.config {
            Some(p) => Config::load(p)?,
            None => Config::default(),
        })
    }

    /// Client settings, in the order every front end uses
    /// (`nodekernel_client::discover`): --meta / NK_META, then the
    /// `[client]` section of --config / NK_CONFIG, then the default.
    fn client_config(&self) -> anyhow::Result<nodekernel_client::ClientConfig> {
        Ok(nodekernel_client::discover(
            self.meta.as_deref(),
            self.config.as_deref(),
        )?)
    }
}

fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> ExitCode {
    // Like other Unix tools, stop quietly when the reader of our output goes
    // away (`nk cat big | head`) instead of failing on a broken pipe.
    // SAFETY: restoring the default disposition of a signal at start-up,
    // before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let server = match &cli.cmd {
        Cmd::Up(_) | Cmd::Meta(_) => true,
        Cmd::Store(a) => a.action.is_none(),
        _ => false,
    };
    let mount = matches!(&cli.cmd, Cmd::Mount(_));
    // (fuser warns when its own unmount at the end finds the file system
    // already unmounted, as `nk umount` leaves it.)
    init_logging(if server {
        "info"
    } else if mount {
        "warn,fuser::mnt=error"
    } else {
        "warn"
    });
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nk: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nk: {}", common::error_text(e.chain()));
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match &cli.cmd {
        Cmd::Up(a) => return servers::up(cli.load_config()?, a).await,
        Cmd::Meta(a) => return servers::meta(cli.load_config()?, cli.meta.as_deref(), a).await,
        Cmd::Store(a) if a.action.is_none() => {
            let metas = cli.client_config()?.metas;
            return servers::store(cli.load_config()?, metas, a).await;
        }
        Cmd::Bench(a) => return bench::run(cli.client_config()?, a).await,
        Cmd::Mount(a) => return mount::mount(cli.client_config()?, a).await,
        Cmd::Umount(a) => return mount::umount(&a.mountpoint, a.lazy),
        Cmd::Token(TokenCmd::New { file }) => return new_secret(file, "cluster token"),
        Cmd::Key(KeyCmd::New { file }) => return new_secret(file, "encryption key"),
        Cmd::Tls(TlsCmd::New { dir, hosts }) => return new_certificates(dir, hosts),
        _ => {}
    }
    let client = match &cli.cmd {
        // Waiting for readiness includes waiting for the metadata servers
        // to come up.
        Cmd::Status {
            wait: true,
            timeout,
            ..
        } => {
            connect_within(
                cli.client_config()?,
                std::time::Duration::from_secs(*timeout),
            )
            .await?
        }
        _ => nodekernel_client::Client::connect(cli.client_config()?).await?,
    };
    match cli.cmd {
        Cmd::Ls { path, json } => fs::ls(&client, &path, json).await,
        Cmd::Mkdir {
            path,
            parents,
            ty,
            non_enumerable,
            class,
        } => fs::mkdir(&client, &path, parents, &ty, non_enumerable, class).await,
        Cmd::Put {
            local,
            path,
            class,
            local_placement,
            pinned,
        } => {
            let opts = nodekernel_client::CreateOptions {
                storage_class: class,
                local: local_placement,
                pinned,
                ..Default::default()
            };
            fs::put(&client, &local, &path, opts).await
        }
        Cmd::Get { path, local } => fs::get(&client, &path, &local).await,
        Cmd::Cat {
            path,
            reads_in_flight,
        } => fs::cat(&client, &path, reads_in_flight).await,
        Cmd::Rm { path, recursive } => Ok(client.delete(&fs::norm(&path), recursive).await?),
        Cmd::Mv { src, dst } => Ok(client.rename(&fs::norm(&src), &fs::norm(&dst)).await?),
        Cmd::Stat { path, json, blocks } => fs::stat(&client, &path, json, blocks).await,
        Cmd::Kv(KvCmd::Put { key, value }) => fs::kv_put(&client, &key, value).await,
        Cmd::Kv(KvCmd::Get { key }) => fs::get(&client, &key, std::path::Path::new("-")).await,
        Cmd::Kv(KvCmd::Ls { table, json }) => fs::kv_ls(&client, &table, json).await,
        Cmd::Kv(KvCmd::Rm { key }) => fs::kv_rm(&client, &key).await,
        Cmd::Snapshot { path, dir, json } => snapshot::snapshot(&client, &path, &dir, json).await,
        Cmd::Restore {
            dir,
            path,
            force,
            json,
        } => snapshot::restore(&client, &dir, &path, force, json).await,
        Cmd::Status {
            json,
            wait,
            timeout,
        } => {
            let wait = wait.then(|| std::time::Duration::from_secs(timeout));
            fs::status(&client, json, wait).await
        }
        Cmd::Top {
            interval,
            once,
            json,
        } => top::top(&client, interval, once, json).await,
        Cmd::Drain {
            server,
            cancel,
            no_wait,
            json,
            stuck_after,
        } => {
            let stuck = std::time::Duration::from_secs(stuck_after);
            drain::drain(&client, &server, cancel, !no_wait, json, stuck).await
        }
        Cmd::Policy(cmd) => policy::run(&client, cmd).await,
        Cmd::Store(servers::StoreArgs {
            action: Some(action),
            ..
        }) => resize::run(&client, action).await,
        Cmd::Bench(_)
        | Cmd::Mount(_)
        | Cmd::Umount(_)
        | Cmd::Token(_)
        | Cmd::Tls(_)
        | Cmd::Key(_) => {
            unreachable!("handled above")
        }
        Cmd::Up(_) | Cmd::Meta(_) | Cmd::Store(_) => unreachable!("handled above"),
    }
}

/// Connects, retrying while no metadata server answers, for at most
/// `timeout`.
async fn connect_within(
    cfg: nodekernel_client::ClientConfig,
    timeout: std::time::Duration,
) -> anyhow::Result<nodekernel_client::Client> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match nodekernel_client::Client::connect(cfg.clone()).await {
            Ok(c) => return Ok(c),
            Err(e)
                if matches!(
                    e.code,
                    nodekernel_client::ErrorCode::Unavailable
                        | nodekernel_client::ErrorCode::Timeout
                ) && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("the cluster is not ready after {timeout:?}")))
            }
        }
    }
}
