//! Links XGBoost statically into everything that depends on this crate.
//!
//! `xgboost_lib-sys` (feature `local_build`) compiles XGBoost's bundled C++ with CMake into a
//! shared library and asks for `-lxgboost`. A binary linked that way needs `libxgboost.so` at
//! run time, which only `cargo run` and `cargo test` put on the loader's path: the same binary
//! run directly, copied, or installed with `cargo install` fails to start.
//!
//! That CMake build compiles the library from an object library (`objxgboost`) whose object
//! files stay in its build directory. Cargo tells us where (`DEP_XGBOOST_ROOT`: the bindings
//! crate declares `links = "xgboost"` and its CMake step prints `root`), so we archive those
//! objects into a static library of our own, which rustc bundles into this crate's rlib. The
//! linker resolves every XGBoost symbol from it before it reaches `-lxgboost`, and rustc's
//! `--as-needed` then leaves the shared library out of the binary. Nothing is compiled twice.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DEP_XGBOOST_ROOT");
    let root = match std::env::var_os("DEP_XGBOOST_ROOT") {
        Some(root) => PathBuf::from(root),
        None => fail("DEP_XGBOOST_ROOT is not set: xgboost_lib-sys ran no CMake build"),
    };
    let objects_dir = root.join("build/src/CMakeFiles/objxgboost.dir");
    let mut objects = Vec::new();
    if let Err(e) = collect_objects(&objects_dir, &mut objects) {
        fail(&format!("cannot read {}: {e}", objects_dir.display()));
    }
    if objects.is_empty() {
        fail(&format!("no object files under {}", objects_dir.display()));
    }
    // Sorted, so that the archive (and its hash in the rlib) is the same on every build.
    objects.sort();
    let archive = cc::Build::new()
        .cargo_metadata(false)
        .try_create_archive("tensortune_xgboost", &objects);
    let archive = match archive {
        Ok(path) => path,
        Err(e) => fail(&format!("archiving XGBoost's objects: {e}")),
    };
    if let Some(dir) = archive.parent() {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    println!("cargo:rustc-link-lib=static=tensortune_xgboost");
}

/// Every `.o` file below `dir`.
fn collect_objects(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_objects(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "o") {
            out.push(path);
        }
    }
    Ok(())
}

/// A build script reports failure by exiting non-zero with the reason on stderr.
fn fail(message: &str) -> ! {
    eprintln!("tensortune-cost-model build: {message}");
    std::process::exit(1);
}
