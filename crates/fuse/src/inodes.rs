//! The mount's inode numbers: plain data, no I/O.
//!
//! The kernel names files by inode number; NodeKernel names them by path.
//! Node ids cannot serve as inode numbers: a replaced KeyValue is a new
//! node at the same path, and every metadata partition counts its own
//! ids. So the mount numbers the paths it hands out itself, keeps each
//! number's path current across renames (a directory's descendants move
//! with it), and forgets a number once the kernel has forgotten every
//! lookup of it.

use nodekernel_client::NodeType;
use std::collections::HashMap;

/// The kernel's number for the mount's root.
pub const ROOT_INO: u64 = 1;

#[derive(Debug)]
struct Entry {
    /// The NodeKernel path; `None` once the node was removed or replaced
    /// (the kernel may still hold the number).
    path: Option<String>,
    /// Lookups the kernel has not forgotten yet.
    lookups: u64,
    /// The node's type, once known (it stays with the number: a rename
    /// moves the node, a replaced path gets a new number).
    kind: Option<NodeType>,
}

#[derive(Debug)]
pub struct Inodes {
    by_ino: HashMap<u64, Entry>,
    by_path: HashMap<String, u64>,
    next: u64,
}

/// `name` under directory `parent` (both NodeKernel paths).
pub fn child_path(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

impl Inodes {
    /// A table whose root number names `root`.
    pub fn new(root: &str) -> Inodes {
        let mut t = Inodes {
            by_ino: HashMap::new(),
            by_path: HashMap::new(),
            next: ROOT_INO + 1,
        };
        t.by_ino.insert(
            ROOT_INO,
            Entry {
                path: Some(root.to_string()),
                lookups: 1,
                kind: None,
            },
        );
        t.by_path.insert(root.to_string(), ROOT_INO);
        t
    }

    pub fn path(&self, ino: u64) -> Option<&str> {
        self.by_ino.get(&ino).and_then(|e| e.path.as_deref())
    }

    pub fn kind(&self, ino: u64) -> Option<NodeType> {
        self.by_ino.get(&ino).and_then(|e| e.kind)
    }

    pub fn set_kind(&mut self, ino: u64, kind: NodeType) {
        if let Some(e) = self.by_ino.get_mut(&ino) {
            e.kind = Some(kind);
        }
    }

    pub fn ino(&self, path: &str) -> Option<u64> {
        self.by_path.get(path).copied()
    }

    /// The number of `path`, counting one more lookup by the kernel when
    /// `lookup` is set (a readdir entry is not a lookup).
    pub fn intern(&mut self, path: &str, lookup: bool) -> u64 {
        let ino = match self.by_path.get(path) {
            Some(i) => *i,
            None => {
                let ino = self.next;
                self.next += 1;
                self.by_path.insert(path.to_string(), ino);
                self.by_ino.insert(
                    ino,
                    Entry {
                        path: Some(path.to_string()),
                        lookups: 0,
                        kind: None,
                    },
                );
                ino
            }
        };
        if lookup {
            if let Some(e) = self.by_ino.get_mut(&ino) {
                e.lookups += 1;
            }
        }
        ino
    }

    /// The kernel forgets `n` lookups of `ino`; at zero the number goes.
    pub fn forget(&mut self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let Some(e) = self.by_ino.get_mut(&ino) else {
            return;
        };
        e.lookups = e.lookups.saturating_sub(n);
        if e.lookups == 0 {
            if let Some(p) = self.by_ino.remove(&ino).and_then(|e| e.path) {
                self.by_path.remove(&p);
            }
        }
    }

    /// `path` is gone (removed, or replaced by a rename): its number keeps
    /// no path, and so do its descendants'.
    pub fn detach(&mut self, path: &str) {
        for p in self.subtree(path) {
            if let Some(ino) = self.by_path.remove(&p) {
                match self.by_ino.get_mut(&ino) {
                    Some(e) if e.lookups > 0 => e.path = None,
                    _ => {
                        self.by_ino.remove(&ino);
                    }
                }
            }
        }
    }

    /// `from` is now `to` (and so is everything under it); whatever was at
    /// `to` is detached first.
    pub fn rename(&mut self, from: &str, to: &str) {
        if from == to {
            return;
        }
        self.detach(to);
        for p in self.subtree(from) {
            let Some(ino) = self.by_path.remove(&p) else {
                continue;
            };
            let moved = format!("{to}{}", &p[from.len()..]);
            if let Some(e) = self.by_ino.get_mut(&ino) {
                e.path = Some(moved.clone());
            }
            self.by_path.insert(moved, ino);
        }
    }

    /// `path` and the known paths under it.
    fn subtree(&self, path: &str) -> Vec<String> {
        let prefix = if path == "/" {
            "/".to_string()
        } else {
            format!("{path}/")
        };
        self.by_path
            .keys()
            .filter(|p| p.as_str() == path || p.starts_with(&prefix))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_follow_renames_and_go_when_forgotten() {
        let mut t = Inodes::new("/m");
        assert_eq!(t.path(ROOT_INO), Some("/m"));
        let d = t.intern("/m/d", true);
        let f = t.intern("/m/d/f", true);
        assert_eq!(
            t.intern("/m/d/f", true),
            f,
            "the same path, the same number"
        );
        t.rename("/m/d", "/m/e");
        assert_eq!(t.path(d), Some("/m/e"));
        assert_eq!(t.path(f), Some("/m/e/f"), "descendants move along");
        assert_eq!(t.ino("/m/d/f"), None);
        // A rename over an existing path detaches the old one.
        let g = t.intern("/m/g", true);
        t.rename("/m/e/f", "/m/g");
        assert_eq!(t.path(f), Some("/m/g"));
        assert_eq!(
            t.path(g),
            None,
            "the replaced file keeps its number, not the path"
        );
        assert_eq!(t.ino("/m/g"), Some(f));
        // Forgetting every lookup drops the number.
        t.forget(f, 1);
        assert_eq!(t.path(f), Some("/m/g"), "one lookup left");
        t.forget(f, 1);
        assert_eq!(t.path(f), None);
        assert_eq!(t.ino("/m/g"), None);
        t.set_kind(d, NodeType::Directory);
        assert_eq!(
            t.kind(d),
            Some(NodeType::Directory),
            "kept across the rename"
        );
        t.forget(ROOT_INO, 100);
        assert_eq!(t.path(ROOT_INO), Some("/m"), "the root stays");
    }

    #[test]
    fn detach_takes_a_subtree_and_readdir_entries_need_no_forget() {
        let mut t = Inodes::new("/");
        let a = t.intern("/a", true);
        let listed = t.intern("/a/x", false);
        let ab = t.intern("/ab", false);
        t.detach("/a");
        assert_eq!(t.path(a), None);
        assert_eq!(
            t.path(listed),
            None,
            "an entry nobody looked up goes at once"
        );
        assert_eq!(t.ino("/ab"), Some(ab), "a sibling sharing the prefix stays");
        assert_eq!(child_path("/", "a"), "/a");
        assert_eq!(child_path("/a", "b"), "/a/b");
    }
}
