//! The proxy the agent's environment names for a URL, and whether a failed request was that
//! proxy's refusal. Decided by the error's kind and the environment, never by its text.
//!
//! reqwest sends requests through `HTTPS_PROXY`/`HTTP_PROXY`/`ALL_PROXY` except `NO_PROXY`
//! hosts, with the same matcher used here (hyper-util's), so the proxy named is the one used.

use hyper_util::client::proxy::matcher::Matcher;

use super::ArtifactError;

/// The proxy (`host:port`, never its login) the environment sends `url` through, if any.
pub(crate) fn proxy_for(url: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    let intercept = Matcher::from_env().intercept(&uri)?;
    let proxy = intercept.uri();
    let host = proxy.host()?;
    Some(match proxy.port_u16() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    })
}

/// A failed connection that the proxy refused: a connect error with no I/O error anywhere in
/// its chain (the proxy answered the CONNECT with something else than 200: a refused login,
/// a denied port) for a URL the environment sends through a proxy. An unreachable proxy
/// fails with an I/O error and stays a connection failure.
/// `shown`: what the error names (`url` may carry a signed query).
pub(crate) fn refused_connect(url: &str, shown: &str, e: &reqwest::Error) -> Option<ArtifactError> {
    if !e.is_connect() || has_io_error(e) {
        return None;
    }
    Some(ArtifactError::ProxyRefused {
        url: shown.to_string(),
        proxy: proxy_for(url)?,
        status: String::new(),
    })
}

/// HTTP 407 for a URL the environment sends through a proxy: the proxy wants another login.
pub(crate) fn refused_status(url: &str, shown: &str, status: u16) -> Option<ArtifactError> {
    if status != 407 {
        return None;
    }
    Some(ArtifactError::ProxyRefused {
        url: shown.to_string(),
        proxy: proxy_for(url)?,
        status: " (HTTP 407)".to_string(),
    })
}

fn has_io_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.downcast_ref::<std::io::Error>().is_some() {
            return true;
        }
        cur = err.source();
    }
    false
}
