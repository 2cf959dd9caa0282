//! `nk`: the NodeKernel command line.

mod bench;
mod common;
mod copy;
mod drain;
mod examples;
mod fs;
mod inspect;
mod mount;
mod paths;
mod policy;
mod quota;
#[cfg(test)]
mod reference;
mod resize;
mod run;
mod servers;
mod snapshot;
mod status;
mod top;
mod walk;

use anyhow::Context;
use clap::{Parser, Subcommand};
use nodekernel_cluster::Config;
use paths::Loc;
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
    #[arg(
        long,
        global = true,
        env = "NK_META",
        hide_env_values = true,
        value_name = "HOST:PORT"
    )]
    meta: Option<String>,
    /// TOML configuration file
    #[arg(
        long,
        global = true,
        env = "NK_CONFIG",
        hide_env_values = true,
        value_name = "FILE"
    )]
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
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
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
        .with_context(|| format!("cannot create {}", file.display()))?;
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
    /// List containers' children, or show data nodes
    #[command(disable_help_flag = true, after_help = examples::LS)]
    Ls {
        /// Paths or wildcard patterns, quoted so the shell leaves them
        /// alone ('/logs/*.gz') [default: /]
        #[arg(value_name = "PATH")]
        paths: Vec<String>,
        /// Long format: type, permissions, size (bytes; a container's
        /// number of children), modification time (UTC), name
        #[arg(short = 'l', long = "long")]
        long: bool,
        /// List every container below, each under a `PATH:` heading
        #[arg(short = 'R', long)]
        recursive: bool,
        /// With -l: sizes in KiB, MiB, GiB instead of bytes
        #[arg(short = 'h', long = "human-readable")]
        human: bool,
        /// List containers themselves, not their children
        #[arg(short = 'd', long)]
        directory: bool,
        /// Print one JSON array of entries (name, path, type, size, mode,
        /// mtime_ns)
        #[arg(long)]
        json: bool,
        /// Print help
        #[arg(long, action = clap::ArgAction::Help)]
        help: Option<bool>,
    },
    /// Create Directories (or Tables or Bags with --type)
    #[command(after_help = examples::MKDIR)]
    Mkdir {
        /// The containers to create
        #[arg(value_name = "PATH", required = true)]
        paths: Vec<String>,
        /// Create missing parents too; an existing container is no error
        #[arg(short, long)]
        parents: bool,
        /// Node type: dir, table or bag
        #[arg(long = "type", default_value = "dir", value_name = "TYPE")]
        ty: String,
        /// For tables: keep no child records (listing shows nothing,
        /// creates are faster)
        #[arg(long)]
        non_enumerable: bool,
        /// Preferred storage class, inherited by children
        #[arg(long, value_name = "CLASS")]
        class: Option<u8>,
        /// The container (with everything in it) expires this long from
        /// now: 90s, 30m, 1h, 2d; or never (not even under a parent's
        /// --child-ttl)
        #[arg(long, value_name = "DURATION", value_parser = common::parse_ttl)]
        ttl: Option<nodekernel_client::Ttl>,
        /// New children created in it without a TTL of their own expire
        /// this long after their create
        #[arg(long, value_name = "DURATION", value_parser = common::parse_duration)]
        child_ttl: Option<std::time::Duration>,
    },
    /// Set when nodes expire (with everything in them), or a container's
    /// TTL for new children
    #[command(after_help = examples::EXPIRE)]
    Expire {
        /// Paths or wildcard patterns
        #[arg(value_name = "PATH", required = true, num_args = 1..)]
        paths: Vec<String>,
        /// How long from now: 90s, 30m, 1h, 2d; or never (with --child:
        /// none)
        #[arg(value_name = "DURATION", allow_hyphen_values = false)]
        ttl: String,
        /// Set the TTL of the container's new children instead
        #[arg(long)]
        child: bool,
        /// Print JSON: each node's path and expiry
        #[arg(long)]
        json: bool,
    },
    /// Copy local files or directories (or stdin) into the cluster
    #[command(after_help = examples::PUT)]
    Put {
        /// Local files, directories (with -r) or - for stdin
        #[arg(value_name = "LOCAL", required = true, num_args = 1..)]
        sources: Vec<PathBuf>,
        /// Where to: a File path, or an existing container to copy into
        /// (each source keeps its name; a trailing / says it must be one)
        #[arg(value_name = "PATH")]
        dest: String,
        #[command(flatten)]
        copy: CopyFlags,
        #[command(flatten)]
        place: PlaceFlags,
    },
    /// Copy Files, KeyValues or containers (with -r) to local files (or - for stdout)
    #[command(after_help = examples::GET)]
    Get {
        /// Cluster paths or wildcard patterns
        #[arg(value_name = "PATH", required = true, num_args = 1..)]
        sources: Vec<String>,
        /// A local file, an existing local directory to copy into, or -
        /// for stdout (written only once the whole value was read)
        #[arg(value_name = "LOCAL")]
        dest: PathBuf,
        #[command(flatten)]
        copy: CopyFlags,
    },
    /// Copy inside the cluster, or between it and local files (file:PATH)
    #[command(after_help = examples::CP)]
    Cp {
        /// Sources: cluster paths (/a, nk:/a; wildcards allowed) or local
        /// ones (file:PATH, - for stdin)
        #[arg(value_name = "SRC", required = true, num_args = 1..)]
        sources: Vec<String>,
        /// Destination: a cluster path, file:PATH or - for stdout; an
        /// existing container or directory is copied into
        #[arg(value_name = "DEST")]
        dest: String,
        #[command(flatten)]
        copy: CopyFlags,
        #[command(flatten)]
        place: PlaceFlags,
    },
    /// Print Files or KeyValues, and Bags as one stream each, to stdout
    #[command(after_help = examples::CAT)]
    Cat {
        /// Paths or wildcard patterns, printed one after another
        #[arg(value_name = "PATH", required = true)]
        paths: Vec<String>,
        /// Bag reads in flight
        #[arg(long, value_name = "N", default_value_t = nodekernel_client::DEFAULT_BAG_READS_IN_FLIGHT)]
        reads_in_flight: usize,
    },
    /// Print the first bytes or lines of Files or KeyValues
    #[command(after_help = examples::HEAD)]
    Head {
        /// Paths or wildcard patterns (several get `==> PATH <==` headings)
        #[arg(value_name = "PATH", required = true)]
        paths: Vec<String>,
        #[command(flatten)]
        amount: AmountFlags,
    },
    /// Print the last bytes or lines of Files or KeyValues
    #[command(after_help = examples::TAIL)]
    Tail {
        /// Paths or wildcard patterns (several get `==> PATH <==` headings)
        #[arg(value_name = "PATH", required = true)]
        paths: Vec<String>,
        #[command(flatten)]
        amount: AmountFlags,
    },
    /// Remove nodes (-r for a container with everything in it)
    #[command(after_help = examples::RM)]
    Rm {
        /// Paths or wildcard patterns
        #[arg(value_name = "PATH", required = true)]
        paths: Vec<String>,
        /// Remove containers with everything in them
        #[arg(short, long)]
        recursive: bool,
        /// A missing path, or a pattern that matches nothing, is no error
        #[arg(short, long)]
        force: bool,
    },
    /// Move (rename) nodes atomically, or into a container
    #[command(after_help = examples::MV)]
    Mv {
        /// Paths or wildcard patterns to move (same metadata partition as DEST)
        #[arg(value_name = "SRC", required = true, num_args = 1..)]
        sources: Vec<String>,
        /// The new path, or an existing container to move into
        #[arg(value_name = "DEST")]
        dest: String,
        /// Replace an existing File or KeyValue (or empty container of the
        /// same type) at the destination, in the same atomic step
        #[arg(short, long)]
        force: bool,
    },
    /// Create empty Files, or set existing nodes' modification time to now
    #[command(after_help = examples::TOUCH)]
    Touch {
        /// Paths (an empty KeyValue in a Table, an empty File elsewhere)
        #[arg(value_name = "PATH", required = true)]
        paths: Vec<String>,
        /// Create nothing: only touch the nodes that exist
        #[arg(short = 'c', long)]
        no_create: bool,
    },
    /// Show nodes' metadata
    #[command(after_help = examples::STAT)]
    Stat {
        /// Paths or wildcard patterns
        #[arg(value_name = "PATH", required = true)]
        paths: Vec<String>,
        /// Print JSON: an object, or an array for several paths
        #[arg(long)]
        json: bool,
        /// List every block with its storage class and server
        #[arg(long)]
        blocks: bool,
    },
    /// Find nodes by name and type below paths (also -name, -type, -maxdepth)
    #[command(after_help = examples::FIND)]
    Find {
        /// Where to look (wildcards allowed) [default: /]
        #[arg(value_name = "PATH")]
        paths: Vec<String>,
        /// A wildcard pattern the node's name must match ('*.parquet')
        #[arg(long, value_name = "PATTERN")]
        name: Option<String>,
        /// Node types to show: f (File), d (Directory), t (Table), b (Bag),
        /// k (KeyValue); repeatable or comma-separated
        #[arg(long = "type", value_name = "TYPE", value_delimiter = ',', value_parser = inspect::parse_find_type)]
        types: Vec<nodekernel_client::NodeType>,
        /// Go at most this many levels below each path
        #[arg(long, value_name = "N")]
        maxdepth: Option<usize>,
        /// Print one JSON array of paths
        #[arg(long)]
        json: bool,
    },
    /// Bytes of data under paths, per container (children first); with
    /// -s, each path's totals from the metadata servers' accounting
    /// (instant, whatever the subtree's size)
    #[command(disable_help_flag = true, after_help = examples::DU)]
    Du {
        /// Paths or wildcard patterns [default: /]
        #[arg(value_name = "PATH")]
        paths: Vec<String>,
        /// Only each path's total, from the accounting (no walk): with
        /// --json also its nodes, blocks per storage class and quota
        #[arg(short, long)]
        summarize: bool,
        /// Sizes in KiB, MiB, GiB instead of bytes
        #[arg(short = 'h', long = "human-readable")]
        human: bool,
        /// The bytes of the cluster the nodes take (blocks, pieces, child
        /// records; with -s, data nodes' blocks and pieces) instead of the
        /// bytes of data
        #[arg(long)]
        stored: bool,
        /// Print a JSON array of {path, bytes, stored, files, containers}
        /// (with -s: {path, type, nodes, bytes, stored, classes, quota})
        #[arg(long)]
        json: bool,
        /// Print help
        #[arg(long, action = clap::ArgAction::Help)]
        help: Option<bool>,
    },
    /// Check a path, for scripts: exit status 0 if the check holds, 1 if
    /// not, 2 on an error
    #[command(after_help = examples::TEST)]
    Test {
        /// The path to check
        #[arg(value_name = "PATH")]
        path: String,
        /// It exists
        #[arg(short = 'e')]
        exists: bool,
        /// It is a container (Directory, Table or Bag)
        #[arg(short = 'd')]
        dir: bool,
        /// It is a File or KeyValue
        #[arg(short = 'f')]
        file: bool,
        /// It is a File or KeyValue of at least one byte
        #[arg(short = 's')]
        non_empty: bool,
        /// It is a File or KeyValue of zero bytes
        #[arg(short = 'z')]
        empty: bool,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    #[command(after_help = examples::COMPLETION)]
    Completion {
        /// The shell to complete for
        shell: clap_complete::Shell,
    },
    /// Key/value commands on Tables
    #[command(subcommand)]
    Kv(KvCmd),
    /// Write a point-in-time copy of a subtree (or /), data and metadata,
    /// into a new or empty local directory
    #[command(after_help = examples::SNAPSHOT)]
    Snapshot {
        /// The subtree to copy (/ for everything)
        path: String,
        /// A local directory that does not exist yet or is empty
        dir: PathBuf,
        /// Print a JSON summary
        #[arg(long)]
        json: bool,
    },
    /// Load a snapshot directory into the cluster at PATH
    #[command(after_help = examples::RESTORE)]
    Restore {
        /// A directory `nk snapshot` wrote
        dir: PathBuf,
        /// Where the snapshot's subtree goes in the cluster
        path: String,
        /// Replace PATH if it exists (for /: everything in it), once the
        /// snapshot is restored whole beside it
        #[arg(long)]
        force: bool,
        /// Print a JSON summary
        #[arg(long)]
        json: bool,
    },
    /// Run a command with cluster directories that live as long as it
    /// does: removed with everything in them when it exits, or when nk run
    /// dies (`docs/lifecycle.md`)
    #[command(after_help = examples::RUN)]
    Run(run::RunArgs),
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
    /// Quotas on the storage and nodes of containers' subtrees
    /// (`docs/lifecycle.md`)
    #[command(subcommand)]
    Quota(quota::QuotaCmd),
    /// Show storage servers, classes, capacity and use, per metadata
    /// partition too; exits 1 (after printing) when a metadata partition
    /// is unreachable
    Status {
        /// Print JSON (the admin endpoint's /status, merged over the partitions)
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
    #[command(after_help = examples::KV_PUT)]
    Put {
        /// TABLE/KEY: the Table must exist
        key: String,
        /// The value as text; - or nothing reads it from stdin
        value: Option<String>,
    },
    /// Print the value of TABLE/KEY
    Get {
        /// TABLE/KEY
        key: String,
    },
    /// List the keys of a table
    Ls {
        /// The Table
        table: String,
        /// Print a JSON array of keys
        #[arg(long)]
        json: bool,
    },
    /// Remove TABLE/KEY
    Rm {
        /// TABLE/KEY
        key: String,
    },
}

/// How `put`, `get` and `cp` copy.
#[derive(clap::Args, Debug, Clone)]
struct CopyFlags {
    /// Overwrite existing destination files (atomically: readers see the
    /// old or the new one whole)
    #[arg(short, long)]
    force: bool,
    /// Copy directories and containers with everything in them
    #[arg(short, long)]
    recursive: bool,
    /// Files copied at once (1 to 64)
    #[arg(long, value_name = "N", default_value_t = copy::DEFAULT_PARALLEL)]
    parallel: usize,
    /// Print a JSON summary when done ({files, directories, bytes,
    /// seconds}); errors as JSON on stderr
    #[arg(long)]
    json: bool,
}

/// Where new cluster files go.
#[derive(clap::Args, Debug, Clone)]
struct PlaceFlags {
    /// Preferred storage class
    #[arg(long, value_name = "CLASS")]
    class: Option<u8>,
    /// Prefer storage servers on this host
    #[arg(long)]
    local_placement: bool,
    /// Tier migration never moves the new files' blocks (e.g. broadcast
    /// data that must stay in DRAM)
    #[arg(long)]
    pinned: bool,
    /// The new files expire this long from now: 90s, 30m, 1h, 2d; or
    /// never (not even under a container's child TTL)
    #[arg(long, value_name = "DURATION", value_parser = common::parse_ttl)]
    ttl: Option<nodekernel_client::Ttl>,
}

impl PlaceFlags {
    fn create_options(&self) -> nodekernel_client::CreateOptions {
        nodekernel_client::CreateOptions {
            storage_class: self.class,
            local: self.local_placement,
            pinned: self.pinned,
            ttl: self.ttl,
            ..Default::default()
        }
    }
}

impl CopyFlags {
    fn options(&self, create: nodekernel_client::CreateOptions) -> copy::CopyOpts {
        copy::CopyOpts {
            force: self.force,
            recursive: self.recursive,
            parallel: self.parallel,
            create,
            json: self.json,
        }
    }
}

/// How much `head` and `tail` print.
#[derive(clap::Args, Debug, Clone)]
struct AmountFlags {
    /// Bytes to print (size units allowed: 1KiB)
    #[arg(short = 'c', long, value_name = "BYTES", value_parser = inspect::parse_count, conflicts_with = "lines")]
    bytes: Option<u64>,
    /// Lines to print
    #[arg(short = 'n', long, value_name = "LINES", default_value_t = 10)]
    lines: u64,
}

impl AmountFlags {
    fn amount(&self) -> inspect::Amount {
        match self.bytes {
            Some(b) => inspect::Amount::Bytes(b),
            None => inspect::Amount::Lines(self.lines),
        }
    }
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
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colour only for a person at a terminal: never in a log file or a
    // pipe, and never with NO_COLOR set (https://no-color.org).
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .init();
}

/// Exit status of a failed command (and of `nk test` when its check does
/// not hold).
const FAILED: u8 = 1;
/// Exit status of a command line `nk` cannot read, and of `nk test` when it
/// cannot tell.
const USAGE: u8 = 2;

/// `nk find` takes `find`'s one-dash spellings too: `-name` is `--name`
/// (after the word `find` only: no other command has such flags).
fn find_spellings(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let mut after_find = false;
    args.into_iter()
        .map(|a| {
            after_find |= a == "find";
            match a.to_str() {
                Some("-name" | "-type" | "-maxdepth") if after_find => {
                    format!("-{}", a.to_string_lossy()).into()
                }
                _ => a,
            }
        })
        .collect()
}

fn main() -> ExitCode {
    // Like other Unix tools, stop quietly when the reader of our output goes
    // away (`nk cat big | head`) instead of failing on a broken pipe.
    // SAFETY: restoring the default disposition of a signal at start-up,
    // before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let args = find_spellings(std::env::args_os().collect());
    // A command given --json gets its errors as JSON too.
    let json = args.iter().any(|a| a == "--json");
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => return usage_error(e, json),
    };
    let server = match &cli.cmd {
        Cmd::Up(_) | Cmd::Meta(_) => true,
        Cmd::Store(a) => a.action.is_none(),
        _ => false,
    };
    let mount = matches!(&cli.cmd, Cmd::Mount(_));
    let test = matches!(&cli.cmd, Cmd::Test { .. });
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
            let e = anyhow::Error::new(e).context("cannot start the async runtime");
            eprintln!("{}", common::error_line(&e, json));
            return ExitCode::from(FAILED);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(status) => ExitCode::from(status),
        Err(e) => {
            eprintln!("{}", common::error_line(&e, json));
            ExitCode::from(if test { USAGE } else { FAILED })
        }
    }
}

