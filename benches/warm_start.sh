#!/usr/bin/env bash
# Does a cost model trained on other shapes start the search warm (issue 22)? Tunes a training
# database of matmul and conv2d shapes, then tunes held-out shapes not in it, cold (`--cold`)
# and warm (the default: a model trained on the database's other workloads), three seeds
# each, one thread pinned to one core, cold and warm interleaved, each on its own copy of
# the training database. Prints, per held-out shape and seed, the cold run's final best,
# the trials each run needed to reach 95% of it, and the warm run's final best.
#   bash benches/warm_start.sh [OUTDIR]
# Environment: WARM_CORE (1), WARM_TRAIN_TRIALS (128), WARM_TRIALS (128), WARM_SEEDS ("0 1 2"),
# TENSORTUNE (the binary; default target/release/tensortune).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${TENSORTUNE:-target/release/tensortune}")
[ -x "$bin" ] || { echo "warm_start: build it first: cargo build --release" >&2; exit 2; }
outdir="${1:-$(mktemp -d "${TMPDIR:-/tmp}/warm_start.XXXXXX")}"
mkdir -p "$outdir"
outdir=$(realpath "$outdir")
core="${WARM_CORE:-1}"
train_trials="${WARM_TRAIN_TRIALS:-128}"
trials="${WARM_TRIALS:-128}"
read -r -a seeds <<<"${WARM_SEEDS:-0 1 2}"
train=(
  "matmul:M=256,N=256,K=256"
  "matmul:M=512,N=384,K=256"
  "matmul:M=384,N=512,K=512"
  "conv2d:N=1,C=32,H=28,W=28,K=32,R=3,S=3,stride=1,pad=1"
  "conv2d:N=1,C=64,H=14,W=14,K=128,R=3,S=3,stride=1,pad=1"
)
held_out=(
  "matmul:M=640,N=480,K=320"
  "conv2d:N=1,C=48,H=28,W=28,K=64,R=3,S=3,stride=1,pad=1"
)
train_db="$outdir/train.db"
if [ ! -f "$train_db" ]; then
  for w in "${train[@]}"; do
    echo "warm_start: training database: $w ($train_trials trials)" >&2
    taskset -c "$core" "$bin" tune --workload "$w" --trials "$train_trials" --db "$train_db" \
      --quiet --cold >>"$outdir/train.log" 2>&1
  done
fi
for w in "${held_out[@]}"; do
  for s in "${seeds[@]}"; do
    for mode in cold warm; do
      db="$outdir/$mode-$s-$(echo "$w" | tr ':,=' '___').db"
      cp "$train_db" "$db"
      flag=()
      [ "$mode" = cold ] && flag=(--cold)
      echo "warm_start: $w seed $s $mode" >&2
      taskset -c "$core" "$bin" tune --workload "$w" --trials "$trials" --seed "$s" --db "$db" \
        --quiet --json "${flag[@]}" >"$db.json" 2>"$db.log"
    done
  done
done
python3 - "$outdir" "${held_out[@]}" <<'PY'
import glob, json, sqlite3, sys
outdir, workloads = sys.argv[1], sys.argv[2:]

def curve(db, key):
    """Latencies in measurement order of the run's records of `key` (None: failed)."""
    con = sqlite3.connect(db)
    rows = con.execute(
        "SELECT r.median_s FROM records r JOIN workloads w ON w.id = r.workload_id "
        "WHERE w.key = ? ORDER BY r.id", (key,)).fetchall()
    return [r[0] for r in rows]

def trials_to(lat, target):
    best = float("inf")
    for i, l in enumerate(lat):
        if l is not None:
            best = min(best, l)
        if best <= target:
            return i + 1
    return None

print("| held-out workload | seed | cold best (ms) | cold: trials to 95% | warm: trials to 95% | warm best (ms) |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for w in workloads:
    safe = w.replace(":", "_").replace(",", "_").replace("=", "_")
    for cold_db in sorted(glob.glob(f"{outdir}/cold-*-{safe}.db")):
        seed = cold_db.split("/cold-")[1].split("-")[0]
        warm_db = cold_db.replace("/cold-", "/warm-")
        key = json.loads(open(cold_db + ".json").read().splitlines()[-1])["workload"]
        cold, warm = curve(cold_db, key), curve(warm_db, key)
        cold_best = min(l for l in cold if l is not None)
        warm_best = min(l for l in warm if l is not None)
        target = cold_best / 0.95  # 95% of the cold best's throughput
        print(f"| {w} | {seed} | {cold_best*1e3:.3f} | {trials_to(cold, target)} | "
              f"{trials_to(warm, target)} | {warm_best*1e3:.3f} |")
PY
