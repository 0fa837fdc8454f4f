//! Where a node's containerd config is changed, whatever the distro: the files containerd
//! reads (main file and drop-ins), or the template a distro renders them from. One interface
//! for the transaction engine: the handlers defined, a plan to add or remove one, and the
//! view moved on by a plan (several changes of one transaction are planned on one view).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::error::ConfigError;
use super::io::{load_dropins, read_optional};
use super::plan::{AddOptions, ConfigFile, ConfigSet, Plan};
use super::register::{plan_add, plan_adds, plan_remove, plan_removes};
use super::spec::RuntimeSpec;
use super::template::{self, Dropins, TemplateSet};
use crate::hostroot::HostRoot;

/// How a node's containerd config is changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// containerd reads `config` and the drop-ins it imports (plus `dropin_dir`'s).
    Files {
        config: PathBuf,
        dropin_dir: Option<PathBuf>,
    },
    /// `rendered` is written by the distro from a Go template beside it (k3s, rke2); handlers
    /// go to the drop-in directory it imports, else to the template.
    GoTemplate { rendered: PathBuf, base: bool },
    /// Not the agent's to change.
    Unsupported { profile: String, why: String },
}

/// A layout's files as they are now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Current {
    Files(ConfigSet),
    GoTemplate(TemplateSet),
}

impl Layout {
    /// Read the files (nothing is written).
    pub fn load(&self, root: &HostRoot) -> Result<Current, ConfigError> {
        match self {
            Layout::Files { config, dropin_dir } => Ok(Current::Files(super::io::load(
                root,
                config,
                dropin_dir.as_deref(),
            )?)),
            Layout::GoTemplate { rendered, base } => {
                let by = distro_of(rendered);
                let bytes =
                    read_optional(root, rendered)?.ok_or_else(|| ConfigError::NotRendered {
                        path: rendered.clone(),
                        by: by.clone(),
                    })?;
                let rendered = ConfigFile {
                    host_path: rendered.clone(),
                    bytes,
                };
                let version = template::rendered_version(&rendered)?;
                let exists = |p: &Path| root.resolve(p).map(|l| l.exists()).unwrap_or(false);
                let path = template::template_path(&rendered.host_path, version, exists);
                let current = read_optional(root, &path)?;
                let dropins = match template::imported_dropin_dir(&rendered)? {
                    Some(dir) => Some(Dropins {
                        dir_exists: root.resolve(&dir).is_ok_and(|l| l.is_dir()),
                        files: load_dropins(root, &rendered.host_path, &rendered.bytes, None)?,
                        dir,
                    }),
                    None => None,
                };
                Ok(Current::GoTemplate(TemplateSet {
                    rendered,
                    template: (path, current),
                    base: *base,
                    by,
                    dropins,
                }))
            }
            Layout::Unsupported { profile, why } => Err(ConfigError::UnsupportedSystem {
                profile: profile.clone(),
                why: why.clone(),
            }),
        }
    }
}

/// `k3s` or `rke2`, from `/var/lib/rancher/<distro>/…`.
fn distro_of(rendered: &Path) -> String {
    rendered
        .strip_prefix("/var/lib/rancher")
        .ok()
        .and_then(|p| p.iter().next())
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|| "the distribution".into())
}

impl Current {
    /// Handlers containerd serves (or will, once a template is rendered).
    pub fn handlers(&self) -> Result<BTreeSet<String>, ConfigError> {
        match self {
            Current::Files(set) => Ok(super::inspect(set)?
                .handlers
                .into_iter()
                .map(|h| h.name)
                .collect()),
            Current::GoTemplate(t) => t.handlers(),
        }
    }

    /// Plan registering `spec`.
    pub fn plan_add(&self, spec: &RuntimeSpec, opts: &AddOptions) -> Result<Plan, ConfigError> {
        match self {
            Current::Files(set) => plan_add(set, spec, opts),
            Current::GoTemplate(t) => t.plan_add(spec, opts.replace),
        }
    }

    /// Plan registering every spec in order, each on the view the ones before it left.
    /// Files: one parse, and one rendering of each file edited ([`plan_adds`]); should that
    /// fail, the specs are planned again one at a time, so an error names the spec and the
    /// file as [`plan_add`](Self::plan_add) does. Templates: one at a time. The plans are
    /// to be combined; an error carries the index of its spec.
    pub fn plan_adds(
        &self,
        specs: &[(RuntimeSpec, AddOptions)],
    ) -> Result<Vec<Plan>, (usize, ConfigError)> {
        self.plan_each(
            specs,
            |set, specs| plan_adds(set, specs).ok(),
            |view, (spec, opts)| view.plan_add(spec, opts),
        )
    }

    /// Plan unregistering `handler`.
    pub fn plan_remove(&self, handler: &str) -> Result<Plan, ConfigError> {
        match self {
            Current::Files(set) => plan_remove(set, handler),
            Current::GoTemplate(t) => t.plan_remove(handler),
        }
    }

    /// Plan unregistering every handler in order, as [`plan_adds`](Self::plan_adds) plans
    /// registering: one parse for files, one handler at a time for templates and to find
    /// an error again.
    pub fn plan_removes(&self, handlers: &[String]) -> Result<Vec<Plan>, (usize, ConfigError)> {
        self.plan_each(
            handlers,
            |set, handlers| plan_removes(set, handlers).ok(),
            |view, h| view.plan_remove(h),
        )
    }

    /// `items` planned together by `together` on files (one plan), or else (a template, or
    /// an error to find again) one at a time by `one`, each on the view the ones before
    /// left; an error names the item it came from.
    fn plan_each<T>(
        &self,
        items: &[T],
        together: impl FnOnce(&ConfigSet, &[T]) -> Option<Plan>,
        one: impl Fn(&Current, &T) -> Result<Plan, ConfigError>,
    ) -> Result<Vec<Plan>, (usize, ConfigError)> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        if let Current::Files(set) = self
            && let Some(plan) = together(set, items)
        {
            return Ok(vec![plan]);
        }
        let mut view = self.clone();
        let mut plans = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let plan = one(&view, item).map_err(|e| (i, e))?;
            view.update(&plan);
            plans.push(plan);
        }
        Ok(plans)
    }

    /// Reflect a plan's results in this view.
    pub fn update(&mut self, plan: &Plan) {
        match self {
            Current::Files(set) => update_set(set, plan),
            Current::GoTemplate(t) => t.update(plan),
        }
    }
}

/// Reflect a plan's results in the in-memory view of the files.
fn update_set(set: &mut ConfigSet, plan: &Plan) {
    for c in &plan.changes {
        if c.host_path == set.main.host_path {
            if let Some(after) = &c.after {
                set.main.bytes = after.clone();
            }
            continue;
        }
        set.dropins.retain(|d| d.host_path != c.host_path);
        if let Some(after) = &c.after {
            set.dropins.push(ConfigFile {
                host_path: c.host_path.clone(),
                bytes: after.clone(),
            });
        }
    }
}
