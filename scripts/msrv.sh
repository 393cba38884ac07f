#!/usr/bin/env bash
# Checks the declared minimum Rust version (`rust-version` of the workspace) against the locked
# dependencies: every package that Cargo.lock resolves for this platform and that states a
# `rust-version` must accept the declared one. Fails, naming the packages, when one needs a
# newer Rust. A declaration above what they need is reported, not refused: our own code may
# need more. Its use of std APIs newer than the declaration is checked by clippy
# (`incompatible_msrv`), which reads the same field.
set -euo pipefail
cd "$(dirname "$0")/.."
host=$(rustc -vV | sed -n 's/^host: //p')
cargo metadata --format-version 1 --locked --filter-platform "$host" |
  python3 -c '
import json, sys

def version(text):
    parts = [int(p) for p in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))

def dotted(v):
    return ".".join(map(str, v))

meta = json.load(sys.stdin)
members = set(meta["workspace_members"])
declared = {p["rust_version"] for p in meta["packages"] if p["id"] in members}
if len(declared) != 1 or None in declared:
    sys.exit(f"msrv: the workspace crates declare {sorted(map(str, declared))}: want one rust-version for all")
ours = declared.pop()
needs = [(version(p["rust_version"]), p["name"], p["version"])
         for p in meta["packages"] if p["id"] not in members and p["rust_version"]]
too_new = sorted(n for n in needs if n[0] > version(ours))
if too_new:
    listed = ", ".join(f"{name} {v} (rust {dotted(r)})" for r, name, v in too_new)
    sys.exit(f"msrv: rust-version {ours} is too old for the locked {listed}")
highest = max(needs)[0] if needs else (0, 0, 0)
if highest < version(ours):
    print(f"msrv: note: the locked dependencies need only rust {dotted(highest)}")
print(f"msrv: rust-version {ours} matches the locked dependencies ({len(needs)} state one)")
'
