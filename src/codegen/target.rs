//! The host CPU as LLVM sees it.

use std::sync::OnceLock;
use tensortune_schedules::target::{CacheSizes, CpuDesc, TargetDesc, TargetKey};

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
            // Only the target's registration is needed here, which happens even when the
            // options are refused; that error reaches whoever compiles.
            let _ = super::llvm::init_llvm();
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
        self.target_key(threads).to_string()
    }

    /// [`HostTarget::key`], parsed.
    pub fn target_key(&self, threads: usize) -> TargetKey {
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
        TargetKey::llvm(&self.cpu, attrs, threads)
    }

    /// What the search reads about this CPU with `threads` threads: its vector width, the
    /// width of its FMA pipes and, where Linux reports them, its cache sizes.
    pub fn desc(&self, threads: usize) -> TargetDesc {
        TargetDesc::Cpu(CpuDesc {
            vector_bits: self.vector_bits,
            vector_unit_bits: tensortune_schedules::target::vector_unit_bits(
                &self.cpu,
                self.vector_bits,
            ),
            l1_ways: tensortune_schedules::target::l1_ways(&self.cpu),
            threads: threads.max(1),
            caches: *host_caches(),
        })
    }
}

/// The data cache sizes of CPU 0 from Linux's sysfs (unknown elsewhere; read once).
fn host_caches() -> &'static CacheSizes {
    static CACHES: OnceLock<CacheSizes> = OnceLock::new();
    CACHES.get_or_init(|| {
        let mut c = CacheSizes::default();
        for i in 0..8 {
            let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
            let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
            let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
            else {
                continue;
            };
            let Some(bytes) = crate::runtime::cache::parse_cache_size(size.trim()) else {
                continue;
            };
            let bytes = bytes as u64;
            match (level.trim(), kind.trim()) {
                ("1", "Data") => c.l1d = Some(bytes),
                ("2", "Unified" | "Data") => c.l2 = Some(bytes),
                ("3", "Unified") => c.l3 = Some(bytes),
                _ => {}
            }
        }
        c
    })
}
