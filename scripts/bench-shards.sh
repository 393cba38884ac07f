#!/usr/bin/env bash
# The shard figure of docs/measurements.md ("Plans over shards"): a plan of 8 tasks tuned by
# one process, then by two shards at once (each into its own SQLite file, as array tasks
# without a server would), with the same trials per task; prints both wall times and their
# ratio. A measurement, not a test: run it on a machine otherwise idle.
#
#   bash scripts/bench-shards.sh [TRIALS]   # default 16; builds nothing: needs
#                                           # target/release/tensortune (cargo build --release)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$PWD/target/release/tensortune"
trials="${1:-16}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
workloads=()
for s in M=32,N=32,K=32 M=64,N=32,K=32 M=32,N=64,K=32 M=32,N=32,K=64 \
  M=64,N=64,K=32 M=64,N=32,K=64 M=32,N=64,K=64 M=64,N=64,K=64; do
  workloads+=(--workload "matmul:$s")
done
"$bin" plan "${workloads[@]}" --trials "$trials" --out "$dir/plan.json"
now() { date +%s.%N; }
t0="$(now)"
"$bin" tune --plan "$dir/plan.json" --db "$dir/one.db" --quiet >/dev/null
t1="$(now)"
"$bin" tune --plan "$dir/plan.json" --shard 0/2 --db "$dir/a.db" --quiet >/dev/null &
a=$!
"$bin" tune --plan "$dir/plan.json" --shard 1/2 --db "$dir/b.db" --quiet >/dev/null &
b=$!
wait "$a"
wait "$b"
t2="$(now)"
"$bin" merge --into "$dir/two.db" "$dir/a.db" "$dir/b.db" >/dev/null
for db in one two; do
  echo "$db: $("$bin" records --db "$dir/$db.db" | grep -c 'matmul:') workloads"
done
python3 - "$t0" "$t1" "$t2" <<'PY'
import sys
t0, t1, t2 = map(float, sys.argv[1:])
one, two = t1 - t0, t2 - t1
print(f"one process: {one:.1f} s; two shards at once: {two:.1f} s; ratio {two / one:.2f}")
PY
