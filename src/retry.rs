//! When to try again: capped exponential backoff, so a Shim that keeps failing (a drift repair
//! containerd refuses, a broken artifact) is not retried in a loop, and stable draws that
//! spread a fleet's retries (a node draws the same for the same inputs, nodes differ).

use std::time::Duration;

use sha2::{Digest, Sha256};

/// First retry after a failure; doubled per failure up to [`BACKOFF_MAX_SECS`].
pub const BACKOFF_BASE_SECS: u64 = 10;
/// Longest pause between attempts of a failing Shim.
pub const BACKOFF_MAX_SECS: u64 = 600;

/// The pause after the `attempts`-th failure in a row.
pub fn backoff(attempts: u32) -> Duration {
    let secs = BACKOFF_BASE_SECS.saturating_mul(1 << attempts.saturating_sub(1).min(10));
    Duration::from_secs(secs.min(BACKOFF_MAX_SECS))
}

/// A stable pseudo-random number drawn from `parts`: the same parts draw the same number.
pub fn draw(parts: &[&str]) -> u64 {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    let d = h.finalize();
    u64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

/// A pause in `[0, max)` drawn from `parts` (a node's name and what it waits for), so nodes
/// turned away together do not come back together.
pub fn spread(parts: &[&str], max: Duration) -> Duration {
    let us = max.as_micros().max(1) as u64;
    Duration::from_micros(draw(parts) % us)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(1), Duration::from_secs(10));
        assert_eq!(backoff(2), Duration::from_secs(20));
        assert_eq!(backoff(40), Duration::from_secs(BACKOFF_MAX_SECS));
    }
}
