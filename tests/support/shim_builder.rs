//! `Shim` objects for tests, built in code rather than copied from YAML literals (in the style
//! of controller-rs's test fixtures):
//!
//! ```ignore
//! ShimBuilder::new("demo")
//!     .artifact(&url, &sha)
//!     .node_selector("test", "demo")
//!     .handler("demo-handler")
//!     .yaml()
//! ```
//!
//! [`ShimBuilder::yaml`] gives the manifest text, for what takes YAML (the CLI, `kubectl
//! apply`, static Shim files, `parse_shims`); [`ShimBuilder::build`] gives the typed
//! [`Shim`], for what takes the object. Both describe the same Shim. The methods are those the
//! tests need, nothing more; a test about the text itself (odd or malformed YAML) keeps its
//! literal.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use shim_agent::api::{
    AnonHttp, CheckContainer, CheckSpec, CheckSuccess, FetchStrategy, FetchType, PlatformArtifact,
    RollingUpdate, RolloutStrategy, RolloutType, RuntimeClassRef, RuntimeSettings, Shim, ShimSpec,
    TaintEffect, Toleration, TolerationOperator,
};

/// A Shim under construction; see the module's documentation.
#[derive(Clone, Debug)]
#[must_use]
pub struct ShimBuilder {
    shim: Shim,
}

impl ShimBuilder {
    /// A Shim `name` whose RuntimeClass is `name` too, fetched by `anonymousHttp` from
    /// nowhere yet: give it an [`artifact`](Self::artifact) or [`platform`](Self::platform)s.
    pub fn new(name: &str) -> ShimBuilder {
        let spec = ShimSpec {
            node_selector: None,
            fetch_strategy: FetchStrategy {
                type_: FetchType::AnonymousHttp,
                anon_http: None,
                oci: None,
                platforms: None,
            },
            runtime_class: RuntimeClassRef {
                name: name.to_string(),
                ..RuntimeClassRef::default()
            },
            runtime: None,
            rollout_strategy: None,
            check: None,
            signature: None,
        };
        ShimBuilder {
            shim: Shim::new(name, spec),
        }
    }

    /// `metadata.generation`, as the API server would have set it.
    pub fn generation(mut self, generation: i64) -> ShimBuilder {
        self.shim.metadata.generation = Some(generation);
        self
    }

