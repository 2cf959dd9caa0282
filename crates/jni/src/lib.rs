//! JNI bindings of the NodeKernel client: the native half of the Java
//! `nodekernel-client` (`java/nodekernel-client`, class
//! `io.nodekernel.Native`). Java never speaks the protocol itself; every
//! call goes through the one Rust client.
//!
//! **Handles.** Java holds clients, streams and sessions as `long` handles: keys into
//! per-kind tables of this library, never pointers. A closed, forged or
//! never-opened handle finds nothing and raises `IllegalStateException`; it
//! cannot reach freed memory. Each call takes its object out of the table
//! (an `Arc` clone) and works on that, so closing a client while another
//! thread still uses it finishes that call first.
//!
//! **Failures never cross as panics.** Every entry point runs inside
//! `call`: a client error becomes the `NodeKernelException` subclass of
//! its code (`io.nodekernel.NodeKernelException$<CodeName>`), a bad
//! argument an `IllegalArgumentException`, and a panic (a bug) an
//! `IllegalStateException` naming it, so the JVM keeps running.
//!
//! **Buffers.** Data moves only through direct `ByteBuffer`s, read and
//! written in place by the client (on the shared-memory path: one memory
//! copy between the buffer and the storage server's memory). The Java side
//! copies heap arrays through a direct buffer of its own.
//!
//! **Blocking.** Calls block the calling Java thread on one multi-threaded
//! runtime per process; many Java threads may call at once.

use futures::stream::{self, StreamExt, TryStreamExt};
use jni::objects::{
    JByteArray, JByteBuffer, JClass, JLongArray, JObject, JObjectArray, JString, JThrowable,
};
use jni::sys::{jboolean, jint, jlong, jobject};
use jni::JNIEnv;
use nk::{ErrorCode, NodeType};
use nodekernel_client as nk;
use nodekernel_client::sync;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::runtime::Runtime;

// ---------------------------------------------------------------------------
// Failures

enum Fail {
    /// A client error: thrown as the exception class of its code.
    Nk(nk::Error),
    /// A client error about one range of an `openRanges`: thrown as `Nk`,
    /// with the range's index set on the exception.
    Range(usize, nk::Error),
    /// A JNI call failed; usually a Java exception is already pending.
    Jni(jni::errors::Error),
    /// A bad argument from Java.
    Arg(String),
    /// A handle that is not (or no longer) in its table.
    Handle(String),
}

impl From<nk::Error> for Fail {
    fn from(e: nk::Error) -> Self {
        Fail::Nk(e)
    }
}

impl From<jni::errors::Error> for Fail {
    fn from(e: jni::errors::Error) -> Self {
        Fail::Jni(e)
    }
}

impl From<nk::RangeError> for Fail {
    fn from(e: nk::RangeError) -> Self {
        match e.range {
            Some(i) => Fail::Range(i, e.error),
            None => Fail::Nk(e.error),
        }
    }
}

type R<T> = Result<T, Fail>;

/// The Java class thrown for `code` (nested in `NodeKernelException`).
fn exception_class(code: ErrorCode) -> String {
    format!("io/nodekernel/NodeKernelException${}", code.name())
}

fn throw(env: &mut JNIEnv<'_>, fail: Fail) {
    // A pending exception (from a failed JNI call) says more than ours.
    if env.exception_check().unwrap_or(true) {
        return;
    }
    let (class, message) = match fail {
        Fail::Nk(e) => (exception_class(e.code), e.message),
        Fail::Range(i, e) => {
            let class = exception_class(e.code);
            if throw_range(env, &class, &e.message, i).is_ok() {
                return;
            }
            // Thrown without the index (a jar of another version).
            let _ = env.exception_clear();
            (class, e.message)
        }
        Fail::Jni(e) => (
            "java/lang/IllegalStateException".to_string(),
            format!("NodeKernel native call failed in JNI: {e}"),
        ),
        Fail::Arg(m) => ("java/lang/IllegalArgumentException".to_string(), m),
        Fail::Handle(m) => ("java/lang/IllegalStateException".to_string(), m),
    };
    if env.throw_new(&class, &message).is_err() && !env.exception_check().unwrap_or(true) {
        // Only if the class could not be loaded (a jar of another version).
        let _ = env.throw_new("java/io/IOException", format!("{class}: {message}"));
    }
}

/// Throws `class(message)` with `setRange(range)` called on it.
fn throw_range(env: &mut JNIEnv<'_>, class: &str, message: &str, range: usize) -> R<()> {
    let message = env.new_string(message)?;
    let e = env.new_object(class, "(Ljava/lang/String;)V", &[(&message).into()])?;
    let range = jint::try_from(range).unwrap_or(jint::MAX);
    env.call_method(&e, "setRange", "(I)V", &[range.into()])?;
    env.throw(JThrowable::from(e))?;
    Ok(())
}

/// Runs one native entry point: errors and panics become Java exceptions
/// (and `fallback` the value Java sees returned, which it ignores).
fn call<'l, T>(env: &mut JNIEnv<'l>, fallback: T, f: impl FnOnce(&mut JNIEnv<'l>) -> R<T>) -> T {
    let fail = match std::panic::catch_unwind(AssertUnwindSafe(|| f(env))) {
        Ok(Ok(v)) => return v,
        Ok(Err(fail)) => fail,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            Fail::Handle(format!(
                "NodeKernel native library bug (please report): {what}"
            ))
        }
    };
    throw(env, fail);
    fallback
}

// ---------------------------------------------------------------------------
// Runtime and handle tables

fn runtime() -> R<&'static Runtime> {
    static RT: OnceLock<Result<Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("nodekernel")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| {
        Fail::Nk(nk::Error::internal(format!(
            "cannot start the I/O runtime: {e}"
        )))
    })
}

fn block_on<F: std::future::Future>(f: F) -> R<F::Output> {
    Ok(runtime()?.block_on(f))
}

/// Handles are never reused: a stale one finds nothing.
static NEXT_HANDLE: AtomicI64 = AtomicI64::new(1);

struct Table<T> {
    kind: &'static str,
    map: Mutex<BTreeMap<jlong, Arc<T>>>,
}

