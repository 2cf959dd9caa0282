//! Paths on the command line: cluster paths (normalised, wildcards
//! expanded against the namespace) and, for `nk cp`, which side of the
//! copy an operand names.

use crate::common::{coded, Code};
use nodekernel_client::{Client, ErrorCode, NodeType};
use std::path::PathBuf;

/// Accepts `/a/b/` for `/a/b` (the core refuses empty components).
pub fn norm(path: &str) -> String {
    if path.len() > 1 && path.ends_with('/') {
        path.trim_end_matches('/').to_string()
    } else {
        path.to_string()
    }
}

/// The last component of a cluster path (`""` for `/`).
pub fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or_default()
}

/// An operand of `nk cp`: a cluster path (`/a/b`, or `nk:/a/b`) or a
/// local one (`file:PATH`, or `-` for stdin and stdout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loc {
    Cluster(String),
    Local(PathBuf),
}

impl Loc {
    /// Reads an operand: `file:` marks a local path (`file:///tmp/x`,
    /// `file:/tmp/x` and `file:x` alike), `nk:` a cluster one (`nk:/a`,
    /// `nk:///a`), `-` is stdin or stdout; otherwise an absolute path is a
    /// cluster path, and a relative one is refused (the cluster has no
    /// working directory), saying how to name a local file.
    pub fn parse(s: &str) -> anyhow::Result<Loc> {
        if s == "-" {
            return Ok(Loc::Local(PathBuf::from("-")));
        }
        if let Some(rest) = s.strip_prefix("file:") {
            let rest = rest.strip_prefix("//").unwrap_or(rest);
            if rest.is_empty() {
                return Err(coded(
                    Code::Wire(ErrorCode::InvalidArgument),
                    "file: names no path",
                ));
            }
            return Ok(Loc::Local(PathBuf::from(rest)));
        }
        if let Some(rest) = s.strip_prefix("nk:") {
            let rest = rest.strip_prefix("//").unwrap_or(rest);
            return Ok(Loc::Cluster(norm(rest)));
        }
        if s.starts_with('/') {
            return Ok(Loc::Cluster(norm(s)));
        }
        Err(coded(
            Code::Wire(ErrorCode::InvalidPath),
            format!(
                "{s:?} is a relative path: cluster paths start with / (or nk:/), local ones with file: (file:{s})"
            ),
        ))
    }

    pub fn is_local(&self) -> bool {
        matches!(self, Loc::Local(_))
    }
}

impl std::fmt::Display for Loc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Loc::Cluster(p) => f.write_str(p),
            Loc::Local(p) => write!(f, "{}", p.display()),
        }
    }
}

/// Whether `s` holds a wildcard (`*`, `?` or `[`).
pub fn has_wildcard(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// How wildcards match a name: as a shell does, `*` and `?` never match a
/// leading `.` (hidden names need `.*`), and never cross a `/`.
const MATCH: glob::MatchOptions = glob::MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: true,
};

