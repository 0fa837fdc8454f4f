//! Leader election on a [`ShimLease`] (a Lease's fields under shim-agent's API group; see
//! [`crate::api::lease`] for why not a `coordination.k8s.io` Lease), with client-go's semantics.
//!
//! # Guarantees
//! - Every write is a replace guarded by the `resourceVersion` that was read: of two
//!   candidates racing for an expired Lease, one gets a 409 and stays a follower.
//! - Expiry is measured on this process's monotonic clock from the moment it last *saw the
//!   record change*, never by comparing the holder's `renewTime` with the local wall clock:
//!   clocks of different nodes may disagree by minutes.
//! - A leader that cannot renew within `renew_deadline` stops acting as leader before its
//!   Lease can expire for the others (`renew_deadline < lease_duration`).
//! - On a clean shutdown the leader releases the Lease (empty holder), so a successor takes
//!   over at once instead of waiting for the expiry.
//!
//! # Caveats
//! Like client-go, this is not fencing: a leader paused longer than the lease (a frozen VM)
//! may act once more after a successor took over. Everything the coordinator writes is
//! idempotent and guarded by resourceVersion, so such a late write is rejected or harmless.
//!
//! [`Observer`] is the pure part (what to write, or wait); [`LeaseLock`] does the I/O.

use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::time::Instant;

use crate::api::lease::{ShimLease, ShimLeaseSpec as LeaseSpec};

/// Timings, as client-go names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// How long a Lease is valid without renewal (client-go: 15 s).
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it steps down (client-go: 10 s).
    pub renew_deadline: Duration,
    /// Pause between attempts (client-go: 2 s).
    pub retry_period: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// The last record seen and when (local monotonic clock) it last changed.
#[derive(Debug, Clone, Default)]
pub struct Observer {
    seen: Option<(Option<LeaseSpec>, Instant)>,
}

/// What to do with a Lease just read.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Someone else holds it and it has not expired on our clock.
    Wait { holder: String },
    /// Write this spec (acquire, take over or renew).
    Write(LeaseSpec),
}

impl Observer {
    /// Record `spec` as read at `now` and decide. `wall_now` only fills the new record's
    /// timestamps (for people and for client-go peers); it never decides expiry.
    pub fn decide(
        &mut self,
        spec: Option<&LeaseSpec>,
        identity: &str,
        timings: &Timings,
        now: Instant,
        wall_now: MicroTime,
    ) -> Decision {
        let changed = match &self.seen {
            Some((prev, _)) => prev.as_ref() != spec,
            None => true,
        };
        if changed {
            self.seen = Some((spec.cloned(), now));
        }
        let observed_at = self.seen.as_ref().map(|(_, t)| *t).unwrap_or(now);
        let holder = spec
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default();
        let duration = spec
            .and_then(|s| s.lease_duration_seconds)
            .map(|s| Duration::from_secs(s.max(0) as u64))
            .unwrap_or(timings.lease_duration);
        if !holder.is_empty() && holder != identity && now < observed_at + duration {
            return Decision::Wait { holder };
        }
        let ours = holder == identity;
        let transitions = spec.and_then(|s| s.lease_transitions).unwrap_or(0);
        Decision::Write(LeaseSpec {
            holder_identity: Some(identity.to_string()),
            lease_duration_seconds: Some(timings.lease_duration.as_secs() as i32),
            acquire_time: if ours {
                spec.and_then(|s| s.acquire_time.clone())
            } else {
                Some(wall_now.clone())
            },
            renew_time: Some(wall_now),
            lease_transitions: Some(if ours || holder.is_empty() && transitions == 0 {
                transitions
            } else {
                transitions + 1
            }),
        })
    }

    /// Remember our own successful write, so our clock starts from it.
    pub fn wrote(&mut self, spec: LeaseSpec, now: Instant) {
        self.seen = Some((Some(spec), now));
    }

    /// Record a record seen on the watch (its clock starts when it changes).
    pub fn observe(&mut self, spec: Option<&LeaseSpec>, now: Instant) {
        let changed = match &self.seen {
            Some((prev, _)) => prev.as_ref() != spec,
            None => true,
        };
        if changed {
            self.seen = Some((spec.cloned(), now));
        }
    }

    /// When `identity` may try to take the Lease: `None` before anything was seen, `now` or
    /// earlier when it is free, ours, or expired on our clock.
    pub fn vacant_at(&self, identity: &str, timings: &Timings) -> Option<Instant> {
        let (spec, at) = self.seen.as_ref()?;
        let Some(spec) = spec else {
            return Some(*at);
        };
        let holder = spec.holder_identity.as_deref().unwrap_or_default();
        if holder.is_empty() || holder == identity {
            return Some(*at);
        }
        let duration = spec
            .lease_duration_seconds
            .map(|s| Duration::from_secs(s.max(0) as u64))
            .unwrap_or(timings.lease_duration);
        Some(*at + duration)
    }
}

