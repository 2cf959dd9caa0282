//! `nk mount` end to end: a cluster of separate `nk` processes, a real
//! FUSE mount, and unmodified programs (sort, tar, git, sqlite3, cc,
//! Python) whose output on the mount must equal their output on tmpfs.
//!
//! FUSE needs `/dev/fuse` and the right to mount (root, or `fusermount3`).
//! Where those are missing the tests say so and pass, unless
//! `NK_REQUIRE_FUSE=1` (set by `scripts/test.sh`, which installs fuse3)
//! makes that a failure.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::common;

use common::{start_role, Proc};

/// Generous bound that only catches hangs.
const HANG: Duration = Duration::from_secs(120);

pub(crate) fn fuse_available() -> bool {
    let ok = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_ok()
        // SAFETY: geteuid cannot fail.
        && (unsafe { libc::geteuid() } == 0 || which("fusermount3"));
    if !ok {
        assert!(
            std::env::var("NK_REQUIRE_FUSE").as_deref() != Ok("1"),
            "NK_REQUIRE_FUSE=1 but FUSE cannot be used here (/dev/fuse, root or fusermount3)"
        );
        eprintln!("skipped: FUSE is not available here (/dev/fuse, root or fusermount3)");
    }
    ok
}

fn which(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A cluster (metadata partitions and storage servers, separate `nk`
/// processes) and a mount of one of its directories.
struct Mounted {
    metas: String,
    config: PathBuf,
    /// Config files and the mount point live here.
    _dir: tempfile::TempDir,
    mnt: PathBuf,
    /// The foreground `nk mount`.
    mount: Option<Child>,
    /// `nk mount --lease`: how long hidden files outlive a dead mount.
    session_lease: &'static str,
    stores: Vec<Proc>,
    _metas: Vec<Proc>,
}

struct Setup {
    partitions: usize,
    /// (class, size) of each storage server.
    stores: Vec<(u8, &'static str)>,
    client_timeout_ms: u64,
    root: &'static str,
    /// `meta.lease_timeout_ms` (0: the default).
    lease_ms: u64,
    /// `nk mount --lease`.
    session_lease: &'static str,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            partitions: 1,
            stores: vec![(0, "256MiB")],
            client_timeout_ms: 120_000,
            root: "/m",
            lease_ms: 0,
            session_lease: "10s",
        }
    }
}

impl Mounted {
    fn start(s: Setup) -> Mounted {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("nk.toml");
        std::fs::write(
            &config,
            format!(
                "[client]\ntimeout_ms = {}\n[meta]\ndead_after_ms = 2000\n",
                s.client_timeout_ms
            ),
        )
        .unwrap();
        let mut metas = Vec::new();
        let mut addrs = Vec::new();
        let lease = match s.lease_ms {
            0 => String::new(),
            ms => format!("lease_timeout_ms = {ms}\n"),
        };
        for p in 0..s.partitions {
            let pc = dir.path().join(format!("meta-{p}.toml"));
            std::fs::write(
                &pc,
                format!(
                    "[meta]\npartition = {p}\npartitions = {}\ndead_after_ms = 2000\nexpect_servers = {}\n{lease}",
                    s.partitions,
                    s.stores.len()
                ),
            )
            .unwrap();
            let (m, addr) = start_role(
                &["meta", "--listen", "127.0.0.1:0"],
                &[("NK_CONFIG", pc.to_str().unwrap())],
                "metadata server listening on",
            );
            metas.push(Proc(m));
            addrs.push(addr);
        }
        let meta = addrs.join(",");
        let stores = s
            .stores
            .iter()
            .map(|(class, size)| {
                let class = class.to_string();
                let (st, _) = start_role(
                    &[
                        "store", "--class", &class, "--medium", "dram", "--size", size,
                    ],
                    &[("NK_META", &meta)],
                    "storage server",
                );
                Proc(st)
            })
            .collect();
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let mut m = Mounted {
            metas: meta,
            config,
            _dir: dir,
            mnt,
            mount: None,
            session_lease: s.session_lease,
            stores,
            _metas: metas,
        };
        m.nk_ok(&["status", "--wait", "--timeout", "120"]);
        if s.root != "/" {
            m.nk_ok(&["mkdir", s.root]);
        }
        m.mount(s.root);
        m
    }

    fn nk(&self, args: &[&str]) -> Command {
        let mut c = common::nk();
        c.args(args)
            .env("NK_META", &self.metas)
            .env("NK_CONFIG", &self.config);
        c
    }

    fn nk_ok(&self, args: &[&str]) -> Vec<u8> {
        let out = self.nk(args).output().unwrap();
        assert!(
            out.status.success(),
            "nk {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// Mounts `root` with a foreground `nk mount`, returning once it says
    /// it is mounted.
    fn mount(&mut self, root: &str) {
        let child = self.spawn_mount(&self.mnt, root);
        self.mount = Some(child);
    }

    /// One more mount of `root`, on a new mount point `name` next to the
    /// first.
    fn extra_mount(&self, name: &str, root: &str) -> ExtraMount {
        let mnt = self.mnt.with_file_name(name);
        std::fs::create_dir(&mnt).unwrap();
        let child = self.spawn_mount(&mnt, root);
        ExtraMount { mnt, child }
    }

    /// Blocks in use on every storage server.
    fn used_blocks(&self) -> u64 {
        let st: serde_json::Value =
            serde_json::from_slice(&self.nk_ok(&["status", "--json"])).unwrap();
        st["servers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["used_blocks"].as_u64().unwrap())
            .sum()
    }

    /// Names in `dir` (hidden ones included: `nk ls` shows every node).
    fn ls(&self, dir: &str) -> String {
        String::from_utf8(self.nk_ok(&["ls", dir])).unwrap()
    }

    fn spawn_mount(&self, mnt: &Path, root: &str) -> Child {
        let mnt = mnt.to_str().unwrap().to_string();
        let mut child = self
            .nk(&[
                "mount",
                &mnt,
                "--root",
                root,
                "--foreground",
                "--lease",
                self.session_lease,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = lines
            .next()
            .expect("nk mount exited before mounting")
            .unwrap();
        assert!(line.starts_with("mounted "), "unexpected: {line}");
        std::thread::spawn(move || for _ in lines {});
        child
    }

    /// Files unlinked while open are gone once closed (the kernel closes
    /// them just after the program does, so this waits a little).
    fn no_unlinked_files_left(&self, dir: &str) {
        let start = Instant::now();
        loop {
            let ls = String::from_utf8(self.nk_ok(&["ls", dir])).unwrap();
            if !ls.contains(".nk-unlinked-") {
                return;
            }
            assert!(start.elapsed() < HANG, "unlinked files are left: {ls}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The KeyValue at `key` reads `old` until it reads `new` (the value
    /// written through the mount replaces the old one at the last close of
    /// a descriptor open for writing, which the kernel sends just after
    /// `close` returns), and never
    /// anything else.
    fn kv_becomes(&self, key: &str, old: &[u8], new: &[u8]) {
        let start = Instant::now();
        loop {
            let got = self.nk_ok(&["kv", "get", key]);
            if got == new {
                return;
            }
            assert_eq!(got, old, "{key}: neither the old nor the new value");
            assert!(start.elapsed() < HANG, "{key}: the new value never showed");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Unmounts with `nk umount` and checks the mount process ends well.
    fn unmount(&mut self) {
        let mnt = self.mnt.to_str().unwrap().to_string();
        self.nk_ok(&["umount", &mnt]);
        let mut child = self.mount.take().expect("mounted");
        let status = wait_exit(&mut child);
        assert!(status.success(), "nk mount ended with {status}");
        assert!(!is_mounted(&self.mnt));
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut c) = self.mount.take() {
            let _ = common::nk()
                .args(["umount", "--lazy"])
                .arg(&self.mnt)
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A mount besides the first, unmounted (lazily) and ended when dropped.
struct ExtraMount {
    mnt: PathBuf,
    child: Child,
}

impl Drop for ExtraMount {
    fn drop(&mut self) {
        let _ = common::nk()
            .args(["umount", "--lazy"])
            .arg(&self.mnt)
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for `cond`, polling; panics only on a hang.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < HANG, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(start.elapsed() < HANG, "the mount process does not end");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn is_mounted(p: &Path) -> bool {
    let p = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(p.to_str().unwrap()))
}

/// A directory on tmpfs (`/dev/shm`, else the temp dir).
fn tmpfs_dir() -> tempfile::TempDir {
    match tempfile::tempdir_in("/dev/shm") {
        Ok(d) => d,
        Err(_) => tempfile::tempdir().unwrap(),
    }
}

/// Runs `script` with `sh -e` in `dir` (with `TMPDIR` there too) and
/// returns its stdout; fails the test on a non-zero exit.
fn sh(dir: &Path, script: &str) -> String {
    let out = Command::new("sh")
        .args(["-ec", script])
        .current_dir(dir)
        .env("TMPDIR", dir)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z")
        .env("HOME", dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "in {}: {script}\nstdout: {}\nstderr: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The same script on the mount and on tmpfs gives the same output.
fn same_as_tmpfs(m: &Mounted, name: &str, script: &str) {
    let on_mount = m.path(name);
    std::fs::create_dir(&on_mount).unwrap();
    let tmp = tmpfs_dir();
    let a = sh(&on_mount, script);
    let b = sh(tmp.path(), script);
    assert!(!b.is_empty(), "{name}: the script printed nothing");
    assert_eq!(a, b, "{name}: output differs between the mount and tmpfs");
}

#[test]
fn unmodified_programs_give_the_same_output_as_on_tmpfs() {
    if !fuse_available() {
        return;
    }
    for tool in ["sort", "tar", "git", "sqlite3", "cc", "python3"] {
        assert!(
            which(tool),
            "{tool} is missing (scripts/test.sh installs it)"
        );
    }
    let m = Mounted::start(Setup::default());
    // sort: a file far larger than its 64 KiB buffer, so it spills
    // temporary files into -T and merges them.
    same_as_tmpfs(
        &m,
        "sort",
        "awk 'BEGIN { for (i = 0; i < 200000; i++) print (i * 7919) % 200003 }' > in.txt
         sort -S 64K -T . in.txt > out.txt
         sort -n -S 64K -T . in.txt | md5sum
         md5sum < out.txt; wc -l < out.txt",
    );
    // tar: create an archive of a source tree on the mount, extract it
    // there, compare the trees.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    same_as_tmpfs(
        &m,
        "tar",
        &format!(
            "mkdir tree && cp -r {} tree/src
             tar -cf t.tar -C tree src
             mkdir out && tar -xf t.tar -C out
             diff -r tree/src out/src
             tar -tf t.tar | sort
             find out -type f | sort | xargs md5sum",
            src.display()
        ),
    );
    // git: a repository on the mount (objects, index, refs, lock files
    // renamed over their targets).
    same_as_tmpfs(
        &m,
        "git",
        "git init -q repo && cd repo
         for i in 1 2 3; do echo line $i >> f.txt; mkdir -p d$i; echo $i > d$i/x; git add -A; git commit -qm c$i; done
         git mv f.txt g.txt && git commit -qm moved
         git gc -q
         git log --format='%H %s'
         git fsck --strict 2>&1
         git status --porcelain
         git cat-file -p HEAD:g.txt",
    );
    // sqlite3: a database with an index (journal files created, written,
    // truncated and deleted).
    same_as_tmpfs(
        &m,
        "sqlite",
        "sqlite3 db.sqlite \"create table t(a integer primary key, b text);
           create index tb on t(b);
           with recursive c(x) as (select 1 union all select x + 1 from c where x < 20000)
             insert into t select x, 'v' || (x * 37 % 1000) from c;
           delete from t where a % 3 = 0;
           update t set b = b || '!' where a % 5 = 0;
           vacuum;
           pragma integrity_check;
           select count(*), min(b), max(b) from t where b like 'v9%';
           select b, count(*) from t indexed by tb group by b order by b limit 5;\"",
    );
    // A C compile whose temporary files go to TMPDIR on the mount.
    same_as_tmpfs(
        &m,
        "cc",
        "printf '#include <stdio.h>\\nint main(void) { for (int i = 0; i < 3; i++) printf(\"%d\\\\n\", i * i); return 0; }\\n' > p.c
         cc -O1 -o p p.c
         ./p
         ls",
    );
    // Python's tempfile (TemporaryFile unlinks a file while it is open).
    same_as_tmpfs(
        &m,
        "py",
        "python3 - <<'EOF'
import os, tempfile
with tempfile.TemporaryFile() as f:
    f.write(b'abc' * 100000); f.seek(0)
    print(len(f.read()), os.listdir('.'))
with tempfile.NamedTemporaryFile(dir='.', delete=True) as f:
    f.write(b'x' * 5000); f.flush()
    print(os.path.getsize(f.name))
with tempfile.SpooledTemporaryFile(max_size=10) as f:
    f.write(b'y' * 100); f.seek(0); print(f.read(3))
d = tempfile.mkdtemp(dir='.')
open(os.path.join(d, 'k'), 'w').write('v')
print(sorted(os.listdir(d))); import shutil; shutil.rmtree(d)
print(sorted(os.listdir('.')))
EOF",
    );
    for dir in ["sort", "tar", "git", "sqlite", "cc", "py"] {
        m.no_unlinked_files_left(&format!("/m/{dir}"));
    }
}

/// One side of the fsx comparison: a file and its open handle.
struct Side {
    dir: PathBuf,
    name: String,
    file: File,
}

impl Side {
    fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }

    fn contents(&self) -> Vec<u8> {
        // A fresh open, so the kernel's cached pages of the mount are
        // dropped and the bytes come from the file system.
        let mut b = Vec::new();
        File::open(self.path())
            .unwrap()
            .read_to_end(&mut b)
            .unwrap();
        b
    }
}

#[test]
fn random_operations_on_the_mount_match_tmpfs_after_every_step() {
    if !fuse_available() {
        return;
    }
    let m = Mounted::start(Setup::default());
    let steps: usize = std::env::var("NK_FSX_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    let seed: u64 = std::env::var("NK_FSX_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed);
    let mut rng = SmallRng::seed_from_u64(seed);
    let tmp = tmpfs_dir();
    let open_new = |dir: &Path, name: &str| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join(name))
            .unwrap()
    };
    let mut sides: Vec<Side> = [m.path(""), tmp.path().to_path_buf()]
        .into_iter()
        .map(|dir| Side {
            file: open_new(&dir, "f0"),
            dir,
            name: "f0".into(),
        })
        .collect();
    // Files up to 3 blocks of 1 MiB, so writes and truncates cross block
    // boundaries; most operations stay near the end.
    const MAX: u64 = 3 << 20;
    let mut counts = [0usize; 7];
    for step in 0..steps {
        let size = sides[1].file.metadata().unwrap().len();
        let op = rng.gen_range(0..100);
        let what = match op {
            0..=39 => {
                let off = if rng.gen_bool(0.5) {
                    rng.gen_range(0..=size.min(MAX))
                } else {
                    (size + rng.gen_range(0..70_000)).min(MAX)
                };
                let len = rng.gen_range(1..=200_000usize);
                let byte = rng.gen::<u8>();
                let data: Vec<u8> = (0..len).map(|i| byte.wrapping_add(i as u8)).collect();
                for s in &sides {
                    s.file.write_all_at(&data, off).unwrap();
                }
                counts[0] += 1;
                format!("write {len} at {off}")
            }
            40..=54 => {
                let to = match rng.gen_range(0..4) {
                    0 => 0,
                    1 => size / 2,
                    2 => rng.gen_range(0..=MAX),
                    _ => size + rng.gen_range(0..100_000),
                };
                for s in &sides {
                    s.file.set_len(to).unwrap();
                }
                counts[1] += 1;
                format!("truncate to {to}")
            }
            55..=74 => {
                let off = rng.gen_range(0..=size + 10);
                let len = rng.gen_range(0..300_000usize);
                let mut got = Vec::new();
                for s in &sides {
                    let mut b = vec![0u8; len];
                    let n = read_at_most(&s.file, &mut b, off);
                    b.truncate(n);
                    got.push(b);
                }
                assert!(
                    got[0] == got[1],
                    "step {step} (seed {seed}): read {len} at {off} differs"
                );
                counts[2] += 1;
                format!("read {len} at {off}")
            }
            75..=84 => {
                let name = format!("f{}", step);
                for s in &mut sides {
                    std::fs::rename(s.path(), s.dir.join(&name)).unwrap();
                    s.name = name.clone();
                }
                counts[3] += 1;
                format!("rename to {name}")
            }
            85..=92 => {
                // Unlink while open: the handle keeps working; then the
                // file comes back under a new name with what the handle
                // still reads.
                for s in &sides {
                    std::fs::remove_file(s.path()).unwrap();
                    assert!(!s.path().exists());
                }
                let data = write_then_read_through_unlinked(&mut sides, &mut rng);
                let name = format!("f{}", step);
                for s in &mut sides {
                    let f = open_new(&s.dir, &name);
                    f.write_all_at(&data, 0).unwrap();
                    s.file = f;
                    s.name = name.clone();
                }
                counts[4] += 1;
                format!("unlink while open, back as {name}")
            }
            93..=96 => {
                for s in &mut sides {
                    s.file.sync_all().unwrap();
                    s.file = OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(s.path())
                        .unwrap();
                }
                counts[5] += 1;
                "fsync and reopen".to_string()
            }
            _ => {
                for s in &sides {
                    s.file.sync_data().unwrap();
                }
                counts[6] += 1;
                "fdatasync".to_string()
            }
        };
        let (a, b) = (sides[0].contents(), sides[1].contents());
        assert_eq!(
            a.len(),
            b.len(),
            "step {step} (seed {seed}) after {what}: sizes differ"
        );
        if let Some(i) = (0..a.len()).find(|i| a[*i] != b[*i]) {
            panic!("step {step} (seed {seed}) after {what}: byte {i} differs");
        }
        let st = std::fs::metadata(sides[0].path()).unwrap();
        assert_eq!(st.len(), b.len() as u64, "step {step}: stat size");
    }
    eprintln!(
        "fsx: {steps} steps, (write, truncate, read, rename, unlink, reopen, fdatasync) = {counts:?}"
    );
    assert!(counts.iter().all(|c| *c > 0) || steps < 500);
    drop(sides);
    m.no_unlinked_files_left("/m");
}

fn read_at_most(f: &File, buf: &mut [u8], off: u64) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], off + n as u64).unwrap() {
            0 => break,
            k => n += k,
        }
    }
    n
}

/// Writes through and reads back the unlinked but open files of both
/// sides; returns what they hold.
fn write_then_read_through_unlinked(sides: &mut [Side], rng: &mut SmallRng) -> Vec<u8> {
    let off = rng.gen_range(0..100_000u64);
    let data = vec![rng.gen::<u8>(); 5000];
    let mut all = Vec::new();
    for s in sides.iter() {
        s.file.write_all_at(&data, off).unwrap();
        let len = s.file.metadata().unwrap().len();
        let mut b = vec![0u8; len as usize];
        assert_eq!(read_at_most(&s.file, &mut b, 0), len as usize);
        all.push(b);
    }
    assert!(all[0] == all[1], "an unlinked open file reads differently");
    all.swap_remove(0)
}

fn errno_of(r: libc::c_int) -> i32 {
    if r == 0 {
        return 0;
    }
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

#[test]
fn what_cannot_be_mapped_fails_with_its_errno() {
    if !fuse_available() {
        return;
    }
    let m = Mounted::start(Setup::default());
    let f = m.path("f");
    std::fs::write(&f, b"data").unwrap();
    let (cf, other) = (cpath(&f), cpath(&m.path("g")));
    // SAFETY (all the libc calls below): valid C strings and buffers.
    unsafe {
        assert_eq!(
            errno_of(libc::link(cf.as_ptr(), other.as_ptr())),
            libc::EPERM,
            "hard link"
        );
        assert_eq!(
            errno_of(libc::symlink(cf.as_ptr(), other.as_ptr())),
            libc::EPERM,
            "symlink"
        );
        assert_eq!(
            errno_of(libc::mknod(other.as_ptr(), libc::S_IFIFO | 0o644, 0)),
            libc::EPERM,
            "FIFO"
        );
        assert_eq!(
            errno_of(libc::mknod(
                other.as_ptr(),
                libc::S_IFCHR | 0o644,
                libc::makedev(1, 3)
            )),
            libc::EPERM,
            "device node"
        );
        assert_eq!(
            errno_of(libc::mknod(other.as_ptr(), libc::S_IFSOCK | 0o644, 0)),
            libc::EPERM,
            "socket"
        );
        let (name, val) = (CString::new("user.k").unwrap(), b"v");
        assert_eq!(
            errno_of(libc::setxattr(
                cf.as_ptr(),
                name.as_ptr(),
                val.as_ptr().cast(),
                1,
                0
            )),
            libc::ENOTSUP,
            "setxattr"
        );
        let mut buf = [0u8; 64];
        assert_eq!(
            libc::getxattr(cf.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 64),
            -1
        );
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ENOTSUP),
            "getxattr"
        );
        assert_eq!(
            libc::listxattr(cf.as_ptr(), buf.as_mut_ptr().cast(), 64),
            -1
        );
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ENOTSUP),
            "listxattr"
        );
        assert_eq!(
            errno_of(libc::removexattr(cf.as_ptr(), name.as_ptr())),
            libc::ENOTSUP,
            "removexattr"
        );
        // A different owner.
        assert_eq!(
            errno_of(libc::chown(cf.as_ptr(), 12345, u32::MAX)),
            libc::EPERM,
            "chown"
        );
        // RENAME_EXCHANGE has no NodeKernel counterpart.
        std::fs::write(m.path("g"), b"g").unwrap();
        assert_eq!(
            errno_of(libc::renameat2(
                libc::AT_FDCWD,
                cf.as_ptr(),
                libc::AT_FDCWD,
                other.as_ptr(),
                libc::RENAME_EXCHANGE
            ) as libc::c_int),
            libc::EINVAL,
            "rename exchange"
        );
        // Space cannot be reserved ahead (posix_fallocate then writes).
        let fd = libc::open(cf.as_ptr(), libc::O_RDWR);
        assert!(fd >= 0);
        assert_eq!(
            errno_of(libc::fallocate(fd, 0, 0, 1 << 20)),
            libc::EOPNOTSUPP,
            "fallocate"
        );
        assert_eq!(
            libc::posix_fallocate(fd, 0, 10_000),
            0,
            "posix_fallocate falls back"
        );
        libc::close(fd);
        // An unnamed temporary file (O_TMPFILE).
        let dir = cpath(&m.path(""));
        assert_eq!(
            libc::open(dir.as_ptr(), libc::O_TMPFILE | libc::O_RDWR, 0o600),
            -1
        );
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EOPNOTSUPP),
            "O_TMPFILE"
        );
    }
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 10_000);
    // A Table holds only KeyValues and a Bag only Files: no directories.
    m.nk_ok(&["mkdir", "--type", "table", "/m/t"]);
    m.nk_ok(&["mkdir", "--type", "bag", "/m/b"]);
    for c in ["t", "b"] {
        let e = std::fs::create_dir(m.path(c).join("sub")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "mkdir in {c}");
    }
    // The usual errors of the usual calls.
    let e = std::fs::remove_dir(&f).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR));
    std::fs::create_dir(m.path("d")).unwrap();
    std::fs::write(m.path("d/x"), b"x").unwrap();
    let e = std::fs::remove_file(m.path("d")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EISDIR));
    let e = std::fs::remove_dir(m.path("d")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY));
    let e = std::fs::rename(m.path("g"), m.path("d")).unwrap_err();
    assert_eq!(
        e.raw_os_error(),
        Some(libc::EISDIR),
        "file over a directory"
    );
    let e = std::fs::read(m.path("nope")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    let long = "n".repeat(256);
    let e = std::fs::write(m.path(&long), b"").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENAMETOOLONG));
}

