#!/usr/bin/env bash
# The test command: set-up, then the whole test suite of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo test --workspace --all-targets "$@"
