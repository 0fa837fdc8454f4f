//! `BeforeRollout`'s pure part: where a Shim generation's rollout stands with its
//! extensions ([`Hold`]), what its status already records ([`persisted`]), how the answers of
//! several extensions make one hold ([`fold`]), and the request they are asked with
//! ([`request`]). The task shell that asks them is [`super::rollout`].

use std::time::Duration;

use kube::ResourceExt;
use tokio::time::Instant;

use super::decide::Verdict;
use super::wire::{ChangeKind, Request, ShimChange};
use crate::api::Shim;
use crate::api::extension::HookName;
use crate::api::names::{condition, reason};

/// How long a generation may stay [`Hold::Asking`] before it is asked again (a lost task):
/// the wait for the extensions' cache and one call, each at most 30 s, and some slack.
pub const ASK_LIMIT: Duration = Duration::from_secs(90);

/// Where a Shim generation's rollout stands with its extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Slots may open.
    Go,
    /// The extensions are being asked (since then): held. Asked again after a deferral, the
    /// deferral's message is kept, and the rollout is shown deferred until they answer; asked
    /// first, there is no condition of its own.
    Asking(Instant, Option<String>),
    /// Ask again at this time.
    Deferred(Instant, String),
    /// Halted with the extension's message.
    Refused(String),
}

impl Hold {
    /// When the coordinator should look at the Shim again for this hold.
    pub fn due(&self) -> Option<Instant> {
        match self {
            Hold::Deferred(until, _) => Some(*until),
            Hold::Asking(since, _) => Some(*since + ASK_LIMIT),
            _ => None,
        }
    }
}

/// The answer `shim`'s status records for its current generation: approved (`Go`), or refused
/// with the message of its `RolloutHalted` condition. A coordinator trusts it, so a failover
/// neither asks again for an approved generation nor lets a refused one through.
pub fn persisted(shim: &Shim) -> Option<Hold> {
    let generation = shim.metadata.generation.unwrap_or_default();
    let status = shim.status.as_ref()?;
    if status.approved_generation == Some(generation) {
        return Some(Hold::Go);
    }
    if status.refused_generation != Some(generation) {
        return None;
    }
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| {
            c.type_ == condition::ROLLOUT_HALTED
                && c.status == "True"
                && c.reason.as_deref() == Some(reason::EXTENSION_REFUSED)
        })
        .map(|c| Hold::Refused(c.message.clone().unwrap_or_default()))
}

/// The hold the verdicts of a generation's extensions make together, at `now`: a refusal wins;
/// deferrals defer until the latest of them; approvals (and ignored errors) go.
pub fn fold(verdicts: impl IntoIterator<Item = Verdict>, now: Instant) -> Hold {
    let mut hold = Hold::Go;
    for v in verdicts {
        hold = match (hold, v) {
            (h @ Hold::Refused(_), _) => h,
            (_, Verdict::Fail(m)) => Hold::Refused(m),
            (Hold::Deferred(u, m), Verdict::Defer(d, m2)) => {
                let u2 = now + d;
                if u2 > u {
                    Hold::Deferred(u2, m2)
                } else {
                    Hold::Deferred(u, m)
                }
            }
            (_, Verdict::Defer(d, m)) => Hold::Deferred(now + d, m),
            (h, _) => h,
        };
    }
    hold
}

/// The BeforeRollout request for `shim`'s generation.
pub fn request(shim: &Shim) -> Request {
    let installed = shim
        .status
        .as_ref()
        .and_then(|s| s.nodes.as_ref())
        .is_some_and(|n| n.installed > 0);
    let change = ShimChange {
        name: shim.name_any(),
        change: if installed {
            ChangeKind::Upgrade
        } else {
            ChangeKind::Install
        },
        old_digest: None,
        new_digest: shim
            .spec
            .fetch_strategy
            .anon_http
            .as_ref()
            .and_then(|a| a.sha256.clone()),
    };
    let mut req = Request::new(HookName::BeforeRollout, None, vec![change]);
    req.generation = Some(shim.metadata.generation.unwrap_or_default());
    req
}
