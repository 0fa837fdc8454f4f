//! The tests that need nothing but this machine: no API server, no node env. Parsers, the
//! containerd config engine (golden cases, property tests, the corpus), artifacts over loopback
//! HTTP and scripted registries, transactions against a scripted containerd, offline installs
//! into temporary image roots, the CLI through the real binary.
//!
//! `cargo test --test pure` (one module: `cargo test --test pure cli::`). The real-containerd
//! readers (`containerd_real::`, `distro_templates::`) are `#[ignore]`d: they need containerd
//! binaries, which scripts/test passes to them (`-- --ignored`).
//!
//! proptest keeps the failing cases it found in `tests/proptest-regressions/<module>.txt` (its
//! default: a `proptest-regressions/` beside the directory of the crate's `main.rs`), and runs
//! them first.
//!
//! The groups: `pure` (here), `kube` (a real kube-apiserver), `node` (a real systemd +
//! containerd node), `failpoints` (crashes injected in this process); their helpers are in
//! `tests/support/`.

#[path = "../support/mod.rs"]
mod support;

mod api;
mod artifact_credentials;
mod artifact_fetch;
mod artifact_links;
mod artifact_mirrors;
mod artifact_oci;
mod artifact_place;
mod artifact_proxy;
mod artifact_tls;
mod artifact_trees;
mod artifact_unpack;
mod artifact_unpack_props;
mod cli;
mod cluster_plan;
mod containerd_batch;
mod containerd_corpus;
mod containerd_errors;
mod containerd_golden;
mod containerd_props;
mod containerd_real;
mod daemon;
mod distro_engine;
mod distro_templates;
mod docs_examples;
mod doctor_root;
mod live_txn;
mod monitoring;
mod node_cri_info;
mod offline_install;
mod reconciler_table;
mod reference_docs;
mod runtime_check;
mod runtime_class;
mod shape;
mod signature;
mod signature_python;
mod signature_time;
mod signed_install;
mod signed_oci;
mod signed_oci_replies;
mod txn_blame;
mod txn_gate;
mod untrusted_text;
