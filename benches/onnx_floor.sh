#!/usr/bin/env bash
# The floor benchmark of docs/onnx.md: a real CNN (PP-OCR's text-direction classifier from the
# rapidocr-onnxruntime wheel) tuned on one core with at most TRIALS_PER_TASK trials per task,
# then its end-to-end latency (run by `run-model`, and built into a program by `Build::model`)
# beside ONNX Runtime's with intra_op_num_threads=1, measured in the same script on the same
# core (`taskset -c CORE`).
#   bash benches/onnx_floor.sh [TRIALS_PER_TASK=64] [CORE=1] [DB=target/onnx-floor/cls.db]
# Import, tune (resumable: run it again on the same DB), run: one command. Needs what
# `scripts/setup.sh --for-tests` installs (onnxruntime, the wheel in target/test-data).
set -euo pipefail
cd "$(dirname "$0")/.."
per_task=${1:-64}
core=${2:-1}
dir=target/onnx-floor
db=${3:-$dir/cls.db}
mkdir -p "$dir"
python3 tests/onnx/real_model.py target/test-data "$dir" >/dev/null
cargo build --release --quiet --bin tensortune
bin=target/release/tensortune
shape=x=1x3x48x192
tasks=$("$bin" tune-model "$dir/cls.onnx" --db "$dir/plan.db" --trials 0 --input-shape "$shape" | sed -n 's/^\([0-9]*\) tasks.*/\1/p')
echo "onnx_floor: $tasks tasks, $per_task trials each on core $core"
taskset -c "$core" "$bin" tune-model "$dir/cls.onnx" --db "$db" --trials $((tasks * per_task)) \
  --input-shape "$shape" --quiet | tail -n 3
echo "--- tensortune (records of $db), one thread"
taskset -c "$core" "$bin" run-model "$dir/cls.onnx" --db "$db" --inputs "$dir/cls.input.npy" \
  --output "$dir/cls.tensortune.npy" --repeat 50
echo "--- tensortune, the same records built into a program (Build::model, no LLVM), one thread"
cargo build --release --quiet --example model_build
taskset -c "$core" target/release/examples/model_build --model "$dir/cls.onnx" --db "$db" \
  --input-shape "$shape" --inputs "$dir/cls.input.npy" --repeat 50 --out "$dir/built" | sed -n 1,2p
echo "--- ONNX Runtime, intra_op_num_threads=1"
taskset -c "$core" python3 - "$dir" <<'PY'
import sys, time
import numpy as np
import onnxruntime as ort
d = sys.argv[1]
o = ort.SessionOptions()
o.intra_op_num_threads = 1
o.inter_op_num_threads = 1
s = ort.InferenceSession(f"{d}/cls.onnx", o, providers=["CPUExecutionProvider"])
x = np.load(f"{d}/cls.input.npy")
feed = {s.get_inputs()[0].name: x}
for _ in range(5):
    y = s.run(None, feed)
times = []
for _ in range(50):
    t = time.perf_counter()
    s.run(None, feed)
    times.append(time.perf_counter() - t)
ours = np.load(f"{d}/cls.tensortune.npy")
print(f"onnxruntime {ort.__version__}: end-to-end latency {np.median(times) * 1e3:.3f} ms (median of 50)")
print(f"largest difference of the outputs: {np.abs(ours - y[0]).max():.2e}")
PY
