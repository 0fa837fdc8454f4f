//! Registry credentials from the node for `oci` artifacts, against a real registry (Debian's
//! docker-registry, TLS from a private CA, htpasswd): a Docker `config.json`, and a kubelet
//! credential-provider plugin that the test writes (a script speaking
//! `credentialprovider.kubelet.k8s.io/v1`), which comes first and whose answer is cached by its
//! own rule. A refused credential, a failing plugin and a plugin that hangs each give their own
//! reason, naming the host and never the secret.

use std::path::{Path, PathBuf};
use std::time::Duration;

use oci_client::secrets::RegistryAuth;
use shim_agent::artifact::credential_exec::ProviderSetup;
use shim_agent::artifact::{ArtifactError, Fetcher, Limits, RetryPolicy, Store};

use crate::support::registry::{self, Registry, registry_with_login};
use crate::support::{good_shim_tgz, oci_spec, sha256_hex};

const TEST: &str = "artifact_credentials";

fn fetcher(reg: &Registry, providers: Option<ProviderSetup>, docker: Option<PathBuf>) -> Fetcher {
    let limits = Limits {
        read_timeout: Duration::from_secs(5),
        ..Limits::default()
    };
    let retry = RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::default()
    };
    Fetcher::new(limits, retry)
        .unwrap()
        .with_ca_pem(std::fs::read(reg.ca()).unwrap())
        .with_node_credentials(providers, docker)
}

async fn fetch(f: &Fetcher, reference: &str, store: &Path) -> Result<String, ArtifactError> {
    let store = Store::open(store).unwrap();
    f.fetch(&oci_spec(reference), &store)
        .await
        .map(|a| a.digest)
}

fn docker_config(dir: &Path, name: &str, host: &str, password: &str) -> PathBuf {
    let p = dir.join(format!("{name}.json"));
    std::fs::write(
        &p,
        format!(
            "{{\"auths\":{{\"{host}\":{{\"username\":\"{}\",\"password\":\"{password}\"}}}}}}",
            registry::USER
        ),
    )
    .unwrap();
    p
}

/// A provider named `name` matching `host`, whose plugin runs `script` (sh) and counts its
/// calls in `<bin>/<name>.calls`.
fn provider(dir: &Path, name: &str, host: &str, script: &str) -> ProviderSetup {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("plugins");
    std::fs::create_dir_all(&bin).unwrap();
    let plugin = bin.join(name);
    std::fs::write(
        &plugin,
        format!("#!/bin/sh\necho x >> \"$0.calls\"\n{script}\n"),
    )
    .unwrap();
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n- name: {name}\n  matchImages: [\"{host}\"]\n  defaultCacheDuration: 0s\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n"
        ),
    )
    .unwrap();
    ProviderSetup {
        config,
        bin_dir: bin,
        timeout: Duration::from_secs(2),
    }
}

