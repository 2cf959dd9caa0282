//! Path rules.
//!
//! A path is absolute and `/`-separated UTF-8. Each component is non-empty,
//! at most [`MAX_NAME_LEN`] bytes, is neither `.` nor `..` and contains no NUL
//! (and, being a component, no `/`). A path has at most [`MAX_DEPTH`]
//! components and at most [`MAX_PATH_LEN`] bytes. The root is `/`.
//! Names are kept in full everywhere: two different names never collide.

use crate::error::{Error, Result};

/// Longest component, in bytes.
pub const MAX_NAME_LEN: usize = 255;
/// Longest path, in bytes.
pub const MAX_PATH_LEN: usize = 4096;
/// Most components in one path.
pub const MAX_DEPTH: usize = 128;

/// Checks a path and returns its components (empty for the root).
pub fn components(path: &str) -> Result<Vec<&str>> {
    let bad = |why: String| Error::invalid_path(format!("{path:?}: {why}"));
    if path.len() > MAX_PATH_LEN {
        return Err(bad(format!(
            "path is {} bytes, the limit is {MAX_PATH_LEN}",
            path.len()
        )));
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(bad("paths must be absolute (start with '/')".into()));
    };
    if rest.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for comp in rest.split('/') {
        check_name(comp).map_err(|e| bad(e.message))?;
        out.push(comp);
        if out.len() > MAX_DEPTH {
            return Err(bad(format!("more than {MAX_DEPTH} components")));
        }
    }
    Ok(out)
}

/// Checks one name component.
pub fn check_name(name: &str) -> Result<()> {
    let why = if name.is_empty() {
        "empty component (double or trailing '/')".to_string()
    } else if name == "." || name == ".." {
        format!("component {name:?} is not allowed")
    } else if name.contains('\0') {
        "component contains a NUL byte".to_string()
    } else if name.contains('/') {
        "component contains '/'".to_string()
    } else if name.len() > MAX_NAME_LEN {
        format!(
            "component of {} bytes exceeds the limit of {MAX_NAME_LEN}",
            name.len()
        )
    } else {
        return Ok(());
    };
    Err(Error::invalid_path(why))
}

/// Splits a valid non-root path into (parent path, last name).
pub fn split_parent(path: &str) -> Result<(&str, &str)> {
    let comps = components(path)?;
    if comps.is_empty() {
        return Err(Error::invalid_path("\"/\": the root has no parent"));
    }
    let idx = path.rfind('/').expect("absolute path has a '/'");
    let parent = if idx == 0 { "/" } else { &path[..idx] };
    Ok((parent, &path[idx + 1..]))
}

/// Joins a parent path and a child name.
pub fn join(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

/// The top-level component that decides which metadata partition owns a path
/// (`None` for the root, which every partition shares).
pub fn top_level(path: &str) -> Option<&str> {
    path.strip_prefix('/')
        .and_then(|r| r.split('/').next())
        .filter(|s| !s.is_empty())
}

/// Stable FNV-1a hash of a top-level name: metadata partition = hash % n.
pub fn partition_of(path: &str, partitions: usize) -> usize {
    if partitions <= 1 {
        return 0;
    }
    let Some(top) = top_level(path) else { return 0 };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in top.as_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % partitions as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    #[test]
    fn valid_paths() {
        assert_eq!(components("/").unwrap(), Vec::<&str>::new());
        assert_eq!(components("/a/b c/ü").unwrap(), vec!["a", "b c", "ü"]);
        assert_eq!(split_parent("/a").unwrap(), ("/", "a"));
        assert_eq!(split_parent("/a/b/c").unwrap(), ("/a/b", "c"));
        assert_eq!(join("/", "x"), "/x");
        assert_eq!(join("/a", "x"), "/a/x");
    }

    #[test]
    fn invalid_paths_name_the_reason() {
        let long = format!("/{}", "x".repeat(256));
        let deep = "/a".repeat(MAX_DEPTH + 1);
        let cases = [
            ("", "absolute"),
            ("a/b", "absolute"),
            ("//a", "empty component"),
            ("/a//b", "empty component"),
            ("/a/", "empty component"),
            ("/a/..", "\"..\""),
            ("/./a", "\".\""),
            ("/a\0b", "NUL"),
            (long.as_str(), "exceeds the limit of 255"),
            (deep.as_str(), "components"),
        ];
        for (p, why) in cases {
            let e = components(p).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidPath, "{p:?}");
            assert!(e.message.contains(why), "{p:?}: {}", e.message);
        }
        let exact = format!("/{}", "x".repeat(255));
        assert!(components(&exact).is_ok());
        let too_long = format!("/{}", ["y"; 2100].join("/"));
        assert!(components(&too_long).unwrap_err().message.contains("bytes"));
    }

    #[test]
    fn partitioning_uses_top_level_only() {
        assert_eq!(partition_of("/a/b/c", 4), partition_of("/a", 4));
        assert_eq!(partition_of("/", 4), 0);
        assert_eq!(partition_of("/anything", 1), 0);
        let spread: std::collections::HashSet<_> = (0..64)
            .map(|i| partition_of(&format!("/t{i}"), 4))
            .collect();
        assert_eq!(
            spread.len(),
            4,
            "top-level names spread over all partitions"
        );
    }
}
