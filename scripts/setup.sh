#!/usr/bin/env bash
# Installs what tensortune needs on a Debian machine, and only what is missing. Each need is
# checked by what it provides (a command, a library, a header), not by a package name, so a
# tool installed some other way counts:
#   LLVM 19 (llvm-config-19, linked statically through inkwell, with Polly and zstd);
#   the build tools of XGBoost's bundled C++ source (cmake, ninja, a C++ compiler, libclang);
#   with --for-tests, also Debian's chromium (a test renders `tensortune report` in it),
#   Debian's postgresql (the records tests' server, started by scripts/pg-test-server.sh),
#   Debian's slurm-wlm and munge (a single-node cluster, scripts/slurm-test-cluster.sh),
#   numpy (the baseline benchmarks), onnx and onnxruntime with a CNN's wheel (the ONNX tests)
#   and, best effort, ptxas from the nvidia-cuda-nvcc-cu12
#   wheel (tests/nvptx.rs assembles the PTX it emits; it skips that check without one).
#
#   bash scripts/setup.sh [--for-tests]
#
# As root it runs apt-get itself; otherwise through sudo only when sudo needs no password.
# When it cannot install, it prints the exact command to run and exits 1. Safe to run again.
set -euo pipefail
for_tests=0
for a in "$@"; do
  case "$a" in
    --for-tests) for_tests=1 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup: unknown argument '$a' (expected --for-tests)" >&2; exit 2 ;;
  esac
done

need=()
has_cmd() { command -v "$1" >/dev/null 2>&1; }
# A file that some candidate path holds (globs allowed).
has_file() { local f; for f in "$@"; do [ -e "$f" ] && return 0; done; return 1; }

# Polly with LLVM: llvm-sys links every component llvm-config lists, Polly's among them, and
# a machine that gets llvm-19-dev here has not had its libPolly.a checked for yet.
has_cmd llvm-config-19 || need+=(llvm-19-dev libpolly-19-dev)
if has_cmd llvm-config-19; then
  libdir="$(llvm-config-19 --libdir)"
  has_file "$libdir"/libPolly.a || need+=(libpolly-19-dev)
fi
has_file /usr/include/zstd.h /usr/local/include/zstd.h || need+=(libzstd-dev)
has_cmd cmake || need+=(cmake)
has_cmd ninja || need+=(ninja-build)
has_cmd c++ || has_cmd g++ || has_cmd clang++ || need+=(clang)
# bindgen (XGBoost's raw bindings) loads libclang at build time: `libclang.so*` or
# `libclang-N.so*`. Not `libclang-cpp.so.N`, the C++ library that llvm-19-dev brings along,
# which bindgen cannot use (matching it left a fresh machine without libclang).
if [ -z "${LIBCLANG_PATH:-}" ]; then
  found_libclang=0
  for d in /usr/lib/llvm-*/lib /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu; do
    has_file "$d"/libclang.so* "$d"/libclang-[0-9]*.so* && found_libclang=1
  done
  [ "$found_libclang" -eq 1 ] || need+=(libclang-dev)
fi
if [ "$for_tests" -eq 1 ]; then
  has_cmd chromium || has_cmd chromium-browser || [ -n "${TENSORTUNE_CHROMIUM:-}" ] || need+=(chromium)
  # The server's own binaries (Debian keeps them off the PATH), not only a client.
  has_cmd pg_ctl || has_file /usr/lib/postgresql/*/bin/pg_ctl || need+=(postgresql)
  # The daemons live in /usr/sbin, off a user's PATH.
  has_cmd slurmctld || has_file /usr/sbin/slurmctld || need+=(slurm-wlm)
  has_cmd munged || has_file /usr/sbin/munged || need+=(munge)
fi

if [ "${#need[@]}" -gt 0 ]; then
  line="apt-get install -y ${need[*]}"
  if [ "$(id -u)" -eq 0 ]; then
    sudo=""
  elif has_cmd sudo && sudo -n true 2>/dev/null; then
    sudo="sudo"
  else
    echo "setup: missing: ${need[*]}" >&2
    echo "setup: install them with:  sudo apt-get update && sudo $line" >&2
    echo "setup: (or run the scripts with --skip-setup once they are installed another way)" >&2
    exit 1
  fi
  echo "setup: installing ${need[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [ "$for_tests" -eq 1 ] && ! python3 -c 'import numpy' >/dev/null 2>&1; then
  python3 -m pip install -q numpy threadpoolctl >/dev/null 2>&1 ||
    echo "setup: numpy not installed (only the baseline benchmark needs it)" >&2
fi

# The ONNX tests compare with ONNX Runtime and run ONNX's own node tests, which the onnx wheel
# ships only up to 1.19; the real-model test reads a CNN from the rapidocr-onnxruntime wheel
# (downloaded, not installed: its dependencies are not needed). Best effort: without them those
# tests say so and pass.
if [ "$for_tests" -eq 1 ]; then
  if ! python3 -c 'import onnxruntime' >/dev/null 2>&1 ||
    [ ! -d "$(python3 -c 'import onnx, os; print(os.path.dirname(onnx.__file__))' 2>/dev/null)/backend/test/data/node" ]; then
    python3 -m pip install -q 'onnx>=1.16,<1.20' onnxruntime >/dev/null 2>&1 ||
      echo "setup: onnx/onnxruntime not installed (the ONNX tests then skip)" >&2
  fi
  if ! ls target/test-data/rapidocr_onnxruntime-1.4.4-*.whl >/dev/null 2>&1; then
    mkdir -p target/test-data
    python3 -m pip download -q --no-deps rapidocr-onnxruntime==1.4.4 -d target/test-data >/dev/null 2>&1 ||
      echo "setup: the rapidocr-onnxruntime wheel was not downloaded (the real-model test then skips)" >&2
  fi
fi

if [ "$for_tests" -eq 1 ] && [ -z "${PTXAS:-}" ] && ! has_cmd ptxas &&
  ! python3 -c 'import nvidia.cuda_nvcc' >/dev/null 2>&1; then
  python3 -m pip install -q nvidia-cuda-nvcc-cu12 >/dev/null 2>&1 ||
    echo "setup: ptxas not installed (tests/nvptx.rs then skips assembling its PTX)" >&2
fi
