//! What a storage server sets up before it serves: its data directory,
//! its medium, and for a persistent server the decision to keep or
//! discard the blocks of its last run ([`prepare`]); and its data port
//! ([`bind`]).

use crate::config::{DataDirConfig, FileIoConfig, MediumKind, StoreConfig};
use crate::datadir::{self, DataDir, Footprint};
use crate::file::FileMedium;
use crate::medium::{DramMedium, Medium};
use crate::persist::{self, Discarded, GenFile, StoreState};
use crate::StoreError;
use nodekernel_shm::ServerRegion;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// What [`prepare`] set up.
pub(crate) struct Prepared {
    pub(crate) medium: Box<dyn Medium>,
    pub(crate) footprint: Footprint,
    /// The generation file of a persistent file medium.
    pub(crate) gens: Option<GenFile>,
    pub(crate) persist: Option<Persist>,
}

/// A persistent server's state (see [`persist`](crate::persist)).
pub(crate) struct Persist {
    pub(crate) dir: PathBuf,
    /// As written at start (`clean = false`).
    pub(crate) state: StoreState,
    /// Whether the blocks of the last run were kept, or why not.
    pub(crate) kept: std::result::Result<(), Discarded>,
}

impl Persist {
    /// Says whether the blocks of the last run were kept, or why not.
    pub(crate) fn log_kept(&self, num_blocks: u32) {
        let dir = self.dir.display();
        match &self.kept {
            Ok(()) => tracing::info!(
                "storage server in {dir}: kept its {num_blocks} blocks from the last run (incarnation {:016x})",
                self.state.incarnation
            ),
            Err(why @ Discarded::NoState) => {
                tracing::info!("storage server in {dir}: starts empty: {why}")
            }
            Err(why) => tracing::warn!(
                "storage server in {dir}: starts empty, the blocks of its last run are discarded: {why}"
            ),
        }
    }
}

