//! The agent's fetch settings applied to this module: a [`Fetcher`] with the configured
//! limits and retries, and a Shim's `fetchStrategy` as the plain [`FetchSpec`] it reads.

use anyhow::Context;

use super::{ArtifactSource, FetchSpec, Fetcher, Limits, OciAuth, OciSource, Platform};
use super::{ContainerdVersion, PlatformSource, ResolvedSource, RetryPolicy};
use crate::api::{FetchType, Shim};
use crate::settings::FetchSettings;

/// A fetcher configured from the settings.
pub fn fetcher(f: &FetchSettings, platform: Platform, progress: bool) -> anyhow::Result<Fetcher> {
    let limits = Limits {
        max_download_bytes: f.max_download_bytes,
        max_unpacked_bytes: f.max_unpacked_bytes,
        max_file_bytes: f.max_unpacked_bytes,
        max_entries: f.max_entries,
        connect_timeout: std::time::Duration::from_secs(f.connect_timeout_secs),
        read_timeout: std::time::Duration::from_secs(f.read_timeout_secs),
        ..Limits::default()
    };
    let retry = RetryPolicy {
        max_attempts: f.attempts,
        ..RetryPolicy::default()
    };
    let fetcher = Fetcher::new(limits, retry)?
        .allow_unverified(f.allow_unverified)
        .for_platform(platform)
        .with_progress(progress);
    let providers =
        (!f.credential_provider_config.is_empty()).then(|| super::credential_exec::ProviderSetup {
            config: f.credential_provider_config.clone().into(),
            bin_dir: f.credential_provider_bin_dir.clone().into(),
            timeout: std::time::Duration::from_secs(f.credential_provider_timeout_secs),
        });
    let docker_config = (!f.registry_config.is_empty()).then(|| f.registry_config.clone().into());
    let http_credentials =
        (!f.http_credentials_file.is_empty()).then(|| f.http_credentials_file.clone().into());
    let fetcher = fetcher
        .with_node_credentials(providers, docker_config)
        .with_http_credentials(http_credentials);
    Ok(match f.ca_file.as_str() {
        "" => fetcher,
        path => fetcher.with_ca_pem(
            std::fs::read(path).with_context(|| format!("cannot read fetch.ca-file {path}"))?,
        ),
    })
}

/// The Shim's fetchStrategy as this module's plain input; the registry token comes from
/// `fetch.registry-token-file`.
pub fn fetch_spec(shim: &Shim, f: &FetchSettings) -> anyhow::Result<FetchSpec> {
    let fs = &shim.spec.fetch_strategy;
    let token = match f.registry_token_file.as_str() {
        "" => None,
        path => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read fetch.registry-token-file {path}"))?
                .trim()
                .to_string(),
        ),
    };
    Ok(FetchSpec {
        strategy: match fs.type_ {
            FetchType::AnonymousHttp => "anonymousHttp".into(),
            FetchType::Oci => "oci".into(),
        },
        anon_http: fs.anon_http.as_ref().and_then(|a| {
            a.location.as_ref().map(|l| ArtifactSource {
                location: l.clone(),
                sha256: a.sha256.clone(),
            })
        }),
        platforms: fs
            .platforms
            .iter()
            .flatten()
            .map(|p| PlatformSource {
                os: p.os.clone(),
                arch: p.arch.clone(),
                source: ArtifactSource {
                    location: p.location.clone(),
                    sha256: p.sha256.clone(),
                },
                containerd: p.containerd.clone(),
            })
            .collect(),
        oci: fs.oci.as_ref().map(|o| OciSource {
            reference: o.reference.clone(),
            auth: token.map(OciAuth::Bearer).unwrap_or_default(),
            layer: o.layer.clone(),
            insecure_http: false,
        }),
    })
}

/// Where a node fetches `spec` from, as recorded in its state: the source
/// [`FetchSpec::resolve`] chooses for `platform` and `containerd` (the build the node took,
/// not the first `platforms` entry). A spec that does not resolve (never the case once its
/// fetch has succeeded) records its first location.
pub fn spec_location(
    spec: &FetchSpec,
    platform: &Platform,
    containerd: Option<&ContainerdVersion>,
) -> String {
    match spec.resolve(platform, containerd) {
        Ok(ResolvedSource::Http(a)) => return a.location,
        Ok(ResolvedSource::Oci(o)) => return o.reference,
        Err(_) => {}
    }
    if let Some(o) = &spec.oci {
        return o.reference.clone();
    }
    match (&spec.anon_http, spec.platforms.first()) {
        (Some(a), _) => a.location.clone(),
        (None, Some(p)) => p.source.location.clone(),
        (None, None) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_location_is_the_build_the_node_took() {
        let build = |arch: &str, range: &str, loc: &str| PlatformSource {
            os: "linux".into(),
            arch: arch.into(),
            source: ArtifactSource {
                location: loc.into(),
                sha256: Some("a".repeat(64)),
            },
            containerd: Some(range.into()),
        };
        let spec = FetchSpec {
            strategy: "anonymousHttp".into(),
            platforms: vec![
                build("arm64", "<2.3", "http://x/arm64-old"),
                build("amd64", "<2.3", "http://x/amd64-old"),
                build("amd64", ">=2.3", "http://x/amd64-new"),
            ],
            ..Default::default()
        };
        let amd64 = Platform::new("linux", "amd64");
        let v = |s: &str| ContainerdVersion::parse(s).ok();
        let at = |c: Option<ContainerdVersion>| spec_location(&spec, &amd64, c.as_ref());
        assert_eq!(at(v("v2.3.4")), "http://x/amd64-new");
        assert_eq!(at(v("1.7.2")), "http://x/amd64-old");
        // no build fits: the first location, as before
        assert_eq!(at(None), "http://x/arm64-old");
    }
}