impl<T> Table<T> {
    const fn new(kind: &'static str) -> Self {
        Table {
            kind,
            map: Mutex::new(BTreeMap::new()),
        }
    }

    fn insert(&self, v: T) -> jlong {
        let h = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(h, Arc::new(v));
        h
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<jlong, Arc<T>>> {
        sync::lock(&self.map)
    }

    fn missing(&self) -> Fail {
        Fail::Handle(format!("this {} is closed", self.kind))
    }

    fn get(&self, h: jlong) -> R<Arc<T>> {
        self.lock().get(&h).cloned().ok_or_else(|| self.missing())
    }

    fn remove(&self, h: jlong) -> R<Arc<T>> {
        self.lock().remove(&h).ok_or_else(|| self.missing())
    }
}

enum Reader {
    File {
        node: Arc<nk::Node>,
        /// The sequential stream from `pos`, made on the first read after
        /// an open or a seek.
        stream: Option<nk::BufferedReader>,
        pos: u64,
    },
    Bag {
        reader: nk::BagReader,
        pos: u64,
    },
}

type Writer = Option<nk::BufferedWriter>;

static CLIENTS: Table<nk::Client> = Table::new("NodeKernel client");
static READERS: Table<Mutex<Reader>> = Table::new("input stream");
static WRITERS: Table<Mutex<Writer>> = Table::new("output stream");
static SESSIONS: Table<nk::Session> = Table::new("session");

/// Most sessions one process keeps open at once: each is a task renewing
/// it and a request per metadata partition every third of its lease (and
/// a metadata server keeps at most 65,536).
const MAX_SESSIONS: usize = 4096;

// ---------------------------------------------------------------------------
// Arguments and results

fn string(env: &mut JNIEnv<'_>, s: &JString<'_>, what: &str) -> R<String> {
    if s.is_null() {
        return Err(Fail::Arg(format!("{what} must not be null")));
    }
    Ok(env.get_string(s)?.into())
}

fn optional_string(env: &mut JNIEnv<'_>, s: &JString<'_>) -> R<Option<String>> {
    if s.is_null() {
        return Ok(None);
    }
    Ok(Some(env.get_string(s)?.into()))
}

fn path(env: &mut JNIEnv<'_>, s: &JString<'_>) -> R<String> {
    let p = string(env, s, "the path")?;
    if p.contains('\0') {
        return Err(Fail::Arg("paths cannot contain NUL characters".into()));
    }
    Ok(p)
}

/// The bytes `[off, off + len)` of a direct buffer.
///
/// # Safety
/// The slice aliases the buffer's memory: it must not outlive the native
/// call (Java keeps the buffer alive while the call runs), and Java code
/// must not use the same bytes concurrently (the Java API documents this).
unsafe fn buffer<'b>(
    env: &mut JNIEnv<'_>,
    buf: &JByteBuffer<'_>,
    off: jint,
    len: jint,
) -> R<&'b mut [u8]> {
    if buf.is_null() {
        return Err(Fail::Arg("the buffer must not be null".into()));
    }
    if off < 0 || len < 0 {
        return Err(Fail::Arg(format!(
            "negative buffer offset or length ({off}, {len})"
        )));
    }
    let cap = env
        .get_direct_buffer_capacity(buf)
        .map_err(|_| Fail::Arg("the buffer is not a direct ByteBuffer".into()))?;
    let (off, len) = (off as usize, len as usize);
    if off + len > cap {
        return Err(Fail::Arg(format!(
            "bytes {off}..{} lie outside the buffer's {cap}",
            off + len
        )));
    }
    if len == 0 {
        return Ok(&mut []);
    }
    let addr = env
        .get_direct_buffer_address(buf)
        .map_err(|_| Fail::Arg("the buffer is not a direct ByteBuffer".into()))?;
    Ok(std::slice::from_raw_parts_mut(addr.add(off), len))
}

/// Longs per node in the status arrays Java decodes (`NodeStatus`).
const STAT_FIELDS: usize = 11;

fn stat_of(info: &nk::NodeInfo, out: &mut Vec<i64>) {
    out.extend_from_slice(&[
        info.ty as i64,
        info.size as i64,
        info.block_size as i64,
        info.mode as i64,
        info.mtime as i64,
        info.id as i64,
        info.storage_class as i64,
        (info.enumerable as i64) | ((info.encrypted as i64) << 1),
        info.stored as i64,
        info.expires_ms as i64,
        info.child_ttl_ms as i64,
    ]);
}

/// A TTL from Java: 0 none given, -1 never, otherwise milliseconds.
fn ttl_of(ms: jlong) -> R<Option<nk::Ttl>> {
    Ok(match ms {
        0 => None,
        -1 => Some(nk::Ttl::Never),
        ms => Some(nk::Ttl::After(Duration::from_millis(positive_ms(ms)?))),
    })
}

/// A child TTL from Java: 0 none, otherwise milliseconds.
fn child_ttl_of(ms: jlong) -> R<Option<Duration>> {
    Ok(match ms {
        0 => None,
        ms => Some(Duration::from_millis(positive_ms(ms)?)),
    })
}

fn positive_ms(ms: jlong) -> R<u64> {
    u64::try_from(ms)
        .ok()
        .filter(|&m| m > 0)
        .ok_or_else(|| Fail::Arg(format!("{ms} ms is not a positive TTL")))
}

fn long_array<'l>(env: &mut JNIEnv<'l>, v: &[i64]) -> R<JLongArray<'l>> {
    let len = jint::try_from(v.len())
        .map_err(|_| Fail::Arg(format!("{} values do not fit a Java array", v.len())))?;
    let a = env.new_long_array(len)?;
    env.set_long_array_region(&a, 0, v)?;
    Ok(a)
}

fn string_array<'l>(env: &mut JNIEnv<'l>, v: &[String]) -> R<JObjectArray<'l>> {
    let len = jint::try_from(v.len())
        .map_err(|_| Fail::Arg(format!("{} names do not fit a Java array", v.len())))?;
    let a = env.new_object_array(len, "java/lang/String", JObject::null())?;
    for (i, s) in v.iter().enumerate() {
        let js = env.new_string(s)?;
        env.set_object_array_element(&a, i as jint, &js)?;
        env.delete_local_ref(js)?;
    }
    Ok(a)
}

