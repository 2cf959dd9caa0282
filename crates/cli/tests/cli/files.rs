//! The everyday file commands (`docs/cli.md`), each run as its own `nk`
//! process against a cluster the test starts: copies in and out and
//! inside the cluster, listings, several paths and wildcards, `find`,
//! `du`, `test`, `head`/`tail`, completion, and one error format.

use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use crate::cli::Up;
use crate::common::{client, succeeds};

/// A cluster and a local working directory the commands run in.
struct Env {
    up: Up,
    dir: tempfile::TempDir,
}

impl Env {
    fn start() -> Env {
        Env {
            up: Up::start(&[]),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn write(&self, p: &str, data: &[u8]) {
        let p = self.path(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }

    fn read(&self, p: &str) -> Vec<u8> {
        std::fs::read(self.path(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
    }

    /// `nk ARGS` in the working directory.
    fn nk(&self, args: &[&str]) -> Output {
        client(&self.up.meta)
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .unwrap()
    }

    /// `nk ARGS` with `input` on stdin.
    fn nk_stdin(&self, args: &[&str], input: &[u8]) -> Output {
        let mut child = client(&self.up.meta)
            .args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().unwrap()
    }

    /// Runs and checks success; returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = succeeds(
            client(&self.up.meta)
                .args(args)
                .current_dir(self.dir.path()),
        );
        String::from_utf8(out).unwrap()
    }

    /// Runs and checks it fails with exit status 1 and one line `nk:
    /// CODE: message` on stderr; returns the message.
    fn fails(&self, args: &[&str], code: &str) -> String {
        failed_with(&self.nk(args), args, code, 1)
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.ok(args);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("nk {args:?}: {e}: {out}"))
    }

    fn cluster_bytes(&self, path: &str) -> Vec<u8> {
        let out = self.nk(&["cat", path]);
        assert!(out.status.success(), "cat {path}: {out:?}");
        out.stdout
    }

    fn exists(&self, path: &str) -> bool {
        let out = self.nk(&["test", "-e", path]);
        match out.status.code() {
            Some(0) => true,
            Some(1) => false,
            other => panic!("nk test -e {path}: {other:?} {out:?}"),
        }
    }
}

/// Checks `out` failed with `status` and printed `nk: CODE: message` on
/// stderr (log warnings may come before it, a usage error's usage lines
/// after it); returns the message.
fn failed_with(out: &Output, args: &[&str], code: &str, status: i32) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(status),
        "nk {args:?}: exit status; stderr: {err}"
    );
    let last = err
        .lines()
        .rfind(|l| l.starts_with("nk: "))
        .unwrap_or_default();
    let prefix = format!("nk: {code}: ");
    assert!(
        last.starts_with(&prefix),
        "nk {args:?}: expected `{prefix}...`, got: {err}"
    );
    last[prefix.len()..].to_string()
}

fn names(listing: &str) -> Vec<&str> {
    listing.lines().collect()
}

