//! How a round ends, in both run modes, pure: who a failed round blames ([`judge`]), and what
//! the node's memory makes of the round's outcome ([`Memory::conclude`]): success forgets the
//! failures, a blamed Shim backs off, an unnamed batch failure runs each Shim alone, a round
//! that only waited for the API server waits a little. The run mode only reports the verdict.

use std::time::Duration;

use tokio::time::Instant;

use super::memory::{Memory, Wanted};
use crate::txn::{Report, TxnError};

/// How a failed round is judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// The agent stops: nothing was tried, nothing failed.
    Stopping,
    /// The Shims changed while the node waited for its first slot: nothing was tried,
    /// nothing failed; the node plans again at once.
    Replan,
    /// A batch failed without naming its culprit: run each change alone.
    RunAlone(Vec<String>),
    /// Nothing was tried: no rollout slot could be had while the API server was away or
    /// overloaded. These changes wait a little and try again; nobody failed.
    Wait(Vec<String>),
    /// These Shims failed.
    Blame(Vec<String>),
}

/// How a round's transaction ended without its changes, as far as blame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The agent stops.
    Stopping,
    /// The wait for a first slot ended because the Shims changed.
    Superseded,
    /// No slot could be had while the API server was away or overloaded.
    OnlyWaits,
    /// Anything else: a change failed.
    Failed,
}

/// Who a failed round blames: nobody when the agent stops, when the Shims changed under its
/// wait for a slot, or when it only waits for the API server; else the one change, the Shims
/// the error names (`blamed`), or, for a batch that names none, each change alone next.
pub fn judge(work: &[String], blamed: &[String], ended: Ended) -> Judgement {
    match ended {
        Ended::Stopping => return Judgement::Stopping,
        Ended::Superseded => return Judgement::Replan,
        Ended::OnlyWaits => return Judgement::Wait(work.to_vec()),
        Ended::Failed => {}
    }
    let culprit: Vec<String> = match work {
        [one] => vec![one.clone()],
        many => many
            .iter()
            .filter(|n| blamed.contains(n))
            .cloned()
            .collect(),
    };
    if culprit.is_empty() && work.len() > 1 {
        return Judgement::RunAlone(work.to_vec());
    }
    Judgement::Blame(culprit)
}

/// What a round's outcome decided, for the run mode to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The changes ended well (or needed nothing).
    Succeeded,
    /// The agent stops before the transaction: nothing was tried, nothing failed.
    Stopping,
    /// The Shims changed while the node waited for its first slot: the next round comes at
    /// once.
    Replan,
    /// Nothing was tried for want of a rollout slot while the API server was away: these
    /// changes wait `pause`; nobody failed.
    Wait { names: Vec<String>, pause: Duration },
    /// A batch failed without naming its culprit: each change runs alone, from the next round
    /// on, which comes at once.
    RunAlone(Vec<String>),
    /// These Shims failed, each backing off for its pause; the next round comes at once for
    /// the others.
    Failed(Vec<(String, Duration)>),
}

/// What the run mode knows of how the round ended, beside the transaction's outcome.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// The agent is stopping.
    pub stopping: bool,
    /// Spreads the waits of a fleet turned away together: the node's name.
    pub node: &'a str,
    pub now: Instant,
}

impl Memory {
    /// Take in a round's outcome: the transaction of `work` (the Shims it really changes),
    /// the Shims wanted now, and how it ended.
    pub fn conclude(
        &mut self,
        outcome: &Result<Report, TxnError>,
        work: &[String],
        wanted: &Wanted<'_>,
        cx: Context<'_>,
    ) -> Verdict {
        let e = match outcome {
            Ok(report) => {
                let done = report.installed.iter().chain(&report.removed);
                self.succeeded(done.chain(&report.unchanged));
                return Verdict::Succeeded;
            }
            Err(e) => e,
        };
        let ended = if cx.stopping {
            Ended::Stopping
        } else if e.superseded() {
            Ended::Superseded
        } else if e.only_waits() {
            Ended::OnlyWaits
        } else {
            Ended::Failed
        };
        match judge(work, &e.blamed, ended) {
            Judgement::Stopping => Verdict::Stopping,
            Judgement::Replan => {
                self.rerun();
                Verdict::Replan
            }
            Judgement::Wait(names) => {
                let pause = self.wait(&names, cx.node, cx.now);
                Verdict::Wait { names, pause }
            }
            Judgement::RunAlone(each) => {
                self.run_alone(each.clone());
                Verdict::RunAlone(each)
            }
            Judgement::Blame(culprits) => {
                if !culprits.is_empty() {
                    self.rerun(); // the others go on at once; the culprits wait
                }
                let reason = e.reason();
                let failed = culprits
                    .into_iter()
                    .map(|name| {
                        let shim = wanted.get(&name);
                        let pause = self.failed(&name, shim, reason, e.message.clone(), cx.now);
                        (name, pause)
                    })
                    .collect();
                Verdict::Failed(failed)
            }
        }
    }
}