/// `value` (of the key at `path`) as a Java array, if one can hold it.
fn value_array<'l>(env: &mut JNIEnv<'l>, path: &str, value: &[u8]) -> R<JByteArray<'l>> {
    if i32::try_from(value.len()).is_err() {
        return Err(Fail::Nk(nk::Error::new(
            ErrorCode::InvalidArgument,
            format!(
                "{path} holds {} bytes, more than a Java array takes; read it with a stream",
                value.len()
            ),
        )));
    }
    Ok(env.byte_array_from_slice(value)?)
}

/// Reads in flight asked for from Java; 0 or less: the default.
fn reads_in_flight_or_default(n: jint) -> usize {
    if n > 0 {
        n as usize
    } else {
        nk::DEFAULT_BAG_READS_IN_FLIGHT
    }
}

fn node_type(code: jint) -> R<NodeType> {
    u8::try_from(code)
        .ok()
        .and_then(|c| NodeType::from_u8(c).ok())
        .ok_or_else(|| Fail::Arg(format!("{code} is not a node type code")))
}

// ---------------------------------------------------------------------------
// Entry points: the client

#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_connect<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    meta: JString<'l>,
    config: JString<'l>,
) -> jlong {
    call(&mut env, 0, |env| {
        let meta = optional_string(env, &meta)?;
        let config = optional_string(env, &config)?;
        let cfg = nk::discover(meta.as_deref(), config.as_deref().map(std::path::Path::new))?;
        let client = block_on(nk::Client::connect(cfg))??;
        Ok(CLIENTS.insert(client))
    })
}

#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_disconnect<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
) {
    // Connections close when the last call using the client returns.
    call(&mut env, (), |_| CLIENTS.remove(c).map(drop))
}

/// Names of the error codes, indexed by code - 1 (the Java test checks its
/// `ErrorCode` enum against this list).
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_errorCodeNames<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
) -> jobject {
    call(&mut env, std::ptr::null_mut(), |env| {
        let names: Vec<String> = ErrorCode::ALL
            .iter()
            .map(|c| c.name().to_string())
            .collect();
        Ok(string_array(env, &names)?.into_raw())
    })
}

/// Throws the exception of error `code` the way every failing call does
/// (for the tests of the error mapping; a code that does not exist is an
/// `IllegalArgumentException`).
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_raise<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    code: jint,
    message: JString<'l>,
) {
    call(&mut env, (), |env| {
        let message = string(env, &message, "the message")?;
        let code = u16::try_from(code)
            .ok()
            .and_then(ErrorCode::from_u16)
            .ok_or_else(|| Fail::Arg(format!("{code} is not an error code")))?;
        Err(Fail::Nk(nk::Error::new(code, message)))
    })
}

#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_panicForTest<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
) {
    call(&mut env, (), |_| -> R<()> {
        panic!("a panic raised on purpose by Native.panicForTest")
    })
}

#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_localLocation<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
) -> jobject {
    call(&mut env, std::ptr::null_mut(), |env| {
        Ok(env.new_string(nk::default_location())?.into_raw())
    })
}

#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_location<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
) -> jobject {
    call(&mut env, std::ptr::null_mut(), |env| {
        let client = CLIENTS.get(c)?;
        Ok(env.new_string(&client.config().location)?.into_raw())
    })
}

#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_lookup<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    p: JString<'l>,
) -> jobject {
    call(&mut env, std::ptr::null_mut(), |env| {
        let client = CLIENTS.get(c)?;
        let p = path(env, &p)?;
        let node = block_on(client.lookup(&p))??;
        let mut st = Vec::with_capacity(STAT_FIELDS);
        stat_of(node.info(), &mut st);
        Ok(long_array(env, &st)?.into_raw())
    })
}

/// Sets the permission bits (`mode`, -1: unchanged) and/or the
/// modification time (`mtime`, nanoseconds since the epoch, -1: unchanged);
/// returns the node's status as it is now.
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_setAttrs<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    p: JString<'l>,
    mode: jint,
    mtime: jlong,
) -> jobject {
    call(&mut env, std::ptr::null_mut(), |env| {
        let client = CLIENTS.get(c)?;
        let p = path(env, &p)?;
        let mode = match mode {
            -1 => None,
            m => Some(u32::try_from(m).map_err(|_| Fail::Arg(format!("bad mode {m}")))?),
        };
        let mtime = match mtime {
            -1 => None,
            t => Some(u64::try_from(t).map_err(|_| Fail::Arg(format!("bad mtime {t}")))?),
        };
        let info = block_on(client.set_attrs(&p, mode, mtime))??;
        let mut st = Vec::with_capacity(STAT_FIELDS);
        stat_of(&info, &mut st);
        Ok(long_array(env, &st)?.into_raw())
    })
}

/// Gives a node a new TTL (`ttl`: -1 never, otherwise milliseconds);
/// returns its status as it is now.
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_expire<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    p: JString<'l>,
    ttl: jlong,
) -> jobject {
    call(&mut env, std::ptr::null_mut(), |env| {
        let client = CLIENTS.get(c)?;
        let p = path(env, &p)?;
        let ttl = ttl_of(ttl)?.ok_or_else(|| Fail::Arg("no TTL given".into()))?;
        let info = block_on(client.expire(&p, ttl))??;
        let mut st = Vec::with_capacity(STAT_FIELDS);
        stat_of(&info, &mut st);
        Ok(long_array(env, &st)?.into_raw())
    })
}

/// Gives a container a child TTL (`ttl`: 0 none, otherwise milliseconds);
/// returns its status as it is now.
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_setChildTtl<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    p: JString<'l>,
    ttl: jlong,
) -> jobject {
    call(&mut env, std::ptr::null_mut(), |env| {
        let client = CLIENTS.get(c)?;
        let p = path(env, &p)?;
        let info = block_on(client.set_child_ttl(&p, child_ttl_of(ttl)?))??;
        let mut st = Vec::with_capacity(STAT_FIELDS);
        stat_of(&info, &mut st);
        Ok(long_array(env, &st)?.into_raw())
    })
}

