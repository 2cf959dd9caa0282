//! The cli crate's integration tests, one binary (one link, one
//! compilation of the shared helpers) with a module per subject.

mod common;

mod cli;
mod crash;
mod drain;
mod faults;
mod files;
mod first_minute;
mod mount;
mod multihost;
mod quota;
mod snapshot;
mod tenants;
