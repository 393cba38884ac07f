#!/usr/bin/env bash
# Packages every crate of the workspace as crates.io would receive it, in dependency order
# (cargo resolves the unpublished siblings from the packages it has just made). Extra
# arguments go to `cargo package` (e.g. `--allow-dirty` in a work tree with changes).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo package --workspace --locked "$@"
