//! Looking into the namespace without copying it: `head`, `tail`, `find`,
//! `du` and `test`.

use crate::common::{coded, invalid, Code};
use crate::fs::{not_a, printable};
use crate::paths::{base_name, expand_all};
use crate::walk::{walk, WalkOpts};
use nodekernel_client::{Client, ErrorCode, Node, NodeType};
use nodekernel_cluster::human;
use serde::Serialize;
use std::io::Write;

/// Bytes `head`/`tail` read at a time while counting lines.
const LINE_CHUNK: u64 = 64 << 10;

/// How much of a file `head` or `tail` prints.
#[derive(Debug, Clone, Copy)]
pub enum Amount {
    Bytes(u64),
    Lines(u64),
}

async fn data_node(client: &Client, path: &str) -> anyhow::Result<Node> {
    let node = client.lookup(path).await?;
    if node.info().ty.is_container() {
        return Err(not_a(path, node.info().ty, "File or KeyValue"));
    }
    Ok(node)
}

/// Which end of a file `head`/`tail` print.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Head,
    Tail,
}

/// `nk head` and `nk tail`: the first or last bytes or lines of each file
/// (`==> PATH <==` headings when there are several, as `head` does),
/// reading only what they print (and, for lines, the chunk around it).
pub async fn peek(
    client: &Client,
    operands: &[String],
    amount: Amount,
    end: End,
) -> anyhow::Result<()> {
    let paths = expand_all(client, operands).await?;
    let mut out = std::io::stdout().lock();
    for (i, p) in paths.iter().enumerate() {
        if paths.len() > 1 {
            let sep = if i == 0 { "" } else { "\n" };
            writeln!(out, "{sep}==> {} <==", printable(p))?;
        }
        let node = data_node(client, p).await?;
        let bytes = match end {
            End::Head => head_of(&node, amount).await?,
            End::Tail => tail_of(&node, amount).await?,
        };
        out.write_all(&bytes)?;
    }
    out.flush()?;
    Ok(())
}

async fn head_of(node: &Node, amount: Amount) -> nodekernel_client::Result<Vec<u8>> {
    let size = node.info().size;
    let n = match amount {
        Amount::Bytes(n) => return node.read(0, n.min(size)).await,
        Amount::Lines(n) => n,
    };
    let mut got = Vec::new();
    let mut at = 0;
    while at < size {
        let len = LINE_CHUNK.min(size - at);
        got.extend_from_slice(&node.read(at, len).await?);
        at += len;
        if let Some(end) = nth_newline_end(&got, n) {
            got.truncate(end);
            break;
        }
    }
    Ok(got)
}

async fn tail_of(node: &Node, amount: Amount) -> nodekernel_client::Result<Vec<u8>> {
    let size = node.info().size;
    let n = match amount {
        Amount::Bytes(n) => {
            let n = n.min(size);
            return node.read(size - n, n).await;
        }
        Amount::Lines(n) => n,
    };
    // Read backwards until n line ends before the last byte (a final
    // newline ends the last line, it starts none).
    let mut got: Vec<u8> = Vec::new();
    let mut at = size;
    loop {
        if let Some(start) = start_of_last_lines(&got, n, at == 0) {
            got.drain(..start);
            return Ok(got);
        }
        let len = LINE_CHUNK.min(at);
        at -= len;
        let mut chunk = node.read(at, len).await?;
        chunk.extend_from_slice(&got);
        got = chunk;
    }
}

/// The length of the first `n` lines of `data`, if it holds that many.
fn nth_newline_end(data: &[u8], n: u64) -> Option<usize> {
    if n == 0 {
        return Some(0);
    }
    data.iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .nth(n as usize - 1)
        .map(|(i, _)| i + 1)
}

/// Where the last `n` lines of `data` start, if `data` shows it (it holds
/// n line ends before its last byte, or it is the whole file).
fn start_of_last_lines(data: &[u8], n: u64, whole: bool) -> Option<usize> {
    if n == 0 {
        return Some(data.len());
    }
    let body = match data.last() {
        Some(b'\n') => &data[..data.len() - 1],
        _ => data,
    };
    let found = body
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, b)| **b == b'\n')
        .nth(n as usize - 1)
        .map(|(i, _)| i + 1);
    match found {
        Some(i) => Some(i),
        None if whole => Some(0),
        None => None,
    }
}

