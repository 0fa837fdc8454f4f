//! A ShimExtension for tests: HTTPS on loopback (hyper http1 over tokio-rustls) with a
//! certificate from a test CA (`support::tls`, the `openssl` CLI), scripted answers, and a log
//! of every request. A request of another `apiVersion` is refused with 400, as a real
//! extension that serves only v1alpha1 would.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};

pub const API_VERSION: &str = "hooks.containerd.x-k8s.io/v1alpha1";
/// The name a `service` reference makes the agent verify.
pub const SERVICE_HOST: &str = "hooks.shim-hooks-test.svc";

/// One request the server saw.
#[derive(Debug, Clone)]
pub struct Call {
    pub at: Instant,
    pub kind: String,
    pub node: String,
    pub body: Value,
}

/// What to answer: after `delay`, HTTP `status` with `body`.
pub struct Reply {
    pub delay: Duration,
    pub status: u16,
    pub body: Value,
}

/// The script: the request and how many earlier requests of its kind came from its node.
pub type Script = Arc<dyn Fn(&Call, usize) -> Reply + Send + Sync>;

pub fn success(kind: &str) -> Reply {
    answer(kind, json!({"status": "Success"}))
}

pub fn defer(kind: &str, secs: i64) -> Reply {
    answer(
        kind,
        json!({"status": "Success", "retryAfterSeconds": secs, "message": "not now"}),
    )
}

pub fn failure(kind: &str, msg: &str) -> Reply {
    answer(kind, json!({"status": "Failure", "message": msg}))
}

/// `fields` as the response to a `kind` request.
pub fn answer(kind: &str, fields: Value) -> Reply {
    let mut body = json!({"apiVersion": API_VERSION, "kind": kind.replace("Request", "Response")});
    if let (Some(b), Some(f)) = (body.as_object_mut(), fields.as_object()) {
        b.extend(f.clone());
    }
    Reply {
        delay: Duration::ZERO,
        status: 200,
        body,
    }
}

pub struct HookServer {
    pub addr: SocketAddr,
    pub ca_pem: String,
    pub calls: Arc<Mutex<Vec<Call>>>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Drop for HookServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HookServer {
    pub fn url(&self) -> String {
        format!("https://{}/hook", self.addr)
    }

    /// The test CA as a ShimExtension's `caBundle`: its PEM as bytes (base64), a JSON string
    /// that fits a YAML flow mapping.
    pub fn ca_bundle(&self) -> String {
        serde_json::to_string(&k8s_openapi::ByteString(self.ca_pem.clone().into_bytes())).unwrap()
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// The requests of `kind` from `node`.
    pub fn of(&self, kind: &str, node: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.kind == kind && c.node == node)
            .collect()
    }

    /// Serve `script` on a free loopback port.
    pub async fn start(script: Script) -> HookServer {
        Self::start_at(std::net::Ipv4Addr::LOCALHOST.into(), script).await
    }

    /// Serve `script` on a free port of `ip`.
    pub async fn start_at(ip: std::net::IpAddr, script: Script) -> HookServer {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        super::tls::make_certs(dir.path(), SERVICE_HOST);
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(dir.path().join("server.pem"))
                .unwrap()
                .map(Result::unwrap)
                .collect();
        let key = PrivateKeyDer::from_pem_file(dir.path().join("server.key")).unwrap();
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
        let log = calls.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let log = log.clone();
                let script = script.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let log = log.clone();
                        let script = script.clone();
                        async move {
                            let body = req.into_body().collect().await?.to_bytes();
                            let (status, out) = handle(&body, &log, &script).await;
                            let resp = hyper::Response::builder()
                                .status(status)
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(out.to_string())))
                                .unwrap();
                            Ok::<_, hyper::Error>(resp)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        let ca_pem = std::fs::read_to_string(dir.path().join("ca.pem")).unwrap();
        HookServer {
            addr,
            ca_pem,
            calls,
            task,
            _dir: dir,
        }
    }
}

async fn handle(body: &[u8], log: &Mutex<Vec<Call>>, script: &Script) -> (u16, Value) {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return (400, json!({"error": "not JSON"}));
    };
    if v["apiVersion"] != API_VERSION {
        return (
            400,
            json!({"error": format!("unsupported apiVersion {}; this extension serves {API_VERSION}", v["apiVersion"])}),
        );
    }
    let call = Call {
        at: Instant::now(),
        kind: v["kind"].as_str().unwrap_or_default().to_string(),
        node: v["node"].as_str().unwrap_or_default().to_string(),
        body: v.clone(),
    };
    let nth = {
        let mut l = log.lock().unwrap();
        let n = l
            .iter()
            .filter(|c| c.kind == call.kind && c.node == call.node)
            .count();
        l.push(call.clone());
        n
    };
    let reply = script(&call, nth);
    tokio::time::sleep(reply.delay).await;
    (reply.status, reply.body)
}
