//! Node transactions: install, upgrade and uninstall as journalled state machines.
//!
//! [`machine`] is the pure core (phases, transitions, recovery decisions); the shell that
//! performs each step lives beside it.

pub mod live;
pub mod machine;
pub mod real;
