//! The merged settings checked once more as a whole: known profiles, no zero timeouts or
//! limits, the coordinator's timings in order, absolute paths.

use super::sections::{FetchSettings, Settings};

impl Settings {
    pub(super) fn validate(&self) -> Result<(), String> {
        const PROFILES: &[&str] = &[
            "auto",
            "containerd",
            "k3s",
            "k3s-agent",
            "rke2-agent",
            "rke2-server",
            "k0s",
            "microk8s",
        ];
        if !PROFILES.contains(&self.containerd.profile.as_str()) {
            return Err(format!(
                "containerd.profile = {:?} is not known; use one of {}",
                self.containerd.profile,
                PROFILES.join(", ")
            ));
        }
        for (name, v) in [
            (
                "containerd.restart-timeout-secs",
                self.containerd.restart_timeout_secs,
            ),
            (
                "containerd.verify-timeout-secs",
                self.containerd.verify_timeout_secs,
            ),
            (
                "fetch.connect-timeout-secs",
                self.fetch.connect_timeout_secs,
            ),
            ("fetch.read-timeout-secs", self.fetch.read_timeout_secs),
            ("fetch.max-download-bytes", self.fetch.max_download_bytes),
            ("fetch.max-unpacked-bytes", self.fetch.max_unpacked_bytes),
            ("fetch.max-entries", self.fetch.max_entries),
            ("fetch.attempts", u64::from(self.fetch.attempts)),
            (
                "check.sandbox-timeout-secs",
                self.check.sandbox_timeout_secs,
            ),
            (
                "check.version-timeout-secs",
                self.check.version_timeout_secs,
            ),
            (
                "kubernetes.lease-duration-secs",
                self.kubernetes.lease_duration_secs,
            ),
            (
                "kubernetes.renew-deadline-secs",
                self.kubernetes.renew_deadline_secs,
            ),
            (
                "kubernetes.retry-period-secs",
                self.kubernetes.retry_period_secs,
            ),
        ] {
            if v == 0 {
                return Err(format!("{name} must be greater than 0"));
            }
        }
        let k = &self.kubernetes;
        if !(k.retry_period_secs < k.renew_deadline_secs
            && k.renew_deadline_secs < k.lease_duration_secs)
        {
            return Err(format!(
                "kubernetes: retry-period-secs ({}) < renew-deadline-secs ({}) < lease-duration-secs ({}) must hold, or a coordinator could lose its lease while it still acts",
                k.retry_period_secs, k.renew_deadline_secs, k.lease_duration_secs
            ));
        }
        self.fetch.validate_credentials()?;
        self.signatures.validate()?;
        self.validate_paths()
    }

    fn validate_paths(&self) -> Result<(), String> {
        for (name, p) in [
            ("paths.state-dir", &self.paths.state_dir),
            ("paths.static-shims-dir", &self.paths.static_shims_dir),
        ] {
            if !p.starts_with('/') {
                return Err(format!("{name} = {p:?} must be an absolute path"));
            }
        }
        Ok(())
    }
}

impl FetchSettings {
    fn validate_credentials(&self) -> Result<(), String> {
        if self.credential_provider_timeout_secs == 0 {
            return Err("fetch.credential-provider-timeout-secs must be greater than 0".into());
        }
        if self.credential_provider_config.is_empty() != self.credential_provider_bin_dir.is_empty()
        {
            return Err(
                "fetch: credential-provider-config and credential-provider-bin-dir go together (the kubelet's --image-credential-provider-config and --image-credential-provider-bin-dir)"
                    .into(),
            );
        }
        Ok(())
    }
}