/// Every file below `root`, as (relative path, bytes), sorted.
fn local_tree(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(d) = pending.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                pending.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn put_copies_files_and_trees_in_and_refuses_to_overwrite_without_f() {
    let e = Env::start();
    e.write("a.csv", b"first");
    e.write("b.csv", b"bee");
    e.ok(&["put", "a.csv", "/a"]);
    assert_eq!(e.cluster_bytes("/a"), b"first");
    // An existing File is replaced only with -f, and the error says so.
    e.write("a.csv", b"second");
    let msg = e.fails(&["put", "a.csv", "/a"], "AlreadyExists");
    assert!(msg.contains("/a exists") && msg.contains("-f"), "{msg}");
    assert_eq!(
        e.cluster_bytes("/a"),
        b"first",
        "a refused put changes nothing"
    );
    e.ok(&["put", "-f", "a.csv", "/a"]);
    assert_eq!(e.cluster_bytes("/a"), b"second");
    // Into an existing container, each under its own name; several need one.
    e.ok(&["mkdir", "/in"]);
    e.ok(&["put", "a.csv", "b.csv", "/in"]);
    assert_eq!(names(&e.ok(&["ls", "/in"])), ["a.csv", "b.csv"]);
    e.fails(&["put", "a.csv", "b.csv", "/a"], "TypeMismatch");
    e.fails(&["put", "a.csv", "b.csv", "/missing"], "NotFound");
    e.fails(&["put", "a.csv", "/missing/"], "NotFound");
    e.fails(&["put", "nothing.csv", "/x"], "NotFound");
    // A directory needs -r, then comes whole, its nesting kept.
    e.write("tree/top.txt", b"top");
    e.write("tree/sub/deep.txt", b"deep");
    e.write("tree/sub/empty.txt", b"");
    let msg = e.fails(&["put", "tree", "/tree"], "InvalidArgument");
    assert!(msg.contains("-r"), "{msg}");
    let summary = e.json(&["put", "-r", "--parallel", "2", "--json", "tree", "/tree"]);
    assert_eq!(summary["files"], 3, "{summary}");
    assert_eq!(summary["directories"], 2, "{summary}");
    assert_eq!(summary["bytes"], 7, "{summary}");
    assert_eq!(e.cluster_bytes("/tree/sub/deep.txt"), b"deep");
    assert_eq!(e.cluster_bytes("/tree/sub/empty.txt"), b"");
    // Into an existing container, the directory keeps its name.
    e.ok(&["put", "-r", "tree", "/in/"]);
    assert_eq!(e.cluster_bytes("/in/tree/top.txt"), b"top");
    // Its files exist now: again only with -f.
    e.fails(&["put", "-r", "tree", "/in/"], "AlreadyExists");
    e.ok(&["put", "-r", "-f", "tree", "/in/"]);
    e.fails(
        &["put", "--parallel", "0", "a.csv", "/p0"],
        "InvalidArgument",
    );
    // stdin, of a size not known in advance.
    let out = e.nk_stdin(&["put", "-", "/stdin"], b"piped bytes");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(e.cluster_bytes("/stdin"), b"piped bytes");
    // No hidden copy is left behind anywhere.
    let all = e.ok(&["find", "/"]);
    assert!(!all.contains("nk-copying"), "{all}");
    // A copy into a Table makes KeyValues.
    e.ok(&["mkdir", "--type", "table", "/t"]);
    e.ok(&["put", "b.csv", "/t/"]);
    assert_eq!(e.ok(&["kv", "get", "/t/b.csv"]), "bee");
    assert_eq!(e.json(&["stat", "/t/b.csv", "--json"])["type"], "KeyValue");
}

#[test]
fn get_copies_into_directories_and_trees_out() {
    let e = Env::start();
    e.write("src.txt", b"payload");
    e.ok(&["put", "src.txt", "/f"]);
    // Into the current directory and into an existing one, by name.
    e.ok(&["get", "/f", "./"]);
    assert_eq!(e.read("f"), b"payload");
    std::fs::create_dir(e.path("d1")).unwrap();
    e.ok(&["get", "/f", "d1/"]);
    assert_eq!(e.read("d1/f"), b"payload");
    e.ok(&["get", "-f", "/f", "d1"]);
    e.fails(&["get", "/f", "nodir/"], "NotFound");
    // An existing local file is replaced only with -f.
    let msg = e.fails(&["get", "/f", "f"], "AlreadyExists");
    assert!(msg.contains("-f"), "{msg}");
    e.write("src.txt", b"newer");
    e.ok(&["put", "-f", "src.txt", "/f"]);
    e.ok(&["get", "-f", "/f", "f"]);
    assert_eq!(e.read("f"), b"newer");
    // To stdout.
    assert_eq!(e.ok(&["get", "/f", "-"]), "newer");
    // Trees, with -r.
    e.ok(&["mkdir", "-p", "/tree/sub"]);
    e.ok(&["put", "src.txt", "/tree/a.txt"]);
    e.ok(&["put", "src.txt", "/tree/sub/b.txt"]);
    let msg = e.fails(&["get", "/tree", "out"], "InvalidArgument");
    assert!(msg.contains("-r"), "{msg}");
    e.ok(&["get", "-r", "/tree", "out"]);
    assert_eq!(
        local_tree(&e.path("out")),
        [
            ("a.txt".to_string(), b"newer".to_vec()),
            ("sub/b.txt".to_string(), b"newer".to_vec())
        ]
    );
    // Wildcards, quoted as a user would.
    std::fs::create_dir(e.path("parts")).unwrap();
    e.ok(&["get", "/tree/*.txt", "parts/"]);
    assert_eq!(e.read("parts/a.txt"), b"newer");
    let msg = e.fails(&["get", "/tree/*.csv", "parts/"], "NotFound");
    assert!(msg.contains("no match"), "{msg}");
    // A container to a file, and a missing source.
    e.fails(&["get", "/nothing", "x"], "NotFound");
}

#[test]
fn cp_copies_inside_the_cluster_and_across_with_file_paths() {
    let e = Env::start();
    e.write("local.txt", b"from disk");
    // Local to cluster needs file:, a relative path alone is refused.
    let msg = e.fails(&["cp", "local.txt", "/x"], "InvalidPath");
    assert!(msg.contains("file:local.txt"), "{msg}");
    e.ok(&["cp", "file:local.txt", "/x"]);
    assert_eq!(e.cluster_bytes("/x"), b"from disk");
    // Inside the cluster: to a path, into a container, trees with -r.
    e.ok(&["cp", "/x", "/y"]);
    assert_eq!(e.cluster_bytes("/y"), b"from disk");
    e.fails(&["cp", "/x", "/y"], "AlreadyExists");
    e.ok(&["mkdir", "/dir"]);
    e.ok(&["cp", "/x", "nk:/y", "/dir/"]);
    assert_eq!(names(&e.ok(&["ls", "/dir"])), ["x", "y"]);
    e.ok(&["mkdir", "-p", "/dir/sub"]);
    e.ok(&["cp", "/x", "/dir/sub/z"]);
    e.fails(&["cp", "/dir", "/dir2"], "InvalidArgument");
    e.ok(&["cp", "-r", "/dir", "/dir2"]);
    assert_eq!(e.cluster_bytes("/dir2/sub/z"), b"from disk");
    e.fails(&["cp", "-r", "/dir", "/dir/inside"], "InvalidArgument");
    // Tables stay Tables, their values KeyValues.
    e.ok(&["mkdir", "--type", "table", "/t"]);
    e.ok(&["kv", "put", "/t/k", "value"]);
    e.ok(&["cp", "-r", "/t", "/t2"]);
    assert_eq!(e.json(&["stat", "/t2", "--json"])["type"], "Table");
    assert_eq!(e.ok(&["kv", "get", "/t2/k"]), "value");
    // Cluster to local.
    e.ok(&["cp", "-r", "/dir", "file:copied"]);
    assert_eq!(e.read("copied/sub/z"), b"from disk");
    e.fails(&["cp", "file:a", "file:b"], "InvalidArgument");
    // -f replaces atomically.
    e.ok(&["cp", "-f", "/dir/sub/z", "/y"]);
}

#[test]
fn ls_lists_names_long_recursive_with_headings_and_json() {
    let e = Env::start();
    e.write("f.bin", &[7u8; 3000]);
    e.ok(&["mkdir", "-p", "/l/sub"]);
    e.ok(&["put", "f.bin", "/l/f.bin"]);
    e.ok(&["put", "f.bin", "/l/sub/g.bin"]);
    assert_eq!(names(&e.ok(&["ls", "/l"])), ["f.bin", "sub"]);
    let long = e.ok(&["ls", "-l", "/l"]);
    let f = long.lines().find(|l| l.ends_with("f.bin")).unwrap();
    assert!(
        f.starts_with("File") && f.contains("rw-r--r--") && f.contains(" 3000 "),
        "{long}"
    );
    let d = long.lines().find(|l| l.ends_with("sub")).unwrap();
    assert!(
        d.starts_with("Directory") && d.contains("1 items"),
        "{long}"
    );
    assert!(e.ok(&["ls", "-lh", "/l"]).contains("2.9 KiB"));
    let rec = e.ok(&["ls", "-R", "/l"]);
    assert_eq!(names(&rec), ["/l:", "f.bin", "sub", "", "/l/sub:", "g.bin"]);
    assert_eq!(names(&e.ok(&["ls", "-d", "/l"])), ["/l"]);
    // Several operands: data nodes first, then each container's heading.
    let both = e.ok(&["ls", "/l/sub", "/l/f.bin"]);
    assert_eq!(names(&both), ["/l/f.bin", "", "/l/sub:", "g.bin"]);
    assert_eq!(names(&e.ok(&["ls", "/l/*.bin"])), ["/l/f.bin"]);
    let j = e.json(&["ls", "-R", "/l", "--json"]);
    let paths: Vec<&str> = j
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["/l/f.bin", "/l/sub", "/l/sub/g.bin"]);
    assert_eq!(j[0]["size"], 3000);
    assert_eq!(j[0]["mode"], "0644");
    assert!(j[0]["mtime_ns"].as_u64().unwrap() > 0);
    e.fails(&["ls", "/nope"], "NotFound");
    e.fails(&["ls", "/l/*.csv"], "NotFound");
}