/// Children looked up at once, at most this many at a time.
const LIST_LOOKUPS_IN_FLIGHT: usize = 32;

/// `{String[] names, long[] stats}` of a container's children; a child
/// removed between the listing and its lookup is left out.
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_list<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    p: JString<'l>,
) -> jobject {
    call(&mut env, std::ptr::null_mut(), |env| {
        let client = CLIENTS.get(c)?;
        let p = path(env, &p)?;
        let found: Vec<(String, nk::NodeInfo)> = block_on(async {
            let names = client.enumerate(&p).await?;
            let lookups = names.into_iter().map(|name| {
                let child = if p.ends_with('/') {
                    format!("{p}{name}")
                } else {
                    format!("{p}/{name}")
                };
                let client = &client;
                async move {
                    match client.lookup(&child).await {
                        Ok(n) => Ok(Some((name, n.info().clone()))),
                        Err(e) if e.code == ErrorCode::NotFound => Ok(None),
                        Err(e) => Err(e),
                    }
                }
            });
            stream::iter(lookups)
                .buffered(LIST_LOOKUPS_IN_FLIGHT)
                .try_filter_map(|f| async move { Ok(f) })
                .try_collect()
                .await
        })??;
        let mut stats = Vec::with_capacity(found.len() * STAT_FIELDS);
        let mut names = Vec::with_capacity(found.len());
        for (name, info) in found {
            stat_of(&info, &mut stats);
            names.push(name);
        }
        let names = string_array(env, &names)?;
        let stats = long_array(env, &stats)?;
        let pair = env.new_object_array(2, "java/lang/Object", JObject::null())?;
        env.set_object_array_element(&pair, 0, names)?;
        env.set_object_array_element(&pair, 1, stats)?;
        Ok(pair.into_raw())
    })
}

#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_enumerate<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    p: JString<'l>,
) -> jobject {
    call(&mut env, std::ptr::null_mut(), |env| {
        let client = CLIENTS.get(c)?;
        let p = path(env, &p)?;
        let names = block_on(client.enumerate(&p))??;
        Ok(string_array(env, &names)?.into_raw())
    })
}

#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_mkdir<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    p: JString<'l>,
    parents: jboolean,
) {
    call(&mut env, (), |env| {
        let client = CLIENTS.get(c)?;
        let p = path(env, &p)?;
        Ok(block_on(client.mkdir(&p, parents != 0))??)
    })
}

fn stream_options(buffer_size: jint, slice_size: jint) -> R<nk::StreamOptions> {
    if buffer_size <= 0 && slice_size <= 0 {
        return Ok(nk::StreamOptions::default());
    }
    let (b, s) = (
        usize::try_from(buffer_size).unwrap_or(0),
        usize::try_from(slice_size).unwrap_or(0),
    );
    Ok(nk::StreamOptions::new(b, s)?)
}

/// Creates a node; for a File or KeyValue returns a writer handle, for a
/// container 0. `storage_class` and `mode` are -1 for "not set". With
/// `open_existing` (a File only) an existing File is opened for appending.
/// `session` is the handle of the session to bind the new node to, or 0.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "system" fn Java_io_nodekernel_Native_create<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    p: JString<'l>,
    ty: jint,
    storage_class: jint,
    local: jboolean,
    pinned: jboolean,
    enumerable: jboolean,
    mode: jint,
    size_hint: jlong,
    buffer_size: jint,
    slice_size: jint,
    open_existing: jboolean,
    ttl: jlong,
    child_ttl: jlong,
    session: jlong,
) -> jlong {
    call(&mut env, 0, |env| {
        let client = CLIENTS.get(c)?;
        let p = path(env, &p)?;
        let ty = node_type(ty)?;
        let session = match session {
            0 => None,
            s => Some(SESSIONS.get(s)?.as_ref().clone()),
        };
        let opts = nk::CreateOptions {
            storage_class: match storage_class {
                -1 => None,
                c => Some(
                    u8::try_from(c)
                        .map_err(|_| Fail::Arg(format!("{c} is not a storage class")))?,
                ),
            },
            local: local != 0,
            pinned: pinned != 0,
            enumerable: enumerable != 0,
            size_hint: u64::try_from(size_hint)
                .map_err(|_| Fail::Arg(format!("negative size hint {size_hint}")))?,
            mode: match mode {
                -1 => None,
                m => Some(u32::try_from(m).map_err(|_| Fail::Arg(format!("bad mode {m}")))?),
            },
            mtime: None,
            ttl: ttl_of(ttl)?,
            child_ttl: child_ttl_of(child_ttl)?,
            session,
        };
        let sopts = stream_options(buffer_size, slice_size)?;
        let node = if open_existing != 0 {
            if ty != NodeType::File {
                return Err(Fail::Arg(format!(
                    "only a File can be appended to, not a {ty}"
                )));
            }
            block_on(client.open_append(&p, opts))??
        } else {
            block_on(client.create(&p, ty, opts))??
        };
        if !matches!(ty, NodeType::File | NodeType::KeyValue) {
            return Ok(0);
        }
        let writer = nk::BufferedWriter::new(node, sopts)?;
        Ok(WRITERS.insert(Mutex::new(Some(writer))))
    })
}

/// Opens an existing File for appending; returns a writer handle.
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_append<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    p: JString<'l>,
    buffer_size: jint,
    slice_size: jint,
) -> jlong {
    call(&mut env, 0, |env| {
        let client = CLIENTS.get(c)?;
        let p = path(env, &p)?;
        let sopts = stream_options(buffer_size, slice_size)?;
        let node = block_on(client.open_write(&p))??;
        let writer = nk::BufferedWriter::new(node, sopts)?;
        Ok(WRITERS.insert(Mutex::new(Some(writer))))
    })
}