/// A Lease used as a lock by one identity.
pub struct LeaseLock {
    pub api: Api<ShimLease>,
    pub name: String,
    pub identity: String,
    pub timings: Timings,
    observer: Observer,
}

impl LeaseLock {
    pub fn new(api: Api<ShimLease>, name: &str, identity: &str, timings: Timings) -> Self {
        LeaseLock {
            api,
            name: name.to_string(),
            identity: identity.to_string(),
            timings,
            observer: Observer::default(),
        }
    }

    /// One attempt to acquire or renew: `Ok(true)` when we hold the Lease now.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let wall_now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let existing = self.api.get_opt(&self.name).await?;
        let now = Instant::now();
        let Some(lease) = existing else {
            let Decision::Write(spec) =
                self.observer
                    .decide(None, &self.identity, &self.timings, now, wall_now)
            else {
                return Ok(false);
            };
            let lease = ShimLease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: spec.clone(),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    self.observer.wrote(spec, Instant::now());
                    Ok(true)
                }
                Err(e) if is_conflict(&e) => Ok(false),
                Err(e) => Err(e),
            };
        };
        match self.observer.decide(
            Some(&lease.spec),
            &self.identity,
            &self.timings,
            now,
            wall_now,
        ) {
            Decision::Wait { .. } => Ok(false),
            Decision::Write(spec) => {
                let mut next = lease.clone();
                next.spec = spec.clone();
                match self
                    .api
                    .replace(&self.name, &PostParams::default(), &next)
                    .await
                {
                    Ok(_) => {
                        self.observer.wrote(spec, Instant::now());
                        Ok(true)
                    }
                    Err(e) if is_conflict(&e) => Ok(false),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Give the Lease up (empty holder) if we still hold it.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let spec = &mut lease.spec;
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_conflict(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// A 409 (write raced another) or "already exists".
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Hold leadership: wait to acquire, then renew every `retry_period`; return when a renewal
/// has not succeeded for `renew_deadline` (leadership lost) or `stop` fires.
pub async fn lead<F, Fut>(
    lock: &mut LeaseLock,
    mut stop: tokio::sync::watch::Receiver<bool>,
    duties: F,
) -> bool
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    // Acquire. A follower makes no requests while the holder renews: it watches the Lease by
    // name and only tries when the record has not changed for a whole lease duration.
    let config = watcher::Config::default().fields(&format!("metadata.name={}", lock.name));
    let mut events = std::pin::pin!(watcher(lock.api.clone(), config).default_backoff());
    loop {
        let now = Instant::now();
        match lock.observer.vacant_at(&lock.identity, &lock.timings) {
            Some(t) if t <= now => match lock.try_acquire_or_renew().await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => super::CoordinatorError::Election(e).record("coordinator lease"),
            },
            _ => {}
        }
        let wake = match lock.observer.vacant_at(&lock.identity, &lock.timings) {
            // not expired yet: wake at expiry (a change on the watch wakes us earlier)
            Some(t) if t > Instant::now() => t,
            // free but the write lost a race, or failed: try again after a retry period
            _ => Instant::now() + jitter(lock.timings.retry_period),
        };
        tokio::select! {
            ev = events.next() => match ev {
                Some(Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l))) => {
                    lock.observer.observe(Some(&l.spec), Instant::now());
                }
                Some(Ok(watcher::Event::Delete(_))) => lock.observer.observe(None, Instant::now()),
                Some(Ok(watcher::Event::InitDone)) if lock.observer.vacant_at(&lock.identity, &lock.timings).is_none() => {
                    lock.observer.observe(None, Instant::now());
                }
                _ => {}
            },
            _ = tokio::time::sleep_until(wake) => {}
            _ = stop.changed() => return false,
        }
    }
    tracing::info!(identity = %lock.identity, "elected coordinator");
    let timings = lock.timings;
    let renew = async {
        let mut last_ok = Instant::now();
        loop {
            tokio::time::sleep(timings.retry_period).await;
            match lock.try_acquire_or_renew().await {
                Ok(true) => last_ok = Instant::now(),
                Ok(false) => return,
                Err(e) => super::CoordinatorError::Election(e).record("coordinator lease renewal"),
            }
            if last_ok.elapsed() >= timings.renew_deadline {
                return;
            }
        }
    };
    tokio::select! {
        _ = renew => {
            tracing::warn!("lost the coordinator lease; stepping down");
            false
        }
        _ = duties() => true,
        _ = stop.changed() => true,
    }
}

