#!/usr/bin/env bash
# Whole-model benchmark on a compute-bound CNN: a ResNet-18 or ResNet-50 at 224x224, batch 1
# (benches/resnet.py: torchvision's graph with its batch norms folded, random weights), tuned
# on one core with TRIALS_PER_TASK trials per task, then its end-to-end latency (`run-model`,
# median of REPEAT runs) beside ONNX Runtime's (intra_op_num_threads=1, all its graph
# optimizations) on the same core, in the same script, and the largest difference of the two
# outputs.
#   bash benches/resnet_floor.sh [DEPTH=18] [TRIALS_PER_TASK=64] [CORE=1] [DB=target/resnet/resnetDEPTH.db]
# Resumable: run it again on the same DB to add trials. Needs numpy, onnx and onnxruntime
# (`scripts/setup.sh --for-tests` installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
depth=${1:-18}
per_task=${2:-64}
core=${3:-1}
dir=target/resnet
db=${4:-$dir/resnet$depth.db}
repeat=${REPEAT:-30}
mkdir -p "$dir"
model=$(python3 benches/resnet.py "$depth" "$dir")
input=$dir/resnet$depth.input.npy
cargo build --release --quiet --bin tensortune
bin=target/release/tensortune
shape=x=1x3x224x224
tasks=$("$bin" tune-model "$model" --db "$dir/plan.db" --trials 0 --input-shape "$shape" | sed -n 's/^\([0-9]*\) tasks.*/\1/p')
echo "resnet_floor: ResNet-$depth, $tasks tasks, $per_task trials each on core $core"
start=$(date +%s)
taskset -c "$core" "$bin" tune-model "$model" --db "$db" --trials $((tasks * per_task)) \
  --input-shape "$shape" --quiet | tail -n 3
echo "tuning wall time: $(( $(date +%s) - start )) s"
echo "--- tensortune (records of $db), one thread"
taskset -c "$core" "$bin" run-model "$model" --db "$db" --inputs "$input" \
  --output "$dir/resnet$depth.tensortune.npy" --repeat "$repeat"
echo "--- ONNX Runtime, intra_op_num_threads=1"
taskset -c "$core" python3 - "$model" "$input" "$dir/resnet$depth.tensortune.npy" "$repeat" <<'PY'
import sys, time
import numpy as np
import onnxruntime as ort
model, inp, ours, repeat = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
o = ort.SessionOptions()
o.intra_op_num_threads = 1
o.inter_op_num_threads = 1
s = ort.InferenceSession(model, o, providers=["CPUExecutionProvider"])
x = np.load(inp)
feed = {s.get_inputs()[0].name: x}
for _ in range(3):
    y = s.run(None, feed)
times = []
for _ in range(repeat):
    t = time.perf_counter()
    s.run(None, feed)
    times.append(time.perf_counter() - t)
ref = y[0]
got = np.load(ours)
print(f"onnxruntime {ort.__version__}: end-to-end latency {np.median(times) * 1e3:.3f} ms (median of {repeat})")
print(f"largest difference of the outputs: {np.abs(got - ref).max():.2e} (outputs up to {np.abs(ref).max():.2e})")
PY
