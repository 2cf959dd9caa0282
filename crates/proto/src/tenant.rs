//! Tenants (`[[security.tenant]]`, `docs/security.md`, *Tenants*): a
//! credential narrower than the cluster token. A tenant has a name, its own
//! token, a root path and rights; its connections see the namespace from
//! its root down (`/` is its root), and nothing else.
//!
//! This module is plain data and the path arithmetic both ends share: the
//! metadata server maps a tenant's paths into its root and back
//! ([`Tenant::inside`], [`Tenant::outside`]), and rewrites the paths in its
//! error messages ([`Tenant::own_message`]).

use crate::error::{Error, Result};
use crate::path;

/// Most tenants one cluster configures: each connection's proof is checked
/// against every tenant's token (one HMAC each), so the list stays short.
pub const MAX_TENANTS: usize = 1024;
/// Longest tenant name, in bytes.
pub const MAX_TENANT_NAME: usize = 64;

/// What a tenant may do below its root.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rights {
    /// Look up, list, read, `du`, quotas' listing.
    pub read: bool,
    /// Create, write, remove, move, TTLs, sessions' bindings.
    pub write: bool,
    /// Set quotas on containers strictly below its root (never on the root
    /// itself: that quota is the cluster admin's cap on the tenant).
    pub admin: bool,
}

impl Rights {
    /// Rights named as in the configuration (`read`, `write`, `admin`).
    pub fn parse(names: &[String]) -> Result<Rights> {
        let mut r = Rights::default();
        for n in names {
            match n.as_str() {
                "read" => r.read = true,
                "write" => r.write = true,
                "admin" => r.admin = true,
                other => {
                    return Err(Error::invalid_argument(format!(
                        "unknown right {other:?}: a tenant's rights are \"read\", \"write\" and \
                         \"admin\""
                    )))
                }
            }
        }
        if r == Rights::default() {
            return Err(Error::invalid_argument(
                "a tenant needs at least one right (\"read\", \"write\", \"admin\")",
            ));
        }
        Ok(r)
    }

    /// The names of the rights held, for messages and listings.
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.read, "read"),
            (self.write, "write"),
            (self.admin, "admin"),
        ]
        .into_iter()
        .filter_map(|(held, n)| held.then_some(n))
        .collect()
    }
}

/// One tenant: who it is, where its namespace starts, what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub name: String,
    /// An absolute, valid path ([`crate::path`]); `/` gives the tenant the
    /// whole namespace (a narrower credential: read-only, say).
    pub root: String,
    pub rights: Rights,
}

impl Tenant {
    /// A tenant, its name and root checked.
    pub fn new(name: &str, root: &str, rights: Rights) -> Result<Tenant> {
        let ok_name = !name.is_empty()
            && name.len() <= MAX_TENANT_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
        if !ok_name {
            return Err(Error::invalid_argument(format!(
                "tenant name {name:?}: 1 to {MAX_TENANT_NAME} letters, digits, '-', '_' or '.'"
            )));
        }
        path::components(root)
            .map_err(|e| Error::invalid_argument(format!("tenant {name}'s root: {}", e.message)))?;
        Ok(Tenant {
            name: name.to_string(),
            root: root.to_string(),
            rights,
        })
    }

    /// The namespace path of the tenant's path `p` (checked: absolute and
    /// valid, and not past the path limits once under the root).
    pub fn inside(&self, p: &str) -> Result<String> {
        path::components(p)?;
        let full = if self.root == "/" {
            p.to_string()
        } else if p == "/" {
            self.root.clone()
        } else {
            format!("{}{p}", self.root)
        };
        // The root's length counts against the path limits.
        path::components(&full).map_err(|e| Error::invalid_path(self.own_message(&e.message)))?;
        Ok(full)
    }

    /// The tenant's path for namespace path `p`, if it lies in the root.
    pub fn outside(&self, p: &str) -> Option<String> {
        if self.root == "/" {
            return Some(p.to_string());
        }
        if p == self.root {
            return Some("/".into());
        }
        let rest = p.strip_prefix(self.root.as_str())?;
        rest.starts_with('/').then(|| rest.to_string())
    }

