//! `nk bench zipf`: a skewed read/write workload over a set of files, for
//! tier migration. Every operation picks a file by a Zipf distribution
//! (rank r with weight 1/r^s) and reads it whole (lookup + read) or, with
//! the write share, replaces it with a fresh put of the same size (new
//! blocks). Which file has which rank is a seeded shuffle, so the hot
//! files are not simply the ones created first (which would sit in the
//! fastest class from the start). The report adds the bytes the measured
//! reads got from each storage class (the client's
//! `DataPathStats::read_bytes_by_class`) and the blocks tier migration
//! moved.

use anyhow::bail;
use nodekernel_client::{Client, CreateOptions, NodeType};
use nodekernel_cluster::ByteSize;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// Files a run may have (the sampler holds one `f64` per file).
const MAX_FILES: u64 = 1 << 26;

/// Files when neither `--files` nor `--data` is given.
const DEFAULT_FILES: u64 = 1000;

/// A Zipf sampler over ranks `0..n` (0 the most frequent): the normalized
/// cumulative weights, searched with a uniform draw.
pub(super) struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// Ranks `0..n`, rank `r` with weight `1 / (r + 1)^exponent`.
    pub(super) fn new(n: u64, exponent: f64) -> anyhow::Result<Zipf> {
        if n == 0 || n > MAX_FILES {
            bail!("zipf: between 1 and {MAX_FILES} files, not {n}");
        }
        if !exponent.is_finite() || exponent < 0.0 {
            bail!("--zipf must be a finite exponent of at least 0, not {exponent}");
        }
        let mut sum = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|r| {
                sum += (r as f64).powf(-exponent);
                sum
            })
            .collect();
        for c in &mut cdf {
            *c /= sum;
        }
        Ok(Zipf { cdf })
    }

    /// One rank.
    pub(super) fn sample(&self, rng: &mut impl Rng) -> usize {
        let u: f64 = rng.gen();
        // The first rank whose cumulative weight passes u (rounding may
        // leave the last one a hair under 1).
        self.cdf
            .partition_point(|&c| c <= u)
            .min(self.cdf.len() - 1)
    }
}

/// The files of a run and how operations pick them.
pub(super) struct Workload {
    zipf: Zipf,
    /// The file of each rank.
    file_of_rank: Vec<u64>,
    write_share: f64,
    /// The Table that holds the files.
    table: String,
    pub(super) exponent: f64,
}

/// The number of files: `--files`, else `--data` / `--size`, else
/// [`DEFAULT_FILES`].
pub(super) fn file_count(files: Option<u64>, data: Option<ByteSize>, size: u64) -> u64 {
    files.unwrap_or_else(|| data.map_or(DEFAULT_FILES, |d| d.0 / size.max(1)))
}

impl Workload {
    /// `files` files in a Table at `table`; ranks shuffled with `seed`.
    pub(super) fn new(
        table: String,
        files: u64,
        exponent: f64,
        write_share: f64,
        seed: u64,
    ) -> anyhow::Result<Workload> {
        if !(0.0..=1.0).contains(&write_share) {
            bail!("--write-share must be between 0 and 1, not {write_share}");
        }
        let zipf = Zipf::new(files, exponent)?;
        let mut file_of_rank: Vec<u64> = (0..files).collect();
        file_of_rank.shuffle(&mut rand::rngs::SmallRng::seed_from_u64(seed));
        Ok(Workload {
            zipf,
            file_of_rank,
            write_share,
            table,
            exponent,
        })
    }

    pub(super) fn files(&self) -> u64 {
        self.file_of_rank.len() as u64
    }

    pub(super) fn write_share(&self) -> f64 {
        self.write_share
    }

    fn path(&self, file: u64) -> String {
        format!("{}/f{file}", self.table)
    }

    /// Creates the Table and every file, `value` in each.
    pub(super) async fn create(
        &self,
        c: &Client,
        opts: &CreateOptions,
        value: &[u8],
    ) -> anyhow::Result<()> {
        c.create(&self.table, NodeType::Table, opts.clone()).await?;
        for f in 0..self.files() {
            c.put(&self.path(f), value).await?;
        }
        Ok(())
    }

    /// One operation: a whole-file read, or (write share) a replacing put.
    pub(super) async fn op(
        &self,
        c: &Client,
        rng: &mut impl Rng,
        value: &[u8],
    ) -> nodekernel_client::Result<()> {
        let rank = self.zipf.sample(rng);
        let path = self.path(self.file_of_rank.get(rank).copied().unwrap_or(0));
        if rng.gen_bool(self.write_share) {
            return c.put(&path, value).await;
        }
        let got = c.get(&path).await?;
        if got.len() != value.len() {
            return Err(nodekernel_client::Error::internal(format!(
                "zipf: {path} has {} bytes instead of {}",
                got.len(),
                value.len()
            )));
        }
        Ok(())
    }
}

/// Blocks tier migration moved so far, over every class.
#[derive(Clone, Copy, Default)]
pub(super) struct Moves {
    demoted: u64,
    promoted: u64,
}

