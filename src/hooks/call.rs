//! The I/O shell of hook calls: the extensions from a watch cache, one HTTPS client per
//! extension (verifying against its `caBundle`), `service` references resolved through the
//! API, and a call bounded by the hook's timeout.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::core::{Selector, SelectorExt};
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};

use super::decide::{Outcome, Verdict};
use super::record::{StatusRecorder, entry};
use super::wire::{MAX_BODY, Request, clip, parse_response};
use crate::api::Shim;
use crate::api::extension::{ClientConfig, HookName, HookSpec, ServiceRef, ShimExtension};
use crate::text::error_chain;

/// How long a round waits for the first list of ShimExtensions before it refuses a restart
/// (an extension might be there to stop it).
pub const CACHE_WAIT: Duration = Duration::from_secs(30);

/// The cluster's extensions and their HTTPS clients.
pub struct Hooks {
    kube: Client,
    store: Store<ShimExtension>,
    /// Per extension, keyed by name and resourceVersion (a changed caBundle gets a new one).
    http: Mutex<HashMap<String, reqwest::Client>>,
    /// The API server said the ShimExtension kind does not exist (its CRD is not applied).
    crd_missing: std::sync::atomic::AtomicBool,
    /// Writes `status.hooks` beside the calls.
    status: std::sync::Arc<StatusRecorder>,
}

/// One extension that serves one hook.
#[derive(Clone)]
pub struct Target {
    pub ext: std::sync::Arc<ShimExtension>,
    pub spec: HookSpec,
}

impl Target {
    pub fn name(&self) -> String {
        self.ext.name_any()
    }
}

impl Hooks {
    pub fn new(kube: Client, store: Store<ShimExtension>) -> Hooks {
        Hooks {
            status: std::sync::Arc::new(StatusRecorder::new(kube.clone(), store.clone())),
            kube,
            store,
            http: Mutex::new(HashMap::new()),
            crd_missing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether the extensions are known without waiting: the cache synced, or the API server
    /// said the ShimExtension kind does not exist.
    pub fn known(&self) -> bool {
        self.crd_missing.load(std::sync::atomic::Ordering::Relaxed) || self.synced()
    }

    /// Wait (at most [`CACHE_WAIT`]) for the first list of extensions.
    ///
    /// Without the ShimExtension CRD (an agent upgraded before the cluster's manifests) there
    /// can be no extension: that is "no extensions", said once, not a refusal, and not a
    /// wait. Only the API server's own answer decides it (a 404 for the kind); an unreachable
    /// or forbidden list still refuses once the wait is over, since an extension might be
    /// there to stop the restart. Once the CRD is applied, the watch lists it and the cache
    /// is used again.
    ///
    /// A synced cache answers at once with no request. Before it synced (the agent's start,
    /// or no CRD) one list of at most one extension decides: the kind is missing or there is
    /// none, so nothing waits for the cache; otherwise the cache is waited for.
    pub async fn ready(&self) -> Result<(), String> {
        use std::sync::atomic::Ordering;
        if self.synced() {
            self.crd_missing.store(false, Ordering::Relaxed);
            return Ok(());
        }
        // from the API server's watch cache (resourceVersion 0), as every list of the agent:
        // a quorum read costs the server a read from etcd, and a fleet that starts together
        // would make one each
        let probe = Api::<ShimExtension>::all(self.kube.clone())
            .list(&ListParams::default().match_any().limit(1))
            .await;
        match probe {
            Err(kube::Error::Api(s)) if s.code == 404 => {
                if !self.crd_missing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "the ShimExtension CRD is not applied: no lifecycle hooks are called (apply `shim-agent manifests`)"
                    );
                }
                return Ok(());
            }
            // the list works and there is none (the watch is only slow to start)
            Ok(list) if list.items.is_empty() => return Ok(()),
            _ => {}
        }
        match tokio::time::timeout(CACHE_WAIT, self.store.wait_until_ready()).await {
            Ok(Ok(())) => {
                self.crd_missing.store(false, Ordering::Relaxed);
                Ok(())
            }
            _ => Err(format!(
                "the ShimExtensions could not be listed within {} s (is the API server reachable, and may this node list them?)",
                CACHE_WAIT.as_secs()
            )),
        }
    }

    /// The cache has its first list.
    fn synced(&self) -> bool {
        use futures_util::FutureExt;
        self.store
            .wait_until_ready()
            .now_or_never()
            .is_some_and(|r| r.is_ok())
    }

    /// The extensions serving `hook` whose `shimSelector` selects one of `shims` (a Shim not
    /// in the cluster, e.g. a static one, has no labels here: only selector-less extensions
    /// are called for it). From the cache: no request.
    pub fn targets(&self, hook: HookName, shims: &[String], cluster: &[Shim]) -> Vec<Target> {
        let mut out: Vec<Target> = Vec::new();
        for ext in self.store.state() {
            let Some(spec) = ext.spec.hooks.iter().find(|h| h.name == hook) else {
                continue;
            };
            let selects = |labels: &BTreeMap<String, String>| match &ext.spec.shim_selector {
                None => true,
                Some(sel) => Selector::try_from(sel.clone()).is_ok_and(|s| s.matches(labels)),
            };
            let empty = BTreeMap::new();
            let any = shims.iter().any(|n| {
                let labels = cluster
                    .iter()
                    .find(|s| s.name_any() == *n)
                    .map_or(&empty, |s| s.labels());
                selects(labels)
            });
            if any {
                out.push(Target {
                    spec: spec.clone(),
                    ext,
                });
            }
        }
        out.sort_by_key(Target::name);
        out
    }