/// Help and the version go to stdout as clap prints them; a command line
/// `nk` cannot read is `nk: InvalidArgument: ...` (with clap's usage and
/// tip) and exit status 2.
fn usage_error(e: clap::Error, json: bool) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit();
    }
    let text = e.render().to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text).trim_end();
    let e = common::invalid(text.to_string());
    eprintln!("{}", common::error_line(&e, json));
    ExitCode::from(USAGE)
}

async fn run(cli: Cli) -> anyhow::Result<u8> {
    if let Cmd::Run(a) = &cli.cmd {
        // The command's exit status is nk run's.
        let client = nodekernel_client::Client::connect(cli.client_config()?).await?;
        return run::run(&client, a).await;
    }
    run_command(cli)
        .await
        .map(|holds| if holds { 0 } else { FAILED })
}

/// Runs the command; false only for `nk test` whose check does not hold.
async fn run_command(cli: Cli) -> anyhow::Result<bool> {
    match &cli.cmd {
        Cmd::Up(a) => return servers::up(cli.load_config()?, a).await.map(|()| true),
        Cmd::Meta(a) => {
            return servers::meta(cli.load_config()?, cli.meta.as_deref(), a)
                .await
                .map(|()| true)
        }
        Cmd::Store(a) if a.action.is_none() => {
            let metas = cli.client_config()?.metas;
            return servers::store(cli.load_config()?, metas, a)
                .await
                .map(|()| true);
        }
        Cmd::Bench(a) => return bench::run(cli.client_config()?, a).await.map(|()| true),
        Cmd::Mount(a) => return mount::mount(cli.client_config()?, a).await.map(|()| true),
        Cmd::Umount(a) => return mount::umount(&a.mountpoint, a.lazy).map(|()| true),
        Cmd::Token(TokenCmd::New { file }) => {
            return new_secret(file, "cluster token").map(|()| true)
        }
        Cmd::Key(KeyCmd::New { file }) => return new_secret(file, "encryption key").map(|()| true),
        Cmd::Tls(TlsCmd::New { dir, hosts }) => return new_certificates(dir, hosts).map(|()| true),
        Cmd::Completion { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(*shell, &mut cmd, "nk", &mut std::io::stdout());
            return Ok(true);
        }
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
        Cmd::Ls {
            paths,
            long,
            recursive,
            human,
            directory,
            json,
            help: _,
        } => {
            let opts = fs::LsOpts {
                long,
                recursive,
                human,
                directory,
                json,
            };
            fs::ls(&client, &paths, opts).await?
        }
        Cmd::Mkdir {
            paths,
            parents,
            ty,
            non_enumerable,
            class,
            ttl,
            child_ttl,
        } => {
            let o = fs::MkdirOpts {
                parents,
                ty,
                non_enumerable,
                class,
                ttl,
                child_ttl,
            };
            fs::mkdir(&client, &paths, &o).await?
        }
        Cmd::Expire {
            paths,
            ttl,
            child,
            json,
        } => fs::expire(&client, &paths, &ttl, child, json).await?,
        Cmd::Put {
            sources,
            dest,
            copy: flags,
            place,
        } => {
            let src: Vec<Loc> = sources.into_iter().map(Loc::Local).collect();
            let opts = flags.options(place.create_options());
            let to = Loc::Cluster(paths::norm(&dest));
            copy::copy(&client, "put", &src, &dest, to, &opts).await?
        }
        Cmd::Get {
            sources,
            dest,
            copy: flags,
        } => {
            let src: Vec<Loc> = paths::expand_all(&client, &sources)
                .await?
                .into_iter()
                .map(Loc::Cluster)
                .collect();
            let opts = flags.options(Default::default());
            let dest_arg = dest.to_string_lossy().into_owned();
            copy::copy(&client, "get", &src, &dest_arg, Loc::Local(dest), &opts).await?
        }
        Cmd::Cp {
            sources,
            dest,
            copy: flags,
            place,
        } => {
            let mut src = Vec::new();
            for s in &sources {
                match Loc::parse(s)? {
                    Loc::Cluster(p) => src.extend(
                        paths::expand(&client, &p)
                            .await?
                            .into_iter()
                            .map(Loc::Cluster),
                    ),
                    local => src.push(local),
                }
            }
            let opts = flags.options(place.create_options());
            let to = Loc::parse(&dest)?;
            copy::copy(&client, "cp", &src, &dest, to, &opts).await?
        }
        Cmd::Cat {
            paths,
            reads_in_flight,
        } => fs::cat(&client, &paths, reads_in_flight).await?,
        Cmd::Head { paths, amount } => {
            inspect::peek(&client, &paths, amount.amount(), inspect::End::Head).await?
        }
        Cmd::Tail { paths, amount } => {
            inspect::peek(&client, &paths, amount.amount(), inspect::End::Tail).await?
        }
        Cmd::Rm {
            paths,
            recursive,
            force,
        } => fs::rm(&client, &paths, recursive, force).await?,
        Cmd::Mv {
            sources,
            dest,
            force,
        } => fs::mv(&client, &sources, &dest, force).await?,
        Cmd::Touch { paths, no_create } => fs::touch(&client, &paths, no_create).await?,
        Cmd::Stat {
            paths,
            json,
            blocks,
        } => fs::stat(&client, &paths, json, blocks).await?,
        Cmd::Find {
            paths,
            name,
            types,
            maxdepth,
            json,
        } => {
            let roots = if paths.is_empty() {
                vec!["/".to_string()]
            } else {
                paths
            };
            let o = inspect::FindOpts {
                name,
                types,
                max_depth: maxdepth,
                json,
            };
            inspect::find(&client, &roots, &o).await?
        }
        Cmd::Du {
            paths,
            summarize,
            human,
            stored,
            json,
            help: _,
        } => {
            let roots = if paths.is_empty() {
                vec!["/".to_string()]
            } else {
                paths
            };
            if summarize {
                quota::du_summary(&client, &roots, human, stored, json).await?
            } else {
                inspect::du(&client, &roots, summarize, human, stored, json).await?
            }
        }
        Cmd::Test {
            path,
            exists,
            dir,
            file,
            non_empty,
            empty,
        } => {
            use inspect::Test;
            let t = inspect::one_test(&[
                (exists, Test::Exists),
                (dir, Test::Dir),
                (file, Test::File),
                (non_empty, Test::NonEmpty),
                (empty, Test::Empty),
            ])?;
            return inspect::test(&client, &path, t).await;
        }
        Cmd::Kv(KvCmd::Put { key, value }) => fs::kv_put(&client, &key, value).await?,
        Cmd::Kv(KvCmd::Get { key }) => {
            let src = [Loc::Cluster(paths::norm(&key))];
            let opts = copy::CopyOpts {
                force: false,
                recursive: false,
                parallel: 1,
                create: Default::default(),
                json: false,
            };
            copy::copy(&client, "get", &src, "-", Loc::Local("-".into()), &opts).await?
        }
        Cmd::Kv(KvCmd::Ls { table, json }) => fs::kv_ls(&client, &table, json).await?,
        Cmd::Kv(KvCmd::Rm { key }) => fs::kv_rm(&client, &key).await?,
        Cmd::Snapshot { path, dir, json } => snapshot::snapshot(&client, &path, &dir, json).await?,
        Cmd::Restore {
            dir,
            path,
            force,
            json,
        } => snapshot::restore(&client, &dir, &path, force, json).await?,
        Cmd::Status {
            json,
            wait,
            timeout,
        } => {
            let wait = wait.then(|| std::time::Duration::from_secs(timeout));
            status::status(&client, json, wait).await?
        }
        Cmd::Top {
            interval,
            once,
            json,
        } => top::top(&client, interval, once, json).await?,
        Cmd::Drain {
            server,
            cancel,
            no_wait,
            json,
            stuck_after,
        } => {
            let stuck = std::time::Duration::from_secs(stuck_after);
            drain::drain(&client, &server, cancel, !no_wait, json, stuck).await?
        }
        Cmd::Policy(cmd) => policy::run(&client, cmd).await?,
        Cmd::Quota(cmd) => quota::run(&client, cmd).await?,
        Cmd::Store(servers::StoreArgs {
            action: Some(action),
            ..
        }) => resize::run(&client, action).await?,
        Cmd::Bench(_)
        | Cmd::Run(_)
        | Cmd::Mount(_)
        | Cmd::Umount(_)
        | Cmd::Token(_)
        | Cmd::Tls(_)
        | Cmd::Key(_)
        | Cmd::Completion { .. } => {
            unreachable!("handled above")
        }
        Cmd::Up(_) | Cmd::Meta(_) | Cmd::Store(_) => unreachable!("handled above"),
    }
    Ok(true)
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