impl Moves {
    pub(super) async fn now(c: &Client) -> anyhow::Result<Moves> {
        let s = c.status().await?;
        Ok(s.moves.iter().fold(Moves::default(), |m, c| Moves {
            demoted: m.demoted + c.demoted,
            promoted: m.promoted + c.promoted,
        }))
    }

    fn since(self, before: Moves) -> Moves {
        Moves {
            demoted: self.demoted.saturating_sub(before.demoted),
            promoted: self.promoted.saturating_sub(before.promoted),
        }
    }
}

/// The zipf part of a report (`--json`: the `zipf` object).
#[derive(Serialize, Clone, Debug)]
pub struct ZipfReport {
    pub files: u64,
    /// Files x size.
    pub data_bytes: u64,
    pub exponent: f64,
    pub write_share: f64,
    /// Bytes the measured reads got from each storage class: classes 0
    /// (DRAM), 1, 2, and 3 and up.
    pub read_bytes_by_class: [u64; 4],
    /// Share of the measured read bytes that class 0 (DRAM) served, 0 to 1.
    pub dram_read_share: f64,
    /// Blocks tier migration moved down / up while the files were created.
    pub setup_blocks_demoted: u64,
    pub setup_blocks_promoted: u64,
    /// Blocks moved down / up during the warm-up and measured operations.
    pub blocks_demoted: u64,
    pub blocks_promoted: u64,
}

impl ZipfReport {
    /// `moves`: before the files were created, after, and at the end.
    pub(super) fn new(
        w: &Workload,
        size: u64,
        read_bytes_by_class: [u64; 4],
        moves: [Moves; 3],
    ) -> ZipfReport {
        let read: u64 = read_bytes_by_class.iter().sum();
        let setup = moves[1].since(moves[0]);
        let run = moves[2].since(moves[1]);
        ZipfReport {
            files: w.files(),
            data_bytes: w.files().saturating_mul(size),
            exponent: w.exponent,
            write_share: w.write_share(),
            read_bytes_by_class,
            dram_read_share: if read > 0 {
                read_bytes_by_class[0] as f64 / read as f64
            } else {
                0.0
            },
            setup_blocks_demoted: setup.demoted,
            setup_blocks_promoted: setup.promoted,
            blocks_demoted: run.demoted,
            blocks_promoted: run.promoted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(n: u64, exponent: f64, draws: usize) -> Vec<u64> {
        let z = Zipf::new(n, exponent).unwrap();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut seen = vec![0u64; n as usize];
        for _ in 0..draws {
            seen[z.sample(&mut rng)] += 1;
        }
        seen
    }

    #[test]
    fn rank_one_is_the_most_frequent_and_frequencies_follow_the_exponent() {
        for s in [0.99, 1.5] {
            let draws = 400_000;
            let seen = counts(100, s, draws);
            let top = seen.iter().max().unwrap();
            assert_eq!(seen[0], *top, "s={s}: {:?}", &seen[..5]);
            // f(r) / f(1) = r^-s: compare ranks 2, 4 and 10 with rank 1
            // (within 10% of the expected ratio).
            for r in [2usize, 4, 10] {
                let got = seen[r - 1] as f64 / seen[0] as f64;
                let want = (r as f64).powf(-s);
                assert!(
                    (got / want - 1.0).abs() < 0.1,
                    "s={s}, rank {r}: {got:.4} vs {want:.4}"
                );
            }
            // Log-log slope over ranks 1..20 near -s.
            let pts: Vec<(f64, f64)> = (1..=20)
                .map(|r| ((r as f64).ln(), (seen[r - 1] as f64).ln()))
                .collect();
            let n = pts.len() as f64;
            let (mx, my) = (
                pts.iter().map(|p| p.0).sum::<f64>() / n,
                pts.iter().map(|p| p.1).sum::<f64>() / n,
            );
            let slope = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum::<f64>()
                / pts.iter().map(|p| (p.0 - mx).powi(2)).sum::<f64>();
            assert!((slope + s).abs() < 0.1, "s={s}: slope {slope:.3}");
        }
    }

    #[test]
    fn every_rank_is_reachable_and_bad_parameters_are_refused() {
        // Exponent 0: uniform.
        let seen = counts(10, 0.0, 100_000);
        assert!(
            seen.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{seen:?}"
        );
        assert_eq!(counts(1, 0.99, 10), vec![10]);
        assert!(Zipf::new(0, 0.99).is_err());
        assert!(Zipf::new(10, f64::NAN).is_err());
        assert!(Zipf::new(10, -1.0).is_err());
        assert!(Workload::new("/t".into(), 10, 0.99, 1.5, 1).is_err());
        let w = Workload::new("/t".into(), 50, 0.99, 0.1, 1).unwrap();
        let mut ranks = w.file_of_rank.clone();
        ranks.sort();
        assert_eq!(ranks, (0..50).collect::<Vec<_>>(), "a permutation");
        assert_eq!(file_count(Some(7), None, 4), 7);
        assert_eq!(file_count(None, Some(ByteSize(256 << 20)), 1 << 20), 256);
        assert_eq!(file_count(None, None, 1), DEFAULT_FILES);
    }
}
