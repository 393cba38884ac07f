#!/usr/bin/env bash
# The test command: set-up, then the whole test suite of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Release mode: the property tests and the JIT run much faster, and clippy, the tests and the
# benches then share one build of LLVM-linked crates and of XGBoost's C++ (a debug and a
# release build of it would each take many minutes).
cargo test --release --workspace --all-targets "$@"
