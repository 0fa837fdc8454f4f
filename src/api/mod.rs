//! The Shim API.
