//! Several config changes as one: the plans of a batch (each made on the view the previous
//! one left) merged so each file is written once.

use crate::containerd::{FileChange, Plan};

/// Several plans as one: per file the first `before` and the last `after`, in the order
/// files first appear (which keeps "drop-in before its import, import before its removal");
/// the directories to remove when empty of all of them (one a later plan writes into is not
/// empty then, and stays).
pub(super) fn combine(plans: Vec<Plan>) -> Plan {
    let mut out: Vec<FileChange> = Vec::new();
    let mut dirs = Vec::new();
    for p in plans {
        for d in p.remove_empty_dirs {
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
        for c in p.changes {
            match out.iter_mut().find(|x| x.host_path == c.host_path) {
                Some(x) => x.after = c.after,
                None => out.push(c),
            }
        }
    }
    out.retain(|c| c.before != c.after);
    Plan {
        changes: out,
        remove_empty_dirs: dirs,
    }
}