/// Sets up what a server holds on disk and in memory: locks and reads its
/// data directory, then creates the medium (after locking a block file).
/// A persistent server first decides whether to keep its blocks, and
/// writes its state file (`clean = false`) before returning, so before
/// anything can change a block. Blocking work (file system calls,
/// preallocating, prefaulting DRAM): run it off the async workers. On
/// error, the dropped footprint removes what was created.
pub(crate) fn prepare(
    cfg: &StoreConfig,
    num_blocks: u32,
    bytes: u64,
    file_io: &FileIoConfig,
) -> std::result::Result<Prepared, StoreError> {
    let block_size = cfg.block_size;
    let dir = match &cfg.data_dir {
        DataDirConfig::None => None,
        DataDirConfig::At(p) => Some(DataDir::open(p)?),
        DataDirConfig::Private => Some(DataDir::private("store")?),
    };
    let mut footprint = Footprint::new(dir, cfg.persistent);
    let block_path = match &cfg.medium {
        MediumKind::Dram => None,
        MediumKind::File { path } => Some(match footprint.data_dir() {
            Some(d) if path.is_relative() => d.path().join(path),
            _ => path.clone(),
        }),
    };
    if !cfg.persistent {
        if let Some(d) = footprint.data_dir() {
            // A persistent server may have used this directory before: its
            // state file must not vouch for files this server is about to
            // empty or reuse (were it persistent again later).
            let state_path = d.path().join(persist::STATE_FILE);
            persist::remove_state(d.path())
                .map_err(|e| StoreError::io("remove", &state_path, e))?;
        }
        let medium: Box<dyn Medium> = match &block_path {
            None => Box::new(DramMedium::new(block_size, num_blocks)?),
            Some(path) => {
                let m = FileMedium::create_with(path, bytes, file_io)?;
                if let Some(b) = m.footprint() {
                    footprint.set_block_file(b);
                }
                Box::new(m)
            }
        };
        return Ok(Prepared {
            medium,
            footprint,
            gens: None,
            persist: None,
        });
    }
    // Persistent (validated: the data directory is `At`).
    let dir = match footprint.data_dir() {
        Some(d) => d.path().to_path_buf(),
        None => {
            return Err(StoreError::config(
                "persistent",
                "needs a data directory (data_dir)",
            ))
        }
    };
    let settings = persist::Settings {
        dram: block_path.is_none(),
        block_size,
        num_blocks,
    };
    let boot = persist::boot_id();
    let dram_path = dir.join(persist::DRAM_FILE);
    let gens_path = dir.join(persist::GENS_FILE);
    let state_path = dir.join(persist::STATE_FILE);
    let kept = persist::decide(&dir, settings, boot).and_then(|incarnation| {
        let files = match &block_path {
            None => ServerRegion::check_file(&dram_path, block_size, num_blocks),
            Some(path) => persist::check_size(path, bytes.next_multiple_of(crate::file::ALIGN))
                .and_then(|()| persist::check_size(&gens_path, u64::from(num_blocks) * 8)),
        };
        files.map(|()| incarnation).map_err(Discarded::MediumFiles)
    });
    let keep = kept.is_ok();
    if !keep {
        // Before any medium file is emptied: a crash from here on finds no
        // state file, and discards again.
        persist::remove_state(&dir).map_err(|e| StoreError::io("remove", &state_path, e))?;
    }
    let (medium, gens): (Box<dyn Medium>, Option<GenFile>) = match &block_path {
        None => {
            footprint.note_new(&dram_path);
            (
                Box::new(DramMedium::open_file(
                    &dram_path, block_size, num_blocks, keep,
                )?),
                None,
            )
        }
        Some(path) => {
            let m = FileMedium::open_with(path, bytes, file_io, keep)?;
            if let Some(b) = m.footprint() {
                footprint.set_block_file(b);
            }
            footprint.note_new(&gens_path);
            let gens = GenFile::open(&gens_path, num_blocks, keep)?;
            (Box::new(m), Some(gens))
        }
    };
    let incarnation = match &kept {
        Ok(i) => *i,
        Err(_) => datadir::random_incarnation()
            .map_err(|e| StoreError::io("generate an incarnation from", "getrandom", e))?,
    };
    let state = StoreState {
        dram: settings.dram,
        clean: false,
        block_size,
        num_blocks,
        incarnation,
        boot_id: boot.unwrap_or([0; 16]),
    };
    footprint.note_new(&state_path);
    state
        .write(&dir)
        .map_err(|e| StoreError::io("write", &state_path, e))?;
    Ok(Prepared {
        medium,
        footprint,
        gens,
        persist: Some(Persist {
            dir,
            state,
            kept: kept.map(|_| ()),
        }),
    })
}

/// Binds the data port: for a persistent server whose configured port is
/// 0, first the address it had last time (remembered in its data
/// directory), so that clients and metadata servers holding it can carry
/// on; a fresh port if that is taken.
pub(crate) async fn bind(
    cfg: &StoreConfig,
    persist: Option<&Persist>,
) -> std::io::Result<tokio::net::TcpListener> {
    let wanted: Option<SocketAddr> = cfg.listen.parse().ok();
    let remembered = persist.and_then(|p| persist::read_address(&p.dir));
    if let (Some(w), Some(old)) = (wanted, remembered) {
        if w.port() == 0 && w.ip() == old.ip() && old.port() != 0 {
            // The server before us may be closing its listener right now
            // (a restart within one process): give it a moment.
            let mut tries = 0;
            loop {
                match tokio::net::TcpListener::bind(old).await {
                    Ok(l) => return Ok(l),
                    Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && tries < 10 => {
                        tries += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(e) => {
                        tracing::info!(
                            "storage server: its previous address {old} is not free ({e}); taking a new port"
                        );
                        break;
                    }
                }
            }
        }
    }
    tokio::net::TcpListener::bind(&cfg.listen).await
}