#[test]
fn mkdir_rm_mv_and_touch_take_several_paths_and_say_what_to_do() {
    let e = Env::start();
    e.ok(&["mkdir", "/a", "/b", "/c"]);
    e.fails(&["mkdir", "/a"], "AlreadyExists");
    e.ok(&["mkdir", "-p", "/a", "/a/x/y"]);
    e.fails(&["mkdir", "/q/r"], "NotFound");
    e.fails(&["mkdir", "--type", "file", "/z"], "InvalidArgument");
    // rm: several paths and wildcards; a container needs -r, and is told.
    e.ok(&["touch", "/b/f1", "/b/f2", "/c/g"]);
    e.ok(&["rm", "/b/f1", "/c/*"]);
    assert!(!e.exists("/b/f1") && e.exists("/b/f2") && !e.exists("/c/g"));
    let msg = e.fails(&["rm", "/a"], "NotEmpty");
    assert!(msg.contains("-r"), "{msg}");
    e.ok(&["rm", "-r", "/a"]);
    e.fails(&["rm", "/gone"], "NotFound");
    e.ok(&["rm", "-f", "/gone", "/none/*"]);
    // Several failures: each printed, the command fails once at the end.
    let out = e.nk(&["rm", "/gone1", "/gone2"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 3);
    // mv into an existing container, several at once, and -f to replace.
    e.ok(&["touch", "/m1", "/m2"]);
    e.ok(&["mv", "/m1", "/c/"]);
    e.ok(&["mv", "/m2", "/b/f2", "/c"]);
    assert_eq!(names(&e.ok(&["ls", "/c"])), ["f2", "m1", "m2"]);
    e.ok(&["touch", "/n1"]);
    let msg = e.fails(&["mv", "/n1", "/c/m1"], "AlreadyExists");
    assert!(msg.contains("-f"), "{msg}");
    e.ok(&["mv", "-f", "/n1", "/c/m1"]);
    assert!(!e.exists("/n1"));
    e.fails(&["mv", "/c/m1", "/c/m2", "/c/f2"], "TypeMismatch");
    e.fails(&["mv", "/c/m2", "/nowhere/"], "NotFound");
    // touch: an empty File, a newer time for an existing node, -c.
    let before = e.json(&["stat", "/c/m2", "--json"])["mtime_ns"]
        .as_u64()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    e.ok(&["touch", "/c/m2"]);
    let after = e.json(&["stat", "/c/m2", "--json"])["mtime_ns"]
        .as_u64()
        .unwrap();
    assert!(after > before, "{before} -> {after}");
    e.ok(&["touch", "-c", "/c/nothing"]);
    assert!(!e.exists("/c/nothing"));
    assert_eq!(e.json(&["stat", "/c/m2", "--json"])["size"], 0);
    e.ok(&["mkdir", "--type", "table", "/t"]);
    e.ok(&["touch", "/t/k"]);
    assert_eq!(e.json(&["stat", "/t/k", "--json"])["type"], "KeyValue");
}

#[test]
fn head_tail_cat_and_stat_read_parts_and_several_files() {
    let e = Env::start();
    let text: String = (1..=30).map(|i| format!("line {i}\n")).collect();
    e.write("t.txt", text.as_bytes());
    e.write("u.txt", b"one\ntwo");
    e.ok(&["put", "t.txt", "u.txt", "/"]);
    let head = e.ok(&["head", "/t.txt"]);
    assert_eq!(
        head,
        (1..=10).map(|i| format!("line {i}\n")).collect::<String>()
    );
    assert_eq!(e.ok(&["head", "-n", "2", "/t.txt"]), "line 1\nline 2\n");
    assert_eq!(e.ok(&["head", "-c", "4", "/t.txt"]), "line");
    assert_eq!(e.ok(&["tail", "-n", "2", "/t.txt"]), "line 29\nline 30\n");
    assert_eq!(e.ok(&["tail", "-n", "1", "/u.txt"]), "two");
    assert_eq!(e.ok(&["tail", "-c", "3", "/u.txt"]), "two");
    assert_eq!(e.ok(&["tail", "-n", "99", "/u.txt"]), "one\ntwo");
    let two = e.ok(&["head", "-n", "1", "/t.txt", "/u.txt"]);
    assert_eq!(two, "==> /t.txt <==\nline 1\n\n==> /u.txt <==\none\n");
    e.ok(&["mkdir", "/d"]);
    e.fails(&["head", "/d"], "TypeMismatch");
    let out = e.nk(&["tail", "-c", "x", "/u.txt"]);
    failed_with(&out, &["tail", "-c", "x"], "InvalidArgument", 2);
    assert_eq!(e.ok(&["cat", "/u.txt", "/u.txt"]), "one\ntwoone\ntwo");
    // What prints data prints nothing else.
    for args in [
        &["cat", "/u.txt"][..],
        &["get", "/u.txt", "-"],
        &["head", "/u.txt"],
    ] {
        let out = e.nk(args);
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "nk {args:?}: {out:?}"
        );
    }
    let one = e.json(&["stat", "/u.txt", "--json"]);
    assert_eq!(one["size"], 7);
    let many = e.json(&["stat", "/*.txt", "--json"]);
    assert_eq!(many.as_array().unwrap().len(), 2);
    let text = e.ok(&["stat", "/t.txt", "/u.txt"]);
    assert_eq!(text.matches("path:").count(), 2);
}

