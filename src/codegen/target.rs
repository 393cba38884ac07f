//! The host CPU as LLVM sees it.

use std::sync::OnceLock;

/// The host CPU: triple, LLVM CPU name and feature string, and the vector width codegen uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostTarget {
    /// LLVM target triple, e.g. `x86_64-unknown-linux-gnu`.
    pub triple: String,
    /// LLVM CPU name, e.g. `znver4`, `sapphirerapids`.
    pub cpu: String,
    /// LLVM feature string, `+f1,-f2,...`, as the host reports it.
    pub features: String,
    /// Width in bits of the vectors generated code should use: 512 where AVX-512F is present,
    /// 256 with AVX2, else 128.
    pub vector_bits: u32,
}

impl HostTarget {
    /// The machine this process runs on (computed once).
    pub fn host() -> &'static HostTarget {
        static HOST: OnceLock<HostTarget> = OnceLock::new();
        HOST.get_or_init(|| {
            super::llvm::init_llvm();
            let triple = inkwell::targets::TargetMachine::get_default_triple();
            let cpu = inkwell::targets::TargetMachine::get_host_cpu_name().to_string();
            let features = inkwell::targets::TargetMachine::get_host_cpu_features().to_string();
            let has = |f: &str| features.split(',').any(|x| x == format!("+{f}"));
            let vector_bits = if has("avx512f") {
                512
            } else if has("avx2") {
                256
            } else {
                128
            };
            HostTarget {
                triple: triple.as_str().to_string_lossy().into_owned(),
                cpu,
                features,
                vector_bits,
            }
        })
    }

    /// True if the host has the LLVM feature `name` (e.g. `avx512f`).
    pub fn has_feature(&self, name: &str) -> bool {
        self.features
            .split(',')
            .any(|x| x.strip_prefix('+') == Some(name))
    }

    /// Lanes of a vector register for elements of `bytes` bytes.
    pub fn lanes(&self, bytes: usize) -> usize {
        (self.vector_bits as usize / 8) / bytes.max(1)
    }

    /// The target key records are filed under, e.g.
    /// `llvm -mcpu=znver4 -mattr=+avx2,+avx512f,+fma -threads=1`: the CPU name, the enabled
    /// SIMD features that change generated code, and the thread count.
    pub fn key(&self, threads: usize) -> String {
        const KEY_FEATURES: [&str; 8] = [
            "avx",
            "avx2",
            "fma",
            "avx512f",
            "avx512bw",
            "avx512dq",
            "avx512vl",
            "avx512bf16",
        ];
        let attrs: Vec<String> = KEY_FEATURES
            .iter()
            .filter(|f| self.has_feature(f))
            .map(|f| format!("+{f}"))
            .collect();
        format!(
            "llvm -mcpu={} -mattr={} -threads={}",
            self.cpu,
            attrs.join(","),
            threads.max(1)
        )
    }
}