    /// A label of the Shim object itself (`metadata.labels`).
    pub fn label(mut self, key: &str, value: &str) -> ShimBuilder {
        self.shim
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_string(), value.to_string());
        self
    }

    /// One more `spec.nodeSelector` entry (none: the selector is absent).
    pub fn node_selector(mut self, key: &str, value: &str) -> ShimBuilder {
        self.shim
            .spec
            .node_selector
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_string(), value.to_string());
        self
    }

    /// The one artifact for every node: `anonHttp` `location` and `sha256`.
    pub fn artifact(mut self, location: &str, sha256: &str) -> ShimBuilder {
        self.shim.spec.fetch_strategy.anon_http = Some(AnonHttp {
            location: Some(location.to_string()),
            sha256: Some(sha256.to_string()),
        });
        self
    }

    /// The artifact as an OCI reference (`fetchStrategy.type: oci`).
    pub fn oci(mut self, reference: &str) -> ShimBuilder {
        self.shim.spec.fetch_strategy.type_ = shim_agent::api::FetchType::Oci;
        self.shim.spec.fetch_strategy.anon_http = None;
        self.shim.spec.fetch_strategy.oci = Some(shim_agent::api::OciSource {
            reference: reference.to_string(),
            layer: None,
        });
        self
    }

    /// One more entry of `fetchStrategy.platforms` (they are tried in this order).
    pub fn platform(mut self, os: &str, arch: &str, location: &str, sha256: &str) -> ShimBuilder {
        self.shim
            .spec
            .fetch_strategy
            .platforms
            .get_or_insert_with(Vec::new)
            .push(PlatformArtifact {
                os: os.to_string(),
                arch: arch.to_string(),
                location: location.to_string(),
                sha256: Some(sha256.to_string()),
                containerd: None,
            });
        self
    }

    /// One more entry of `fetchStrategy.platforms` for the containerd releases of `range`
    /// (`"<2.0"`, `">=2.3"`).
    pub fn platform_for_containerd(
        mut self,
        os: &str,
        arch: &str,
        range: &str,
        location: &str,
        sha256: &str,
    ) -> ShimBuilder {
        self = self.platform(os, arch, location, sha256);
        if let Some(last) = self
            .shim
            .spec
            .fetch_strategy
            .platforms
            .as_mut()
            .and_then(|p| p.last_mut())
        {
            last.containerd = Some(range.to_string());
        }
        self
    }

    /// `runtimeClass.name`, when it is not the Shim's name.
    pub fn runtime_class(mut self, name: &str) -> ShimBuilder {
        self.shim.spec.runtime_class.name = name.to_string();
        self
    }

    /// `runtimeClass.handler` (absent: the Shim's name).
    pub fn handler(mut self, handler: &str) -> ShimBuilder {
        self.shim.spec.runtime_class.handler = Some(handler.to_string());
        self
    }

    /// `runtimeClass.overhead.podFixed[resource]`: a quantity (`250m`, `160Mi`).
    pub fn overhead(mut self, resource: &str, quantity: &str) -> ShimBuilder {
        let rc = &mut self.shim.spec.runtime_class;
        rc.overhead
            .get_or_insert_with(Default::default)
            .pod_fixed
            .get_or_insert_with(Default::default)
            .insert(resource.into(), IntOrString::String(quantity.into()));
        self
    }

    /// One more `runtimeClass.scheduling.nodeSelector` term.
    pub fn class_node_selector(mut self, key: &str, value: &str) -> ShimBuilder {
        let rc = &mut self.shim.spec.runtime_class;
        rc.scheduling
            .get_or_insert_with(Default::default)
            .node_selector
            .get_or_insert_with(Default::default)
            .insert(key.into(), value.into());
        self
    }

    /// One more `runtimeClass.scheduling.tolerations` entry: `key=value:effect`, operator
    /// Equal.
    pub fn toleration(mut self, key: &str, value: &str, effect: TaintEffect) -> ShimBuilder {
        let rc = &mut self.shim.spec.runtime_class;
        rc.scheduling
            .get_or_insert_with(Default::default)
            .tolerations
            .get_or_insert_with(Default::default)
            .push(Toleration {
                key: Some(key.into()),
                operator: Some(TolerationOperator::Equal),
                value: Some(value.into()),
                effect: Some(effect),
                toleration_seconds: None,
            });
        self
    }

    /// One more `runtimeClass.labels` entry.
    pub fn class_label(mut self, key: &str, value: &str) -> ShimBuilder {
        let rc = &mut self.shim.spec.runtime_class;
        rc.labels
            .get_or_insert_with(Default::default)
            .insert(key.into(), value.into());
        self
    }

    /// One more `runtimeClass.annotations` entry.
    pub fn class_annotation(mut self, key: &str, value: &str) -> ShimBuilder {
        let rc = &mut self.shim.spec.runtime_class;
        rc.annotations
            .get_or_insert_with(Default::default)
            .insert(key.into(), value.into());
        self
    }

    /// `runtime.binary`: the shim's file in the artifact.
    pub fn binary(mut self, binary: &str) -> ShimBuilder {
        self.runtime().binary = Some(binary.to_string());
        self
    }

    /// One more `runtime.options` entry.
    pub fn option(mut self, key: &str, value: impl Into<serde_json::Value>) -> ShimBuilder {
        self.runtime()
            .options
            .get_or_insert_with(serde_json::Map::new)
            .insert(key.to_string(), value.into());
        self
    }

    /// One more `runtime.optionPaths` entry: option `key` names file `path` of the artifact.
    pub fn option_path(mut self, key: &str, path: &str) -> ShimBuilder {
        self.runtime()
            .option_paths
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_string(), path.to_string());
        self
    }

    /// `rolloutStrategy: {type: rolling, rolling: {maxUpdate, maxFailures}}`.
    pub fn rolling(mut self, max_update: IntOrString, max_failures: i32) -> ShimBuilder {
        self.shim.spec.rollout_strategy = Some(RolloutStrategy {
            type_: RolloutType::Rolling,
            rolling: Some(RollingUpdate {
                max_update: Some(max_update),
                max_failures: Some(max_failures),
            }),
        });
        self
    }

    /// `check.container`: `image` run with `command` in a sandbox of the new handler; it must
    /// exit 0 and print `output` (when given) within `timeout_seconds`.
    pub fn check_container(
        mut self,
        image: &str,
        command: &[&str],
        output: Option<&str>,
        timeout_seconds: i32,
    ) -> ShimBuilder {
        self.shim.spec.check = Some(CheckSpec {
            container: Some(CheckContainer {
                image: image.to_string(),
                command: command.iter().map(|c| c.to_string()).collect(),
                args: None,
                success: Some(CheckSuccess {
                    exit_code: Some(0),
                    output_contains: output.map(str::to_string),
                }),
                timeout_seconds: Some(timeout_seconds),
            }),
        });
        self
    }

    /// `signature`: who must have signed the shim and where the material is.
    pub fn signature(mut self, spec: shim_agent::api::signature::SignatureSpec) -> ShimBuilder {
        self.shim.spec.signature = Some(spec);
        self
    }

    /// `rolloutStrategy: {type: recreate}`: every node at once, no slots.
    pub fn recreate(mut self) -> ShimBuilder {
        self.shim.spec.rollout_strategy = Some(RolloutStrategy {
            type_: RolloutType::Recreate,
            rolling: None,
        });
        self
    }

    /// The typed Shim.
    pub fn build(self) -> Shim {
        self.shim
    }

    /// The Shim's manifest (one YAML document, ending in a newline).
    pub fn yaml(&self) -> String {
        serde_yaml::to_string(&self.shim).expect("a Shim serializes to YAML")
    }

    fn runtime(&mut self) -> &mut RuntimeSettings {
        self.shim.spec.runtime.get_or_insert_with(Default::default)
    }
}
