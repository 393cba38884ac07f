#!/usr/bin/env bash
# Installs what tensortune needs on a fresh Debian machine, only what is missing:
# LLVM 19 (linked statically through inkwell), the build tools of XGBoost's bundled source,
# numpy for the baseline benchmarks, and Debian's chromium, in which a test renders the HTML of
# `tensortune report`. Safe to run again.
set -euo pipefail
need=()
have() { dpkg -s "$1" >/dev/null 2>&1; }
for p in llvm-19-dev libpolly-19-dev libzstd-dev clang libclang-dev cmake ninja-build chromium; do
  have "$p" || need+=("$p")
done
if [ "${#need[@]}" -gt 0 ]; then
  echo "setup: installing ${need[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! python3 -c 'import numpy' >/dev/null 2>&1; then
  python3 -m pip install -q numpy threadpoolctl >/dev/null 2>&1 || echo "setup: numpy not installed (only the baseline benchmark needs it)" >&2
fi
