#!/usr/bin/env bash
# The performance floor of a change (issue 20): tunes matmul 1024³ and the ResNet-50 conv2d
# layer with two tensortune binaries side by side (before and after the change), 256 trials,
# one thread pinned to one core, three seeds, runs interleaved (before s0, after s0, before s1,
# ...), each into a fresh database. Prints a markdown table of the best GFLOP/s each run found
# (`tune --json`'s best_gflops: the top records re-measured at the end of tuning) and its wall
# time, then re-measures every run's best record with `run --db` (both binaries on their own
# databases, and each on the other's, interleaved) on the same core.
#   bash benches/perf_floor.sh BEFORE_BIN AFTER_BIN [OUTDIR]
# OUTDIR (default: a new temporary directory) keeps the databases and the logs of every run.
# Environment: PERF_FLOOR_CORE (1), PERF_FLOOR_TRIALS (256), PERF_FLOOR_SEEDS ("0 1 2").
# A binary built before XGBoost was linked statically (fda15ae) loads libxgboost.so.3 from its
# build folder: put that folder (TARGET/release/build/xgboost_lib-sys-*/out/lib) in
# LD_LIBRARY_PATH; a statically linked binary ignores it.
set -euo pipefail

usage() {
  echo "usage: bash benches/perf_floor.sh BEFORE_BIN AFTER_BIN [OUTDIR]" >&2
  exit 2
}
if [ "$#" -lt 2 ] || [ "$#" -gt 3 ]; then usage; fi
before_bin=$(realpath "$1")
after_bin=$(realpath "$2")
for b in "$before_bin" "$after_bin"; do
  [ -x "$b" ] || { echo "perf_floor: $b is not an executable" >&2; exit 2; }
done
outdir="${3:-$(mktemp -d "${TMPDIR:-/tmp}/perf_floor.XXXXXX")}"
mkdir -p "$outdir"
outdir=$(realpath "$outdir")

core="${PERF_FLOOR_CORE:-1}"
trials="${PERF_FLOOR_TRIALS:-256}"
read -r -a seeds <<<"${PERF_FLOOR_SEEDS:-0 1 2}"
names=(matmul1024 resnet50_conv2d)
specs=(
  "matmul:M=1024,N=1024,K=1024"
  "conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1"
)
sides=(before after)
bins=("$before_bin" "$after_bin")

# Both binaries must take the flags used below.
for b in "${bins[@]}"; do
  help=$("$b" tune --help)
  for flag in --workload --trials --threads --seed --db --json --quiet; do
    grep -q -- "$flag" <<<"$help" || { echo "perf_floor: $b tune has no $flag" >&2; exit 2; }
  done
  help=$("$b" run --help)
  for flag in --workload --threads --db --json; do
    grep -q -- "$flag" <<<"$help" || { echo "perf_floor: $b run has no $flag" >&2; exit 2; }
  done
done
taskset -c "$core" true || { echo "perf_floor: cannot pin to core $core" >&2; exit 2; }

# The value of a number (or null) field of one line of JSON, "n/a" when absent.
json_field() {
  local v
  v=$(grep -o "\"$1\":[^,}]*" <<<"$2" | head -n 1 | cut -d: -f2 | tr -d ' "')
  echo "${v:-n/a}"
}
json_text() {
  local v
  v=$(grep -o "\"$1\":\"[^\"]*\"" <<<"$2" | head -n 1 | cut -d: -f2- | tr -d '"')
  echo "${v:-n/a}"
}
fmt1() { if [ "$1" = n/a ] || [ "$1" = null ]; then echo "$1"; else printf '%.1f' "$1"; fi; }

echo "perf_floor: $(date -u '+%Y-%m-%d %H:%M UTC'), $(lscpu | sed -n 's/^Model name: *//p' | head -n 1), $(nproc) cores, pinned to core $core"
echo "perf_floor: before $before_bin"
echo "perf_floor: after  $after_bin"
echo "perf_floor: outputs in $outdir"

