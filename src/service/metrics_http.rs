//! Prometheus metrics over HTTP: on a unix socket (`metrics.socket`, default
//! `/run/shim-agent/metrics.sock`, the unit's RuntimeDirectory) and optionally on a TCP
//! address (`metrics.address`, e.g. `127.0.0.1:9464`). `GET /metrics` answers the text
//! format; anything else is 404. A listener that cannot be opened is logged and skipped:
//! metrics are never a reason for the agent not to run.

use std::convert::Infallible;
use std::path::Path;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinHandle;

use crate::settings::MetricsSettings;
use crate::telemetry;

/// The listeners; dropping it closes them.
pub struct MetricsServer {
    tasks: Vec<JoinHandle<()>>,
}

impl MetricsServer {
    /// Close the listeners, and wait until they are closed (so that the same address can be
    /// bound again at once).
    pub async fn stop(mut self) {
        for t in std::mem::take(&mut self.tasks) {
            t.abort();
            let _ = t.await;
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn answer(req: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let found = req.uri().path() == "/metrics" && req.method() == hyper::Method::GET;
    let mut resp = if found {
        Response::new(Full::new(Bytes::from(telemetry::metrics().encode())))
    } else {
        let mut r = Response::new(Full::new(Bytes::from_static(b"not found; try /metrics\n")));
        *r.status_mut() = StatusCode::NOT_FOUND;
        r
    };
    if found {
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
    }
    Ok(resp)
}

fn serve_conn<S>(stream: S)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    tokio::spawn(async move {
        let conn = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), hyper::service::service_fn(answer));
        // a scrape that hangs up early is not worth a log line
        let _ = conn.await;
    });
}

fn unix_listener(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    tokio::net::UnixListener::bind(path)
}

/// Open the configured listeners and serve until dropped.
pub async fn serve(settings: &MetricsSettings) -> MetricsServer {
    let mut tasks = Vec::new();
    if !settings.socket.is_empty() {
        let path = Path::new(&settings.socket);
        match unix_listener(path) {
            Ok(l) => {
                tracing::info!(socket = %path.display(), "serving metrics");
                tasks.push(tokio::spawn(async move {
                    while let Ok((s, _)) = l.accept().await {
                        serve_conn(s);
                    }
                }));
            }
            Err(e) => {
                tracing::warn!(socket = %path.display(), "cannot serve metrics on this socket: {e}")
            }
        }
    }
    if !settings.address.is_empty() {
        match tokio::net::TcpListener::bind(&settings.address).await {
            Ok(l) => {
                tracing::info!(address = %settings.address, "serving metrics");
                tasks.push(tokio::spawn(async move {
                    while let Ok((s, _)) = l.accept().await {
                        serve_conn(s);
                    }
                }));
            }
            Err(e) => {
                tracing::warn!(address = %settings.address, "cannot serve metrics on this address: {e}")
            }
        }
    }
    MetricsServer { tasks }
}
