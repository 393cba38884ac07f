#!/usr/bin/env bash
# The main job: set-up, build, then tune a workload on this CPU (one thread) into tuning.db
# and print the result and where the records are (256 trials: about a minute once built).
#   bash scripts/tune.sh [--skip-setup] [SPEC] [TRIALS]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--skip-setup" ]; then
  shift
else
  bash scripts/setup.sh
fi
spec="${1:-matmul:M=512,N=512,K=512}"
trials="${2:-256}"
cargo run --release --bin tensortune -- tune --workload "$spec" --trials "$trials" --threads 1 --db tuning.db
cargo run -q --release --bin tensortune -- records --db tuning.db
echo "records: $(pwd)/tuning.db"