/// The paths `pattern` names: itself (normalised) if it has no wildcard;
/// else every existing path whose components match it, component by
/// component (`*`, `?`, `[abc]`, `[!abc]`; `[*]` for a literal `*`),
/// sorted. A pattern that matches nothing is `NotFound`, as in a shell
/// with `failglob`.
pub async fn expand(client: &Client, pattern: &str) -> anyhow::Result<Vec<String>> {
    let pattern = norm(pattern);
    if !has_wildcard(&pattern) {
        return Ok(vec![pattern]);
    }
    if !pattern.starts_with('/') {
        return Err(coded(
            Code::Wire(ErrorCode::InvalidPath),
            format!("{pattern:?}: cluster paths start with /"),
        ));
    }
    let mut found = vec![String::from("/")];
    for comp in pattern.split('/').filter(|c| !c.is_empty()) {
        let mut next = Vec::new();
        if !has_wildcard(comp) {
            for dir in &found {
                next.push(nodekernel_proto::path::join(dir, comp));
            }
        } else {
            let pat = glob::Pattern::new(comp).map_err(|e| {
                coded(
                    Code::Wire(ErrorCode::InvalidArgument),
                    format!("{pattern:?}: bad wildcard in {comp:?}: {}", e.msg),
                )
            })?;
            for dir in &found {
                let names = match client.enumerate_typed(dir).await {
                    Ok(n) => n,
                    // Something that is not a container (or is gone) has no
                    // children to match.
                    Err(e) if matches!(e.code, ErrorCode::NotFound | ErrorCode::TypeMismatch) => {
                        continue
                    }
                    Err(e) => return Err(e.into()),
                };
                let mut names: Vec<String> = names
                    .into_iter()
                    .map(|(n, _)| n)
                    .filter(|n| pat.matches_with(n, MATCH))
                    .collect();
                names.sort();
                next.extend(names.iter().map(|n| nodekernel_proto::path::join(dir, n)));
            }
        }
        found = next;
    }
    // A match ending in a wildcard was listed, so it exists; literal
    // components after the last wildcard may name nothing.
    let last = pattern.rsplit('/').next().unwrap_or_default();
    let mut out = Vec::with_capacity(found.len());
    for p in found {
        if has_wildcard(last) {
            out.push(p);
            continue;
        }
        match client.lookup(&p).await {
            Ok(_) => out.push(p),
            Err(e) if matches!(e.code, ErrorCode::NotFound | ErrorCode::TypeMismatch) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if out.is_empty() {
        return Err(coded(
            Code::Wire(ErrorCode::NotFound),
            format!("no match for {pattern}"),
        ));
    }
    Ok(out)
}

/// Every operand expanded ([`expand`]), in the order given.
pub async fn expand_all(client: &Client, operands: &[String]) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for o in operands {
        out.extend(expand(client, o).await?);
    }
    Ok(out)
}

/// What kind of node, if any, a cluster path names.
pub async fn cluster_type(client: &Client, path: &str) -> anyhow::Result<Option<NodeType>> {
    match client.lookup(path).await {
        Ok(n) => Ok(Some(n.info().ty)),
        Err(e) if e.code == ErrorCode::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operands_name_their_side() {
        assert_eq!(Loc::parse("/a/b/").unwrap(), Loc::Cluster("/a/b".into()));
        assert_eq!(Loc::parse("nk:/a").unwrap(), Loc::Cluster("/a".into()));
        assert_eq!(Loc::parse("nk:///a").unwrap(), Loc::Cluster("/a".into()));
        assert_eq!(Loc::parse("file:x").unwrap(), Loc::Local("x".into()));
        assert_eq!(
            Loc::parse("file:/tmp/x").unwrap(),
            Loc::Local("/tmp/x".into())
        );
        assert_eq!(
            Loc::parse("file:///tmp/x").unwrap(),
            Loc::Local("/tmp/x".into())
        );
        assert_eq!(Loc::parse("-").unwrap(), Loc::Local("-".into()));
        let e = Loc::parse("data.csv").unwrap_err();
        assert!(e.to_string().contains("file:data.csv"), "{e}");
        assert!(Loc::parse("file:").is_err());
    }

    #[test]
    fn wildcards_match_like_a_shell() {
        let m = |p: &str, n: &str| glob::Pattern::new(p).unwrap().matches_with(n, MATCH);
        assert!(m("*.gz", "a.gz"));
        assert!(!m("*.gz", ".a.gz"), "hidden names need a literal dot");
        assert!(m(".*", ".a"));
        assert!(m("part-?", "part-1"));
        assert!(m("[ab]x", "bx"));
        assert!(!m("[!ab]x", "ax"));
        assert!(m("[*]", "*"));
        assert!(has_wildcard("/a/*") && !has_wildcard("/a/b"));
        assert_eq!(norm("/a/"), "/a");
        assert_eq!(norm("/"), "/");
        assert_eq!(base_name("/a/b"), "b");
    }
}
