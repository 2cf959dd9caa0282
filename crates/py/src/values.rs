//! What calls return to Python: node types, stats, the cluster status,
//! values and listings.

use crate::buffers::Target;
use nk::{NodeInfo, NodeType};
use nodekernel_client as nk;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

pub(crate) fn type_name_of(t: NodeType) -> &'static str {
    match t {
        NodeType::Directory => "dir",
        NodeType::File => "file",
        NodeType::Table => "table",
        NodeType::KeyValue => "kv",
        NodeType::Bag => "bag",
    }
}

pub(crate) fn parse_type(s: &str, allowed: &[NodeType]) -> PyResult<NodeType> {
    let t = match s {
        "dir" | "directory" => Some(NodeType::Directory),
        "file" => Some(NodeType::File),
        "table" => Some(NodeType::Table),
        "kv" | "keyvalue" => Some(NodeType::KeyValue),
        "bag" => Some(NodeType::Bag),
        _ => None,
    };
    match t {
        Some(t) if allowed.contains(&t) => Ok(t),
        _ => {
            let names: Vec<&str> = allowed.iter().map(|t| type_name_of(*t)).collect();
            Err(PyValueError::new_err(format!(
                "type must be one of {names:?}, not {s:?}"
            )))
        }
    }
}

/// A node's attributes, returned as a dict.
pub(crate) struct Stat {
    pub(crate) name: String,
    pub(crate) info: NodeInfo,
}

impl<'py> IntoPyObject<'py> for Stat {
    type Target = PyDict;
    type Output = Bound<'py, PyDict>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("name", self.name)?;
        d.set_item("type", type_name_of(self.info.ty))?;
        d.set_item("size", self.info.size)?;
        d.set_item("id", self.info.id)?;
        d.set_item("block_size", self.info.block_size)?;
        d.set_item("stored", self.info.stored)?;
        d.set_item("enumerable", self.info.enumerable)?;
        d.set_item("encrypted", self.info.encrypted)?;
        d.set_item("mode", self.info.mode)?;
        // Seconds since the Unix epoch, as `os.stat` gives them.
        d.set_item("mtime", self.info.mtime as f64 / 1e9)?;
        // When it expires, in seconds since the Unix epoch (None: never),
        // and a container's TTL for new children, in seconds (None: none).
        let expires = (self.info.expires_ms != 0).then(|| self.info.expires_ms as f64 / 1e3);
        d.set_item("expires", expires)?;
        let child_ttl = (self.info.child_ttl_ms != 0).then(|| self.info.child_ttl_ms as f64 / 1e3);
        d.set_item("child_ttl", child_ttl)?;
        Ok(d)
    }
}

pub(crate) struct Status(pub(crate) nk::ClusterStatus);

impl<'py> IntoPyObject<'py> for Status {
    type Target = PyDict;
    type Output = Bound<'py, PyDict>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.0;
        let d = PyDict::new(py);
        d.set_item("ready", s.is_ready() && s.unreachable.is_empty())?;
        d.set_item("block_size", s.block_size)?;
        d.set_item("nodes", s.nodes)?;
        d.set_item("puts_in_progress", s.puts_in_progress)?;
        d.set_item("reserved_puts", s.reserved_puts)?;
        d.set_item("reclaiming", s.reclaiming)?;
        d.set_item("partition", s.partition)?;
        d.set_item("partitions", s.partitions)?;
        d.set_item("expected_servers", s.expected_servers)?;
        let servers = PyList::empty(py);
        for v in s.servers {
            let e = PyDict::new(py);
            e.set_item("id", v.id)?;
            e.set_item("addr", v.addr)?;
            e.set_item("class", v.class)?;
            e.set_item("class_name", v.class_name)?;
            e.set_item("medium", v.medium)?;
            e.set_item("location", v.location)?;
            e.set_item(
                "capacity_bytes",
                v.capacity_blocks * u64::from(v.block_size),
            )?;
            e.set_item("used_bytes", v.used_blocks * u64::from(v.block_size))?;
            e.set_item("alive", v.alive)?;
            e.set_item("draining", v.draining)?;
            servers.append(e)?;
        }
        d.set_item("servers", servers)?;
        // Metadata partitions that did not answer (the totals lack them).
        let unreachable = PyList::empty(py);
        for p in s.unreachable {
            let e = PyDict::new(py);
            e.set_item("partition", p.partition)?;
            e.set_item("addr", p.addr)?;
            e.set_item("error", p.error)?;
            unreachable.append(e)?;
        }
        d.set_item("unreachable", unreachable)?;
        let logs = PyList::empty(py);
        for l in s.logs {
            let e = PyDict::new(py);
            e.set_item("partition", l.partition)?;
            e.set_item("fsync", l.fsync)?;
            e.set_item("records", l.records)?;
            e.set_item("checkpoint", l.checkpoint)?;
            e.set_item("log_bytes", l.log_bytes)?;
            logs.append(e)?;
        }
        d.set_item("logs", logs)?;
        // Blocks tier migration moved out of each class (docs/tiering.md).
        let moves = PyList::empty(py);
        for m in s.moves {
            let e = PyDict::new(py);
            e.set_item("class", m.class)?;
            e.set_item("demoted", m.demoted)?;
            e.set_item("promoted", m.promoted)?;
            moves.append(e)?;
        }
        d.set_item("moves", moves)?;
        Ok(d)
    }
}

