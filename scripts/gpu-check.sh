#!/usr/bin/env bash
# The GPU check: one prepared run on a machine with an NVIDIA GPU and no Rust toolchain
# (scripts/gpu-bundle.sh builds what it runs, here). From the repository root:
#
#   bash scripts/gpu-check.sh [--budget-s N] [--trials N] [--max-s N] [--bundle DIR]
#
# Steps, each guarded (a failing step is recorded and the next one runs):
#   1. unpack the bundle (gpu-bundle/*.xz) into a temporary directory;
#   2. nvidia-smi;
#   3. the GPU test binaries of the bundle (gpu_worker's real_device_runs_ptx runs PTX on
#      the GPU, gpu_device runs a kernel on device arrays in-process), with TENSORTUNE_CUDA_WORKER set to the unpacked tensortune;
#   4. `tensortune tune --target cuda` of matmul 4096³, softmax 4096x4096 and a 3x3 conv2d
#      of 16x64x56x56, splitting --budget-s (default 420 s) between them;
#   5. the peers, in Python: PyTorch (cuBLAS without TF32, softmax, cuDNN conv2d) and a
#      Triton matmul autotuned over a few configurations, timed with CUDA events (median
#      of 25 after warm-up).
# It writes one JSON, $OUT/gpu-figures.json ($OUT if set, else the current directory):
# every step with an "error" field (null when it went well), the best latency of each
# workload from tensortune, PyTorch and Triton, and their ratios. It exits 0 only when
# every step went well; without a GPU every step says "no GPU" and it exits 1.
#
# Time: the tunes get --budget-s in all; the other steps have their own timeouts, and the
# tunes' share shrinks so that the whole run stays within --max-s (default 470 s, under
# eight minutes).
set -u

budget_s=420
trials=100000
max_s=470
bundle="gpu-bundle"
usage() {
    sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'
}
while [ $# -gt 0 ]; do
    case "$1" in
        --budget-s) budget_s=${2:-}; shift 2 || break ;;
        --trials) trials=${2:-}; shift 2 || break ;;
        --max-s) max_s=${2:-}; shift 2 || break ;;
        --bundle) bundle=${2:-}; shift 2 || break ;;
        -h | --help) usage; exit 0 ;;
        *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for v in "$budget_s" "$trials" "$max_s"; do
    case "$v" in
        '' | *[!0-9]*) echo "gpu-check: --budget-s, --trials and --max-s take whole numbers" >&2; exit 2 ;;
    esac
done

start=$SECONDS
out_dir=${OUT:-.}
mkdir -p "$out_dir"
figures="$out_dir/gpu-figures.json"
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
steps="$work/steps"
mkdir -p "$steps" "$work/bin"
linked_exe=""
# shellcheck disable=SC2317 # run by the trap below
cleanup() {
    # Only the link this script made, and only if it is still a link.
    if [ -n "$linked_exe" ] && [ -L "$linked_exe" ]; then
        rm -f "$linked_exe"
    fi
    rm -rf "$work"
}
trap cleanup EXIT

log() { printf '[gpu-check %3ds] %s\n' "$((SECONDS - start))" "$*" >&2; }

# A step's record: steps/NAME/{rc,out,err,note} (note: why it was skipped or degraded).
# run_step NAME TIMEOUT_S CMD...: runs CMD under a timeout, stdout and stderr to files.
run_step() {
    local name=$1 limit=$2
    shift 2
    mkdir -p "$steps/$name"
    log "$name: $* (timeout ${limit}s)"
    timeout -k 10 "$limit" "$@" >"$steps/$name/out" 2>"$steps/$name/err"
    local rc=$?
    echo "$rc" >"$steps/$name/rc"
    [ "$rc" -eq 124 ] && note "$name" "timed out after ${limit}s"
    log "$name: exit $rc"
    return "$rc"
}
note() {
    mkdir -p "$steps/$1"
    printf '%s\n' "$2" >>"$steps/$1/note"
}
skip() {
    note "$1" "$2"
    echo skipped >"$steps/$1/rc"
    log "$1: skipped ($2)"
}

