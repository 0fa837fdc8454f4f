//! The pure core of hook calls: what a call's outcome means under its failure policy, and the
//! deferral state machine of `BeforeNodeRestart` (Proceed / Defer / Fail / GiveUpSlot).

use std::time::Duration;

use super::wire::Answer;
use crate::api::extension::FailurePolicy;

/// How one call ended, before its failure policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A well-formed response.
    Answered(Answer),
    /// No well-formed response: timeout, connection or TLS error, HTTP status, malformed body.
    Error(String),
}

/// One call's outcome after its failure policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Proceed,
    /// An error ignored by `failurePolicy: Ignore`: proceed, and say so in a Warning Event.
    ProceedIgnoring(String),
    Defer(Duration, String),
    Fail(String),
}

impl Verdict {
    /// The result label of the call's Event and metric.
    pub fn result(&self) -> &'static str {
        match self {
            Verdict::Proceed => "Success",
            Verdict::ProceedIgnoring(_) => "Ignored",
            Verdict::Defer(..) => "Deferred",
            Verdict::Fail(_) => "Failure",
        }
    }

    /// What follows the result in the call's Event note (`: <message>`, or empty).
    pub fn detail(&self) -> String {
        match self {
            Verdict::Proceed => String::new(),
            Verdict::ProceedIgnoring(m) | Verdict::Fail(m) => format!(": {m}"),
            Verdict::Defer(d, m) => format!(": retry after {} s {m}", d.as_secs()),
        }
    }

    /// Warning for a refusal or an ignored error, Normal otherwise.
    pub fn event_type(&self) -> kube::runtime::events::EventType {
        use kube::runtime::events::EventType;
        match self {
            Verdict::Proceed | Verdict::Defer(..) => EventType::Normal,
            Verdict::ProceedIgnoring(_) | Verdict::Fail(_) => EventType::Warning,
        }
    }
}

/// `outcome` of the extension `ext` under `policy`.
pub fn apply_policy(ext: &str, policy: FailurePolicy, outcome: Outcome) -> Verdict {
    match outcome {
        Outcome::Answered(Answer::Success) => Verdict::Proceed,
        Outcome::Answered(Answer::Defer(d, m)) => Verdict::Defer(d, m),
        Outcome::Answered(Answer::Failure(m)) => {
            Verdict::Fail(format!("extension {ext} refused: {m}"))
        }
        Outcome::Error(e) => match policy {
            FailurePolicy::Ignore => {
                Verdict::ProceedIgnoring(format!("extension {ext} failed (ignored): {e}"))
            }
            FailurePolicy::Fail => Verdict::Fail(format!("extension {ext} failed: {e}")),
        },
    }
}

/// What the node does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Go on to the restart.
    Proceed,
    /// Keep the slot, ask again after this long.
    Defer(Duration),
    /// Fail this node's change with this message (the slot is kept, as for any failure).
    Fail(String),
    /// Deferred past the maximum: release the slot, wait this long, then wait for a slot again.
    GiveUpSlot(Duration),
}

/// The deferrals of one slot tenure.
#[derive(Clone, Debug)]
pub struct Deferrals {
    max: Duration,
    /// Time deferred so far while holding this slot.
    deferred: Duration,
}

impl Deferrals {
    pub fn new(max: Duration) -> Deferrals {
        Deferrals {
            max,
            deferred: Duration::ZERO,
        }
    }

    /// The next step after one round of calls: any failure fails; otherwise the longest
    /// deferral defers, unless the total deferral with it would pass the maximum, which gives
    /// the slot up; otherwise proceed.
    pub fn step(&mut self, verdicts: &[Verdict]) -> Step {
        if let Some(Verdict::Fail(m)) = verdicts.iter().find(|v| matches!(v, Verdict::Fail(_))) {
            return Step::Fail(m.clone());
        }
        let longest = verdicts
            .iter()
            .filter_map(|v| match v {
                Verdict::Defer(d, _) => Some(*d),
                _ => None,
            })
            .max();
        match longest {
            None => Step::Proceed,
            Some(d) if self.deferred + d > self.max => {
                self.deferred = Duration::ZERO;
                Step::GiveUpSlot(d)
            }
            Some(d) => {
                self.deferred += d;
                Step::Defer(d)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn policy_decides_only_about_errors() {
        use FailurePolicy::*;
        let err = || Outcome::Error("timed out after 1 s".into());
        assert!(matches!(
            apply_policy("x", Ignore, err()),
            Verdict::ProceedIgnoring(m) if m.contains("timed out")
        ));
        assert!(
            matches!(apply_policy("x", Fail, err()), Verdict::Fail(m) if m.contains("x failed"))
        );
        // an extension's own Failure fails under either policy
        let refused = || Outcome::Answered(Answer::Failure("maintenance".into()));
        for p in [Ignore, Fail] {
            assert!(
                matches!(apply_policy("x", p, refused()), Verdict::Fail(m) if m.contains("maintenance"))
            );
        }
        assert_eq!(
            apply_policy("x", Fail, Outcome::Answered(Answer::Success)),
            Verdict::Proceed
        );
    }

    #[test]
    fn deferrals_add_up_to_the_maximum_then_give_the_slot_up() {
        let mut d = Deferrals::new(s(10));
        let defer = |n| Verdict::Defer(s(n), String::new());
        assert_eq!(d.step(&[defer(4)]), Step::Defer(s(4)));
        assert_eq!(d.step(&[defer(6)]), Step::Defer(s(6)));
        assert_eq!(d.step(&[defer(1)]), Step::GiveUpSlot(s(1)));
        // a new tenure starts from zero
        assert_eq!(d.step(&[defer(10)]), Step::Defer(s(10)));
        assert_eq!(d.step(&[Verdict::Proceed]), Step::Proceed);
    }

    #[test]
    fn failure_wins_then_the_longest_deferral() {
        let mut d = Deferrals::new(s(100));
        let v = [
            Verdict::Defer(s(3), String::new()),
            Verdict::Fail("no".into()),
            Verdict::Proceed,
        ];
        assert_eq!(d.step(&v), Step::Fail("no".into()));
        let v = [
            Verdict::Defer(s(3), String::new()),
            Verdict::ProceedIgnoring("e".into()),
            Verdict::Defer(s(5), String::new()),
        ];
        assert_eq!(d.step(&v), Step::Defer(s(5)));
        assert_eq!(
            d.step(&[Verdict::ProceedIgnoring("e".into())]),
            Step::Proceed
        );
        assert_eq!(d.step(&[]), Step::Proceed);
    }

    #[test]
    fn a_zero_maximum_gives_up_at_the_first_deferral() {
        let mut d = Deferrals::new(Duration::ZERO);
        assert_eq!(
            d.step(&[Verdict::Defer(s(1), String::new())]),
            Step::GiveUpSlot(s(1))
        );
    }
}