/// Whether `stop` says stop: it turned true, or its sender is gone (nothing can ever say
/// go on; waiting for a change would return at once, and the election would spin).
pub fn stopping(stop: &tokio::sync::watch::Receiver<bool>) -> bool {
    *stop.borrow() || stop.has_changed().is_err()
}

/// `d` stretched by up to 20% (client-go's JitterFactor 1.2), so candidates spread out.
fn jitter(d: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|t| t.subsec_nanos())
        .unwrap_or(0);
    d + d.mul_f64(f64::from(nanos % 1000) / 5000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_by(who: &str, renew_secs: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(who.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(wall(renew_secs)),
            lease_transitions: Some(3),
            ..Default::default()
        }
    }

    fn wall(secs: i64) -> MicroTime {
        MicroTime(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn another_holders_lease_expires_on_our_clock_not_by_its_timestamps() {
        let t = Timings::default();
        let mut o = Observer::default();
        // its renewTime is far in the past by our wall clock: irrelevant
        let spec = held_by("node-b", 0);
        let d = o.decide(Some(&spec), "node-a", &t, Instant::now(), wall(10_000));
        assert_eq!(
            d,
            Decision::Wait {
                holder: "node-b".into()
            }
        );
        tokio::time::advance(Duration::from_secs(14)).await;
        let d = o.decide(Some(&spec), "node-a", &t, Instant::now(), wall(10_014));
        assert!(matches!(d, Decision::Wait { .. }));
        tokio::time::advance(Duration::from_secs(1)).await;
        match o.decide(Some(&spec), "node-a", &t, Instant::now(), wall(10_015)) {
            Decision::Write(w) => {
                assert_eq!(w.holder_identity.as_deref(), Some("node-a"));
                assert_eq!(w.lease_transitions, Some(4));
                assert_eq!(w.acquire_time, Some(wall(10_015)));
            }
            d => panic!("expected a takeover, got {d:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_seen_restarts_the_clock() {
        let t = Timings::default();
        let mut o = Observer::default();
        o.observe(Some(&held_by("node-b", 0)), Instant::now());
        tokio::time::advance(Duration::from_secs(10)).await;
        o.observe(Some(&held_by("node-b", 10)), Instant::now());
        let vacant = o.vacant_at("node-a", &t).unwrap();
        assert_eq!(vacant - Instant::now(), Duration::from_secs(15));
        // the same record again does not restart it
        tokio::time::advance(Duration::from_secs(5)).await;
        o.observe(Some(&held_by("node-b", 10)), Instant::now());
        assert_eq!(o.vacant_at("node-a", &t), Some(vacant));
    }

    #[tokio::test(start_paused = true)]
    async fn our_own_or_an_empty_lease_is_taken_at_once_and_renewal_keeps_the_transitions() {
        let t = Timings::default();
        let mut o = Observer::default();
        assert_eq!(o.vacant_at("node-a", &t), None, "nothing seen yet");
        let now = Instant::now();
        o.observe(Some(&held_by("", 0)), now);
        assert_eq!(o.vacant_at("node-a", &t), Some(now));
        let ours = held_by("node-a", 0);
        match o.decide(Some(&ours), "node-a", &t, Instant::now(), wall(5)) {
            Decision::Write(w) => assert_eq!(w.lease_transitions, Some(3)),
            d => panic!("{d:?}"),
        }
    }
}

#[cfg(test)]
mod stop_tests {
    use std::time::Duration;

    use super::stopping;
    use crate::cluster::coordinator::{CoordinatorConfig, run};

    #[test]
    fn a_stop_channel_whose_sender_is_gone_says_stop() {
        let (tx, rx) = tokio::sync::watch::channel(false);
        assert!(!stopping(&rx));
        drop(tx);
        assert!(stopping(&rx));
        let (tx, rx) = tokio::sync::watch::channel(false);
        tx.send(true).unwrap();
        assert!(stopping(&rx));
    }

    /// Its stop sender dropped (its owner ended without a word), the coordinator ends; it
    /// once went round its election loop without a pause, every error logged, for ever.
    #[tokio::test]
    async fn the_coordinator_ends_when_its_stop_sender_is_gone() {
        // an API server that refuses every connection
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(1);
        let uri = format!("http://127.0.0.1:{port}")
            .parse()
            .unwrap_or_default();
        let client = kube::Client::try_from(kube::Config::new(uri)).expect("a client");
        let (tx, rx) = tokio::sync::watch::channel(false);
        let coordinator = tokio::spawn(run(client, "n".into(), CoordinatorConfig::default(), rx));
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(tx);
        let ended = tokio::time::timeout(Duration::from_secs(10), coordinator).await;
        assert!(
            ended.is_ok(),
            "the coordinator still runs with no one to stop it"
        );
    }
}