#[test]
fn find_du_and_test_answer_scripts() {
    let e = Env::start();
    e.write("x", &[1u8; 100]);
    e.ok(&["mkdir", "-p", "/f/a/b"]);
    e.ok(&["mkdir", "--type", "table", "/f/t"]);
    e.ok(&["put", "x", "/f/one.parquet"]);
    e.ok(&["put", "x", "/f/a/two.parquet"]);
    e.ok(&["put", "x", "/f/a/b/three.csv"]);
    e.ok(&["kv", "put", "/f/t/k", "12345"]);
    // find, with find's own spellings and with --flags.
    assert_eq!(
        names(&e.ok(&["find", "/f", "-name", "*.parquet"])),
        ["/f/a/two.parquet", "/f/one.parquet"]
    );
    assert_eq!(
        names(&e.ok(&["find", "/f", "--type", "d"])),
        ["/f", "/f/a", "/f/a/b"]
    );
    assert_eq!(
        names(&e.ok(&["find", "/f", "-type", "f,k", "-maxdepth", "1"])),
        ["/f/one.parquet"]
    );
    assert_eq!(names(&e.ok(&["find", "/f", "--type", "t"])), ["/f/t"]);
    // find's spellings after a global flag's value too.
    let meta = e.up.meta.clone();
    assert_eq!(
        names(&e.ok(&["--meta", &meta, "find", "/f", "-name", "k"])),
        ["/f/t/k"]
    );
    assert_eq!(
        e.json(&["find", "/f", "--name", "k", "--json"]),
        serde_json::json!(["/f/t/k"])
    );
    let out = e.nk(&["find", "/f", "--type", "x"]);
    failed_with(&out, &["find", "--type", "x"], "InvalidArgument", 2);
    // du: per container, children first (a walk); -s totals from the
    // metadata server's accounting; -h; --json.
    let du = e.ok(&["du", "/f"]);
    assert_eq!(
        names(&du),
        ["100\t/f/a/b", "200\t/f/a", "5\t/f/t", "305\t/f"]
    );
    assert_eq!(e.ok(&["du", "-s", "/f", "/f/a"]), "305\t/f\n200\t/f/a\n");
    assert_eq!(e.ok(&["du", "-sh", "/f/a"]), "200 B\t/f/a\n");
    // --stored: what the nodes take of the cluster, as `nk stat` says of
    // each: a table holding one 5-byte key takes its 640-byte record
    // piece and the key's 64-byte piece. The walk counts both; the
    // accounting (-s) counts what data nodes hold.
    let stored = |p: &str| e.json(&["stat", p, "--json"])["stored"].as_u64().unwrap();
    assert_eq!((stored("/f/t"), stored("/f/t/k")), (640, 64));
    assert_eq!(e.ok(&["du", "--stored", "/f/t"]), "704\t/f/t\n");
    assert_eq!(e.ok(&["du", "-s", "--stored", "/f/t"]), "64\t/f/t\n");
    let all: u64 = names(&e.ok(&["find", "/f"]))
        .iter()
        .map(|p| stored(p))
        .sum();
    let data: u64 = names(&e.ok(&["find", "/f", "--type", "f,k"]))
        .iter()
        .map(|p| stored(p))
        .sum();
    let walk = e.json(&["du", "/f", "--json"]);
    assert_eq!(
        walk.as_array().unwrap().last().unwrap(),
        &serde_json::json!({"path": "/f", "bytes": 305, "stored": all, "files": 4, "containers": 4})
    );
    assert_eq!(
        e.ok(&["du", "--stored", "/f"]).lines().last().unwrap(),
        format!("{all}\t/f")
    );
    let j = e.json(&["du", "-s", "/f", "--json"]);
    let classes = j[0]["classes"].as_array().unwrap();
    // 100-byte files and a 5-byte value: small values, in pieces.
    let pieces: u64 = classes
        .iter()
        .map(|c| c["piece_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(
        (&j[0]["path"], &j[0]["type"], &j[0]["nodes"], &j[0]["bytes"]),
        (&"/f".into(), &"Directory".into(), &7.into(), &305.into()),
        "{j}"
    );
    assert_eq!(j[0]["stored"].as_u64(), Some(data), "{j}");
    assert_eq!(j[0]["quota"], Value::Null);
    assert!(classes.iter().all(|c| c["name"].is_string()), "{j}");
    if classes.iter().all(|c| c["blocks"] == 0) {
        assert_eq!(pieces, data, "{j}");
    }
    assert_eq!(
        e.ok(&["du", "-s", "--stored", "/f"]),
        format!("{data}\t/f\n")
    );
    // test: 0 if it holds, 1 if not, 2 if it cannot tell.
    let code = |args: &[&str]| e.nk(args).status.code();
    assert_eq!(code(&["test", "-e", "/f/one.parquet"]), Some(0));
    assert_eq!(code(&["test", "-e", "/f/none"]), Some(1));
    assert_eq!(code(&["test", "-e", "/f/one.parquet/below"]), Some(1));
    assert_eq!(code(&["test", "-d", "/f/a"]), Some(0));
    assert_eq!(code(&["test", "-d", "/f/one.parquet"]), Some(1));
    assert_eq!(code(&["test", "-f", "/f/t/k"]), Some(0));
    assert_eq!(code(&["test", "-s", "/f/one.parquet"]), Some(0));
    e.ok(&["touch", "/f/empty"]);
    assert_eq!(code(&["test", "-z", "/f/empty"]), Some(0));
    assert_eq!(code(&["test", "-s", "/f/empty"]), Some(1));
    let out = e.nk(&["test", "-e", "-d", "/f"]);
    failed_with(&out, &["test", "-e", "-d"], "InvalidArgument", 2);
    let out = e.nk(&["test", "-e", "relative"]);
    failed_with(&out, &["test", "-e", "relative"], "InvalidPath", 2);
    let down = crate::common::nk()
        .args(["test", "-e", "/f"])
        .env("NK_META", "127.0.0.1:1")
        .env("NK_CONFIG", "/dev/null")
        .output()
        .unwrap();
    assert_eq!(down.status.code(), Some(2), "{down:?}");
}

#[test]
fn completion_scripts_know_the_commands() {
    for shell in ["bash", "zsh", "fish"] {
        let out = crate::common::nk()
            .args(["completion", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = String::from_utf8(out.stdout).unwrap();
        for word in ["cp", "find", "mkdir", "recursive"] {
            assert!(script.contains(word), "{shell} completion lacks {word}");
        }
    }
    let out = crate::common::nk()
        .args(["completion", "tcsh"])
        .output()
        .unwrap();
    failed_with(&out, &["completion", "tcsh"], "InvalidArgument", 2);
}

/// Every way a command fails prints one line, `nk: Code: message`, with
/// the right code (JSON with the code for a command given --json), and
/// exits 1 (2 for a command line nk cannot read).
#[test]
fn every_error_prints_its_code_and_message_in_one_format() {
    let e = Env::start();
    e.write("f", b"x");
    e.ok(&["put", "f", "/f"]);
    e.ok(&["mkdir", "/d"]);
    e.ok(&["touch", "/d/child"]);
    for (args, code) in [
        (&["ls", "/missing"][..], "NotFound"),
        (&["put", "f", "/f"], "AlreadyExists"),
        (&["put", "missing-local", "/x"], "NotFound"),
        (&["put", "f", "/no-parent/x"], "NotFound"),
        (&["cp", "/f", "/no-parent/x"], "NotFound"),
        (&["get", "/f", "f"], "AlreadyExists"),
        (&["get", "/d", "out"], "InvalidArgument"),
        (&["rm", "/d"], "NotEmpty"),
        (&["mkdir", "relative"], "InvalidPath"),
        (&["mkdir", "/f/below"], "TypeMismatch"),
        (&["mv", "/f", "/d/child"], "AlreadyExists"),
        (&["cat", "/d"], "TypeMismatch"),
        (&["kv", "rm", "/f"], "TypeMismatch"),
        (&["kv", "ls", "/d"], "TypeMismatch"),
        (&["policy", "set", "move_rate", "fast"], "InvalidArgument"),
        (
            &["policy", "set", "move_rate", "1MiB", "placement"],
            "InvalidArgument",
        ),
        (&["drain", "no-such-server"], "UnknownServer"),
        (&["top", "--interval", "0"], "InvalidArgument"),
        (&["get", "/f", "/proc/version/x"], "Io"),
    ] {
        let msg = e.fails(args, code);
        assert!(!msg.is_empty(), "nk {args:?}: no message");
        // The same error as JSON on stderr, with --json.
        if ["ls", "policy"].contains(&args[0]) {
            let mut with = args.to_vec();
            with.push("--json");
            let out = e.nk(&with);
            assert_eq!(out.status.code(), Some(1));
            let v: Value = serde_json::from_slice(&out.stderr)
                .unwrap_or_else(|err| panic!("nk {with:?}: {err}: {out:?}"));
            assert_eq!(v["error"]["code"], code, "{v}");
            assert!(v["error"]["message"].as_str().unwrap().len() > 3);
        }
    }
    // A command line nk cannot read: exit status 2, the same format.
    for args in [
        &["ls", "--no-such-flag"][..],
        &["frobnicate"],
        &["put", "only-one"],
    ] {
        let out = e.nk(args);
        failed_with(&out, args, "InvalidArgument", 2);
    }
    // No cluster: Unavailable, naming the address.
    let out = crate::common::nk()
        .args(["ls", "/"])
        .env("NK_META", "127.0.0.1:1")
        .env("NK_CONFIG", "/dev/null")
        .output()
        .unwrap();
    let msg = failed_with(&out, &["ls", "/"], "Unavailable", 1);
    assert!(msg.contains("127.0.0.1:1"), "{msg}");
}

#[test]
fn policy_set_takes_sizes_as_the_config_file_does() {
    let e = Env::start();
    e.ok(&["policy", "set", "move_rate", "64MiB"]);
    let j = e.json(&["policy", "show", "--json"]);
    assert_eq!(j["settings"]["move_rate"], (64u64 << 20).to_string());
    e.ok(&["policy", "set", "move_rate", "1.5GiB"]);
    let j = e.json(&["policy", "show", "--json"]);
    assert_eq!(j["settings"]["move_rate"], (3u64 << 29).to_string());
}

/// Servers' logs written to a file (or a pipe) carry no colour codes.
#[test]
fn logs_written_to_a_file_have_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let log = std::fs::File::create(dir.path().join("up.log")).unwrap();
    let mut child = crate::common::nk()
        .args(["up", "--port", "0", "--dram", "16MiB", "--file", "0"])
        .env_remove("NK_META")
        .env_remove("NK_CONFIG")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    assert!(first.contains("metadata server at"), "{first}");
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(dir.path().join("up.log")).unwrap();
    assert!(text.contains("INFO"), "the log has lines: {text}");
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in a log file: {text}"
    );
}

#[test]
fn ttls_are_set_shown_and_honoured() {
    let e = Env::start();
    e.write("v.txt", b"value");
    e.ok(&["mkdir", "--ttl", "1h", "--child-ttl", "10m", "/jobs"]);
    let st = e.json(&["stat", "/jobs", "--json"]);
    assert_eq!(st["child_ttl_ms"], 600_000, "{st}");
    let expires = st["expires_ms"].as_u64().expect("an expiry");
    let human = e.ok(&["stat", "/jobs"]);
    assert!(
        human.contains("expires:") && human.contains("(in "),
        "{human}"
    );
    assert!(human.contains("child TTL:     10m"), "{human}");
    // A child without a TTL of its own gets the container's.
    e.ok(&["put", "v.txt", "/jobs/a"]);
    let a = e.json(&["stat", "/jobs/a", "--json"])["expires_ms"]
        .as_u64()
        .unwrap();
    assert!(
        a < expires,
        "10 minutes is sooner than an hour: {a} {expires}"
    );
    e.ok(&["put", "--ttl", "never", "v.txt", "/jobs/b"]);
    assert!(e.json(&["stat", "/jobs/b", "--json"])["expires_ms"].is_null());
    // nk expire: a new time, never, a child TTL cleared; --json.
    let out = e.json(&["expire", "--json", "/jobs/b", "2h"]);
    assert!(out[0]["expires_ms"].as_u64().unwrap() > expires, "{out}");
    e.ok(&["expire", "/jobs", "never"]);
    assert!(e.json(&["stat", "/jobs", "--json"])["expires_ms"].is_null());
    assert!(e
        .ok(&["expire", "--child", "/jobs", "none"])
        .contains("no child TTL"));
    assert!(e.json(&["stat", "/jobs", "--json"])["child_ttl_ms"].is_null());
    e.fails(&["expire", "/jobs", "soon"], "InvalidArgument");
    e.fails(&["expire", "/jobs", "0s"], "InvalidArgument");
    e.fails(&["expire", "--child", "/jobs/a", "1m"], "InvalidArgument");
    e.fails(&["expire", "/nothing", "1m"], "NotFound");
    // A short TTL: the node is gone once it is due.
    e.ok(&["expire", "/jobs/a", "200ms"]);
    let start = std::time::Instant::now();
    while e.nk(&["stat", "/jobs/a"]).status.success() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(120),
            "never expired"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    e.fails(&["cat", "/jobs/a"], "NotFound");
    assert_eq!(e.cluster_bytes("/jobs/b"), b"value");
}

/// `nk ARGS` in `e`'s working directory, with this `nk` first on PATH
/// (for the commands `nk run` runs).
fn nk_run(e: &Env, args: &[&str]) -> std::process::Command {
    let bin = Path::new(env!("CARGO_BIN_EXE_nk")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = client(&e.up.meta);
    cmd.args(args).env("PATH", path).current_dir(e.dir.path());
    cmd
}

#[test]
fn nk_run_binds_directories_to_the_commands_life() {
    let e = Env::start();
    e.write("v.txt", b"value");
    e.ok(&["mkdir", "/jobs"]);
    e.ok(&["put", "v.txt", "/jobs/keep"]);
    // The command sees its directory (NK_BIND) and writes into it; its
    // exit status is nk run's; the directory is gone after.
    let out = nk_run(&e, &[
        "run",
        "--bind",
        "/jobs/j1",
        "--bind",
        "/jobs/deep/j2",
        "--",
        "sh",
        "-c",
        "nk put v.txt $NK_BIND/out && nk test -d /jobs/deep/j2 && echo inside:$NK_BIND && exit 7",
    ])
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("inside:/jobs/j1"),
        "{out:?}"
    );
    assert!(!e.exists("/jobs/j1") && !e.exists("/jobs/deep/j2"));
    assert!(e.exists("/jobs/deep"), "parents made for it stay");
    assert_eq!(e.cluster_bytes("/jobs/keep"), b"value");
    // A directory that exists is refused, and the command is not run.
    let out = e.nk(&["run", "--bind", "/jobs/keep", "--", "sh", "-c", "echo ran"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("AlreadyExists"),
        "{out:?}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ran"));
    // A command that cannot start: 127, and nothing left behind.
    let out = e.nk(&["run", "--bind", "/jobs/j3", "--", "/no/such/program"]);
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    assert!(!e.exists("/jobs/j3"));
    // A signal that ends the command: 128 + it, as a shell reports.
    let out = e.nk(&[
        "run",
        "--bind",
        "/jobs/j4",
        "--",
        "sh",
        "-c",
        "kill -TERM $$",
    ]);
    assert_eq!(out.status.code(), Some(128 + 15), "{out:?}");
    assert!(!e.exists("/jobs/j4"));
}

#[test]
fn a_killed_nk_run_leaves_nothing_once_its_lease_lapses() {
    let e = Env::start();
    e.write("v.txt", b"value");
    e.ok(&["mkdir", "/jobs"]);
    e.ok(&["put", "v.txt", "/jobs/keep"]);
    let mut run = nk_run(&e, &[])
        .args([
            "run",
            "--lease",
            "3s",
            "--bind",
            "/jobs/j1",
            "--",
            "sh",
            "-c",
            "nk put v.txt $NK_BIND/out && echo ready $$ && exec sleep 600",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(run.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let sleeper: i32 = line.trim().strip_prefix("ready ").unwrap().parse().unwrap();
    // The command outlives a killed nk run, as any orphan does: the test
    // ends it at the end (it holds the test's stderr).
    struct Reap(i32);
    impl Drop for Reap {
        fn drop(&mut self) {
            // SAFETY: kill with a pid and a valid signal.
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
    let _reap = Reap(sleeper);
    // Renewed while it runs: more than a lease passes and the directory stays.
    std::thread::sleep(std::time::Duration::from_millis(4_000));
    assert_eq!(e.cluster_bytes("/jobs/j1/out"), b"value");
    run.kill().unwrap(); // SIGKILL: no chance to clean up
    run.wait().unwrap();
    let start = std::time::Instant::now();
    while e.exists("/jobs/j1") {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(120),
            "the bound directory outlived its lease"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(e.cluster_bytes("/jobs/keep"), b"value");
}

/// `nk quota`: limits set, kept and cleared; a create or put past a limit
/// fails with QuotaExceeded naming the quota root and leaves nothing.
#[test]
fn quotas_refuse_growth_and_show_their_usage() {
    let e = Env::start();
    e.ok(&["mkdir", "/q"]);
    let set = e.ok(&["quota", "set", "/q", "--nodes", "2", "--bytes", "1MiB"]);
    assert_eq!(
        set, "/q: 0 B held (quota: 1 MiB), 0 nodes (quota: 2)\n",
        "{set}"
    );
    e.ok(&["mkdir", "/q/a"]);
    e.ok(&["mkdir", "/q/b"]);
    let msg = e.fails(&["mkdir", "/q/c"], "QuotaExceeded");
    assert!(msg.contains("/q: its quota of 2 nodes"), "{msg}");
    assert!(!e.exists("/q/c"));
    let j = e.json(&["quota", "show", "--json"]);
    assert_eq!(j.as_array().unwrap().len(), 1, "{j}");
    assert_eq!(
        (&j[0]["path"], &j[0]["nodes"], &j[0]["quota"]),
        (
            &"/q".into(),
            &2.into(),
            &serde_json::json!({"bytes": 1 << 20, "nodes": 2})
        )
    );
    // A limit not given is kept; none removes one.
    let j = e.json(&["quota", "set", "/q", "--nodes", "none", "--json"]);
    assert_eq!(
        j["quota"],
        serde_json::json!({"bytes": 1 << 20, "nodes": null})
    );
    e.ok(&["mkdir", "/q/c"]);
    // A copy past the byte limit fails and leaves no node.
    e.write("big", &vec![7u8; 2 << 20]);
    let msg = e.fails(&["put", "big", "/q/big"], "QuotaExceeded");
    assert!(msg.contains("/q: its quota of 1 MiB"), "{msg}");
    assert!(!e.exists("/q/big"));
    assert_eq!(e.json(&["du", "-s", "/q", "--json"])[0]["nodes"], 3);
    e.write("small", b"fits");
    e.ok(&["put", "small", "/q/small"]);
    assert_eq!(
        e.ok(&["quota", "show", "/q/a"]),
        "/q/a: 0 B held (quota: no limit), 0 nodes (quota: no limit)\n"
    );
    e.ok(&["quota", "set", "/q", "--nodes", "1M"]);
    assert_eq!(
        e.json(&["quota", "show", "--json"])[0]["quota"],
        serde_json::json!({"bytes": 1 << 20, "nodes": 1_000_000})
    );
    e.ok(&["quota", "clear", "/q"]);
    assert_eq!(e.ok(&["quota", "show"]), "no quotas\n");
    e.ok(&["put", "big", "/q/big"]);
    // Only containers carry quotas; a set names what it sets.
    e.fails(&["quota", "set", "/q/big", "--nodes", "1"], "TypeMismatch");
    e.fails(&["quota", "set", "/q"], "InvalidArgument");
    let out = e.nk(&["quota", "set", "/q", "--nodes", "1.5M"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
