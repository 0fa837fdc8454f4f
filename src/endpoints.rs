//! Prometheus metrics over HTTP: on a unix socket (`metrics.socket`, default
//! `/run/shim-agent/metrics.sock`, the unit's RuntimeDirectory) and optionally on a TCP
//! address (`metrics.address`, e.g. `127.0.0.1:9464`). `GET /metrics` answers the text
//! format, `/healthz` and `/readyz` the probes of a Deployment ([`route`]); anything else is
//! 404. A listener that cannot be opened is logged and skipped:
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

/// What `GET path` answers: a status and a body. `/metrics` the text format; `/healthz` 200
/// while the process serves; `/readyz` 200 once it became ready (the agent: its journal
/// recovered and its watches synced; the coordinator: its client made and standing for the
/// election), else 503.
pub fn route(path: &str, readied: u64) -> (StatusCode, Bytes) {
    match path {
        "/metrics" => (StatusCode::OK, Bytes::from(telemetry::metrics().encode())),
        "/healthz" => (StatusCode::OK, Bytes::from_static(b"ok\n")),
        "/readyz" if readied > 0 => (StatusCode::OK, Bytes::from_static(b"ready\n")),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            Bytes::from_static(b"not ready yet\n"),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            Bytes::from_static(b"not found; try /metrics, /healthz or /readyz\n"),
        ),
    }
}

async fn answer(req: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, body) = if req.method() == hyper::Method::GET {
        route(req.uri().path(), telemetry::activity().borrow().readied)
    } else {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            Bytes::from_static(b"GET only\n"),
        )
    };
    let metrics = status == StatusCode::OK && req.uri().path() == "/metrics";
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    let kind = if metrics {
        "text/plain; version=0.0.4; charset=utf-8"
    } else {
        "text/plain; charset=utf-8"
    };
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(kind),
    );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_say_alive_at_once_and_ready_only_once_ready() {
        assert_eq!(route("/healthz", 0).0, StatusCode::OK);
        assert_eq!(route("/readyz", 0).0, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(route("/readyz", 1).0, StatusCode::OK);
        let (status, body) = route("/metrics", 0);
        assert_eq!(status, StatusCode::OK);
        assert!(String::from_utf8_lossy(&body).contains("# EOF"), "{body:?}");
        assert_eq!(route("/metrics/x", 1).0, StatusCode::NOT_FOUND);
    }
}
