#!/usr/bin/env bash
# Tiering benchmark: write and read back a dataset (default 1 GiB) with DRAM
# holding 100%, 50%, 10% and 0% of it and the rest on the file tier; prints
# time relative to all-DRAM and the storage cost from the class prices
# (DRAM $5/GiB, flash $0.63/GiB by default). The table goes into
# docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin nk >&2
SIZE=${SIZE:-1GiB}
DIR=${DATA_DIR:-$(mktemp -d "${TMPDIR:-/var/tmp}/nk-tiering.XXXXXX")}
trap 'rm -rf "$DIR"' EXIT
target/release/nk bench tiering -s "$SIZE" --data-dir "$DIR"
