//! The client operations, shared by [`Client`](crate::classes::Client)
//! and [`AsyncClient`](crate::classes::AsyncClient).

use crate::buffers::Input;
use crate::buffers::Target;
use crate::client::child_path;
use crate::client::in_table;
use crate::client::is_data;
use crate::client::not_data;
use crate::client::read_whole;
use crate::client::with_value;
use crate::client::Core;
use crate::errors::At;
use crate::errors::Fail;
use crate::errors::Failure;
use crate::errors::Out;
use crate::file::FileCore;
use crate::file::Opened;
use crate::values::Stat;
use crate::values::Status;
use crate::values::Usage;
use crate::values::Value;
use nk::{ErrorCode, NodeType};
use nodekernel_client as nk;
use pyo3::exceptions::PyValueError;
use std::sync::Arc;

pub(crate) async fn mkdir(
    core: Arc<Core>,
    path: String,
    ty: NodeType,
    parents: bool,
    enumerable: bool,
    life: Life,
) -> Out<Value> {
    let c = &core.client;
    if ty == NodeType::Directory && enumerable && life.is_none() {
        c.mkdir(&path, parents).await.at(&path)?;
        return Ok(Value::None);
    }
    if parents {
        if let Some(i) = path.rfind('/') {
            if i > 0 {
                c.mkdir(&path[..i], true).await.at(&path)?;
            }
        }
    }
    let opts = nk::CreateOptions {
        enumerable,
        ..life.options()
    };
    c.create(&path, ty, opts).await.at(&path)?;
    Ok(Value::None)
}

/// The TTL, child TTL and session a call gives the node it creates.
#[derive(Clone, Default)]
pub(crate) struct Life {
    pub(crate) ttl: Option<nk::Ttl>,
    pub(crate) child_ttl: Option<std::time::Duration>,
    pub(crate) session: Option<nk::Session>,
}

impl Life {
    fn is_none(&self) -> bool {
        self.ttl.is_none() && self.child_ttl.is_none() && self.session.is_none()
    }

    fn options(&self) -> nk::CreateOptions {
        nk::CreateOptions {
            ttl: self.ttl,
            child_ttl: self.child_ttl,
            session: self.session.clone(),
            ..Default::default()
        }
    }
}

/// Opens a session with a lease of `lease` (`docs/lifecycle.md`).
pub(crate) async fn session(core: Arc<Core>, lease: std::time::Duration) -> Out<Value> {
    let s = core
        .client
        .session(lease)
        .await
        .map_err(|err| Failure { err, path: None })?;
    Ok(Value::Session(s))
}

pub(crate) async fn create(
    core: Arc<Core>,
    path: String,
    ty: NodeType,
    life: Life,
    aio: bool,
) -> Out<Opened> {
    let node = core
        .client
        .create(&path, ty, life.options())
        .await
        .at(&path)?;
    let f = FileCore::writer(core, path, "wb", node)?;
    Ok(Opened {
        f: Arc::new(f),
        aio,
    })
}

pub(crate) async fn open(
    core: Arc<Core>,
    path: String,
    mode: String,
    life: Life,
    aio: bool,
) -> Out<Opened> {
    let c = &core.client;
    let f = match mode.as_str() {
        "rb" | "r" if !life.is_none() => {
            return Err(
                PyValueError::new_err("ttl and session are for writing: mode 'wb' or 'ab'").into(),
            )
        }
        "rb" | "r" => {
            let node = c.lookup(&path).await.at(&path)?;
            match node.info().ty {
                t if is_data(t) => FileCore::reader(core.clone(), path, node),
                NodeType::Bag => {
                    let reader = c
                        .read_bag(&path, nk::DEFAULT_BAG_READS_IN_FLIGHT)
                        .await
                        .at(&path)?;
                    FileCore::bag(core.clone(), path, reader)
                }
                t => return Err(not_data(&path, t).into()),
            }
        }
        "wb" | "w" => {
            let opts = life.options();
            // An existing File is replaced, as Python's open(..., "wb")
            // truncates (see `Client::create_replacing` for writers racing).
            let node = match c.create_replacing(&path, opts.clone()).await {
                // In a Table: a KeyValue (a put in steps, replacing).
                Err(e) if e.code == ErrorCode::TypeMismatch && in_table(c, &path).await => {
                    c.create(&path, NodeType::KeyValue, opts).await.at(&path)?
                }
                r => r.at(&path)?,
            };
            FileCore::writer(core.clone(), path, "wb", node)?
        }
        "ab" | "a" => {
            let node = match c.open_write(&path).await {
                Err(e) if e.code == ErrorCode::NotFound => c
                    .create(&path, NodeType::File, life.options())
                    .await
                    .at(&path)?,
                Ok(_) if life.session.is_some() => {
                    return Err(PyValueError::new_err(format!(
                        "{path} exists: a session binds only what it creates"
                    ))
                    .into())
                }
                Ok(node) => {
                    // An existing File: it gets the TTL from now.
                    if let Some(ttl) = life.ttl {
                        c.expire(&path, ttl).await.at(&path)?;
                    }
                    node
                }
                Err(e) => {
                    return Err(Failure {
                        err: e,
                        path: Some(path),
                    }
                    .into())
                }
            };
            FileCore::writer(core.clone(), path, "ab", node)?
        }
        m => {
            return Err(PyValueError::new_err(format!(
                "mode must be 'rb', 'wb' or 'ab' (binary only), not {m:?}"
            ))
            .into())
        }
    };
    Ok(Opened {
        f: Arc::new(f),
        aio,
    })
}

