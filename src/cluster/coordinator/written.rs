//! One write per slot version: the coordinator does not write a slot again until its cache
//! shows the slot moved past the version the last write was made against.
//!
//! Each round plans the slots' writes from the coordinator's cache. A write that landed, or
//! that a 409 refused (someone moved first), changes the slot on the API server, but the cache
//! shows it only once the watch delivers the event; until then each round planned the same
//! write again against the same old version, and met a 409 again. On a loaded API server the
//! watch lags by seconds and rounds run every few tens of milliseconds: 5000 agents saw
//! 134,470 refused slot writes in under five minutes. A write that failed otherwise (a
//! timeout, a 429) may not have happened and is planned again at the next round; a noted
//! write is forgotten after [`WRITTEN_FOR`] whatever the cache shows (a safety net, never the
//! news).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::slot_plan::SlotAction;
use crate::cluster::slots::Slot;

/// How long a write holds back the next one against the same version at most.
pub const WRITTEN_FOR: Duration = Duration::from_secs(30);

/// The version of a slot a planned write is made against; `""` for a create (no slot yet).
fn version_of(action: &SlotAction) -> &str {
    match action {
        SlotAction::Create { .. } => "",
        SlotAction::Delete {
            resource_version, ..
        }
        | SlotAction::Mark {
            resource_version, ..
        }
        | SlotAction::Free {
            resource_version, ..
        }
        | SlotAction::Stamp {
            resource_version, ..
        }
        | SlotAction::Reserve {
            resource_version, ..
        } => resource_version,
    }
}

/// The slots of one Shim written at a version the cache may not have moved past yet.
#[derive(Debug, Default)]
pub struct Written(BTreeMap<u32, (String, Instant)>);

impl Written {
    /// Forget the slots the cache shows at another version (or gone, for a noted write that
    /// was not a create), and the notes older than [`WRITTEN_FOR`].
    pub fn observe(&mut self, slots: &[Slot], now: Instant) {
        self.0.retain(|index, (version, at)| {
            let seen = slots.iter().find(|s| s.index == *index);
            let same = match seen {
                Some(s) => s.resource_version == *version,
                None => version.is_empty(),
            };
            same && now.saturating_duration_since(*at) < WRITTEN_FOR
        });
    }

    /// Whether `action` is a write made already against the version its slot still shows.
    pub fn already(&self, action: &SlotAction) -> bool {
        self.0
            .get(&action.index())
            .is_some_and(|(v, _)| v == version_of(action))
    }

    /// When the first hold ends: the coordinator plans again then, whether or not anything
    /// changed. A create refused because its name was taken (a Lease of an earlier Shim the
    /// garbage collector took a moment later) was held back, and with nothing left to change
    /// the slot was never made: a fleet waited for good.
    pub fn next_due(&self) -> Option<Instant> {
        self.0.values().map(|(_, at)| *at + WRITTEN_FOR).min()
    }

    /// `action` was written, or refused because the slot moved: its slot is not written
    /// again at this version.
    pub fn note(&mut self, action: &SlotAction, now: Instant) {
        self.0
            .insert(action.index(), (version_of(action).to_string(), now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(index: u32, version: &str) -> Slot {
        Slot {
            index,
            resource_version: version.into(),
            ..Slot::default()
        }
    }

    fn reserve(index: u32, version: &str) -> SlotAction {
        SlotAction::Reserve {
            index,
            node: Some("n".into()),
            resource_version: version.into(),
        }
    }

    #[test]
    fn a_slot_is_written_once_per_version_the_cache_shows() {
        let now = Instant::now();
        let mut w = Written::default();
        let a = reserve(0, "7");
        assert!(!w.already(&a));
        w.note(&a, now);
        // the cache still shows version 7: planned again, not written again
        w.observe(&[slot(0, "7"), slot(1, "3")], now);
        assert!(w.already(&a));
        assert!(
            !w.already(&reserve(1, "3")),
            "another slot is not held back"
        );
        // the cache moved on: the next write goes
        w.observe(&[slot(0, "9")], now);
        assert!(!w.already(&a));
        assert!(!w.already(&reserve(0, "9")));
    }

    #[test]
    fn a_create_waits_for_the_slot_to_show_and_every_note_runs_out() {
        let now = Instant::now();
        let mut w = Written::default();
        let create = SlotAction::Create {
            index: 2,
            closed: None,
        };
        w.note(&create, now);
        w.observe(&[], now);
        assert!(
            w.already(&create),
            "not created again before the cache shows it"
        );
        w.observe(&[slot(2, "11")], now);
        assert!(!w.already(&create));
        // a note the cache never moves past is forgotten in time
        let a = reserve(0, "7");
        w.note(&a, now);
        w.observe(
            &[slot(0, "7")],
            now + WRITTEN_FOR - Duration::from_millis(1),
        );
        assert!(w.already(&a));
        w.observe(&[slot(0, "7")], now + WRITTEN_FOR);
        assert!(!w.already(&a));
    }

    #[test]
    fn the_coordinator_is_due_again_when_the_first_hold_ends() {
        let now = Instant::now();
        let mut w = Written::default();
        assert_eq!(w.next_due(), None, "nothing held back: no wake-up");
        // a create refused (its name taken), then a reservation a second later
        w.note(
            &SlotAction::Create {
                index: 0,
                closed: None,
            },
            now,
        );
        w.note(&reserve(1, "7"), now + Duration::from_secs(1));
        assert_eq!(w.next_due(), Some(now + WRITTEN_FOR));
        // once it ran out and is forgotten, the next one
        w.observe(&[slot(1, "7")], now + WRITTEN_FOR);
        assert_eq!(
            w.next_due(),
            Some(now + Duration::from_secs(1) + WRITTEN_FOR)
        );
    }
}
