#!/usr/bin/env bash
# Regenerates docs/cli.md from the clap definitions of `nk` (a unit test of
# crates/cli fails when the file is stale).
set -euo pipefail
cd "$(dirname "$0")/.."
NK_UPDATE_DOCS=1 cargo test --locked -p nodekernel-cli --bin nk docs_cli_md_is_current -- --quiet
echo "wrote docs/cli.md"
