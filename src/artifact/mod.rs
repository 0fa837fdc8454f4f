//! Fetching, verifying and unpacking shim artifacts.
