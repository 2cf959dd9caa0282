//! The deployment examples under `deploy/` (docs/deployment.md) stay
//! usable: every configuration file loads with the real loader, the files
//! of one cluster agree with each other (metadata servers in the same
//! order everywhere, one server per partition, distinct addresses, one
//! block size...), the systemd units start real `nk` subcommands on
//! configuration files that exist, and the container recipe builds the
//! `nk` binary from a pinned Rust image.
//!
//! The checks are functions returning the problems they find, so the
//! tests at the end can also break the examples in memory and see each
//! check catch its mistake.

use nodekernel_cluster::{Config, StoreSection};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Where the systemd units expect the configuration files: the examples
/// are installed there under their own names (docs/deployment.md).
const CONFIG_DIR: &str = "/etc/nodekernel/";

/// The cluster token file the examples name (docs/deployment.md).
const EXAMPLE_TOKEN: &str = "/etc/nodekernel/token";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

fn deploy_dir() -> PathBuf {
    repo_root().join("deploy")
}

/// Every file under `dir` whose name ends with `suffix`, sorted.
fn files_under(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, suffix: &str, out: &mut Vec<PathBuf>) {
        let entries =
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
        for e in entries {
            let p = e.expect("a directory entry").path();
            if p.is_dir() {
                walk(&p, suffix, out);
            } else if p.to_string_lossy().ends_with(suffix) {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, suffix, &mut out);
    out.sort();
    out
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// One example configuration file.
#[derive(Clone)]
struct Example {
    /// The file name without `.toml`: the systemd instance that uses it.
    name: String,
    cfg: Config,
}

/// The example clusters: one per directory of `.toml` files under
/// `deploy/`, each file loaded and validated by the real loader.
fn clusters() -> BTreeMap<PathBuf, Vec<Example>> {
    let files = files_under(&deploy_dir(), ".toml");
    assert!(!files.is_empty(), "no example configuration under deploy/");
    // The token file exists only on the hosts: loaded here with one of
    // this test's in its place (its naming is checked by `check_cluster`).
    let tmp = tempfile::tempdir().unwrap();
    let token = tmp.path().join("token");
    nodekernel_client::settings::write_new_secret(&token).unwrap();
    let mut out: BTreeMap<PathBuf, Vec<Example>> = BTreeMap::new();
    for f in files {
        let text = read(&f).replace(EXAMPLE_TOKEN, token.to_str().unwrap());
        let mut cfg = Config::parse(&text, &f).unwrap_or_else(|e| panic!("{e}"));
        if cfg.security.token_file.as_deref() == Some(token.as_path()) {
            cfg.security.token_file = Some(EXAMPLE_TOKEN.into());
        }
        let name = f.file_stem().unwrap().to_string_lossy().into_owned();
        let dir = f.parent().unwrap().to_path_buf();
        out.entry(dir).or_default().push(Example { name, cfg });
    }
    out
}

/// Whether the file configures a metadata server: its `meta.listen` is
/// one of the addresses everybody lists in `client.meta`.
fn runs_meta(e: &Example) -> bool {
    e.cfg.client.meta.contains(&e.cfg.meta.listen)
}

fn runs_stores(e: &Example) -> bool {
    !e.cfg.store.is_empty()
}

/// The address a storage server registers: `advertise`, else `listen`.
fn registered(s: &StoreSection) -> &str {
    s.advertise.as_deref().unwrap_or(&s.listen)
}

fn sock(what: &str, addr: &str, problems: &mut Vec<String>) -> Option<SocketAddr> {
    match addr.parse::<SocketAddr>() {
        Ok(a) => Some(a),
        Err(_) => {
            problems.push(format!(
                "{what}: {addr:?} is not an IP address and port (the examples use addresses, not names, so they can be checked)"
            ));
            None
        }
    }
}

/// Everything that must agree between the files of one cluster. Returns
/// one line per problem.
fn check_cluster(files: &[Example]) -> Vec<String> {
    let mut p = Vec::new();
    let Some(first) = files.first() else {
        return vec!["no configuration file".into()];
    };

    // The metadata servers, in the same order everywhere.
    let metas = &first.cfg.client.meta;
    for e in files {
        if &e.cfg.client.meta != metas {
            p.push(format!(
                "{}: client.meta is {:?} but {} lists {:?}: every host must list the same metadata servers in the same order",
                e.name, e.cfg.client.meta, first.name, metas
            ));
        }
    }
    let distinct: BTreeSet<&String> = metas.iter().collect();
    if distinct.len() != metas.len() {
        p.push(format!("client.meta names a server twice: {metas:?}"));
    }

    // One metadata server per partition, at its place in the list.
    let meta_files: Vec<&Example> = files.iter().filter(|e| runs_meta(e)).collect();
    for (i, addr) in metas.iter().enumerate() {
        let serving: Vec<&str> = meta_files
            .iter()
            .filter(|e| &e.cfg.meta.listen == addr)
            .map(|e| e.name.as_str())
            .collect();
        if serving.len() != 1 {
            p.push(format!(
                "client.meta[{i}] = {addr} must be the meta.listen of exactly one file, not of {serving:?}"
            ));
        }
    }
    let mut partitions: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
    for e in &meta_files {
        let m = &e.cfg.meta;
        partitions.entry(m.partition).or_default().push(&e.name);
        let pos = metas.iter().position(|a| a == &m.listen);
        if pos != Some(m.partition as usize) {
            p.push(format!(
                "{}: meta.partition is {} but its address {} is client.meta[{}]",
                e.name,
                m.partition,
                m.listen,
                pos.map_or("?".into(), |x| x.to_string())
            ));
        }
        if m.partitions as usize != metas.len() {
            p.push(format!(
                "{}: meta.partitions is {} but client.meta lists {} metadata servers",
                e.name,
                m.partitions,
                metas.len()
            ));
        }
        if let Err(err) = e.cfg.check_meta_dir() {
            p.push(format!("{}: {err}", e.name));
        }
    }
    for i in 0..metas.len() as u32 {
        match partitions.get(&i).map(Vec::len) {
            Some(1) => {}
            n => p.push(format!(
                "metadata partition {i} appears {} times (in {:?}), not once",
                n.unwrap_or(0),
                partitions.get(&i).cloned().unwrap_or_default()
            )),
        }
    }
    for (i, names) in &partitions {
        if *i as usize >= metas.len() {
            p.push(format!(
                "{names:?}: metadata partition {i} is beyond client.meta"
            ));
        }
    }

    // What every server of the cluster must agree on.
    let servers: Vec<&Example> = files
        .iter()
        .filter(|e| runs_meta(e) || runs_stores(e))
        .collect();
    let same = |what: &str, value: &dyn Fn(&Example) -> String, among: &[&Example]| {
        let mut out = Vec::new();
        if let Some(f) = among.first() {
            for e in among {
                if value(e) != value(f) {
                    out.push(format!(
                        "{}: {what} is {} but {} has {}: it must be the same on every host",
                        e.name,
                        value(e),
                        f.name,
                        value(f)
                    ));
                }
            }
        }
        out
    };
    p.extend(same(
        "meta.block_size",
        &|e| e.cfg.meta.block_size.to_string(),
        &servers,
    ));
    let classes = |e: &Example| {
        e.cfg
            .classes()
            .iter()
            .map(|c| format!("{}={}@{}", c.class, c.name, c.price_per_gib))
            .collect::<Vec<_>>()
            .join(",")
    };
    p.extend(same("[[class]]", &classes, &servers));
    p.extend(same(
        "meta.dead_after_ms",
        &|e| e.cfg.meta.dead_after_ms.to_string(),
        &meta_files,
    ));
    p.extend(same(
        "meta.retire_after_ms",
        &|e| e.cfg.meta.retire_after_ms.to_string(),
        &meta_files,
    ));

    // Storage servers: every metadata server waits for all of them, hears
    // from each often enough, and reaches each at its own address.
    let store_count: usize = files.iter().map(|e| e.cfg.store.len()).sum();
    for e in &meta_files {
        if e.cfg.meta.expect_servers != Some(store_count as u32) {
            p.push(format!(
                "{}: meta.expect_servers is {:?} but the cluster has {store_count} storage servers (every server registers with every partition)",
                e.name, e.cfg.meta.expect_servers
            ));
        }
    }
    let dead_after = meta_files.iter().map(|e| e.cfg.meta.dead_after_ms).min();
    let mut addresses: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut host_ips: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut locations: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in files {
        let mut ips = BTreeSet::new();
        let mut ports = BTreeSet::new();
        if runs_meta(e) {
            if let Some(a) = sock(
                &format!("{}: meta.listen", e.name),
                &e.cfg.meta.listen,
                &mut p,
            ) {
                ips.insert(a.ip());
                ports.insert(a.port());
            }
        }
        let mut dirs = BTreeSet::new();
        if runs_meta(e) {
            if let Some(d) = &e.cfg.meta.data_dir {
                dirs.insert(d.clone());
            }
        }
        let classes = e.cfg.classes();
        for (i, s) in e.cfg.store.iter().enumerate() {
            let what = format!("{}: store[{i}]", e.name);
            let addr = registered(s);
            addresses
                .entry(addr.to_string())
                .or_default()
                .push(what.clone());
            if let Some(a) = sock(&format!("{what}.advertise"), addr, &mut p) {
                ips.insert(a.ip());
                if a.ip().is_unspecified() || a.ip().is_loopback() {
                    p.push(format!(
                        "{what}: registers {addr}, which other hosts cannot reach: set advertise"
                    ));
                }
            }
            if let Some(l) = sock(&format!("{what}.listen"), &s.listen, &mut p) {
                if l.port() == 0 {
                    p.push(format!(
                        "{what}: listen port 0 picks a new port at every start; firewalls need a fixed one"
                    ));
                }
                if !ports.insert(l.port()) {
                    p.push(format!(
                        "{what}: port {} is already used by another server of this host",
                        l.port()
                    ));
                }
            }
            if let Some(d) = dead_after {
                if s.heartbeat_ms >= d {
                    p.push(format!(
                        "{what}: heartbeat_ms {} is not below the metadata servers' dead_after_ms {d}",
                        s.heartbeat_ms
                    ));
                }
            }
            match &s.data_dir {
                None => p.push(format!(
                    "{what}: no data_dir (the identity would change at every start, and a file store would use a private temporary directory)"
                )),
                Some(d) => {
                    if !dirs.insert(d.clone()) {
                        p.push(format!(
                            "{what}: data_dir {} is used twice on this host",
                            d.display()
                        ));
                    }
                }
            }
            match classes.iter().find(|c| c.class == s.class) {
                Some(c) if c.name == s.class_name => {}
                Some(c) => p.push(format!(
                    "{what}: class_name {:?} but class {} is named {:?}",
                    s.class_name, s.class, c.name
                )),
                None => p.push(format!("{what}: class {} is not in [[class]]", s.class)),
            }
            if s.location.is_empty() || s.location != e.cfg.client.location {
                p.push(format!(
                    "{what}: location {:?} should be set and equal to client.location {:?} of the same host",
                    s.location, e.cfg.client.location
                ));
            }
            locations
                .entry(s.location.clone())
                .or_default()
                .push(e.name.clone());
        }
        if ips.len() > 1 {
            p.push(format!(
                "{}: its servers use several host addresses {ips:?}; one file describes one host",
                e.name
            ));
        }
        for ip in ips {
            host_ips
                .entry(ip.to_string())
                .or_default()
                .push(e.name.clone());
        }
    }
    for (addr, who) in &addresses {
        if who.len() > 1 {
            p.push(format!(
                "storage address {addr} is registered by {who:?}: each server needs its own"
            ));
        }
    }
    for (ip, who) in &host_ips {
        if who.len() > 1 {
            p.push(format!("host address {ip} is used by files {who:?}"));
        }
    }
    for (loc, who) in &mut locations {
        who.dedup();
        if who.len() > 1 {
            p.push(format!(
                "location {loc:?} is used by hosts {who:?}: each host has its own"
            ));
        }
    }
    // Servers refuse to start without a cluster token (docs/security.md),
    // and every file (clients too) names the same one.
    for e in files {
        let s = &e.cfg.security;
        if s.insecure {
            p.push(format!(
                "{}: security.insecure: an example runs with the cluster token",
                e.name
            ));
        }
        if s.token_file.is_none() || s.token_file != first.cfg.security.token_file {
            p.push(format!(
                "{}: security.token_file is {:?} but {} names {:?}: every file names the cluster's token file",
                e.name, s.token_file, first.name, first.cfg.security.token_file
            ));
        }
    }
    p
}

/// `Cmd` variants of the `nk` binary, as clap names them.
fn nk_subcommands() -> BTreeSet<String> {
    let main = read(&repo_root().join("crates/cli/src/main.rs"));
    let start = main.find("enum Cmd {").expect("enum Cmd in main.rs");
    let body = &main[start..];
    let body = &body[..body.find("\n}\n").expect("the end of enum Cmd")];
    let mut out = BTreeSet::new();
    for line in body.lines().skip(1) {
        let Some(rest) = line.strip_prefix("    ") else {
            continue;
        };
        if !rest.starts_with(|c: char| c.is_ascii_uppercase()) {
            continue;
        }
        let ident: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        let mut kebab = String::new();
        for (i, c) in ident.chars().enumerate() {
            if c.is_ascii_uppercase() && i > 0 {
                kebab.push('-');
            }
            kebab.push(c.to_ascii_lowercase());
        }
        out.insert(kebab);
    }
    out
}

/// Whether `--flag` is an argument of `nk` (a field of its clap structs).
fn nk_has_flag(flag: &str) -> bool {
    let field = format!(" {}: ", flag.replace('-', "_"));
    ["crates/cli/src/main.rs", "crates/cli/src/servers.rs"]
        .iter()
        .any(|f| read(&repo_root().join(f)).contains(&field))
}

/// The `key=value` lines of a unit file (comments and sections skipped).
fn unit_entries(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .filter(|l| !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// Checks one systemd unit: it starts a server subcommand of `nk` with
/// known flags, stops it with a signal nk handles, restarts it on
/// failure, and reads a configuration file named after its instance
/// under [`CONFIG_DIR`].
fn check_unit(name: &str, text: &str, subcommands: &BTreeSet<String>) -> Vec<String> {
    let mut p = Vec::new();
    let entries = unit_entries(text);
    let get = |k: &str| -> Vec<&String> {
        entries
            .iter()
            .filter(|(key, _)| key == k)
            .map(|(_, v)| v)
            .collect()
    };
    let exec = get("ExecStart");
    if exec.len() != 1 {
        p.push(format!("{name}: {} ExecStart lines, not one", exec.len()));
        return p;
    }
    let words: Vec<&str> = exec[0].split_whitespace().collect();
    if !words.first().is_some_and(|w| w.ends_with("/nk")) {
        p.push(format!(
            "{name}: ExecStart does not run an nk binary: {}",
            exec[0]
        ));
        return p;
    }
    match words.get(1) {
        Some(sub) if subcommands.contains(*sub) => {
            if !["meta", "store", "up"].contains(sub) {
                p.push(format!("{name}: `nk {sub}` is not a server command"));
            }
        }
        other => p.push(format!(
            "{name}: ExecStart names {other:?}, not an nk subcommand ({subcommands:?})"
        )),
    }
    let mut config = None;
    let mut i = 2;
    while i < words.len() {
        let w = words[i];
        let (flag, value) = match w.strip_prefix("--") {
            Some(f) => match f.split_once('=') {
                Some((f, v)) => (f, Some(v)),
                None => (f, None),
            },
            None => {
                p.push(format!("{name}: unexpected argument {w:?}"));
                i += 1;
                continue;
            }
        };
        if !nk_has_flag(flag) {
            p.push(format!("{name}: nk has no --{flag}"));
        }
        let value = value.or_else(|| {
            let v = words.get(i + 1).filter(|v| !v.starts_with("--")).copied();
            if v.is_some() {
                i += 1;
            }
            v
        });
        if flag == "config" {
            config = value;
        }
        i += 1;
    }
    match config {
        None => p.push(format!("{name}: ExecStart passes no --config")),
        Some(c) => {
            if c.strip_prefix(CONFIG_DIR) != Some("%i.toml") {
                p.push(format!(
                    "{name}: --config {c} is not {CONFIG_DIR}%i.toml (the instance names the host's example file)"
                ));
            }
        }
    }
    if !name.ends_with("@.service") {
        p.push(format!("{name}: not a template unit (NAME@.service)"));
    }
    let kill = get("KillSignal");
    if !kill
        .iter()
        .all(|s| ["SIGTERM", "SIGINT"].contains(&s.as_str()))
        || kill.is_empty()
    {
        p.push(format!(
            "{name}: KillSignal must be SIGTERM or SIGINT (what nk stops cleanly on), not {kill:?}"
        ));
    }
    if !get("Restart").iter().any(|v| *v == "on-failure") {
        p.push(format!("{name}: no Restart=on-failure"));
    }
    p
}

/// Instances the examples name (`nk-meta@host-a`, in their comments): each
/// must have its template unit and its configuration file, and the file
/// must configure what the unit starts. Every server file is named by the
/// units it needs.
fn check_instances(files: &[Example], texts: &[String], units: &BTreeSet<String>) -> Vec<String> {
    let mut p = Vec::new();
    let mut named: BTreeSet<(String, String)> = BTreeSet::new();
    for text in texts {
        for prefix in ["nk-meta@", "nk-store@"] {
            for (at, _) in text.match_indices(prefix) {
                let inst: String = text[at + prefix.len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                    .collect();
                if !inst.is_empty() {
                    named.insert((prefix.to_string(), inst));
                }
            }
        }
    }
    for (prefix, inst) in &named {
        let template = format!("{prefix}.service");
        if !units.contains(&template) {
            p.push(format!(
                "{prefix}{inst}: there is no deploy/systemd/{template}"
            ));
        }
        match files.iter().find(|e| &e.name == inst) {
            None => p.push(format!(
                "{prefix}{inst}: no example {inst}.toml for {CONFIG_DIR}{inst}.toml"
            )),
            Some(e) if prefix == "nk-meta@" && !runs_meta(e) => p.push(format!(
                "{prefix}{inst}: {inst}.toml configures no metadata server (its meta.listen is not in client.meta)"
            )),
            Some(e) if prefix == "nk-store@" && !runs_stores(e) => p.push(format!(
                "{prefix}{inst}: {inst}.toml has no [[store]]"
            )),
            Some(_) => {}
        }
    }
    for e in files {
        for (prefix, needed) in [("nk-meta@", runs_meta(e)), ("nk-store@", runs_stores(e))] {
            if needed && !named.contains(&(prefix.to_string(), e.name.clone())) {
                p.push(format!(
                    "{}.toml: no comment says to start {prefix}{}",
                    e.name, e.name
                ));
            }
        }
    }
    p
}

/// `major.minor` of a version such as `1.95.0` or `1.80`.
fn version(v: &str) -> Option<(u32, u32)> {
    let mut it = v.split('.');
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

fn check_containerfile(text: &str) -> Vec<String> {
    let mut p = Vec::new();
    let root = repo_root();
    let cargo = read(&root.join("Cargo.toml"));
    let msrv = cargo
        .lines()
        .find_map(|l| l.trim().strip_prefix("rust-version = "))
        .map(|v| v.trim_matches('"').to_string())
        .and_then(|v| version(&v))
        .expect("workspace rust-version");
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    let froms: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("FROM "))
        .map(|l| l.split_whitespace().next().unwrap_or(""))
        .collect();
    if froms.len() < 2 {
        p.push("Containerfile: not a multi-stage build (a build and a runtime stage)".into());
    }
    for image in &froms {
        let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
        if tag.is_empty() || tag == "latest" || tag.contains('/') {
            p.push(format!(
                "Containerfile: image {image} is not pinned to a tag"
            ));
        }
    }
    match froms
        .iter()
        .find(|i| i.contains("/rust:") || i.starts_with("rust:"))
    {
        None => p.push("Containerfile: no rust build image".into()),
        Some(image) => {
            let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
            let ver = tag.split('-').next().unwrap_or("");
            match version(ver) {
                Some(v) if ver.split('.').count() == 3 && v >= msrv => {}
                _ => p.push(format!(
                    "Containerfile: {image} is not an exact Rust version (x.y.z) of at least the workspace's rust-version {}.{}",
                    msrv.0, msrv.1
                )),
            }
        }
    }
    for l in &lines {
        let Some(rest) = l.strip_prefix("COPY ") else {
            continue;
        };
        if rest.starts_with("--from") {
            continue;
        }
        let words: Vec<&str> = rest.split_whitespace().collect();
        for src in &words[..words.len().saturating_sub(1)] {
            if !root.join(src).exists() {
                p.push(format!(
                    "Containerfile: COPY {src}: no such path in the repository"
                ));
            }
        }
    }
    let cli = read(&root.join("crates/cli/Cargo.toml"));
    let package = cli
        .lines()
        .find_map(|l| l.trim().strip_prefix("name = "))
        .map(|n| n.trim_matches('"').to_string())
        .expect("the cli package name");
    if !text.contains(&format!("-p {package}")) {
        p.push(format!(
            "Containerfile: does not build the {package} package"
        ));
    }
    match lines.iter().rev().find_map(|l| l.strip_prefix("USER ")) {
        Some(u) if !["root", "0"].contains(&u.split(':').next().unwrap_or("")) => {}
        u => p.push(format!(
            "Containerfile: runs as {u:?}, not as a non-root USER"
        )),
    }
    if !lines
        .iter()
        .any(|l| l.starts_with("ENTRYPOINT") && l.contains("/nk\""))
    {
        p.push("Containerfile: the entrypoint is not the nk binary".into());
    }
    p
}

fn units() -> BTreeMap<String, String> {
    files_under(&deploy_dir().join("systemd"), ".service")
        .into_iter()
        .map(|f| {
            (
                f.file_name().unwrap().to_string_lossy().into_owned(),
                read(&f),
            )
        })
        .collect()
}

fn assert_none(what: &str, problems: Vec<String>) {
    assert!(problems.is_empty(), "{what}:\n  {}", problems.join("\n  "));
}

#[test]
fn every_example_loads_with_the_real_loader() {
    let clusters = clusters();
    let total: usize = clusters.values().map(Vec::len).sum();
    assert!(
        total >= 4,
        "expected the 3-host example and its client file"
    );
}

#[test]
fn the_files_of_each_example_cluster_agree() {
    for (dir, files) in clusters() {
        assert!(
            files.iter().filter(|e| runs_meta(e)).count() >= 2,
            "{}: the example should show several metadata partitions",
            dir.display()
        );
        assert_none(&dir.display().to_string(), check_cluster(&files));
    }
}

#[test]
fn systemd_units_start_nk_servers_on_example_files() {
    let units = units();
    assert!(
        units.contains_key("nk-meta@.service") && units.contains_key("nk-store@.service"),
        "units: {:?}",
        units.keys()
    );
    let subcommands = nk_subcommands();
    assert!(
        subcommands.contains("meta") && subcommands.contains("store"),
        "the parser of main.rs found {subcommands:?}"
    );
    for (name, text) in &units {
        assert_none(name, check_unit(name, text, &subcommands));
    }
    let names: BTreeSet<String> = units.keys().cloned().collect();
    let files: Vec<Example> = clusters().into_values().flatten().collect();
    let texts: Vec<String> = files_under(&deploy_dir(), ".toml")
        .iter()
        .map(|f| read(f))
        .collect();
    assert_none("instances", check_instances(&files, &texts, &names));
    let mut seen = BTreeSet::new();
    for e in &files {
        assert!(
            seen.insert(e.name.clone()),
            "{}.toml exists twice under deploy/: installed side by side in {CONFIG_DIR}, they would clash",
            e.name
        );
    }
}

#[test]
fn the_container_recipe_builds_nk_from_a_pinned_image() {
    let text = read(&deploy_dir().join("Containerfile"));
    assert_none("Containerfile", check_containerfile(&text));
}

#[test]
fn the_deployment_guide_names_every_example() {
    let root = repo_root();
    let guide = read(&root.join("docs/deployment.md"));
    for f in files_under(&deploy_dir(), "") {
        let rel = f
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(
            guide.contains(&rel),
            "docs/deployment.md does not mention {rel}"
        );
    }
}

/// The checks catch the mistakes they are for: each mutation of the real
/// examples must be reported, naming what is wrong.
#[test]
fn broken_examples_are_caught() {
    let files: Vec<Example> = clusters()
        .into_values()
        .find(|f| f.iter().filter(|e| runs_meta(e)).count() >= 2)
        .expect("an example with several metadata partitions");
    assert_none("the unchanged example", check_cluster(&files));
    let meta_at = |files: &[Example], i: usize| {
        files
            .iter()
            .position(|e| runs_meta(e) && e.cfg.meta.partition as usize == i)
            .unwrap()
    };
    let with_stores = |files: &[Example]| files.iter().position(runs_stores).unwrap();
    type Mutation = Box<dyn Fn(&mut Vec<Example>)>;
    let cases: Vec<(&str, Mutation)> = vec![
        (
            "names the cluster's token file",
            Box::new(move |f| {
                let i = with_stores(f);
                f[i].cfg.security.token_file = None;
            }),
        ),
        (
            "runs with the cluster token",
            Box::new(move |f| {
                let i = meta_at(f, 0);
                f[i].cfg.security.insecure = true;
            }),
        ),
        (
            "same metadata servers in the same order",
            Box::new(move |f| {
                let i = with_stores(f);
                f[i].cfg.client.meta.reverse();
            }),
        ),
        (
            "appears 2 times",
            Box::new(move |f| {
                let i = meta_at(f, 1);
                f[i].cfg.meta.partition = 0;
            }),
        ),
        (
            "meta.partitions is 3",
            Box::new(move |f| {
                let i = meta_at(f, 0);
                f[i].cfg.meta.partitions = 3;
            }),
        ),
        (
            "is registered by",
            Box::new(move |f| {
                let i = with_stores(f);
                let a = registered(&f[i].cfg.store[0]).to_string();
                f[i].cfg.store[1].advertise = Some(a);
            }),
        ),
        (
            "already used by another server",
            Box::new(move |f| {
                let i = with_stores(f);
                let l = f[i].cfg.store[0].listen.clone();
                f[i].cfg.store[1].listen = l;
            }),
        ),
        (
            "meta.block_size",
            Box::new(move |f| {
                let i = with_stores(f);
                f[i].cfg.meta.block_size.0 *= 2;
            }),
        ),
        (
            "meta.expect_servers",
            Box::new(move |f| {
                let i = with_stores(f);
                let s = f[i].cfg.store[0].clone();
                f[i].cfg.store.push(StoreSection {
                    listen: "0.0.0.0:9099".into(),
                    advertise: s.advertise.map(|a| a.replace(":9070", ":9099")),
                    data_dir: Some("/var/lib/nodekernel/extra".into()),
                    ..s
                });
            }),
        ),
        (
            "must be the meta.listen of exactly one file",
            Box::new(move |f| {
                let i = meta_at(f, 1);
                f[i].cfg.meta.listen = "10.9.9.9:9060".into();
            }),
        ),
        (
            "each host has its own",
            Box::new(move |f| {
                let i = with_stores(f);
                let j = f.iter().rposition(runs_stores).unwrap();
                assert_ne!(i, j);
                let loc = f[j].cfg.client.location.clone();
                f[i].cfg.client.location = loc.clone();
                for s in &mut f[i].cfg.store {
                    s.location = loc.clone();
                }
            }),
        ),
        (
            "heartbeat_ms",
            Box::new(move |f| {
                let i = with_stores(f);
                f[i].cfg.store[0].heartbeat_ms = 60_000;
            }),
        ),
    ];
    for (expect, mutate) in cases {
        let mut broken = files.clone();
        mutate(&mut broken);
        let problems = check_cluster(&broken);
        assert!(
            problems.iter().any(|p| p.contains(expect)),
            "a mutation that should report {expect:?} gave {problems:#?}"
        );
    }

    // Units and instances.
    let subcommands = nk_subcommands();
    let unit = units()["nk-meta@.service"].clone();
    for (from, to, expect) in [
        (" meta ", " metta ", "not an nk subcommand"),
        (" meta ", " status ", "not a server command"),
        ("--config", "--confg", "no --confg"),
        (
            "/%i.toml",
            "/nodekernel.toml",
            "not /etc/nodekernel/%i.toml",
        ),
        ("KillSignal=SIGTERM", "KillSignal=SIGKILL", "KillSignal"),
    ] {
        let broken = unit.replacen(from, to, 1);
        assert_ne!(broken, unit, "{from:?} is not in nk-meta@.service");
        let problems = check_unit("nk-meta@.service", &broken, &subcommands);
        assert!(
            problems.iter().any(|p| p.contains(expect)),
            "{from:?} -> {to:?} should report {expect:?}: {problems:#?}"
        );
    }
    let names: BTreeSet<String> = units().keys().cloned().collect();
    let store_only = files
        .iter()
        .find(|e| runs_stores(e) && !runs_meta(e))
        .unwrap();
    for (text, expect) in [
        (
            format!("nk-meta@{}", store_only.name),
            "configures no metadata server",
        ),
        ("nk-store@nowhere".to_string(), "no example nowhere.toml"),
    ] {
        let problems = check_instances(&files, std::slice::from_ref(&text), &names);
        assert!(
            problems.iter().any(|p| p.contains(expect)),
            "{text} should report {expect:?}: {problems:#?}"
        );
    }

    // The container recipe.
    let recipe = read(&deploy_dir().join("Containerfile"));
    for (from, to, expect) in [
        ("rust:1.", "rust:0.", "rust-version"),
        ("USER nodekernel", "USER root", "non-root"),
        (
            "COPY crates ./crates",
            "COPY crate ./crates",
            "no such path",
        ),
    ] {
        let broken = recipe.replacen(from, to, 1);
        assert_ne!(broken, recipe, "{from:?} is not in the Containerfile");
        let problems = check_containerfile(&broken);
        assert!(
            problems.iter().any(|p| p.contains(expect)),
            "{from:?} -> {to:?} should report {expect:?}: {problems:#?}"
        );
    }
}
