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

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
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
    // acquire
    loop {
        match lock.try_acquire_or_renew().await {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => tracing::debug!(error = %e, "coordinator lease: cannot read or write"),
        }
        tokio::select! {
            _ = tokio::time::sleep(jitter(lock.timings.retry_period)) => {}
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
                Err(e) => tracing::warn!(error = %e, "coordinator lease: renewal failed"),
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

/// `d` stretched by up to 20% (client-go's JitterFactor 1.2), so candidates spread out.
fn jitter(d: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|t| t.subsec_nanos())
        .unwrap_or(0);
    d + d.mul_f64(f64::from(nanos % 1000) / 5000.0)
}