declare -A gflops wall
for i in "${!names[@]}"; do
  for s in "${seeds[@]}"; do
    for k in 0 1; do
      side=${sides[$k]}
      run="${names[$i]}-$side-s$s"
      db="$outdir/$run.db"
      rm -f "$db" "$db-wal" "$db-shm" "$db-journal"
      t0=$(date +%s.%N)
      if json=$(taskset -c "$core" "${bins[$k]}" tune --workload "${specs[$i]}" \
        --trials "$trials" --threads 1 --seed "$s" --db "$db" --json --quiet \
        2>"$outdir/$run.stderr" | tail -n 1); then
        :
      else
        echo "perf_floor: $run failed (stderr in $outdir/$run.stderr)" >&2
        json=""
      fi
      t1=$(date +%s.%N)
      printf '%s\n' "$json" >"$outdir/$run.json"
      gflops[$run]=$(json_field best_gflops "$json")
      wall[$run]=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", b - a }')
      echo "perf_floor: $run: $(fmt1 "${gflops[$run]}") GFLOP/s, ${wall[$run]} s" >&2
    done
  done
done

echo
echo "Tuning, $trials trials, --threads 1, taskset -c $core (best GFLOP/s: tune --json best_gflops)"
echo
echo "| workload | seed | before GFLOP/s | after GFLOP/s | before wall s | after wall s |"
echo "| --- | --- | --- | --- | --- | --- |"
for i in "${!names[@]}"; do
  for s in "${seeds[@]}"; do
    b="${names[$i]}-before-s$s"
    a="${names[$i]}-after-s$s"
    echo "| ${names[$i]} | $s | $(fmt1 "${gflops[$b]}") | $(fmt1 "${gflops[$a]}") | ${wall[$b]} | ${wall[$a]} |"
  done
done
echo
echo "| workload | before min-max (mean) | after min-max (mean) |"
echo "| --- | --- | --- |"
for i in "${!names[@]}"; do
  row="| ${names[$i]} |"
  for side in "${sides[@]}"; do
    vals=""
    for s in "${seeds[@]}"; do vals+="${gflops[${names[$i]}-$side-s$s]} "; done
    row+=$(awk -v v="$vals" 'BEGIN {
      n = split(v, x, " "); c = 0; sum = 0
      for (j = 1; j <= n; j++) if (x[j] ~ /^[0-9.eE+-]+$/) {
        c++; sum += x[j]
        if (c == 1 || x[j] < lo) lo = x[j]
        if (c == 1 || x[j] > hi) hi = x[j]
      }
      if (c == 0) printf " n/a |"; else printf " %.1f-%.1f (%.1f) |", lo, hi, sum / c
    }')
  done
  echo "$row"
done

# Re-measure: each run's best record, by its own binary and by the other one (the other on a
# copy of the database, so that neither binary opens a database the other wrote in place).
cross() { # DB -> a copy of DB in OUTDIR/cross
  local c
  c="$outdir/cross/$(basename "$1")"
  mkdir -p "$outdir/cross"
  rm -f "$c" "$c-wal" "$c-shm"
  cp "$1" "$c"
  [ ! -e "$1-wal" ] || cp "$1-wal" "$c-wal"
  echo "$c"
}
remeasure() { # BIN SPEC DB -> "GFLOPS" or "GFLOPS (default schedule)" or "n/a"
  local out g src
  if out=$(taskset -c "$core" "$1" run --workload "$2" --threads 1 --db "$3" --json 2>/dev/null | tail -n 1); then
    g=$(fmt1 "$(json_field gflops "$out")")
    src=$(json_text schedule "$out")
    if [ "$src" = "best record" ]; then echo "$g"; else echo "$g ($src)"; fi
  else
    echo "n/a"
  fi
}
echo
echo "Re-measured with run --db --threads 1, taskset -c $core (GFLOP/s; bin on db)"
echo
echo "| workload | seed | before on before | after on after | after on before | before on after |"
echo "| --- | --- | --- | --- | --- | --- |"
for i in "${!names[@]}"; do
  for s in "${seeds[@]}"; do
    bdb="$outdir/${names[$i]}-before-s$s.db"
    adb="$outdir/${names[$i]}-after-s$s.db"
    bb=n/a aa=n/a ab=n/a ba=n/a
    # A run without a valid program would re-measure the (slow) default schedule: skip it.
    if [[ "${gflops[${names[$i]}-before-s$s]}" =~ ^[0-9] ]]; then
      bb=$(remeasure "$before_bin" "${specs[$i]}" "$bdb")
      ab=$(remeasure "$after_bin" "${specs[$i]}" "$(cross "$bdb")")
    fi
    if [[ "${gflops[${names[$i]}-after-s$s]}" =~ ^[0-9] ]]; then
      aa=$(remeasure "$after_bin" "${specs[$i]}" "$adb")
      ba=$(remeasure "$before_bin" "${specs[$i]}" "$(cross "$adb")")
    fi
    echo "| ${names[$i]} | $s | $bb | $aa | $ab | $ba |"
  done
done
