//! The admin HTTP endpoint of NodeKernel's servers: `/metrics`
//! (Prometheus text format), `/status` (JSON), `/healthz`, `/readyz`,
//! `/policy` (the tiering policy: `GET`, and `POST` with the settings in
//! the query string) and a live dashboard page (`/`).
//!
//! This crate only serves: what the routes say comes from the embedding
//! server (the metadata or a storage server) through a [`Source`], so it
//! depends on neither. It speaks HTTP/1.1 (hyper), answers `GET` and
//! `HEAD` (and `POST /policy`), never reads a request body, and bounds what a peer can make
//! it hold: [`MAX_CONNECTIONS`] connections, [`MAX_HEADER_BYTES`] of
//! request head each, [`HEADER_TIMEOUT`] to send it, and
//! [`MAX_CONNECTION_AGE`] per connection.

pub mod metrics;
pub mod status;

pub use prometheus_client;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// Most connections served at once; further ones are closed at accept.
pub const MAX_CONNECTIONS: usize = 64;
/// Most bytes of one request's head (request line and headers) buffered.
pub const MAX_HEADER_BYTES: usize = 16 << 10;
/// Most header lines in one request.
pub const MAX_HEADERS: usize = 64;
/// A request head must arrive within this long (an idle keep-alive
/// connection is closed after it too).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection is asked to close (after the request in progress) once it
/// is this old, so no peer holds a slot for ever.
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(300);

/// The content type of `/metrics` (Prometheus text exposition 0.0.4, as
/// `prometheus-client` writes it).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The dashboard page, one file with its CSS and JavaScript (no external
/// assets).
pub const DASHBOARD_HTML: &str = include_str!("dashboard.html");

/// What the routes serve; implemented by the embedding server.
pub trait Source: Send + Sync + 'static {
    /// The body of `/metrics`: Prometheus/OpenMetrics text.
    fn metrics(&self) -> String;
    /// The body of `/status`: a JSON document.
    fn status(&self) -> String;
    /// `Ok` while the server serves; `Err(reason)` answers `/healthz`
    /// with 503 and the reason.
    fn health(&self) -> Result<(), String>;
    /// `Ok` once the server is ready for clients (a metadata server: its
    /// expected storage servers are alive); `Err(reason)` answers
    /// `/readyz` with 503 and the reason. Default: [`Source::health`].
    fn ready(&self) -> Result<(), String> {
        self.health()
    }
    /// `/policy`: the tiering policy as JSON after changing the settings
    /// in `set` (empty for a `GET`); `None`: this server has none (404);
    /// `Some(Err(reason))`: the change was refused (400).
    fn policy(&self, _set: &[(String, String)]) -> Option<Result<String, String>> {
        None
    }
    /// `Err(reason)` when this endpoint may not change anything (`POST`
    /// is then answered 403 with the reason): the HTTP endpoint proves no
    /// cluster token, so a server with one keeps its changes to the
    /// authenticated RPC path. Default: changes allowed.
    fn changes_allowed(&self) -> Result<(), String> {
        Ok(())
    }
}

/// `(key, value)` pairs as one JSON object of strings, in order.
pub fn pairs_json(pairs: &[(String, String)]) -> String {
    let obj: serde_json::Map<String, serde_json::Value> = pairs
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    serde_json::Value::Object(obj).to_string()
}

/// Most `key=value` pairs one `POST /policy` may carry.
pub const MAX_POLICY_PAIRS: usize = 64;

/// The `key=value` pairs of a query string, in order (no percent
/// decoding: the keys and values are plain words).
fn query_pairs(query: &str) -> Result<Vec<(String, String)>, String> {
    let pairs: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    if pairs.len() > MAX_POLICY_PAIRS {
        return Err(format!("at most {MAX_POLICY_PAIRS} settings at once"));
    }
    pairs
        .into_iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(format!("{p:?} is not key=value")),
        })
        .collect()
}

/// Why the admin endpoint could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on admin address {addr}: {error}")]
pub struct AdminError {
    pub addr: String,
    pub error: std::io::Error,
}

/// A running admin endpoint; stops when dropped.
pub struct AdminServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl AdminServer {
    /// Binds `addr` and serves `source` on it in the current tokio
    /// runtime.
    pub async fn start(addr: &str, source: Arc<dyn Source>) -> Result<AdminServer, AdminError> {
        let listener = TcpListener::bind(addr).await.map_err(|error| AdminError {
            addr: addr.to_string(),
            error,
        })?;
        let local = listener.local_addr().map_err(|error| AdminError {
            addr: addr.to_string(),
            error,
        })?;
        let task = tokio::spawn(accept_loop(listener, source));
        Ok(AdminServer { addr: local, task })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR/`, the dashboard's address.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Stops accepting; connections in progress end with their runtime or
    /// their age limit.
    pub fn shutdown(&self) {
        self.task.abort();
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn accept_loop(listener: TcpListener, source: Arc<dyn Source>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors and the like: wait instead of spinning.
                tracing::warn!("admin endpoint: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::debug!("admin endpoint: {MAX_CONNECTIONS} connections open, closing {peer}");
            continue;
        };
        let source = source.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |req| {
                let source = source.clone();
                async move { Ok::<_, std::convert::Infallible>(route(&*source, &req)) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_HEADER_BYTES)
                .max_headers(MAX_HEADERS);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let aged = tokio::time::sleep(MAX_CONNECTION_AGE);
            tokio::pin!(aged);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                () = &mut aged => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                tracing::debug!("admin endpoint: connection from {peer}: {e}");
            }
        });
    }
}

fn reply(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn check(r: Result<(), String>) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    match r {
        Ok(()) => reply(StatusCode::OK, TEXT, "ok\n"),
        Err(why) => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, format!("{why}\n")),
    }
}

/// Answers one request. The body is never read (GET and HEAD; a `POST
/// /policy` carries its settings in the query string).
fn route(source: &dyn Source, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    if req.uri().path() == "/policy"
        && (req.method() == Method::GET || req.method() == Method::POST)
    {
        let set = if req.method() == Method::POST {
            if let Err(why) = source.changes_allowed() {
                return reply(StatusCode::FORBIDDEN, TEXT, format!("{why}\n"));
            }
            match query_pairs(req.uri().query().unwrap_or_default()) {
                Ok(set) => set,
                Err(e) => return reply(StatusCode::BAD_REQUEST, TEXT, format!("{e}\n")),
            }
        } else {
            Vec::new()
        };
        return match source.policy(&set) {
            Some(Ok(json)) => reply(StatusCode::OK, "application/json", json),
            Some(Err(e)) => reply(StatusCode::BAD_REQUEST, TEXT, format!("{e}\n")),
            None => reply(StatusCode::NOT_FOUND, TEXT, "no tiering policy here\n"),
        };
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "only GET and HEAD\n");
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    // hyper sends no body in answer to HEAD.
    match req.uri().path() {
        "/" | "/index.html" => reply(StatusCode::OK, "text/html; charset=utf-8", DASHBOARD_HTML),
        "/metrics" => reply(StatusCode::OK, METRICS_CONTENT_TYPE, source.metrics()),
        "/status" => reply(StatusCode::OK, "application/json", source.status()),
        "/healthz" => check(source.health()),
        "/readyz" => check(source.ready()),
        _ => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: try /, /metrics, /status, /healthz, /readyz or /policy\n",
        ),
    }
}
