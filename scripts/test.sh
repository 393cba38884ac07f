#!/usr/bin/env bash
# The test command: set-up (with what the tests need: chromium, numpy), then the whole test
# suite of the workspace. Arguments after the flags go to cargo test.
#   bash scripts/test.sh [--skip-setup] [CARGO TEST ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--skip-setup" ]; then
  shift
else
  bash scripts/setup.sh --for-tests
fi
# Release mode: the property tests and the JIT run much faster, and clippy, the tests and the
# benches then share one build of LLVM-linked crates and of XGBoost's C++ (a debug and a
# release build of it would each take many minutes).
cargo test --release --workspace --all-targets "$@"