/// What `nk find` looks for.
#[derive(Debug, Clone, Default)]
pub struct FindOpts {
    /// A wildcard pattern the last component must match.
    pub name: Option<String>,
    /// Node types to show (empty: all).
    pub types: Vec<NodeType>,
    pub max_depth: Option<usize>,
    pub json: bool,
}

/// `f`, `d`, `t`, `b` or `k` (as `find -type` takes them), or a type name.
pub fn parse_find_type(s: &str) -> Result<NodeType, String> {
    let t = match s {
        "f" => Some(NodeType::File),
        "d" => Some(NodeType::Directory),
        "t" => Some(NodeType::Table),
        "b" => Some(NodeType::Bag),
        "k" => Some(NodeType::KeyValue),
        _ => NodeType::parse(s),
    };
    t.ok_or_else(|| {
        format!("{s:?}: expected f (File), d (Directory), t (Table), b (Bag) or k (KeyValue)")
    })
}

/// `nk find`: every node under each path (the path itself included) that
/// matches, in pre-order, one path per line.
pub async fn find(client: &Client, operands: &[String], o: &FindOpts) -> anyhow::Result<()> {
    let pattern = match &o.name {
        Some(n) => Some(
            glob::Pattern::new(n)
                .map_err(|e| invalid(format!("--name {n:?}: bad wildcard: {}", e.msg)))?,
        ),
        None => None,
    };
    let roots = expand_all(client, operands).await?;
    let mut out = std::io::stdout().lock();
    let mut found = Vec::new();
    for root in roots {
        let opts = WalkOpts {
            info: false,
            max_depth: o.max_depth,
        };
        walk(client, &root, opts, |e| {
            let name = base_name(&e.path);
            let name_ok = pattern.as_ref().is_none_or(|p| p.matches(name));
            let type_ok = o.types.is_empty() || o.types.contains(&e.ty);
            if name_ok && type_ok {
                if o.json {
                    found.push(e.path);
                } else {
                    writeln!(out, "{}", printable(&e.path))?;
                }
            }
            Ok(())
        })
        .await?;
    }
    if o.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&found)?)?;
    }
    Ok(())
}

#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
struct Usage {
    path: String,
    /// Bytes the data nodes below hold (their sizes, not the blocks
    /// they take).
    bytes: u64,
    /// Bytes of the cluster the nodes below take (blocks, pieces, and the
    /// containers' child records, this one's included).
    stored: u64,
    files: u64,
    containers: u64,
}

/// `nk du`: the bytes of data under each path, and for each container
/// below it (children before their parents, as `du` does); with
/// `summarize`, only the totals; with `stored`, the bytes of the cluster
/// they take instead.
pub async fn du(
    client: &Client,
    operands: &[String],
    summarize: bool,
    human_sizes: bool,
    stored: bool,
    json: bool,
) -> anyhow::Result<()> {
    let roots = expand_all(client, operands).await?;
    let mut rows = Vec::new();
    for root in roots {
        // The containers on the path being walked, with their totals so
        // far: a container's row is done once the walk leaves it.
        let mut open: Vec<(usize, Usage)> = Vec::new();
        let opts = WalkOpts {
            info: true,
            max_depth: None,
        };
        walk(client, &root, opts, |e| {
            while open.last().is_some_and(|(d, _)| *d >= e.depth) {
                close(&mut open, &mut rows, summarize);
            }
            let taken = e.info.as_ref().map_or(0, |i| i.stored);
            if e.ty.is_container() {
                open.push((
                    e.depth,
                    Usage {
                        path: e.path,
                        bytes: 0,
                        stored: taken,
                        files: 0,
                        containers: 1,
                    },
                ));
            } else {
                let size = e.info.map_or(0, |i| i.size);
                match open.last_mut() {
                    Some((_, u)) => {
                        u.bytes += size;
                        u.stored += taken;
                        u.files += 1;
                    }
                    // The root is a data node.
                    None => rows.push(Usage {
                        path: e.path,
                        bytes: size,
                        stored: taken,
                        files: 1,
                        containers: 0,
                    }),
                }
            }
            Ok(())
        })
        .await?;
        while !open.is_empty() {
            close(&mut open, &mut rows, summarize);
        }
    }
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?;
        return Ok(());
    }
    for r in rows {
        let n = if stored { r.stored } else { r.bytes };
        let size = if human_sizes { human(n) } else { n.to_string() };
        writeln!(out, "{size}\t{}", printable(&r.path))?;
    }
    Ok(())
}