#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_delete<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    p: JString<'l>,
    recursive: jboolean,
) {
    call(&mut env, (), |env| {
        let client = CLIENTS.get(c)?;
        let p = path(env, &p)?;
        Ok(block_on(client.delete(&p, recursive != 0))??)
    })
}

#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_rename<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    src: JString<'l>,
    dst: JString<'l>,
    replace: jboolean,
) {
    call(&mut env, (), |env| {
        let client = CLIENTS.get(c)?;
        let src = path(env, &src)?;
        let dst = path(env, &dst)?;
        Ok(block_on(client.rename_with(&src, &dst, replace != 0))??)
    })
}

#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_put<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    p: JString<'l>,
    buf: JByteBuffer<'l>,
    off: jint,
    len: jint,
) {
    call(&mut env, (), |env| {
        let client = CLIENTS.get(c)?;
        let p = path(env, &p)?;
        // SAFETY: used only during this call (see `buffer`).
        let data = unsafe { buffer(env, &buf, off, len)? };
        Ok(block_on(client.put(&p, data))??)
    })
}

#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_get<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    p: JString<'l>,
) -> jobject {
    call(&mut env, std::ptr::null_mut(), |env| {
        let client = CLIENTS.get(c)?;
        let p = path(env, &p)?;
        let value = block_on(client.get(&p))??;
        Ok(value_array(env, &p, &value)?.into_raw())
    })
}

/// The values of several keys (`byte[][]`, in the order given), with up to
/// `in_flight` gets outstanding; a missing key's entry is null, any other
/// failure is thrown.
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_getMany<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    paths: JObjectArray<'l>,
    in_flight: jint,
) -> jobject {
    call(&mut env, std::ptr::null_mut(), |env| {
        let client = CLIENTS.get(c)?;
        if paths.is_null() {
            return Err(Fail::Arg("paths must not be null".into()));
        }
        let n = usize::try_from(env.get_array_length(&paths)?).unwrap_or(0);
        if n > nk::MAX_GET_MANY {
            return Err(Fail::Arg(format!(
                "{n} keys in one get; at most {}",
                nk::MAX_GET_MANY
            )));
        }
        let mut keys = Vec::with_capacity(n);
        for i in 0..n {
            let p = JString::from(env.get_object_array_element(&paths, i as jint)?);
            keys.push(path(env, &p)?);
            env.delete_local_ref(p)?;
        }
        let in_flight = reads_in_flight_or_default(in_flight);
        let values = block_on(client.get_many(&keys, in_flight))??;
        let out = env.new_object_array(n as jint, "[B", JObject::null())?;
        for (i, (key, value)) in keys.iter().zip(values).enumerate() {
            let value = match value {
                Ok(v) => v,
                Err(e) if e.code == ErrorCode::NotFound => continue,
                Err(e) => return Err(Fail::Nk(e)),
            };
            let a = value_array(env, key, &value)?;
            env.set_object_array_element(&out, i as jint, &a)?;
            env.delete_local_ref(a)?;
        }
        Ok(out.into_raw())
    })
}

/// Calls in flight of a `putMany` or `deleteMany` by default (`inFlight` 0
/// or less), and at most.
const DEFAULT_BATCH_IN_FLIGHT: usize = 64;
const MAX_BATCH_IN_FLIGHT: usize = 4096;

fn batch_in_flight(n: jint) -> usize {
    match usize::try_from(n) {
        Ok(n) if n > 0 => n.min(MAX_BATCH_IN_FLIGHT),
        _ => DEFAULT_BATCH_IN_FLIGHT,
    }
}

/// The paths of a batched call: at most `max`, each checked as `path`.
fn batch_paths(env: &mut JNIEnv<'_>, paths: &JObjectArray<'_>, max: usize) -> R<Vec<String>> {
    if paths.is_null() {
        return Err(Fail::Arg("paths must not be null".into()));
    }
    let n = usize::try_from(env.get_array_length(paths)?).unwrap_or(0);
    if n > max {
        return Err(Fail::Arg(format!("{n} keys in one call; at most {max}")));
    }
    let mut keys = Vec::with_capacity(n);
    for i in 0..n {
        let p = JString::from(env.get_object_array_element(paths, i as jint)?);
        if p.is_null() {
            return Err(Fail::Arg(format!("path {i} is null")));
        }
        keys.push(path(env, &p)?);
        env.delete_local_ref(p)?;
    }
    Ok(keys)
}

/// Throws the failures of a batched call, if any: the exception of the
/// first (in the order given), with each other one added to it as a
/// suppressed exception (`Throwable.getSuppressed`); each names its path.
fn throw_batch(env: &mut JNIEnv<'_>, results: Vec<nk::Result<()>>) -> R<()> {
    let mut first: Option<JObject<'_>> = None;
    for e in results.into_iter().filter_map(|r| r.err()) {
        let message = env.new_string(&e.message)?;
        let ex = env.new_object(
            exception_class(e.code),
            "(Ljava/lang/String;)V",
            &[(&message).into()],
        )?;
        env.delete_local_ref(message)?;
        match &first {
            None => first = Some(ex),
            Some(f) => {
                env.call_method(
                    f,
                    "addSuppressed",
                    "(Ljava/lang/Throwable;)V",
                    &[(&ex).into()],
                )?;
                env.delete_local_ref(ex)?;
            }
        }
    }
    if let Some(f) = first {
        env.throw(JThrowable::from(f))?;
    }
    Ok(())
}

/// Puts `values[i]` at `paths[i]` for every `i`, with up to `in_flight`
/// puts outstanding; every item is tried, and the failures are thrown
/// together once all have ended (see `throw_batch`): the other items are
/// stored.
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_putMany<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    paths: JObjectArray<'l>,
    values: JObjectArray<'l>,
    in_flight: jint,
) {
    call(&mut env, (), |env| {
        let client = CLIENTS.get(c)?;
        let keys = batch_paths(env, &paths, nk::MAX_PUT_MANY)?;
        if values.is_null() {
            return Err(Fail::Arg("values must not be null".into()));
        }
        let n = usize::try_from(env.get_array_length(&values)?).unwrap_or(0);
        if n != keys.len() {
            return Err(Fail::Arg(format!("{} paths but {n} values", keys.len())));
        }
        let mut items = Vec::with_capacity(n);
        for (i, key) in keys.into_iter().enumerate() {
            let a = JByteArray::from(env.get_object_array_element(&values, i as jint)?);
            if a.is_null() {
                return Err(Fail::Arg(format!("the value of {key} is null")));
            }
            let value = env.convert_byte_array(&a)?;
            env.delete_local_ref(a)?;
            items.push((key, value));
        }
        let results = block_on(client.put_many(&items, batch_in_flight(in_flight)))??;
        throw_batch(env, results)
    })
}