/// A subtree's disk usage (`du`, `set_quota`, `quotas`), returned as a
/// dict: path, type, nodes (below a container; a data node: 1), bytes (of
/// data), stored (storage held: blocks and pieces), classes (per storage
/// class: class, blocks, piece_bytes) and quota (None, or bytes and nodes,
/// each None for no limit).
pub(crate) struct Usage(pub(crate) nk::UsageInfo);

/// A quota as a dict of bytes and nodes (None: no limit).
fn quota_dict<'py>(py: Python<'py>, q: nk::Quota) -> PyResult<Bound<'py, PyDict>> {
    let limit = |v: u64| (v != nk::NO_LIMIT).then_some(v);
    let d = PyDict::new(py);
    d.set_item("bytes", limit(q.bytes))?;
    d.set_item("nodes", limit(q.nodes))?;
    Ok(d)
}

impl<'py> IntoPyObject<'py> for Usage {
    type Target = PyDict;
    type Output = Bound<'py, PyDict>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let u = self.0;
        let d = PyDict::new(py);
        d.set_item("path", u.path)?;
        d.set_item("type", type_name_of(u.ty))?;
        d.set_item("nodes", u.nodes)?;
        d.set_item("bytes", u.bytes)?;
        d.set_item("stored", u.held)?;
        let classes = PyList::empty(py);
        for c in u.classes {
            let e = PyDict::new(py);
            e.set_item("class", c.class)?;
            e.set_item("blocks", c.blocks)?;
            e.set_item("piece_bytes", c.piece_bytes)?;
            classes.append(e)?;
        }
        d.set_item("classes", classes)?;
        match u.quota {
            Some(q) => d.set_item("quota", quota_dict(py, q)?)?,
            None => d.set_item("quota", py.None())?,
        }
        Ok(d)
    }
}

/// A value or listing: plain data, or Python objects made when finished.
pub(crate) enum Value {
    None,
    Bool(bool),
    Int(u64),
    Names(Vec<String>),
    Stats(Vec<Stat>),
    Stat(Stat),
    Status(Status),
    Usage(Usage),
    Usages(Vec<Usage>),
    /// A container's quota, or None.
    Quota(Option<nk::Quota>),
    /// A session opened (`client.session()`).
    Session(nk::Session),
    Bytes(Target),
    /// Values of several keys in order; `None` for a missing one.
    Values(Vec<Option<Target>>),
}

impl<'py> IntoPyObject<'py> for Value {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(match self {
            Value::None => py.None().into_bound(py),
            Value::Bool(b) => pyo3::types::PyBool::new(py, b).to_owned().into_any(),
            Value::Int(n) => n.into_pyobject(py)?.into_any(),
            Value::Names(v) => v.into_pyobject(py)?.into_any(),
            Value::Stats(v) => v.into_pyobject(py)?.into_any(),
            Value::Stat(s) => s.into_pyobject(py)?.into_any(),
            Value::Status(s) => s.into_pyobject(py)?.into_any(),
            Value::Usage(u) => u.into_pyobject(py)?.into_any(),
            Value::Session(inner) => {
                pyo3::Bound::new(py, crate::session::Session { inner })?.into_any()
            }
            Value::Usages(v) => v.into_pyobject(py)?.into_any(),
            Value::Quota(None) => py.None().into_bound(py),
            Value::Quota(Some(q)) => quota_dict(py, q)?.into_any(),
            Value::Bytes(t) => t.into_bytes(py)?.into_any(),
            Value::Values(v) => {
                let list = PyList::empty(py);
                for t in v {
                    match t {
                        Some(t) => list.append(t.into_bytes(py)?)?,
                        None => list.append(py.None())?,
                    }
                }
                list.into_any()
            }
        })
    }
}