/// Ends the innermost open container: its totals go to its parent and,
/// unless only totals are wanted, its row is printed.
fn close(open: &mut Vec<(usize, Usage)>, rows: &mut Vec<Usage>, summarize: bool) {
    let Some((_, u)) = open.pop() else { return };
    match open.last_mut() {
        Some((_, parent)) => {
            parent.bytes += u.bytes;
            parent.stored += u.stored;
            parent.files += u.files;
            parent.containers += u.containers;
            if !summarize {
                rows.push(u);
            }
        }
        None => rows.push(u),
    }
}

/// What `nk test` checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// The path exists.
    Exists,
    /// It is a container.
    Dir,
    /// It is a File or KeyValue.
    File,
    /// It is a File or KeyValue holding at least one byte.
    NonEmpty,
    /// It is a File or KeyValue of zero bytes.
    Empty,
}

/// `nk test`: whether the check holds (exit status 0) or not (1). An error
/// (the cluster unreachable, a bad path) is an error, not a "no".
pub async fn test(client: &Client, path: &str, t: Test) -> anyhow::Result<bool> {
    let path = crate::paths::norm(path);
    let info = match client.lookup(&path).await {
        Ok(n) => n.info().clone(),
        // A path through a data node names nothing either.
        Err(e) if matches!(e.code, ErrorCode::NotFound | ErrorCode::TypeMismatch) => {
            return Ok(false)
        }
        Err(e) => return Err(e.into()),
    };
    let data = !info.ty.is_container();
    Ok(match t {
        Test::Exists => true,
        Test::Dir => !data,
        Test::File => data,
        Test::NonEmpty => data && info.size > 0,
        Test::Empty => data && info.size == 0,
    })
}

/// A size or count flag of `head`/`tail`: a whole number, with size units
/// for bytes (`-c 1KiB`).
pub fn parse_count(s: &str) -> Result<u64, String> {
    crate::common::parse_size(s).map(|b| b.0)
}

/// `InvalidArgument` unless exactly one of the checks was asked for.
pub fn one_test(flags: &[(bool, Test)]) -> anyhow::Result<Test> {
    let asked: Vec<Test> = flags
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, t)| *t)
        .collect();
    match asked[..] {
        [t] => Ok(t),
        _ => Err(coded(
            Code::Wire(ErrorCode::InvalidArgument),
            "nk test takes exactly one of -e, -d, -f, -s, -z",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_counts_lines_from_the_start() {
        assert_eq!(nth_newline_end(b"a\nb\nc\n", 2), Some(4));
        assert_eq!(nth_newline_end(b"a\nb", 2), None);
        assert_eq!(nth_newline_end(b"a\nb", 0), Some(0));
    }

    #[test]
    fn tail_counts_lines_from_the_end() {
        assert_eq!(start_of_last_lines(b"a\nb\nc\n", 2, true), Some(2));
        assert_eq!(start_of_last_lines(b"a\nb\nc", 2, true), Some(2));
        assert_eq!(start_of_last_lines(b"a\nb\nc\n", 5, true), Some(0));
        assert_eq!(start_of_last_lines(b"b\nc\n", 5, false), None);
        assert_eq!(start_of_last_lines(b"x\nb\nc\n", 2, false), Some(2));
        assert_eq!(start_of_last_lines(b"abc", 0, true), Some(3));
    }

    #[test]
    fn find_types_take_finds_letters_and_names() {
        assert_eq!(parse_find_type("f"), Ok(NodeType::File));
        assert_eq!(parse_find_type("d"), Ok(NodeType::Directory));
        assert_eq!(parse_find_type("table"), Ok(NodeType::Table));
        assert!(parse_find_type("x").is_err());
    }

    #[test]
    fn du_totals_go_to_their_parents() {
        // Each node here takes ten times its bytes of the cluster.
        let u = |p: &str, bytes, files, containers| Usage {
            path: p.into(),
            bytes,
            stored: 10 * bytes,
            files,
            containers,
        };
        let mut open = vec![(0, u("/a", 1, 1, 1)), (1, u("/a/b", 5, 2, 1))];
        let mut rows = Vec::new();
        close(&mut open, &mut rows, false);
        close(&mut open, &mut rows, false);
        assert_eq!(rows, vec![u("/a/b", 5, 2, 1), u("/a", 6, 3, 2)]);
        let mut open = vec![(0, u("/a", 1, 1, 1)), (1, u("/a/b", 5, 2, 1))];
        let mut rows = Vec::new();
        close(&mut open, &mut rows, true);
        close(&mut open, &mut rows, true);
        assert_eq!(rows, vec![u("/a", 6, 3, 2)]);
    }
}