/// Deletes every path (as `delete`), with up to `in_flight` deletes
/// outstanding; every path is tried, and the failures are thrown together
/// once all have ended (see `throw_batch`).
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_deleteMany<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    paths: JObjectArray<'l>,
    recursive: jboolean,
    in_flight: jint,
) {
    call(&mut env, (), |env| {
        let client = CLIENTS.get(c)?;
        let keys = batch_paths(env, &paths, nk::MAX_DELETE_MANY)?;
        let results =
            block_on(client.delete_many(&keys, recursive != 0, batch_in_flight(in_flight)))??;
        throw_batch(env, results)
    })
}

/// Reads the value at `p` into the buffer if it fits; returns its size
/// either way (bigger than `len`: nothing was read).
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_getInto<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    p: JString<'l>,
    buf: JByteBuffer<'l>,
    off: jint,
    len: jint,
) -> jlong {
    call(&mut env, -1, |env| {
        let client = CLIENTS.get(c)?;
        let p = path(env, &p)?;
        // SAFETY: used only during this call (see `buffer`).
        let out = unsafe { buffer(env, &buf, off, len)? };
        let size = block_on(async {
            let mut attempt = 1;
            loop {
                let node = client.lookup(&p).await?;
                let size = node.size();
                if size > out.len() as u64 {
                    return Ok(size);
                }
                match node.read_at(0, &mut out[..size as usize]).await {
                    Err(e) if e.code == ErrorCode::Stale && attempt < nk::GET_ATTEMPTS => {
                        attempt += 1
                    }
                    r => return r.map(|()| size),
                }
            }
        })??;
        Ok(size as jlong)
    })
}

/// For each block of the node, in order: `"<location>\t<host:port>"` of the
/// storage server holding it (the location is the server's host name as
/// configured, the one schedulers compare with their hosts).
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_blockLocations<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    p: JString<'l>,
) -> jobject {
    call(&mut env, std::ptr::null_mut(), |env| {
        let client = CLIENTS.get(c)?;
        let p = path(env, &p)?;
        let (blocks, status) = block_on(async {
            let node = client.lookup(&p).await?;
            let blocks = node.block_locations().await?;
            let status = client.status().await?;
            Ok::<_, nk::Error>((blocks, status))
        })??;
        let hosts: Vec<String> = blocks
            .iter()
            .map(|b| {
                let location = status
                    .servers
                    .iter()
                    .find(|s| s.id == b.server && !s.location.is_empty())
                    .map(|s| s.location.as_str())
                    .unwrap_or_else(|| host_of(&b.addr));
                format!("{location}\t{}", b.addr)
            })
            .collect();
        Ok(string_array(env, &hosts)?.into_raw())
    })
}

fn host_of(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(h, _)| h)
}

/// `{capacity, used}` in bytes over the live storage servers.
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_capacity<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
) -> jobject {
    call(&mut env, std::ptr::null_mut(), |env| {
        let client = CLIENTS.get(c)?;
        let status = block_on(client.status())??;
        let (mut cap, mut used) = (0u64, 0u64);
        for s in status.servers.iter().filter(|s| s.alive) {
            cap = cap.saturating_add(s.capacity_blocks.saturating_mul(s.block_size as u64));
            used = used.saturating_add(s.used_blocks.saturating_mul(s.block_size as u64));
        }
        Ok(long_array(env, &[cap as i64, used as i64])?.into_raw())
    })
}

/// A usage as `Native.du` and `Native.setQuota` return it (`Usage.of` in
/// Java reads it): `{nodes, bytes, stored, quotaBytes, quotaNodes,
/// classes, then (class, blocks, pieceBytes) per class}`; a quota limit is
/// -1 when not set, and both are -2 when there is no quota.
fn usage_longs(u: &nk::UsageInfo) -> Vec<i64> {
    let limit = |v: u64| {
        if v == nk::NO_LIMIT {
            -1
        } else {
            i64::try_from(v).unwrap_or(i64::MAX)
        }
    };
    let big = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let (qb, qn) = u
        .quota
        .map_or((-2, -2), |q| (limit(q.bytes), limit(q.nodes)));
    let mut out = vec![
        big(u.nodes),
        big(u.bytes),
        big(u.held),
        qb,
        qn,
        u.classes.len() as i64,
    ];
    for c in &u.classes {
        out.extend([i64::from(c.class), big(c.blocks), big(c.piece_bytes)]);
    }
    out
}

/// A limit from Java: -1 for none, else at least 0.
fn java_limit(v: jlong, what: &str) -> R<Option<u64>> {
    match v {
        -1 => Ok(None),
        v => u64::try_from(v)
            .map(Some)
            .map_err(|_| Fail::Arg(format!("bad quota limit of {what} {v} (-1: no limit)"))),
    }
}

/// Sets (limits -1: none; both: clears) the quota of the container at
/// `p`; returns its usage (see `usage_longs`).
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_setQuota<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    p: JString<'l>,
    bytes: jlong,
    nodes: jlong,
) -> jobject {
    call(&mut env, std::ptr::null_mut(), |env| {
        let client = CLIENTS.get(c)?;
        let p = path(env, &p)?;
        let (bytes, nodes) = (java_limit(bytes, "bytes")?, java_limit(nodes, "nodes")?);
        let u = block_on(client.set_quota(&p, bytes, nodes))??;
        Ok(long_array(env, &usage_longs(&u))?.into_raw())
    })
}

