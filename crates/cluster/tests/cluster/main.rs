//! The cluster crate's integration tests, one binary (one link, one
//! compilation of the shared helpers) with a module per subject.

#[macro_use]
mod common;

mod admin;
mod colocated;
mod data;
mod datadir;
mod deploy_examples;
mod direct_reads;
mod drain;
mod encryption;
mod faults;
mod lifetimes;
mod local_claims;
mod namespace;
mod persistence;
mod placement;
mod quotas;
mod reserved;
mod safety;
mod security;
mod semantics;
mod sessions;
mod small_files;
mod small_values;
mod snapshot;
mod store_restart;
mod streams;
mod tenants;
mod tiering;
