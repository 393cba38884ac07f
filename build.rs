//! Compiles the one C++ function tensortune needs from LLVM that its C API lacks: parsing
//! command-line options with their errors reported (`src/codegen/llvm/options.cpp`).

use std::path::PathBuf;
use std::process::Command;

/// The `llvm-config` of the LLVM 19 that `llvm-sys` links: under `LLVM_SYS_191_PREFIX` when
/// that is set (as llvm-sys itself looks first), else `llvm-config-19`, else a plain
/// `llvm-config` that reports version 19 (on Debian the plain one may be another version).
fn llvm_config() -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(prefix) = std::env::var_os("LLVM_SYS_191_PREFIX") {
        candidates.push(PathBuf::from(prefix).join("bin").join("llvm-config"));
    }
    candidates.push(PathBuf::from("llvm-config-19"));
    candidates.push(PathBuf::from("llvm-config"));
    candidates.into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .is_some_and(|o| String::from_utf8_lossy(&o.stdout).starts_with("19."))
    })
}

fn main() {
    println!("cargo:rerun-if-changed=src/codegen/llvm/options.cpp");
    println!("cargo:rerun-if-env-changed=LLVM_SYS_191_PREFIX");
    let Some(config) = llvm_config() else {
        // llvm-sys stops the build with its own message when it finds no LLVM 19 either.
        println!("cargo:warning=no llvm-config for LLVM 19 found (set LLVM_SYS_191_PREFIX)");
        return;
    };
    let include = Command::new(&config)
        .arg("--includedir")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .include(include)
        .flag_if_supported("-fno-exceptions")
        .flag_if_supported("-fno-rtti")
        .define("_GNU_SOURCE", None)
        .define("__STDC_CONSTANT_MACROS", None)
        .define("__STDC_FORMAT_MACROS", None)
        .define("__STDC_LIMIT_MACROS", None)
        .warnings(false)
        .file("src/codegen/llvm/options.cpp")
        .compile("tensortune_llvm_options");
}