/// The disk usage of the subtree at `p` (see `usage_longs`), from the
/// metadata servers' accounting.
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_du<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    p: JString<'l>,
) -> jobject {
    call(&mut env, std::ptr::null_mut(), |env| {
        let client = CLIENTS.get(c)?;
        let p = path(env, &p)?;
        let u = block_on(client.du(&p))??;
        Ok(long_array(env, &usage_longs(&u))?.into_raw())
    })
}

// ---------------------------------------------------------------------------
// Entry points: sessions

/// Opens a session of the client with a lease of `lease_ms` (0: the
/// default); returns `{handle, the lease the metadata servers gave in ms}`.
/// The session is renewed in the background until `closeSession` or
/// `dropSession`, whatever becomes of the client's handle.
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_openSession<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    lease_ms: jlong,
) -> jobject {
    call(&mut env, std::ptr::null_mut(), |env| {
        let client = CLIENTS.get(c)?;
        let lease = match lease_ms {
            0 => nk::DEFAULT_SESSION_LEASE,
            ms => Duration::from_millis(
                u64::try_from(ms)
                    .map_err(|_| Fail::Arg(format!("{ms} ms is not a positive lease")))?,
            ),
        };
        if SESSIONS.lock().len() >= MAX_SESSIONS {
            return Err(Fail::Nk(nk::Error::new(
                ErrorCode::Busy,
                format!("{MAX_SESSIONS} sessions are open in this process, the most it keeps: close some"),
            )));
        }
        // Within the runtime: the session's renewals run on it.
        let session = block_on(client.session(lease))??;
        let granted = i64::try_from(session.lease().as_millis()).unwrap_or(i64::MAX);
        let h = SESSIONS.insert(session);
        Ok(long_array(env, &[h, granted])?.into_raw())
    })
}

/// Ends the session: what is bound to it is removed before this returns.
/// The handle is gone afterwards, whether the close got through or not
/// (if not, the session is renewed no more and its lease lapses).
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_closeSession<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    s: jlong,
) {
    call(&mut env, (), |_| {
        let session = SESSIONS.remove(s)?;
        Ok(block_on(session.close())??)
    })
}

/// Forgets a session without waiting (a Java `Session` collected
/// unclosed): it is closed in the background, or, if that does not get
/// out, its lease lapses.
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_dropSession<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    s: jlong,
) {
    call(&mut env, (), |_| {
        let session = SESSIONS.remove(s)?;
        // Dropped within the runtime, the last handle's drop closes it
        // there, in a task of its own.
        let _in_runtime = runtime()?.enter();
        drop(session);
        Ok(())
    })
}

/// Whether the session is known to have ended (its lease lapsed: what it
/// bound is gone).
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_sessionEnded<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    s: jlong,
) -> jboolean {
    call(&mut env, 0, |_| {
        Ok(jboolean::from(SESSIONS.get(s)?.has_ended()))
    })
}

/// Binds the existing node at `p` to the session (removed with it).
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_bindSession<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    s: jlong,
    p: JString<'l>,
) {
    call(&mut env, (), |env| {
        let session = SESSIONS.get(s)?;
        let p = path(env, &p)?;
        Ok(block_on(session.bind_existing(&p))??)
    })
}

// ---------------------------------------------------------------------------
// Entry points: input streams

#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_openReader<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    p: JString<'l>,
) -> jobject {
    call(&mut env, std::ptr::null_mut(), |env| {
        let client = CLIENTS.get(c)?;
        let p = path(env, &p)?;
        let node = block_on(client.lookup(&p))??;
        let info = node.info().clone();
        if !matches!(info.ty, NodeType::File | NodeType::KeyValue) {
            return Err(Fail::Nk(nk::Error::new(
                ErrorCode::TypeMismatch,
                format!("{p} is a {}, not a File or KeyValue", info.ty),
            )));
        }
        let h = READERS.insert(Mutex::new(Reader::File {
            node: Arc::new(node),
            stream: None,
            pos: 0,
        }));
        let mut st = vec![h];
        stat_of(&info, &mut st);
        Ok(long_array(env, &st)?.into_raw())
    })
}

/// Opens a Bag as one stream; returns `{handle, total size}`.
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_openBag<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    p: JString<'l>,
    reads_in_flight: jint,
) -> jobject {
    call(&mut env, std::ptr::null_mut(), |env| {
        let client = CLIENTS.get(c)?;
        let p = path(env, &p)?;
        let in_flight = reads_in_flight_or_default(reads_in_flight);
        let reader = block_on(client.read_bag(&p, in_flight))??;
        let total = reader.total_size();
        let h = READERS.insert(Mutex::new(Reader::Bag { reader, pos: 0 }));
        Ok(long_array(env, &[h, total as i64])?.into_raw())
    })
}

/// Opens byte ranges of Files and KeyValues as one stream; returns
/// `{handle, total size}`. `paths`, `offsets` and `lengths` are parallel
/// arrays (one range each).
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_openRanges<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    c: jlong,
    paths: JObjectArray<'l>,
    offsets: JLongArray<'l>,
    lengths: JLongArray<'l>,
    reads_in_flight: jint,
) -> jobject {
    call(&mut env, std::ptr::null_mut(), |env| {
        let client = CLIENTS.get(c)?;
        if paths.is_null() || offsets.is_null() || lengths.is_null() {
            return Err(Fail::Arg(
                "paths, offsets and lengths must not be null".into(),
            ));
        }
        let n = env.get_array_length(&paths)?;
        if env.get_array_length(&offsets)? != n || env.get_array_length(&lengths)? != n {
            return Err(Fail::Arg(
                "paths, offsets and lengths must have one entry per range".into(),
            ));
        }
        let n = usize::try_from(n).unwrap_or(0);
        if n > nk::MAX_RANGES {
            return Err(Fail::Arg(format!(
                "{n} ranges in one stream; at most {}",
                nk::MAX_RANGES
            )));
        }
        let (mut offs, mut lens) = (vec![0i64; n], vec![0i64; n]);
        env.get_long_array_region(&offsets, 0, &mut offs)?;
        env.get_long_array_region(&lengths, 0, &mut lens)?;
        let mut ranges = Vec::with_capacity(n);
        for i in 0..n {
            let p = JString::from(env.get_object_array_element(&paths, i as jint)?);
            let path = path(env, &p)?;
            env.delete_local_ref(p)?;
            let (offset, len) = match (u64::try_from(offs[i]), u64::try_from(lens[i])) {
                (Ok(o), Ok(l)) => (o, l),
                _ => {
                    return Err(Fail::Arg(format!(
                        "range {i} of {path}: negative offset or length ({}, {})",
                        offs[i], lens[i]
                    )))
                }
            };
            ranges.push(nk::ByteRange { path, offset, len });
        }
        let in_flight = reads_in_flight_or_default(reads_in_flight);
        let reader = block_on(client.read_ranges(&ranges, in_flight))??;
        let total = reader.total_size();
        let h = READERS.insert(Mutex::new(Reader::Bag { reader, pos: 0 }));
        Ok(long_array(env, &[h, total as i64])?.into_raw())
    })
}

