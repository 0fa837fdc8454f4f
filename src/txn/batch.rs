//! Several config changes as one: every handler of a batch is planned on one evolving view of
//! the files, and the plans are merged so each file is written once.

use crate::containerd::{ConfigFile, ConfigSet, FileChange, Plan};

/// Reflect a plan's results in the in-memory view of the files.
pub(super) fn update_set(set: &mut ConfigSet, plan: &Plan) {
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

/// Several plans as one: per file the first `before` and the last `after`, in the order
/// files first appear (which keeps "drop-in before its import, import before its removal").
pub(super) fn combine(plans: Vec<Plan>) -> Plan {
    let mut out: Vec<FileChange> = Vec::new();
    for p in plans {
        for c in p.changes {
            match out.iter_mut().find(|x| x.host_path == c.host_path) {
                Some(x) => x.after = c.after,
                None => out.push(c),
            }
        }
    }
    out.retain(|c| c.before != c.after);
    Plan { changes: out }
}