pub(crate) async fn lookup(core: Arc<Core>, path: String, aio: bool) -> Out<Opened> {
    open(core, path, "rb".into(), Life::default(), aio).await
}

pub(crate) async fn stat(core: Arc<Core>, path: String) -> Out<Value> {
    Ok(Value::Stat(stat_of(&core, path).await?))
}

pub(crate) async fn exists(core: Arc<Core>, path: String) -> Out<Value> {
    match core.client.lookup(&path).await {
        Ok(_) => Ok(Value::Bool(true)),
        // A path through a File or KeyValue names nothing either.
        Err(e) if matches!(e.code, ErrorCode::NotFound | ErrorCode::TypeMismatch) => {
            Ok(Value::Bool(false))
        }
        Err(e) => Err(Failure {
            err: e,
            path: Some(path),
        }
        .into()),
    }
}

pub(crate) async fn ls(core: Arc<Core>, path: String, detail: bool) -> Out<Value> {
    let mut names = core.client.enumerate(&path).await.at(&path)?;
    names.sort();
    if !detail {
        return Ok(Value::Names(names));
    }
    // Children's attributes, a bounded number of lookups at a time.
    use futures::StreamExt;
    let stats: Vec<Out<Stat>> = futures::stream::iter(names)
        .map(|n| stat_of(&core, child_path(&path, &n)))
        .buffered(32)
        .collect()
        .await;
    let mut out = Vec::with_capacity(stats.len());
    for s in stats {
        match s {
            Ok(s) => out.push(s),
            // Removed since the listing: not a child any more.
            Err(Fail::Nk(f)) if f.err.code == ErrorCode::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Value::Stats(out))
}

pub(crate) async fn delete(core: Arc<Core>, path: String, recursive: bool) -> Out<Value> {
    core.client.delete(&path, recursive).await.at(&path)?;
    Ok(Value::None)
}

pub(crate) async fn rename(core: Arc<Core>, src: String, dst: String) -> Out<Value> {
    core.client.rename(&src, &dst).await.at(&src)?;
    Ok(Value::None)
}

pub(crate) async fn status(core: Arc<Core>) -> Out<Value> {
    let s = core
        .client
        .status()
        .await
        .map_err(|err| Failure { err, path: None })?;
    Ok(Value::Status(Status(s)))
}

pub(crate) async fn set_quota(
    core: Arc<Core>,
    path: String,
    bytes: Option<u64>,
    nodes: Option<u64>,
) -> Out<Value> {
    let u = core.client.set_quota(&path, bytes, nodes).await.at(&path)?;
    Ok(Value::Usage(Usage(u)))
}

pub(crate) async fn quota(core: Arc<Core>, path: String) -> Out<Value> {
    Ok(Value::Quota(core.client.quota(&path).await.at(&path)?))
}

pub(crate) async fn quotas(core: Arc<Core>) -> Out<Value> {
    let all = core
        .client
        .quotas()
        .await
        .map_err(|err| Failure { err, path: None })?;
    Ok(Value::Usages(all.into_iter().map(Usage).collect()))
}

pub(crate) async fn du(core: Arc<Core>, path: String) -> Out<Value> {
    Ok(Value::Usage(Usage(core.client.du(&path).await.at(&path)?)))
}

pub(crate) async fn put(core: Arc<Core>, path: String, value: Input, life: Life) -> Out<Value> {
    let opts = life.options();
    core.client
        .put_with(&path, value.data(), opts)
        .await
        .at(&path)?;
    Ok(Value::None)
}

/// Gives the node at `path` a TTL from now (`Ok`), or a container a
/// child TTL (`Err`; `None` clears it); returns its stat.
pub(crate) async fn expire(
    core: Arc<Core>,
    path: String,
    ttl: Result<nk::Ttl, Option<std::time::Duration>>,
) -> Out<Value> {
    let c = &core.client;
    let info = match ttl {
        Ok(ttl) => c.expire(&path, ttl).await,
        Err(child) => c.set_child_ttl(&path, child).await,
    }
    .at(&path)?;
    Ok(Value::Stat(Stat { info, name: path }))
}

pub(crate) async fn get(core: Arc<Core>, path: String) -> Out<Value> {
    let p = path.as_str();
    let t = with_value(&core, p, |node| async move { read_whole(&node, p).await }).await?;
    Ok(Value::Bytes(t))
}

/// Puts every item (as `put`), up to `in_flight` at a time; a
/// `BatchError` lists the items that failed (the others are stored).
pub(crate) async fn put_many(
    core: Arc<Core>,
    items: Vec<(String, Input)>,
    in_flight: usize,
) -> Out<Value> {
    let results = core
        .client
        .put_many(&items, in_flight)
        .await
        .map_err(|err| Failure { err, path: None })?;
    batch_outcome(items.iter().map(|(k, _)| k.as_str()), results)
}

/// Deletes every key (as `delete`), up to `in_flight` at a time; a
/// `BatchError` lists the keys that failed (the others are gone).
pub(crate) async fn delete_many(
    core: Arc<Core>,
    keys: Vec<String>,
    recursive: bool,
    in_flight: usize,
) -> Out<Value> {
    let results = core
        .client
        .delete_many(&keys, recursive, in_flight)
        .await
        .map_err(|err| Failure { err, path: None })?;
    batch_outcome(keys.iter().map(String::as_str), results)
}

/// `None` if every item succeeded, else a `BatchError` of the failures.
fn batch_outcome<'k>(
    keys: impl Iterator<Item = &'k str>,
    results: Vec<nk::Result<()>>,
) -> Out<Value> {
    let total = results.len();
    let failed: Vec<Failure> = keys
        .zip(results)
        .filter_map(|(k, r)| {
            r.err().map(|err| Failure {
                err,
                path: Some(k.to_string()),
            })
        })
        .collect();
    if failed.is_empty() {
        Ok(Value::None)
    } else {
        Err(Fail::Batch { failed, total })
    }
}