/// Reads up to `len` bytes at the stream's position; -1 at the end.
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_read<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    r: jlong,
    buf: JByteBuffer<'l>,
    off: jint,
    len: jint,
) -> jint {
    call(&mut env, -1, |env| {
        let reader = READERS.get(r)?;
        // SAFETY: used only during this call (see `buffer`).
        let out = unsafe { buffer(env, &buf, off, len)? };
        if out.is_empty() {
            return Ok(0);
        }
        let mut reader = sync::lock(&reader);
        let n = match &mut *reader {
            Reader::File { node, stream, pos } => {
                if stream.is_none() {
                    *stream = Some(nk::BufferedReader::new(
                        node.clone(),
                        *pos,
                        nk::StreamOptions::default(),
                    )?);
                }
                let s = stream.as_mut().expect("made above");
                let n = block_on(s.read(out))??;
                *pos += n as u64;
                n
            }
            Reader::Bag { reader, pos } => {
                let n = block_on(reader.read(out))??;
                *pos += n as u64;
                n
            }
        };
        Ok(if n == 0 { -1 } else { n as jint })
    })
}

/// Reads up to `len` bytes at `pos` without moving the stream; -1 when
/// `pos` is at or past the end.
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_pread<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    r: jlong,
    pos: jlong,
    buf: JByteBuffer<'l>,
    off: jint,
    len: jint,
) -> jint {
    call(&mut env, -1, |env| {
        let reader = READERS.get(r)?;
        let pos = u64::try_from(pos).map_err(|_| Fail::Arg(format!("negative position {pos}")))?;
        // SAFETY: used only during this call (see `buffer`).
        let out = unsafe { buffer(env, &buf, off, len)? };
        let node = match &*sync::lock(&reader) {
            Reader::File { node, .. } => node.clone(),
            Reader::Bag { .. } => {
                return Err(Fail::Nk(nk::Error::new(
                    ErrorCode::InvalidArgument,
                    "a Bag stream reads sequentially only",
                )))
            }
        };
        let size = node.size();
        if pos >= size {
            return Ok(-1);
        }
        let n = (size - pos).min(out.len() as u64) as usize;
        block_on(node.read_at(pos, &mut out[..n]))??;
        Ok(n as jint)
    })
}

#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_seek<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    r: jlong,
    to: jlong,
) {
    call(&mut env, (), |_| {
        let reader = READERS.get(r)?;
        let to = u64::try_from(to).map_err(|_| Fail::Arg(format!("negative position {to}")))?;
        let mut guard = sync::lock(&reader);
        match &mut *guard {
            Reader::File { stream, pos, .. } => {
                // Also drops the read-ahead at the same position (unbuffer).
                *stream = None;
                *pos = to;
                Ok(())
            }
            Reader::Bag { pos, .. } if *pos == to => Ok(()),
            Reader::Bag { .. } => Err(Fail::Nk(nk::Error::new(
                ErrorCode::InvalidArgument,
                "a Bag stream reads sequentially only",
            ))),
        }
    })
}

#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_closeReader<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    r: jlong,
) {
    call(&mut env, (), |_| READERS.remove(r).map(drop))
}

// ---------------------------------------------------------------------------
// Entry points: output streams

fn with_writer<T>(w: jlong, f: impl FnOnce(&mut nk::BufferedWriter) -> R<T>) -> R<T> {
    let writer = WRITERS.get(w)?;
    let mut writer = sync::lock(&writer);
    match writer.as_mut() {
        Some(wr) => f(wr),
        None => Err(WRITERS.missing()),
    }
}

#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_write<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    w: jlong,
    buf: JByteBuffer<'l>,
    off: jint,
    len: jint,
) {
    call(&mut env, (), |env| {
        // SAFETY: used only during this call (see `buffer`).
        let data = unsafe { buffer(env, &buf, off, len)? };
        with_writer(w, |wr| Ok(block_on(wr.write_all(data))??))
    })
}

#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_flush<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    w: jlong,
) {
    call(&mut env, (), |_| {
        with_writer(w, |wr| Ok(block_on(wr.flush())??))
    })
}

#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_sync<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    w: jlong,
) {
    call(&mut env, (), |_| {
        with_writer(w, |wr| Ok(block_on(wr.sync())??))
    })
}

#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_position<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    w: jlong,
) -> jlong {
    call(&mut env, -1, |_| {
        with_writer(w, |wr| Ok(wr.position() as jlong))
    })
}

/// Closes (publishing everything) or, with `abort`, abandons the writer.
/// The handle is gone afterwards either way.
#[no_mangle]
pub extern "system" fn Java_io_nodekernel_Native_closeWriter<'l>(
    mut env: JNIEnv<'l>,
    _: JClass<'l>,
    w: jlong,
    abort: jboolean,
) {
    call(&mut env, (), |_| {
        let writer = WRITERS.remove(w)?;
        let Some(wr) = sync::lock(&writer).take() else {
            return Err(WRITERS.missing());
        };
        if abort != 0 {
            Ok(block_on(wr.abort())??)
        } else {
            Ok(block_on(wr.close())??)
        }
    })
}
