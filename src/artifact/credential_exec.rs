//! Running the kubelet's credential-provider plugins (the I/O half of
//! [`super::credentials`]): the plugin named by the matching provider, from the plugin
//! directory, with its args and env beside the agent's environment, the request on its
//! standard input, bounded in time; its answers cached by the plugin's own rule
//! (`cacheKeyType`, `cacheDuration`) for the life of the process. Its output is never logged
//! or echoed: it holds secrets.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::credentials::{self, Provider, Secret};

/// How long a plugin may take, unless the setup says otherwise.
pub const PLUGIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the kubelet's credential providers are, as the agent's config names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderSetup {
    /// The `CredentialProviderConfig` file.
    pub config: PathBuf,
    /// The directory of the plugin binaries.
    pub bin_dir: PathBuf,
    /// How long a plugin may take.
    pub timeout: Duration,
}

/// (provider, what the answer is for: an image, a registry, or everything).
type CacheKey = (String, String);
/// An answer and until when it may be reused.
type Cached = (Instant, Option<Secret>);
static CACHE: Mutex<Option<HashMap<CacheKey, Cached>>> = Mutex::new(None);

fn cache_key(provider: &str, kind: &str, image: &str) -> CacheKey {
    let registry = image.split('/').next().unwrap_or(image);
    let key = match kind {
        "Registry" => registry.to_string(),
        "Global" => String::new(),
        _ => image.to_string(),
    };
    (provider.to_string(), key)
}

fn cached(provider: &str, image: &str) -> Option<Option<Secret>> {
    let guard = CACHE.lock().ok()?;
    let map = guard.as_ref()?;
    ["Image", "Registry", "Global"].iter().find_map(|kind| {
        map.get(&cache_key(provider, kind, image))
            .filter(|(until, _)| *until > Instant::now())
            .map(|(_, s)| s.clone())
    })
}

/// Credentials for `image` (`host[:port]/repository`) from the provider that matches it:
/// `Ok(None)` when none matches or it has none. `Err`: why the plugin failed (its name and
/// what went wrong, never what it printed on its standard output).
pub async fn credentials_for(setup: &ProviderSetup, image: &str) -> Result<Option<Secret>, String> {
    let text = std::fs::read_to_string(&setup.config)
        .map_err(|e| format!("credential provider config {}: {e}", setup.config.display()))?;
    let providers = credentials::parse_provider_config(&text)
        .map_err(|e| format!("credential provider config {}: {e}", setup.config.display()))?;
    let Some(p) = credentials::provider_for(&providers, image) else {
        return Ok(None);
    };
    if let Some(hit) = cached(&p.name, image) {
        return Ok(hit);
    }
    let out = run(p, setup, image).await?;
    let answer =
        credentials::parse_provider_response(&out, image, p.default_cache_duration.as_deref())
            .map_err(|e| format!("credential provider {}: {e}", p.name))?;
    if !answer.cache_for.is_zero()
        && let Ok(mut guard) = CACHE.lock()
    {
        guard.get_or_insert_with(HashMap::new).insert(
            cache_key(&p.name, &answer.cache_key_type, image),
            (Instant::now() + answer.cache_for, answer.secret.clone()),
        );
    }
    Ok(answer.secret)
}

async fn run(p: &Provider, setup: &ProviderSetup, image: &str) -> Result<Vec<u8>, String> {
    use tokio::io::AsyncWriteExt;
    let bin = setup.bin_dir.join(&p.name);
    let mut child = tokio::process::Command::new(&bin)
        .args(&p.args)
        .envs(p.env.iter().map(|e| (&e.name, &e.value)))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            format!(
                "credential provider {}: cannot run {}: {e}",
                p.name,
                bin.display()
            )
        })?;
    let request = credentials::provider_request(image);
    if let Some(mut stdin) = child.stdin.take() {
        // a plugin that exits without reading is judged by its exit status below
        let _ = stdin.write_all(request.as_bytes()).await;
    }
    let out = tokio::time::timeout(setup.timeout, child.wait_with_output())
        .await
        .map_err(|_| {
            format!(
                "credential provider {}: no answer in {:?}",
                p.name, setup.timeout
            )
        })?
        .map_err(|e| format!("credential provider {}: {e}", p.name))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "credential provider {} failed ({}): {}",
            p.name,
            out.status,
            crate::text::clip(stderr.trim(), 256)
        ));
    }
    Ok(out.stdout)
}
