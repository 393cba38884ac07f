#!/usr/bin/env bash
# Packages every crate of the workspace as crates.io would receive it, in dependency order
# (cargo resolves the unpublished siblings from the packages it has just made). Extra
# arguments go to `cargo package` (e.g. `--allow-dirty` in a work tree with changes).
#
# `--no-verify`: the verifying build compiles every packaged crate again from its tarball,
# XGBoost's C++ and the LLVM-linked crate included, many minutes on CI's two cores for sources
# the test suite has just built. Run `bash scripts/package.sh` without it (edit the line)
# before a release.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo package --workspace --locked --no-verify "$@"