# 1. The bundle.
mkdir -p "$steps/unpack"
if [ ! -f "$bundle/tensortune.xz" ]; then
    skip unpack "no bundle at $bundle/tensortune.xz (run scripts/gpu-bundle.sh where Rust is)"
else
    unpack_rc=0
    for f in "$bundle"/*.xz; do
        b=$(basename "$f" .xz)
        if xz -dc "$f" >"$work/bin/$b" 2>>"$steps/unpack/err"; then
            chmod +x "$work/bin/$b"
        else
            unpack_rc=1
            note unpack "cannot unpack $f"
            rm -f "$work/bin/$b"
        fi
    done
    echo "$unpack_rc" >"$steps/unpack/rc"
    cp "$bundle/MANIFEST" "$steps/unpack/out" 2>/dev/null || note unpack "no MANIFEST in $bundle"
    log "unpack: $(cd "$work/bin" && printf '%s ' *)"
fi
tt="$work/bin/tensortune"
export TENSORTUNE_CUDA_WORKER="$tt"

# 2. The GPU.
gpu=no
if command -v nvidia-smi >/dev/null; then
    run_step nvidia_smi 30 nvidia-smi
    cat "$steps/nvidia_smi/out"
    if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
        gpu=yes
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm \
            --format=csv,noheader >"$steps/nvidia_smi/query" 2>/dev/null
    else
        note nvidia_smi "no GPU"
    fi
else
    skip nvidia_smi "no GPU (nvidia-smi not found)"
fi
[ "$gpu" = no ] && log "no GPU: the steps below run and record what they can"

# 3. The GPU tests. They start the worker from the path cargo baked in at build time
# (CARGO_BIN_EXE_tensortune); where it is missing here, link the unpacked binary there.
exe=$(sed -n 's/^bin-exe //p' "$bundle/MANIFEST" 2>/dev/null)
if [ -x "$tt" ] && [ -n "$exe" ] && [ ! -e "$exe" ]; then
    if mkdir -p "$(dirname "$exe")" 2>/dev/null && ln -s "$tt" "$exe" 2>/dev/null; then
        linked_exe=$exe
        log "linked $exe to the unpacked tensortune"
    else
        log "cannot link $exe: tests that start a worker will fail"
    fi
fi
tests_run=0
for t in "$work"/bin/*; do
    name=$(basename "$t")
    [ "$name" = tensortune ] && continue
    tests_run=$((tests_run + 1))
    run_step "test_$name" 60 "$t" --nocapture --test-threads 2
    [ "$gpu" = no ] && note "test_$name" "no GPU: the real-device tests skipped themselves"
    tail -n 3 "$steps/test_$name/out" >&2
done
[ "$tests_run" -eq 0 ] && skip test_bundle "no test binaries unpacked"

# 4. The tunes: matmul, softmax, conv2d with shares of 40%, 20%, 40% of the tuning time
# (softmax's space, one cross-thread reduction sketch, is the smallest). The Python peers get
# 120 s; whatever the earlier steps took comes out of the tunes.
tune_left=$((max_s - (SECONDS - start) - 120 - 15))
[ "$tune_left" -gt "$budget_s" ] && tune_left=$budget_s
[ "$tune_left" -lt 30 ] && tune_left=30
echo "$tune_left" >"$work/tune_budget"
tune() {
    local name=$1 spec=$2 share=$3
    local s=$((tune_left * share / 100))
    [ "$s" -lt 10 ] && s=10
    # The tuner may pass its budget by a round and the final re-measurement: give it 80% of
    # the share as --time-budget, and kill it at the share plus a minute.
    local tb=$((s * 8 / 10))
    echo "$spec $tb" >"$work/tune_$name.spec"
    if [ ! -x "$tt" ]; then
        skip "tune_$name" "no tensortune binary (bundle not unpacked)"
        return
    fi
    run_step "tune_$name" $((s + 60)) "$tt" tune --target cuda --workload "$spec" \
        --trials "$trials" --time-budget "$tb" --db "$out_dir/gpu.db" --json --quiet
    [ "$gpu" = no ] && note "tune_$name" "no GPU"
    tail -n 2 "$steps/tune_$name/out" "$steps/tune_$name/err" >&2
}
tune matmul "matmul:M=4096,N=4096,K=4096" 40
tune softmax "softmax:M=4096,N=4096" 20
tune conv2d "conv2d:N=16,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1" 40

# 5. The peers. Their own process, so that a crash in CUDA or Triton leaves the rest.
mkdir -p "$steps/peers"
cat >"$work/peers.py" <<'PY'
"""PyTorch and an autotuned Triton matmul on the check's workloads, timed with CUDA events."""
import json
import statistics
import sys
import traceback

out = {"error": None, "versions": {}, "pytorch": {}, "triton": {}}


def fail(where, key, e):
    where[key] = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
    traceback.print_exc()


def timed(torch, fn, warmup=5, reps=25):
    """Median seconds of `fn` over `reps` launches, each between two CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return {"median_s": statistics.median(times), "min_s": min(times), "reps": reps}


try:
    import torch

    out["versions"]["torch"] = torch.__version__
    out["versions"]["cuda"] = torch.version.cuda
    if not torch.cuda.is_available():
        raise RuntimeError("no GPU (torch.cuda.is_available() is false)")
    out["device"] = torch.cuda.get_device_name(0)
    # fp32 as tensortune computes it: no TF32 in cuBLAS or cuDNN.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    g = torch.Generator(device="cuda").manual_seed(0)
    rand = lambda *s: torch.rand(*s, device="cuda", generator=g, dtype=torch.float32)
    a, b = rand(4096, 4096), rand(4096, 4096)
    x = rand(4096, 4096)
    img, w = rand(16, 64, 56, 56), rand(64, 64, 3, 3)
    cases = {
        "matmul": lambda: torch.matmul(a, b),
        "softmax": lambda: torch.softmax(x, dim=-1),
        "conv2d": lambda: torch.nn.functional.conv2d(img, w, stride=1, padding=1),
    }
    for name, fn in cases.items():
        try:
            out["pytorch"][name] = timed(torch, fn)
        except Exception as e:  # one case failing leaves the others
            fail(out["pytorch"], name, e)
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    traceback.print_exc()

if out["error"] is None:
    try:
        import triton
        import triton.language as tl

        out["versions"]["triton"] = triton.__version__

        # One program per BLOCK_M x BLOCK_N tile of C, walking K in BLOCK_K steps; fp32 in
        # and out, the products in full fp32 ("ieee": no TF32), like torch above.
        @triton.autotune(
            configs=[
                triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=nw, num_stages=ns)
                for bm, bn, bk, nw, ns in [
                    (128, 128, 32, 8, 3),
                    (128, 64, 32, 4, 4),
                    (64, 128, 32, 4, 4),
                    (64, 64, 32, 4, 5),
                    (128, 256, 16, 8, 3),
                    (256, 64, 16, 8, 3),
                ]
            ],
            key=["M", "N", "K"],
        )
        @triton.jit
        def tile_matmul(a_ptr, b_ptr, c_ptr, M, N, K,
                        s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
            rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
            cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            ks = tl.arange(0, BLOCK_K)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k in range(0, K, BLOCK_K):
                kk = k + ks
                lhs = tl.load(a_ptr + rows[:, None] * s_am + kk[None, :] * s_ak,
                              mask=(rows[:, None] < M) & (kk[None, :] < K), other=0.0)
                rhs = tl.load(b_ptr + kk[:, None] * s_bk + cols[None, :] * s_bn,
                              mask=(kk[:, None] < K) & (cols[None, :] < N), other=0.0)
                acc += tl.dot(lhs, rhs, input_precision="ieee")
            tl.store(c_ptr + rows[:, None] * s_cm + cols[None, :] * s_cn, acc,
                     mask=(rows[:, None] < M) & (cols[None, :] < N))

        c = torch.empty(4096, 4096, device="cuda", dtype=torch.float32)

        def run_triton():
            M, K = a.shape
            N = b.shape[1]
            grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))
            tile_matmul[grid](a, b, c, M, N, K, a.stride(0), a.stride(1),
                              b.stride(0), b.stride(1), c.stride(0), c.stride(1))

        try:
            run_triton()  # the autotuning happens here, on the first call
            torch.cuda.synchronize()
            ref = torch.matmul(a, b)
            err = ((c - ref).abs().max() / ref.abs().max()).item()
            r = timed(torch, run_triton)
            r["max_rel_err"] = err
            r["config"] = str(tile_matmul.best_config)
            if err > 1e-3:
                r["error"] = f"Triton's matmul differs from torch.matmul by {err:.2e}"
            out["triton"]["matmul"] = r
        except Exception as e:
            fail(out["triton"], "matmul", e)
    except Exception as e:
        fail(out["triton"], "matmul", e)

json.dump(out, open(sys.argv[1], "w"), indent=1)
PY
if ! command -v python3 >/dev/null; then
    skip peers "python3 not found"
else
    run_step peers 120 python3 "$work/peers.py" "$work/peers.json"
    [ "$gpu" = no ] && note peers "no GPU"
fi

# 6. The JSON.
cat >"$work/assemble.py" <<'PY'
"""Gathers the step records of gpu-check.sh into one JSON; prints a summary."""
import json
import os
import sys

work, figures_path, gpu, budget, elapsed = sys.argv[1:6]
steps_dir = os.path.join(work, "steps")


def read(*p):
    try:
        with open(os.path.join(*p), encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def tail(text, n=8):
    return "\n".join((text or "").strip().splitlines()[-n:]) or None


steps = {}
for name in sorted(os.listdir(steps_dir)):
    d = os.path.join(steps_dir, name)
    rc = (read(d, "rc") or "").strip()
    note = (read(d, "note") or "").strip() or None
    err = tail(read(d, "err"), 4)
    s = {"exit": int(rc) if rc.lstrip("-").isdigit() else rc or None}
    if rc == "0" and not note:
        s["error"] = None
    elif rc == "0":
        s["error"] = note
    else:
        s["error"] = "; ".join(x for x in [note, f"exit {rc}" if rc not in ("", "skipped") else None, err] if x) or "failed"
    if name.startswith("test_"):
        out = read(d, "out") or ""
        results = [l for l in out.splitlines() if l.startswith("test result:")]
        s["result"] = results[-1] if results else None
        s["real_device"] = [l for l in out.splitlines() if "real_device" in l or l.startswith(("device:", "add_one:", "matmul:", "skipped"))][:8]
    if name.startswith("tune_"):
        spec = (read(work, f"tune_{name[5:]}.spec") or " ").split()
        s["workload"], s["time_budget_s"] = spec[0], float(spec[1]) if len(spec) > 1 else None
        rows = []
        for line in (read(d, "out") or "").splitlines():
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
        s["reports"] = rows
        best = [r.get("best_latency_s") for r in rows if r.get("best_latency_s")]
        s["best_latency_s"] = min(best) if best else None
        s["trials"] = sum(r.get("trials") or 0 for r in rows) if rows else None
        # Candidates the verifier passed whose outputs the GPU got wrong: what a code
        # generation bug (shuffles, wide loads, virtual threads...) looks like.
        s["wrong_results"] = sum((r.get("failed_records") or {}).get("wrong_result", 0) for r in rows)
        if s["wrong_results"]:
            s["warning"] = (f"{s['wrong_results']} candidates gave wrong results on the GPU: "
                            "look for a code generation bug in their records")
        if s["error"] is None and s["best_latency_s"] is None:
            s["error"] = "no valid program (no best_latency_s in the --json output)"
    if name == "nvidia_smi":
        s["gpu"] = (read(d, "query") or "").strip() or None
    if name == "unpack":
        s["manifest"] = (read(d, "out") or "").strip().splitlines()
    steps[name] = s

peers = None
try:
    with open(os.path.join(work, "peers.json"), encoding="utf-8") as f:
        peers = json.load(f)
except (OSError, ValueError) as e:
    if "peers" in steps and steps["peers"]["error"] is None:
        steps["peers"]["error"] = f"no peers.json: {e}"
if peers is not None and "peers" in steps:
    steps["peers"]["versions"] = peers.get("versions")
    steps["peers"]["device"] = peers.get("device")
    if peers.get("error") and not steps["peers"]["error"]:
        steps["peers"]["error"] = peers["error"]
    elif peers.get("error"):
        steps["peers"]["error"] += "; " + peers["error"]

figures = {}
for w in ("matmul", "softmax", "conv2d"):
    t = steps.get(f"tune_{w}", {})
    f = {"workload": t.get("workload"), "tensortune_s": t.get("best_latency_s"),
         "tensortune_error": t.get("error") if t else "not run"}
    for peer in ("pytorch", "triton"):
        r = (peers or {}).get(peer, {}).get(w)
        if r is None:
            continue
        f[f"{peer}_s"] = r.get("median_s")
        if r.get("error"):
            f[f"{peer}_error"] = r["error"]
        if r.get("config"):
            f[f"{peer}_config"] = r["config"]
        if f["tensortune_s"] and r.get("median_s"):
            # Above 1: tensortune's kernel is that many times slower than the peer's.
            f[f"tensortune_over_{peer}"] = f["tensortune_s"] / r["median_s"]
    figures[w] = f

ok = gpu == "yes" and all(s["error"] is None for s in steps.values())
doc = {
    "ok": ok,
    "error": None if ok else ("no GPU" if gpu != "yes" else "a step failed (see steps)"),
    "gpu": gpu == "yes",
    "tune_budget_s": int(budget),
    "elapsed_s": int(elapsed),
    "figures": figures,
    "steps": steps,
}
with open(figures_path, "w", encoding="utf-8") as f:
    json.dump(doc, f, indent=1)
for w, f in figures.items():
    def ms(x):
        return f"{x * 1e3:9.3f} ms" if x else "        --"
    print(f"{w:8} tensortune {ms(f.get('tensortune_s'))}  pytorch {ms(f.get('pytorch_s'))}"
          f"  triton {ms(f.get('triton_s'))}")
for name, s in steps.items():
    print(f"{name:20} {'ok' if s['error'] is None else 'ERROR: ' + s['error'].splitlines()[0][:120]}")
    if s.get("warning"):
        print(f"{'':20} warning: {s['warning']}")
sys.exit(0 if ok else 1)
PY
log "writing $figures"
rc=1
if command -v python3 >/dev/null; then
    python3 "$work/assemble.py" "$work" "$figures" "$gpu" "$(cat "$work/tune_budget")" \
        "$((SECONDS - start))"
    rc=$?
fi
if [ ! -s "$figures" ] || { [ "$rc" -ne 0 ] && [ "$rc" -ne 1 ]; }; then
    # No Python, or the assembly itself failed: a JSON that says so.
    printf '{"ok": false, "error": "could not assemble the figures (python3 missing or failed, exit %s)", "gpu": %s}\n' \
        "$rc" "$([ "$gpu" = yes ] && echo true || echo false)" >"$figures"
    rc=1
fi
log "done in $((SECONDS - start))s, exit $rc"
exit "$rc"
