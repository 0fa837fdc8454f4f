//! The HTTP transport to the API server, as client-go's: HTTP/2 offered by ALPN (`h2`, then
//! `http/1.1`), so that every request and watch of a client shares one TCP+TLS connection,
//! with HTTP/1.1 where a server offers no HTTP/2. kube's own client speaks HTTP/1.1 only, one
//! connection per watch; here kube's layers (base URI, authentication, headers) sit on a hyper
//! client built with HTTP/2.
//!
//! A dead connection is found as client-go finds it: an HTTP/2 PING after 30 s without a frame,
//! answered within 15 s, or the connection is dropped and every stream on it fails over to a
//! new one (watches then resume from their resourceVersion).
//!
//! Proxies as client-go takes them: the kubeconfig's `proxy-url`, else `HTTPS_PROXY` (or
//! `HTTP_PROXY`) from the environment except for the hosts in `NO_PROXY`; the connection is
//! tunnelled through it with CONNECT (TLS stays end to end), the URL's user and password as
//! `Proxy-Authorization`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Uri};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use kube::client::{Body, ConfigExt};
use kube::{Client, Config};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};

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

/// Where connections to the API server go: through the kubeconfig's proxy, or as the
/// environment says (straight when it names none, or the host is in `NO_PROXY`).
#[derive(Clone)]
enum Proxying {
    Fixed { uri: Uri, auth: Option<HeaderValue> },
    Env(Arc<Matcher>),
}

impl Proxying {
    fn of(config: &Config) -> Result<Proxying, kube::Error> {
        let Some(url) = &config.proxy_url else {
            return Ok(Proxying::Env(Arc::new(Matcher::from_env())));
        };
        if !matches!(url.scheme_str(), Some("http") | Some("https")) {
            return Err(kube::Error::Service(
                format!(
                    "proxy-url: only http proxies are supported, not {:?}",
                    url.scheme_str().unwrap_or("")
                )
                .into(),
            ));
        }
        let (uri, auth) = without_userinfo(url);
        Ok(Proxying::Fixed { uri, auth })
    }

    /// The proxy for a connection to `dst`, and its `Proxy-Authorization`.
    fn target(&self, dst: &Uri) -> Option<(Uri, Option<HeaderValue>)> {
        match self {
            Proxying::Fixed { uri, auth } => Some((uri.clone(), auth.clone())),
            Proxying::Env(m) => m
                .intercept(dst)
                .map(|i| (i.uri().clone(), i.basic_auth().cloned())),
        }
    }
}

/// A proxy URL without its `user:password@`, and those as a Basic `Proxy-Authorization`.
fn without_userinfo(url: &Uri) -> (Uri, Option<HeaderValue>) {
    use base64::Engine;
    let Some(authority) = url.authority() else {
        return (url.clone(), None);
    };
    let Some((userinfo, host)) = authority.as_str().rsplit_once('@') else {
        return (url.clone(), None);
    };
    let bare = Uri::builder()
        .scheme(url.scheme_str().unwrap_or("http"))
        .authority(host)
        .path_and_query("/")
        .build()
        .unwrap_or_else(|_| url.clone());
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let decode = |s: &str| percent_decode(s);
    let token = base64::engine::general_purpose::STANDARD.encode(format!(
        "{}:{}",
        decode(user),
        decode(password)
    ));
    let mut auth = HeaderValue::from_str(&format!("Basic {token}")).ok();
    if let Some(a) = auth.as_mut() {
        a.set_sensitive(true);
    }
    (bare, auth)
}

/// `%XX` escapes decoded (a password in a URL may hold them); invalid ones kept as they are.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The TCP connector, tunnelling through the proxy [`Proxying`] picks for each destination.
#[derive(Clone)]
struct ApiConnector {
    tcp: HttpConnector,
    proxy: Proxying,
}

type Connecting =
    Pin<Box<dyn Future<Output = Result<TokioIo<tokio::net::TcpStream>, BoxError>> + Send>>;

impl Service<Uri> for ApiConnector {
    type Response = TokioIo<tokio::net::TcpStream>;
    type Error = BoxError;
    type Future = Connecting;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, dst: Uri) -> Connecting {
        let tcp = self.tcp.clone();
        match self.proxy.target(&dst) {
            Some((proxy, auth)) => {
                let mut tunnel = Tunnel::new(proxy, tcp);
                if let Some(a) = auth {
                    tunnel = tunnel.with_auth(a);
                }
                Box::pin(async move { tunnel.oneshot(dst).await.map_err(BoxError::from) })
            }
            None => Box::pin(async move { tcp.oneshot(dst).await.map_err(BoxError::from) }),
        }
    }
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
        .wrap_connector(ApiConnector {
            tcp: tcp(&config),
            proxy: Proxying::of(&config)?,
        });
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

    #[test]
    fn the_environments_proxy_is_used_except_for_no_proxy_hosts() {
        let env = Proxying::Env(Arc::new(
            Matcher::builder()
                .https("http://proxy.example:3128")
                .no("127.0.0.1,.cluster.local")
                .build(),
        ));
        let via = |dst: &str| {
            env.target(&dst.parse().unwrap())
                .map(|(u, _)| u.to_string())
        };
        assert_eq!(
            via("https://api.example:6443").as_deref(),
            Some("http://proxy.example:3128/")
        );
        assert_eq!(via("https://127.0.0.1:6443"), None);
        assert_eq!(via("https://kubernetes.default.svc.cluster.local"), None);
        let none = Proxying::Env(Arc::new(Matcher::builder().build()));
        assert!(
            none.target(&"https://api.example".parse().unwrap())
                .is_none()
        );
    }

    #[test]
    fn a_proxy_urls_login_becomes_its_authorization_and_leaves_the_url() {
        let url: Uri = "http://agent:p%40ss@proxy.example:3128".parse().unwrap();
        let (bare, auth) = without_userinfo(&url);
        assert_eq!(bare.to_string(), "http://proxy.example:3128/");
        let auth = auth.unwrap();
        assert!(auth.is_sensitive());
        // base64("agent:p@ss")
        assert_eq!(auth.to_str().unwrap(), "Basic YWdlbnQ6cEBzcw==");
        let (same, none) = without_userinfo(&"http://proxy:3128".parse().unwrap());
        assert_eq!(
            (same.to_string(), none),
            ("http://proxy:3128/".to_string(), None)
        );
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }

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
