//! Fault injection for the tests: with the `failpoints` feature, a named point can be made to
//! panic (a crash at that step) or to return early; without it, a point is nothing.
//!
//! The points: `txn::<phase>` right after each phase is journalled (and `txn::planned`,
//! `txn::write_config`, `txn::place_binary`, `txn::restored`), `round::<shim>` inside a
//! round that works on that Shim, after its crash record is saved.

/// The fault point `name`.
pub fn point(_name: &str) {
    fail::fail_point!(_name);
}