fn calls(setup: &ProviderSetup, name: &str) -> usize {
    std::fs::read_to_string(setup.bin_dir.join(format!("{name}.calls")))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// A plugin's answer: these credentials for `host`, cached by `key` for `duration`.
fn answer(host: &str, password: &str, key: &str, duration: &str) -> String {
    format!(
        "cat >/dev/null\ncat <<'EOF'\n{{\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"kind\":\"CredentialProviderResponse\",\"cacheKeyType\":\"{key}\",\"cacheDuration\":\"{duration}\",\"auth\":{{\"{host}\":{{\"username\":\"{}\",\"password\":\"{password}\"}}}}}}\nEOF",
        registry::USER
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_credentials_open_a_private_registry_and_their_failures_are_told_apart() {
    let Some(reg) = registry_with_login(TEST) else {
        return;
    };
    let login = RegistryAuth::Basic(registry::USER.into(), registry::PASSWORD.into());
    let art = good_shim_tgz();
    let manifest = reg.push_as("shims/private", "v1", &art, &login).await;
    let reference = format!("{}/shims/private@{manifest}", reg.host());
    let d = tempfile::tempdir().unwrap();
    let store = |n: &str| d.path().join(n);
    let host = reg.host();
    let no_secret = |e: &ArtifactError| {
        let said = format!("{e} {e:?}");
        assert!(
            !said.contains(registry::PASSWORD) && !said.contains("wr0ng"),
            "a secret in: {said}"
        );
    };

    // anonymous: the registry refuses
    let e = fetch(&fetcher(&reg, None, None), &reference, &store("s0"))
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "OciPullFailed", "{e}");

    // a config.json with the login
    let good = docker_config(d.path(), "good", &host, registry::PASSWORD);
    assert_eq!(
        fetch(
            &fetcher(&reg, None, Some(good.clone())),
            &reference,
            &store("s1")
        )
        .await
        .unwrap(),
        sha256_hex(&art)
    );

    // a config.json with a wrong password: refused, said so, without it
    let bad = docker_config(d.path(), "bad", &host, "wr0ng");
    let e = fetch(
        &fetcher(&reg, None, Some(bad.clone())),
        &reference,
        &store("s2"),
    )
    .await
    .unwrap_err();
    assert_eq!(e.reason(), "RegistryCredentialsRefused", "{e}");
    assert!(
        e.to_string().starts_with(&format!(
            "https://{host} refused the credentials from {}",
            bad.display()
        )),
        "{e}"
    );
    no_secret(&e);

    // a provider comes before config.json, and its answer is reused for its duration
    let p = provider(
        d.path(),
        "good-plugin",
        &host,
        &answer(&host, registry::PASSWORD, "Registry", "1h"),
    );
    let f = fetcher(&reg, Some(p.clone()), Some(bad.clone()));
    assert_eq!(
        fetch(&f, &reference, &store("s3")).await.unwrap(),
        sha256_hex(&art)
    );
    assert_eq!(
        fetch(&f, &reference, &store("s4")).await.unwrap(),
        sha256_hex(&art)
    );
    assert_eq!(
        calls(&p, "good-plugin"),
        1,
        "the cached answer was not reused"
    );

    // a provider whose credentials are refused
    let p = provider(
        d.path(),
        "stale-plugin",
        &host,
        &answer(&host, "wr0ng", "Image", "0s"),
    );
    let e = fetch(
        &fetcher(&reg, Some(p.clone()), None),
        &reference,
        &store("s5"),
    )
    .await
    .unwrap_err();
    assert_eq!(e.reason(), "RegistryCredentialsRefused", "{e}");
    assert!(e.to_string().contains("the credential providers of"), "{e}");
    no_secret(&e);

    // a provider that fails, and one that hangs
    let p = provider(
        d.path(),
        "failing-plugin",
        &host,
        "echo 'no token for this node' >&2\nexit 3",
    );
    let e = fetch(&fetcher(&reg, Some(p), None), &reference, &store("s6"))
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "RegistryCredentialsFailed", "{e}");
    assert!(
        e.to_string().contains(
            "credential provider failing-plugin failed (exit status: 3): no token for this node"
        ),
        "{e}"
    );
    let p = provider(d.path(), "hanging-plugin", &host, "sleep 30");
    let t = std::time::Instant::now();
    let e = fetch(&fetcher(&reg, Some(p), None), &reference, &store("s7"))
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "RegistryCredentialsFailed", "{e}");
    assert!(
        e.to_string()
            .contains("credential provider hanging-plugin: no answer in 2s"),
        "{e}"
    );
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());

    // a plugin that prints its secret in a broken answer: the secret stays out of the error
    let p = provider(
        d.path(),
        "leaky-plugin",
        &host,
        &format!("echo 'password={}'", registry::PASSWORD),
    );
    let e = fetch(&fetcher(&reg, Some(p), None), &reference, &store("s8"))
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "RegistryCredentialsFailed", "{e}");
    no_secret(&e);
}
