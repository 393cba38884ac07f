#!/usr/bin/env bash
# Hand-written C floors for the memory-bound rows of issue 22 (see softmax_floor.c): what
# one core of this machine does with the same algorithm, outside tensortune. Pinned to core 1.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${TMPDIR:-/tmp}/tensortune-floors"
mkdir -p "$out"
cc="${CC:-gcc}"
"$cc" -O3 -march=x86-64-v4 -o "$out/softmax_floor" "$here/softmax_floor.c" -lm
taskset -c 1 "$out/softmax_floor"