    /// Record the result `v` of a call of `t` about `req` as its hook's last result in the
    /// extension's `status.hooks`: beside the call, best effort ([`super::record`]).
    pub fn record(&self, t: &Target, req: &Request, v: &Verdict) {
        let shims: Vec<String> = req.shims.iter().map(|c| c.name.clone()).collect();
        let e = entry(t.spec.name, v, req.node.as_deref(), &shims, req.generation);
        self.status.record(&t.name(), e);
    }

    /// Call `t` with `req`, bounded by its timeout: the outcome and how long it took.
    pub async fn call(&self, t: &Target, req: &Request) -> (Outcome, Duration) {
        let started = Instant::now();
        let limit = t.spec.timeout();
        let outcome = match tokio::time::timeout(limit, self.try_call(t, req, limit)).await {
            Ok(Ok(answer)) => Outcome::Answered(answer),
            Ok(Err(e)) => Outcome::Error(e),
            Err(_) => Outcome::Error(format!("timed out after {} s", limit.as_secs())),
        };
        (outcome, started.elapsed())
    }

    async fn try_call(
        &self,
        t: &Target,
        req: &Request,
        limit: Duration,
    ) -> Result<super::wire::Answer, String> {
        let cc = &t.ext.spec.client_config;
        let (url, resolve) = match (&cc.url, &cc.service) {
            (Some(u), _) => (u.clone(), None),
            (None, Some(s)) => self.resolve(s).await?,
            (None, None) => return Err("clientConfig has neither url nor service".into()),
        };
        let http = self.http_for(&t.ext, cc, resolve, limit)?;
        let resp = http
            .post(&url)
            .json(req)
            .send()
            .await
            .map_err(|e| format!("POST {url}: {}", error_chain(&e)))?;
        let status = resp.status();
        let body = read_limited(resp).await?;
        if !status.is_success() {
            return Err(format!(
                "HTTP {status}: {}",
                clip(&String::from_utf8_lossy(&body), 200)
            ));
        }
        parse_response(t.spec.name, &body)
    }

    fn http_for(
        &self,
        ext: &ShimExtension,
        cc: &ClientConfig,
        resolve: Option<(String, SocketAddr)>,
        limit: Duration,
    ) -> Result<reqwest::Client, String> {
        let key = format!(
            "{}/{}/{:?}",
            ext.name_any(),
            ext.resource_version().unwrap_or_default(),
            resolve
        );
        if let Some(c) = self.http.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(c);
        }
        let _ = rustls::crypto::ring::default_provider().install_default();
        // the call's whole time is bounded by its caller (one timeout, one message)
        let mut b = reqwest::Client::builder()
            .connect_timeout(limit)
            .user_agent(concat!("shim-agent/", env!("CARGO_PKG_VERSION")));
        if let Some(pem) = &cc.ca_bundle {
            let certs = reqwest::Certificate::from_pem_bundle(&pem.0)
                .map_err(|e| format!("caBundle: {}", error_chain(&e)))?;
            if certs.is_empty() {
                return Err("caBundle holds no PEM certificate".into());
            }
            b = b.tls_certs_only(certs);
        }
        if let Some((host, addr)) = resolve {
            b = b.resolve(&host, addr);
        }
        let c = b
            .build()
            .map_err(|e| format!("HTTPS client: {}", error_chain(&e)))?;
        if let Ok(mut m) = self.http.lock() {
            // one entry per extension: drop clients of its older versions
            let prefix = format!("{}/", ext.name_any());
            m.retain(|k, _| !k.starts_with(&prefix));
            m.insert(key, c.clone());
        }
        Ok(c)
    }

    /// A Service reference as a URL naming `<name>.<namespace>.svc` (what the certificate
    /// must name), and the address of a ready endpoint from its EndpointSlices.
    async fn resolve(
        &self,
        s: &ServiceRef,
    ) -> Result<(String, Option<(String, SocketAddr)>), String> {
        let port = s.port.unwrap_or(443);
        let svc: Service = Api::namespaced(self.kube.clone(), &s.namespace)
            .get(&s.name)
            .await
            .map_err(|e| format!("Service {}/{}: {e}", s.namespace, s.name))?;
        let sp = svc
            .spec
            .and_then(|sp| sp.ports)
            .unwrap_or_default()
            .into_iter()
            .find(|p| p.port == port)
            .ok_or_else(|| format!("Service {}/{} has no port {port}", s.namespace, s.name))?;
        let slices: Api<EndpointSlice> = Api::namespaced(self.kube.clone(), &s.namespace);
        let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={}", s.name));
        let list = slices
            .list(&lp)
            .await
            .map_err(|e| format!("EndpointSlices of {}/{}: {e}", s.namespace, s.name))?;
        for slice in list.items {
            let Some(ep_port) = slice
                .ports
                .unwrap_or_default()
                .into_iter()
                .find(|p| p.name == sp.name || (sp.name.is_none() && p.name.as_deref() == Some("")))
                .and_then(|p| p.port)
            else {
                continue;
            };
            for ep in slice.endpoints {
                let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
                let Some(ip) = ep.addresses.iter().find_map(|a| a.parse::<IpAddr>().ok()) else {
                    continue;
                };
                if ready && let Ok(p) = u16::try_from(ep_port) {
                    let host = format!("{}.{}.svc", s.name, s.namespace);
                    let path = s.path.clone().unwrap_or_else(|| "/".into());
                    let url = format!("https://{host}:{p}{path}");
                    return Ok((url, Some((host, SocketAddr::new(ip, p)))));
                }
            }
        }
        Err(format!(
            "Service {}/{} has no ready endpoint for port {port}",
            s.namespace, s.name
        ))
    }
}

async fn read_limited(mut resp: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| format!("reading the response: {}", error_chain(&e)))?
    {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(format!("response larger than {MAX_BODY} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
