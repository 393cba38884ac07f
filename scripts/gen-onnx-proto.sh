#!/usr/bin/env bash
# Regenerates model/src/proto/onnx.rs, the prost messages of ONNX's onnx.proto (checked in
# beside it, copied from the `onnx` PyPI wheel). The generated file is checked in so that
# building tensortune needs no protoc; run this only after replacing onnx.proto. It builds a
# throwaway generator (prost-build with the protoc of protoc-bin-vendored) in a temporary
# folder, a minute or two.
#   bash scripts/gen-onnx-proto.sh
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src" "$work/out"
cat > "$work/Cargo.toml" <<'TOML'
[package]
name = "onnx-protogen"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
prost-build = "0.14"
protoc-bin-vendored = "3"
TOML
cat > "$work/src/main.rs" <<'RS'
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (proto, out) = (&args[1], &args[2]);
    let dir = std::path::Path::new(proto).parent().expect("the proto's folder");
    prost_build::Config::new()
        .protoc_executable(protoc_bin_vendored::protoc_bin_path().expect("a vendored protoc"))
        .out_dir(out)
        .compile_protos(&[proto], &[dir])
        .expect("protoc and prost-build");
}
RS
cargo run --quiet --release --manifest-path "$work/Cargo.toml" -- \
  "$repo/model/src/proto/onnx.proto" "$work/out"
cp "$work/out/onnx.rs" model/src/proto/onnx.rs
rustfmt --edition 2021 model/src/proto/onnx.rs
echo "gen-onnx-proto: wrote model/src/proto/onnx.rs"
