//! The HTTP transport to the API server, as client-go's: HTTP/2 offered by ALPN (`h2`, then
//! `http/1.1`), so that every request and watch of a client shares one TCP+TLS connection,
//! with HTTP/1.1 where a server offers no HTTP/2. kube's own client speaks HTTP/1.1 only, one
//! connection per watch; here kube's layers (base URI, authentication, headers) sit on a hyper
//! client built with HTTP/2.
//!
//! A dead connection is found as client-go finds it: an HTTP/2 PING after 30 s without a frame,
//! answered within 15 s, or the connection is dropped and every stream on it fails over to a
//! new one (watches then resume from their resourceVersion).

use std::time::Duration;

use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{Body, ConfigExt};
use kube::{Client, Config};
use tower::{BoxError, ServiceBuilder};

/// Idle time before a PING on the connection (client-go's ReadIdleTimeout).
const PING_AFTER: Duration = Duration::from_secs(30);
/// How long a PING may go unanswered (client-go's PingTimeout).
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// The TCP side of the connection to the API server.
fn tcp(config: &Config) -> HttpConnector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    // As Go's net package does for client-go: a request's small writes (HEADERS, then DATA)
    // go out at once. Under Nagle's algorithm the second waits for the server's delayed ACK
    // (40 ms on Linux): a slot claim, a release or a label patch paid it each.
    http.set_nodelay(true);
    http
}

/// A client for `config` whose requests and watches share one HTTP/2 connection per API
/// server (HTTP/1.1 where the server speaks no HTTP/2).
pub fn client(config: Config) -> Result<Client, kube::Error> {
    client_observed(config, |r| r)
}

/// [`client`], with `observe` shown every request before it goes (the benchmarks count them).
pub fn client_observed<F>(config: Config, observe: F) -> Result<Client, kube::Error>
where
    F: Fn(http::Request<Body>) -> http::Request<Body> + Clone + Send + Sync + 'static,
{
    // ALPN (`h2`, `http/1.1`) is the connector builder's to set, from the versions enabled
    // below; it refuses a config that has it already.
    let tls = config.rustls_client_config()?;
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(tcp(&config));
    let hyper: HyperClient<_, Body> = HyperClient::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_AFTER)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(https);
    let service = ServiceBuilder::new()
        .map_request(observe)
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(Client::new(service, config.default_namespace))
}

#[cfg(test)]
mod tests {
    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn the_connection_sends_small_writes_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let config = Config::new(format!("https://{addr}").parse().unwrap());
        let uri: http::Uri = format!("http://{addr}").parse().unwrap();
        let conn = tcp(&config).oneshot(uri).await.unwrap();
        assert!(conn.inner().nodelay().unwrap(), "TCP_NODELAY");
    }
}