/// Gets every key (as `get`), up to `in_flight` at a time, in order:
/// `None` for a missing key; any other failure is raised (the first in
/// the order given), as Java's `getMany` does.
pub(crate) async fn get_many(core: Arc<Core>, keys: Vec<String>, in_flight: usize) -> Out<Value> {
    use futures::StreamExt;
    // Each get owns its key and client (a closure borrowing them would make
    // the future not `Send` for every lifetime, as `spawn` needs).
    async fn get_one(core: Arc<Core>, path: String) -> Out<Target> {
        let p = path.as_str();
        with_value(&core, p, |node| async move { read_whole(&node, p).await }).await
    }
    let gets = keys.into_iter().map(|k| get_one(core.clone(), k));
    let got: Vec<Out<Target>> = futures::stream::iter(gets)
        .buffered(in_flight.max(1))
        .collect()
        .await;
    let mut out = Vec::with_capacity(got.len());
    for r in got {
        match r {
            Ok(t) => out.push(Some(t)),
            Err(Fail::Nk(f)) if f.err.code == ErrorCode::NotFound => out.push(None),
            Err(e) => return Err(e),
        }
    }
    Ok(Value::Values(out))
}

pub(crate) async fn get_into(core: Arc<Core>, path: String, mut target: Target) -> Out<Value> {
    let mut attempt = 1;
    loop {
        let node = core.client.lookup(&path).await.at(&path)?;
        if !is_data(node.info().ty) {
            return Err(not_data(&path, node.info().ty).into());
        }
        let len = node.info().size;
        if len > target.len as u64 {
            return Err(PyValueError::new_err(format!(
                "{path} holds {len} bytes; the buffer has room for {}",
                target.len
            ))
            .into());
        }
        // SAFETY: the caller's buffer is pinned by the target.
        let buf = unsafe { &mut target.slice()[..len as usize] };
        match node.read_at(0, buf).await {
            Err(e) if e.code == ErrorCode::Stale && attempt < nk::GET_ATTEMPTS => attempt += 1,
            r => {
                r.at(&path)?;
                return Ok(Value::Int(len));
            }
        }
    }
}

pub(crate) async fn stat_of(core: &Core, path: String) -> Out<Stat> {
    let node = core.client.lookup(&path).await.at(&path)?;
    Ok(Stat {
        info: node.info().clone(),
        name: path,
    })
}
