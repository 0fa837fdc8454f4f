//! Several config changes as one: the plans of a batch (each made on the view the previous
//! one left) merged so each file is written once.

use crate::containerd::{FileChange, Plan};

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
