#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs on a GPU machine that has no Rust toolchain: the
# `tensortune` binary and the GPU test binaries, stripped and xz-compressed into
# gpu-bundle/ (ignored by git; carry it to the GPU machine with the tree).
#
#   bash scripts/gpu-bundle.sh [EXTRA_TEST...]
#
# The default tests are gpu_worker (the worker protocol, and `real_device_runs_ptx`, which
# runs PTX on the GPU), cuda_backend (tuning through the CUDA backend) and gpu_device (tuned
# kernels on device arrays in this process); EXTRA_TEST names
# more integration tests (tests/NAME.rs). The bundle must stay under LIMIT_MIB (60 MiB by
# default): the GPU machine takes a tree of 64 MiB at most. The tensortune binary is
# required; a test binary that would take the bundle past the limit is left out, and the
# script says so.
set -euo pipefail

cd "$(dirname "$0")/.."
LIMIT_MIB=${LIMIT_MIB:-60}
OUT_DIR=gpu-bundle
TESTS=(gpu_worker cuda_backend gpu_device "$@")

log() { printf 'gpu-bundle: %s\n' "$*" >&2; }

command -v xz >/dev/null || { log "xz not found"; exit 1; }
command -v python3 >/dev/null || { log "python3 not found (it reads cargo's JSON)"; exit 1; }

log "building the tensortune binary"
cargo build --release --offline --bin tensortune

test_args=()
for t in "${TESTS[@]}"; do
    test_args+=(--test "$t")
done
log "building the test binaries (${TESTS[*]}) without running them"
json=$(mktemp)
stage=$(mktemp -d)
trap 'rm -rf "$json" "$stage"' EXIT
cargo test --release --offline --no-run "${test_args[@]}" --message-format=json >"$json"

# One "NAME PATH" line per test executable cargo reported (the integration test targets).
mapfile -t exes < <(python3 - "$json" <<'PY'
import json, sys
for line in open(sys.argv[1], encoding="utf-8"):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    t = m.get("target", {})
    if "test" in t.get("kind", []) and m.get("profile", {}).get("test"):
        print(t["name"], m["executable"])
PY
)
if [ "${#exes[@]}" -ne "${#TESTS[@]}" ]; then
    log "cargo reported ${#exes[@]} test executables for ${#TESTS[@]} tests: ${exes[*]:-none}"
    exit 1
fi

rm -rf "$OUT_DIR"
mkdir -p "$OUT_DIR"
limit=$((LIMIT_MIB * 1024 * 1024))
total=0
left_out=()

# Strips and compresses $2 into $OUT_DIR/$1.xz; prints its compressed size.
pack() {
    local name=$1 src=$2
    strip -o "$stage/$name" "$src"
    xz -9 -T1 -c "$stage/$name" >"$stage/$name.xz"
    stat -c %s "$stage/$name.xz"
}

size=$(pack tensortune target/release/tensortune)
if [ "$size" -gt "$limit" ]; then
    log "tensortune alone is $size bytes compressed, over the ${LIMIT_MIB} MiB limit"
    exit 1
fi
mv "$stage/tensortune.xz" "$OUT_DIR/"
total=$size
for line in "${exes[@]}"; do
    name=${line%% *}
    path=${line#* }
    size=$(pack "$name" "$path")
    if [ $((total + size)) -gt "$limit" ]; then
        log "left out $name: $size bytes compressed would take the bundle past ${LIMIT_MIB} MiB"
        left_out+=("$name")
        continue
    fi
    mv "$stage/$name.xz" "$OUT_DIR/"
    total=$((total + size))
done

# What gpu-check.sh reads: the commit, which tests are in, and which were left out.
{
    printf 'commit %s\n' "$(git rev-parse HEAD 2>/dev/null || echo unknown)"
    printf 'dirty %s\n' "$(if git diff --quiet HEAD 2>/dev/null; then echo no; else echo yes; fi)"
    printf 'built %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    # The test binaries run the worker from the path cargo baked into them
    # (CARGO_BIN_EXE_tensortune), not from TENSORTUNE_CUDA_WORKER: gpu-check.sh links the
    # unpacked binary there when that path is missing on the GPU machine.
    printf 'bin-exe %s\n' "$PWD/target/release/tensortune"
    for f in "$OUT_DIR"/*.xz; do
        b=$(basename "$f" .xz)
        [ "$b" = tensortune ] || printf 'test %s\n' "$b"
    done
    for n in "${left_out[@]}"; do
        printf 'left-out %s\n' "$n"
    done
} >"$OUT_DIR/MANIFEST"

printf '%-16s %12s\n' FILE BYTES
for f in "$OUT_DIR"/*.xz; do
    printf '%-16s %12s\n' "$(basename "$f")" "$(stat -c %s "$f")"
done
awk -v t="$total" -v l="$LIMIT_MIB" 'BEGIN { printf "%-16s %12d (%.1f MiB of %d MiB)\n", "total", t, t / 1048576, l }'
if [ "${#left_out[@]}" -gt 0 ]; then
    log "left out: ${left_out[*]}"
fi