#[test]
fn a_rename_across_metadata_partitions_is_exdev() {
    if !fuse_available() {
        return;
    }
    let m = Mounted::start(Setup {
        partitions: 2,
        root: "/",
        ..Setup::default()
    });
    // Two top-level names owned by different partitions.
    let names: Vec<String> = (0..64).map(|i| format!("top{i}")).collect();
    let a = names
        .iter()
        .find(|n| nodekernel_proto::path::partition_of(&format!("/{n}"), 2) == 0)
        .unwrap();
    let b = names
        .iter()
        .find(|n| nodekernel_proto::path::partition_of(&format!("/{n}"), 2) == 1)
        .unwrap();
    std::fs::create_dir(m.path(a)).unwrap();
    std::fs::create_dir(m.path(b)).unwrap();
    std::fs::write(m.path(a).join("f"), b"f").unwrap();
    let e = std::fs::rename(m.path(a).join("f"), m.path(b).join("f")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EXDEV));
    // `mv` copies instead, as across file systems.
    let st = Command::new("mv")
        .arg(m.path(a).join("f"))
        .arg(m.path(b).join("f"))
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(std::fs::read(m.path(b).join("f")).unwrap(), b"f");
    // Within a partition, a rename replaces its target atomically.
    std::fs::write(m.path(a).join("x"), b"new").unwrap();
    std::fs::write(m.path(a).join("y"), b"old").unwrap();
    std::fs::rename(m.path(a).join("x"), m.path(a).join("y")).unwrap();
    assert_eq!(std::fs::read(m.path(a).join("y")).unwrap(), b"new");
    assert!(!m.path(a).join("x").exists());
    // Listing the root merges both partitions.
    let mut listed: Vec<String> = std::fs::read_dir(m.path(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    listed.sort();
    let mut want = vec![a.clone(), b.clone()];
    want.sort();
    assert_eq!(listed, want);
}

#[test]
fn sizes_modes_and_times_are_kept_and_statfs_shows_the_cluster() {
    if !fuse_available() {
        return;
    }
    let mut m = Mounted::start(Setup::default());
    let f = m.path("f");
    std::fs::write(&f, vec![7u8; 300_000]).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
    let when = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
    File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_modified(when)
        .unwrap();
    std::fs::create_dir(m.path("d")).unwrap();
    std::fs::set_permissions(m.path("d"), std::fs::Permissions::from_mode(0o700)).unwrap();
    // Through a fresh mount, everything comes from the metadata server.
    m.unmount();
    m.mount("/m");
    let st = std::fs::metadata(&f).unwrap();
    assert_eq!(st.len(), 300_000);
    assert_eq!(st.permissions().mode() & 0o7777, 0o640);
    assert_eq!(st.modified().unwrap(), when);
    let d = std::fs::metadata(m.path("d")).unwrap();
    assert!(d.is_dir());
    assert_eq!(d.permissions().mode() & 0o7777, 0o700);
    // Writing moves the modification time on.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&f)
        .unwrap()
        .write_all_at(b"x", 300_000)
        .unwrap();
    let after = std::fs::metadata(&f).unwrap();
    assert!(after.modified().unwrap() > when);
    assert_eq!(after.len(), 300_001);
    // The same node through the CLI.
    let stat = String::from_utf8(m.nk_ok(&["stat", "/m/f", "--json"])).unwrap();
    assert!(stat.contains("300001"), "{stat}");
    // statfs: the cluster's capacity (one 256 MiB DRAM server).
    let c = cpath(&m.mnt);
    // SAFETY: a valid path and a zeroed statvfs to fill.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut sv) }, 0);
    assert_eq!(sv.f_blocks * sv.f_frsize, 256 << 20);
    assert!(sv.f_bfree < sv.f_blocks, "the file's blocks are in use");
    assert_eq!(sv.f_namemax, 255);
}

#[test]
fn tables_show_keyvalues_as_files_replaced_whole_and_bags_hold_files() {
    if !fuse_available() {
        return;
    }
    let m = Mounted::start(Setup::default());
    m.nk_ok(&["mkdir", "--type", "table", "/m/t"]);
    m.nk_ok(&["kv", "put", "/m/t/k", "old"]);
    assert_eq!(std::fs::read(m.path("t/k")).unwrap(), b"old");
    // A value written through the mount replaces the old one at close,
    // never before: a reader meanwhile gets the whole old value.
    let mut w = File::create(m.path("t/k")).unwrap();
    std::io::Write::write_all(&mut w, b"new value, part one; ").unwrap();
    w.sync_all().unwrap();
    assert_eq!(m.nk_ok(&["kv", "get", "/m/t/k"]), b"old");
    std::io::Write::write_all(&mut w, b"part two").unwrap();
    drop(w);
    m.kv_becomes("/m/t/k", b"old", b"new value, part one; part two");
    // Appending to a value rewrites it whole, too.
    let mut a = OpenOptions::new().append(true).open(m.path("t/k")).unwrap();
    std::io::Write::write_all(&mut a, b"!").unwrap();
    drop(a);
    m.kv_becomes(
        "/m/t/k",
        b"new value, part one; part two",
        b"new value, part one; part two!",
    );
    // New keys, listed as files (once the kernel's release, just after
    // the close, put the value).
    std::fs::write(m.path("t/k2"), b"v2").unwrap();
    let start = Instant::now();
    loop {
        let mut names: Vec<String> = std::fs::read_dir(m.path("t"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        if names == ["k", "k2"] {
            break;
        }
        assert_eq!(names, ["k"], "only the new key may be missing");
        assert!(start.elapsed() < HANG, "the new key never showed");
        std::thread::sleep(Duration::from_millis(10));
    }
    let kv = String::from_utf8(m.nk_ok(&["stat", "/m/t/k2"])).unwrap();
    assert!(kv.contains("KeyValue"), "{kv}");
    // A Bag's files are Files, and reading the Bag concatenates them.
    m.nk_ok(&["mkdir", "--type", "bag", "/m/b"]);
    std::fs::write(m.path("b/1"), b"one,").unwrap();
    std::fs::write(m.path("b/2"), b"two").unwrap();
    assert_eq!(m.nk_ok(&["cat", "/m/b"]), b"one,two");
    let f = String::from_utf8(m.nk_ok(&["stat", "/m/b/1"])).unwrap();
    assert!(f.contains("File"), "{f}");
}

#[test]
fn a_dead_storage_server_gives_eio_on_its_files_only_and_the_mount_unmounts_cleanly() {
    if !fuse_available() {
        return;
    }
    let mut m = Mounted::start(Setup {
        stores: vec![(0, "64MiB"), (1, "64MiB")],
        client_timeout_ms: 3000,
        ..Setup::default()
    });
    // One directory's files on each server (classes are inherited).
    m.nk_ok(&["mkdir", "--class", "0", "/m/a"]);
    m.nk_ok(&["mkdir", "--class", "1", "/m/b"]);
    let data = vec![3u8; 3 << 20];
    std::fs::write(m.path("a/f"), &data).unwrap();
    std::fs::write(m.path("b/f"), &data).unwrap();
    let before = Instant::now();
    let mut store0 = m.stores.remove(0);
    store0.0.kill().unwrap();
    store0.0.wait().unwrap();
    // Each read is a fresh open (the kernel's cached pages do not
    // answer). For a moment the mount may still read the dead server's
    // memory it has mapped (the right bytes: nobody else can write them);
    // then, within the client timeout, EIO.
    let e = loop {
        match std::fs::read(m.path("a/f")) {
            Ok(got) => assert!(
                got == data,
                "a read of a dead server's file gave wrong bytes"
            ),
            Err(e) => break e,
        }
        assert!(
            before.elapsed() < HANG,
            "reads of a dead server's file never fail"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    eprintln!("EIO after {:?}", before.elapsed());
    // Everything else goes on.
    assert_eq!(std::fs::read(m.path("b/f")).unwrap(), data);
    std::fs::write(m.path("b/g"), b"still writable").unwrap();
    assert_eq!(std::fs::read(m.path("b/g")).unwrap(), b"still writable");
    let listed = std::fs::read_dir(m.path("a")).unwrap().count();
    assert_eq!(listed, 1);
    m.unmount();
    drop(store0);
}

#[test]
fn sigterm_unmounts_cleanly_and_keeps_what_was_written() {
    if !fuse_available() {
        return;
    }
    let mut m = Mounted::start(Setup::default());
    std::fs::write(m.path("kept"), b"written before the signal").unwrap();
    // Unmounting while a file is open is refused (nk umount), or lazy.
    let open = File::open(m.path("kept")).unwrap();
    let mnt = m.mnt.to_str().unwrap().to_string();
    let out = m.nk(&["umount", &mnt]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("busy"));
    drop(open);
    let child = m.mount.as_mut().unwrap();
    // SAFETY: signalling a child we own.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = wait_exit(child);
    m.mount = None;
    assert!(status.success(), "nk mount ended with {status}");
    assert!(!is_mounted(&m.mnt));
    assert_eq!(m.nk_ok(&["cat", "/m/kept"]), b"written before the signal");
    // A background mount returns once ready and `nk umount` ends it.
    let out = m.nk(&["mount", &mnt, "--root", "/m"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("mounted /m at"));
    assert_eq!(
        std::fs::read(m.path("kept")).unwrap(),
        b"written before the signal"
    );
    m.nk_ok(&["umount", &mnt]);
    assert!(!is_mounted(&m.mnt));
    // Mounting something that is not a container is refused, saying so.
    let out = m
        .nk(&["mount", &mnt, "--root", "/m/kept"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a Directory"));
}

/// Issue 36, defect 8: files unlinked while open through a mount that is
/// then killed (SIGKILL) are hidden there for good unless someone removes
/// them. A live mount keeps its hidden files' write leases, so another
/// mount of the same subtree leaves those alone (its start-up walk and its
/// `rmdir`, for several leases); once the mount is dead, `rmdir` of their
/// directory through another mount removes them (instead of `ENOTEMPTY`),
/// so does the next mount of the subtree as it starts, and `nk rm -r`; and
/// their blocks come back.
#[test]
fn hidden_files_of_a_killed_mount_are_removed_and_a_live_mounts_stay() {
    if !fuse_available() {
        return;
    }
    const LEASE_MS: u64 = 1000;
    let mut m = Mounted::start(Setup {
        lease_ms: LEASE_MS,
        // The mount's session outlives the test: what is tested here is
        // what removes a dead mount's hidden files without one (a mount
        // whose session could not be opened, or a dead mount's files
        // before its session lapses).
        session_lease: "1h",
        ..Setup::default()
    });
    // Another mount of the same subtree, up before anything is hidden.
    let other = m.extra_mount("other", "/m");
    m.nk_ok(&["mkdir", "--type", "table", "/m/t"]);
    m.nk_ok(&["kv", "put", "/m/t/keep", "stays"]);
    // Containers keep the record pieces their children took: /m's for
    // t and the three directories below, t's for a second key, taken
    // (and left free) before the count.
    for w in ["w1", "w2", "w3"] {
        m.nk_ok(&["mkdir", &format!("/m/{w}")]);
    }
    m.nk_ok(&["kv", "put", "/m/t/w", "x"]);
    for w in ["w1", "w2", "w3"] {
        m.nk_ok(&["rm", "-r", &format!("/m/{w}")]);
    }
    m.nk_ok(&["kv", "rm", "/m/t/w"]);
    let before = m.used_blocks();
    let data: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    let mut open = Vec::new();
    for d in ["d1", "d2", "d3"] {
        std::fs::create_dir(m.path(d)).unwrap();
        let p = m.path(&format!("{d}/f"));
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        std::io::Write::write_all(&mut f, &data).unwrap();
        f.sync_all().unwrap();
        std::fs::remove_file(&p).unwrap();
        open.push(f);
    }
    // A KeyValue open only for reading, unlinked too.
    std::fs::write(m.path("t/k"), b"a value").unwrap();
    let k = File::open(m.path("t/k")).unwrap();
    std::fs::remove_file(m.path("t/k")).unwrap();
    open.push(k);
    for d in ["/m/d1", "/m/d2", "/m/d3", "/m/t"] {
        assert!(m.ls(d).contains(".nk-unlinked-"), "{d}: {}", m.ls(d));
    }
    // A third mount starts while they are open (its start-up walk meets
    // them, and looks again after a lease), and the other mount's rmdir
    // tries: for several leases, nothing of the live mount goes.
    let third = m.extra_mount("third", "/m");
    std::thread::sleep(Duration::from_millis(4 * LEASE_MS));
    let e = std::fs::remove_dir(other.mnt.join("d1")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY), "{e}");
    for d in ["/m/d1", "/m/d2", "/m/d3", "/m/t"] {
        assert!(m.ls(d).contains(".nk-unlinked-"), "{d}: {}", m.ls(d));
    }
    for f in &open[..3] {
        let mut buf = vec![0u8; data.len()];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert!(buf == data, "an unlinked open file reads back");
    }
    drop(third);
    // The mount dies.
    let mut child = m.mount.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    drop(open);
    m.nk_ok(&["umount", "--lazy", m.mnt.to_str().unwrap()]);
    // rmdir through the other mount (its start-up walk long done) removes
    // d1 once the dead mount's lease ran out.
    eventually(
        "rmdir to remove d1 and the dead mount's hidden file",
        || match std::fs::remove_dir(other.mnt.join("d1")) {
            Ok(()) => true,
            Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => false,
            Err(e) => panic!("rmdir d1: {e}"),
        },
    );
    assert!(!m.ls("/m").contains("d1"), "{}", m.ls("/m"));
    // `nk rm -r` removes a directory with one.
    assert!(m.ls("/m/d3").contains(".nk-unlinked-"));
    m.nk_ok(&["rm", "-r", "/m/d3"]);
    // The next mount of the subtree removes d2's and t's as it starts.
    m.mount("/m");
    eventually("the next mount to remove the hidden files", || {
        !m.ls("/m/d2").contains(".nk-unlinked-") && !m.ls("/m/t").contains(".nk-unlinked-")
    });
    std::fs::remove_dir(m.path("d2")).unwrap();
    eventually("every block of the hidden files to come back", || {
        m.used_blocks() == before
    });
    drop(other);
    m.unmount();
}

/// Issue 41: files a mount hid (unlinked while open) are bound to the
/// mount's session, so when the mount is killed they are removed once its
/// lease lapses, with no other mount or rmdir to find them; the rest stays.
#[test]
fn a_killed_mounts_hidden_files_go_when_its_session_lapses() {
    if !fuse_available() {
        return;
    }
    let mut m = Mounted::start(Setup {
        session_lease: "3s",
        ..Setup::default()
    });
    std::fs::create_dir(m.path("d")).unwrap();
    std::fs::write(m.path("d/keep"), b"stays").unwrap();
    let p = m.path("d/f");
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    std::io::Write::write_all(&mut f, b"unlinked while open").unwrap();
    f.sync_all().unwrap();
    std::fs::remove_file(&p).unwrap();
    assert!(m.ls("/m/d").contains(".nk-unlinked-"), "{}", m.ls("/m/d"));
    // Alive, the mount renews its session: its hidden file stays.
    std::thread::sleep(Duration::from_millis(4_000));
    assert!(m.ls("/m/d").contains(".nk-unlinked-"), "{}", m.ls("/m/d"));
    let mut child = m.mount.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    drop(f);
    m.nk_ok(&["umount", "--lazy", m.mnt.to_str().unwrap()]);
    eventually("the dead mount's hidden file to go", || {
        !m.ls("/m/d").contains(".nk-unlinked-")
    });
    assert_eq!(m.nk_ok(&["cat", "/m/d/keep"]), b"stays");
}

/// A file of a Table (a KeyValue) unlinked while open for writing stays
/// unlinked: its new value is dropped at the last close instead of being
/// put back under the name.
#[test]
fn a_keyvalue_unlinked_while_written_does_not_come_back() {
    if !fuse_available() {
        return;
    }
    let mut m = Mounted::start(Setup::default());
    m.nk_ok(&["mkdir", "--type", "table", "/m/t"]);
    m.nk_ok(&["kv", "put", "/m/t/k", "old"]);
    let mut f = OpenOptions::new().append(true).open(m.path("t/k")).unwrap();
    std::fs::remove_file(m.path("t/k")).unwrap();
    std::io::Write::write_all(&mut f, b" and new").unwrap();
    drop(f);
    m.no_unlinked_files_left("/m/t");
    assert_eq!(m.ls("/m/t"), "", "the unlinked key stays gone");
    assert!(std::fs::metadata(m.path("t/k")).is_err());
    m.unmount();
}

/// A KeyValue's new value replaces the old one when the last descriptor
/// open for writing closes, even while another keeps it open for reading
/// (a reader that opens it just after the writer closed, as `cat` after
/// `echo >` does, must not hold the value back); the reader reads the new
/// value, and a later write starts a newer one. A new key still open for
/// writing can be unlinked (nothing is at its name yet), and its value
/// never shows.
#[test]
fn a_keyvalue_is_published_when_its_writers_close_while_readers_stay() {
    if !fuse_available() {
        return;
    }
    let mut m = Mounted::start(Setup::default());
    m.nk_ok(&["mkdir", "--type", "table", "/m/t"]);
    m.nk_ok(&["kv", "put", "/m/t/k", "old"]);
    let r = File::open(m.path("t/k")).unwrap();
    std::fs::write(m.path("t/k"), b"new").unwrap();
    m.kv_becomes("/m/t/k", b"old", b"new");
    let mut buf = [0u8; 16];
    let n = r.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"new", "the reader reads the published value");
    let mut a = OpenOptions::new().append(true).open(m.path("t/k")).unwrap();
    std::io::Write::write_all(&mut a, b"er").unwrap();
    drop(a);
    m.kv_becomes("/m/t/k", b"new", b"newer");
    let n = r.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"newer");
    drop(r);
    // A new key, unlinked while its first value is written.
    let mut c = File::create(m.path("t/fresh")).unwrap();
    std::io::Write::write_all(&mut c, b"never seen").unwrap();
    std::fs::remove_file(m.path("t/fresh")).unwrap();
    assert!(std::fs::metadata(m.path("t/fresh")).is_err());
    std::io::Write::write_all(&mut c, b", still").unwrap();
    drop(c);
    m.no_unlinked_files_left("/m/t");
    assert_eq!(m.ls("/m/t"), "k\n", "only the first key is there");
    assert_eq!(m.nk_ok(&["kv", "get", "/m/t/k"]), b"newer");
    m.unmount();
}