    /// `msg` with every namespace path in the root written as the tenant
    /// sees it: the root's prefix taken off where it stands as a whole
    /// path or a whole leading part of one (followed by `/`, a quote,
    /// whitespace, `:`, `,`, `)` or the end).
    pub fn own_message(&self, msg: &str) -> String {
        if self.root == "/" {
            return msg.to_string();
        }
        let root = self.root.as_str();
        let mut out = String::with_capacity(msg.len());
        let mut rest = msg;
        while let Some(i) = rest.find(root) {
            let after = &rest[i + root.len()..];
            // A path starts at the root's '/': what precedes it must not be
            // part of a longer path.
            let starts = i == 0 || !is_path_byte(rest.as_bytes()[i - 1]);
            match after.bytes().next() {
                Some(b'/') if starts => {
                    out.push_str(&rest[..i]);
                    rest = after;
                }
                None if starts => {
                    out.push_str(&rest[..i]);
                    out.push('/');
                    rest = after;
                }
                Some(b) if starts && ends_path(b) => {
                    out.push_str(&rest[..i]);
                    out.push('/');
                    rest = after;
                }
                _ => {
                    out.push_str(&rest[..i + root.len()]);
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        out
    }
}

/// Bytes that may stand inside a path as messages print them.
fn is_path_byte(b: u8) -> bool {
    !(b.is_ascii_whitespace() || matches!(b, b'"' | b'\'' | b'(' | b'[' | b','))
}

/// Bytes that end a path in a message.
fn ends_path(b: u8) -> bool {
    b.is_ascii_whitespace() || matches!(b, b'"' | b'\'' | b':' | b',' | b')' | b']' | b';')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(root: &str) -> Tenant {
        Tenant::new("a", root, Rights::parse(&["read".into()]).unwrap()).unwrap()
    }

    #[test]
    fn paths_map_into_the_root_and_back() {
        let a = t("/tenants/a");
        assert_eq!(a.inside("/").unwrap(), "/tenants/a");
        assert_eq!(a.inside("/x/y").unwrap(), "/tenants/a/x/y");
        assert!(a.inside("x").is_err());
        assert!(a.inside("/../b").is_err());
        assert!(a.inside("/x/").is_err());
        assert_eq!(a.outside("/tenants/a").as_deref(), Some("/"));
        assert_eq!(a.outside("/tenants/a/x").as_deref(), Some("/x"));
        // A sibling whose name starts like the root is not in it.
        assert_eq!(a.outside("/tenants/ab"), None);
        assert_eq!(a.outside("/tenants"), None);
        assert_eq!(a.outside("/"), None);
        let all = t("/");
        assert_eq!(all.inside("/x").unwrap(), "/x");
        assert_eq!(all.outside("/").as_deref(), Some("/"));
    }

    #[test]
    fn the_root_counts_against_the_path_limits() {
        let root = format!("/{}", "r".repeat(200));
        let a = t(&root);
        let long = format!("/{}", vec!["n"; path::MAX_DEPTH].join("/"));
        assert!(path::components(&long).is_ok());
        let e = a.inside(&long).unwrap_err();
        assert!(!e.message.contains(&root), "{e}");
    }

    #[test]
    fn messages_name_the_tenants_paths() {
        let a = t("/tenants/a");
        assert_eq!(
            a.own_message("\"/tenants/a/x\": not found; parent /tenants/a does not exist"),
            "\"/x\": not found; parent / does not exist"
        );
        assert_eq!(a.own_message("/tenants/a: its quota"), "/: its quota");
        assert_eq!(a.own_message("at /tenants/a"), "at /");
        // Not a path in the root: left as it is.
        assert_eq!(a.own_message("/tenants/ab/x"), "/tenants/ab/x");
        assert_eq!(a.own_message("/x/tenants/a/y"), "/x/tenants/a/y");
        assert_eq!(t("/").own_message("/x"), "/x");
    }

    #[test]
    fn names_and_rights_are_checked() {
        assert!(Tenant::new("", "/a", Rights::default()).is_err());
        assert!(Tenant::new("a b", "/a", Rights::default()).is_err());
        assert!(Tenant::new("a", "a", Rights::default()).is_err());
        assert!(Rights::parse(&[]).is_err());
        assert!(Rights::parse(&["root".into()]).is_err());
        let r = Rights::parse(&["write".into(), "admin".into()]).unwrap();
        assert_eq!(r.names(), ["write", "admin"]);
    }
}
