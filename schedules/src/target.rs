//! Targets as values: the parsed key records are filed under ([`TargetKey`]) and the plain-data
//! description of the machine the search reads ([`TargetDesc`]).
//!
//! They live in the lowest crate so that records, the tuner and the backends all see them
//! without the tuner depending on a backend. A key is text in the records database and on the
//! command line; this module is the only place that takes that text apart:
//!
//! ```
//! use tensortune_schedules::target::{TargetKey, TargetKind};
//! let key: TargetKey = "llvm -mcpu=znver4 -mattr=+avx2,+fma -threads=4".parse().unwrap();
//! assert_eq!(key.kind(), TargetKind::Cpu);
//! assert_eq!(key.threads(), 4);
//! assert_eq!(key.to_string(), "llvm -mcpu=znver4 -mattr=+avx2,+fma -threads=4");
//! assert!("opencl".parse::<TargetKey>().is_err());
//! ```
//!
//! **Invariant**: `key.to_string().parse() == Ok(key)` for every key, and a key written in the
//! canonical order (`-mcpu`, `-mattr`, `-threads` for `llvm`; `-arch` for `cuda`, each at most
//! once) prints back as the same text, so the keys already in databases keep matching.

use crate::expr::DType;
use std::fmt;
use std::str::FromStr;

/// The kind of machine, which picks a backend's rule list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TargetKind {
    /// A CPU through LLVM (`llvm`).
    Cpu,
    /// An NVIDIA GPU (`cuda`).
    Cuda,
}

/// A target key, parsed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TargetKey {
    /// `llvm [-mcpu=NAME] [-mattr=+f1,+f2...] [-threads=N]`.
    Llvm(LlvmKey),
    /// `cuda [-arch=sm_NN]`.
    Cuda(CudaKey),
}

/// The options of an `llvm` key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LlvmKey {
    /// LLVM CPU name (`-mcpu=`), e.g. `znver4`.
    pub cpu: Option<String>,
    /// The SIMD features named (`-mattr=`, each with its `+`); `Some(vec![])` for a key that
    /// names none (`-mattr=`), which a CPU without AVX writes.
    pub features: Option<Vec<String>>,
    /// Worker threads (`-threads=`); a key without it means one.
    pub threads: Option<usize>,
}

/// The options of a `cuda` key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CudaKey {
    /// The compute capability (`-arch=`), e.g. `sm_90`.
    pub arch: Option<String>,
}

/// Why a text is not a target key; every variant names the key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetKeyError {
    /// The first word is not a target kind this crate knows.
    #[error("unknown target `{key}`: expected `llvm ...` or `cuda ...`")]
    UnknownKind {
        /// The key as given.
        key: String,
    },
    /// An option the kind does not take.
    #[error("target `{key}`: unknown option `{option}`")]
    UnknownOption {
        /// The key as given.
        key: String,
        /// The option.
        option: String,
    },
    /// An option given twice.
    #[error("target `{key}`: option `{option}` given twice")]
    Duplicate {
        /// The key as given.
        key: String,
        /// The option's name.
        option: String,
    },
    /// An option whose value does not parse.
    #[error("target `{key}`: bad value in `{option}`: {reason}")]
    BadValue {
        /// The key as given.
        key: String,
        /// The option.
        option: String,
        /// What was expected.
        reason: String,
    },
}

impl TargetKey {
    /// An `llvm` key.
    pub fn llvm(cpu: &str, features: Vec<String>, threads: usize) -> TargetKey {
        TargetKey::Llvm(LlvmKey {
            cpu: Some(cpu.to_string()),
            features: Some(features),
            threads: Some(threads.max(1)),
        })
    }

    /// The kind of machine it names.
    pub fn kind(&self) -> TargetKind {
        match self {
            TargetKey::Llvm(_) => TargetKind::Cpu,
            TargetKey::Cuda(_) => TargetKind::Cuda,
        }
    }

    /// Threads for parallel loops: the key's `-threads=`, else 1 (a GPU key: 1).
    pub fn threads(&self) -> usize {
        match self {
            TargetKey::Llvm(k) => k.threads.unwrap_or(1).max(1),
            TargetKey::Cuda(_) => 1,
        }
    }

    /// The same key with `threads` threads (a GPU key is returned as it is).
    pub fn with_threads(&self, threads: usize) -> TargetKey {
        match self {
            TargetKey::Llvm(k) => TargetKey::Llvm(LlvmKey {
                threads: Some(threads.max(1)),
                ..k.clone()
            }),
            TargetKey::Cuda(_) => self.clone(),
        }
    }

    /// The key without its thread count: what names the machine's code generation. Two keys
    /// with the same machine part take the same object code.
    pub fn machine(&self) -> TargetKey {
        match self {
            TargetKey::Llvm(k) => TargetKey::Llvm(LlvmKey {
                threads: None,
                ..k.clone()
            }),
            TargetKey::Cuda(_) => self.clone(),
        }
    }

    /// What the key alone says of a CPU: its widest vectors, the width of its FMA pipes and
    /// the ways of its L1 (both from the CPU's name), and its threads (cache sizes unknown).
    /// `None` for a GPU key, whose description comes from the device, not the key.
    pub fn cpu_desc(&self) -> Option<TargetDesc> {
        match self {
            TargetKey::Llvm(k) => {
                let bits = k.vector_bits();
                let cpu = k.cpu.as_deref().unwrap_or("");
                Some(
                    TargetDesc::cpu(bits, self.threads())
                        .with_vector_unit_bits(vector_unit_bits(cpu, bits))
                        .with_l1_ways(l1_ways(cpu)),
                )
            }
            TargetKey::Cuda(_) => None,
        }
    }
}

impl LlvmKey {
    /// True if the key's `-mattr` enables `feature` (named without its `+`).
    pub fn has_feature(&self, feature: &str) -> bool {
        self.features
            .iter()
            .flatten()
            .any(|f| f.strip_prefix('+') == Some(feature))
    }

    /// The widest vectors the key's features allow, in bits: 512 with AVX-512F, 256 with AVX
    /// or AVX2, else 128 (a key without `-mattr` promises no more than SSE).
    pub fn vector_bits(&self) -> u32 {
        if self.has_feature("avx512f") {
            512
        } else if self.has_feature("avx") || self.has_feature("avx2") {
            256
        } else {
            128
        }
    }
}

impl FromStr for TargetKey {
    type Err = TargetKeyError;

    fn from_str(s: &str) -> Result<TargetKey, TargetKeyError> {
        let mut words = s.split_whitespace();
        let unknown = || TargetKeyError::UnknownKind { key: s.to_string() };
        match words.next().ok_or_else(unknown)? {
            "llvm" => parse_llvm(s, words).map(TargetKey::Llvm),
            "cuda" => parse_cuda(s, words).map(TargetKey::Cuda),
            _ => Err(unknown()),
        }
    }
}

/// Splits `-name=value`; the option text for errors is the whole word.
fn option(key: &str, word: &str) -> Result<(String, String), TargetKeyError> {
    word.strip_prefix('-')
        .and_then(|w| w.split_once('='))
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .ok_or_else(|| TargetKeyError::UnknownOption {
            key: key.to_string(),
            option: word.to_string(),
        })
}

/// Sets `slot` once, or reports the option as given twice.
fn set_once<T>(
    slot: &mut Option<T>,
    value: T,
    key: &str,
    name: &str,
) -> Result<(), TargetKeyError> {
    if slot.is_some() {
        return Err(TargetKeyError::Duplicate {
            key: key.to_string(),
            option: name.to_string(),
        });
    }
    *slot = Some(value);
    Ok(())
}

fn parse_llvm<'a>(
    key: &str,
    words: impl Iterator<Item = &'a str>,
) -> Result<LlvmKey, TargetKeyError> {
    let mut k = LlvmKey::default();
    for word in words {
        let (name, value) = option(key, word)?;
        let bad = |reason: &str| TargetKeyError::BadValue {
            key: key.to_string(),
            option: word.to_string(),
            reason: reason.to_string(),
        };
        match name.as_str() {
            "mcpu" if !value.is_empty() => set_once(&mut k.cpu, value, key, "-mcpu")?,
            "mcpu" => return Err(bad("a CPU name")),
            "mattr" => {
                let features: Vec<String> = value
                    .split(',')
                    .filter(|f| !f.is_empty())
                    .map(str::to_string)
                    .collect();
                if features
                    .iter()
                    .any(|f| !f.starts_with(['+', '-']) || f.len() < 2)
                {
                    return Err(bad("features of the form +name or -name"));
                }
                set_once(&mut k.features, features, key, "-mattr")?
            }
            "threads" => {
                let n = value
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| bad("a thread count of at least 1"))?;
                set_once(&mut k.threads, n, key, "-threads")?
            }
            _ => {
                return Err(TargetKeyError::UnknownOption {
                    key: key.to_string(),
                    option: word.to_string(),
                })
            }
        }
    }
    Ok(k)
}

fn parse_cuda<'a>(
    key: &str,
    words: impl Iterator<Item = &'a str>,
) -> Result<CudaKey, TargetKeyError> {
    let mut k = CudaKey::default();
    for word in words {
        match option(key, word)? {
            (name, value) if name == "arch" && value.starts_with("sm_") && value.len() > 3 => {
                set_once(&mut k.arch, value, key, "-arch")?
            }
            (name, _) if name == "arch" => {
                return Err(TargetKeyError::BadValue {
                    key: key.to_string(),
                    option: word.to_string(),
                    reason: "a compute capability such as sm_90".to_string(),
                })
            }
            _ => {
                return Err(TargetKeyError::UnknownOption {
                    key: key.to_string(),
                    option: word.to_string(),
                })
            }
        }
    }
    Ok(k)
}

impl fmt::Display for TargetKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetKey::Llvm(k) => {
                f.write_str("llvm")?;
                if let Some(cpu) = &k.cpu {
                    write!(f, " -mcpu={cpu}")?;
                }
                if let Some(features) = &k.features {
                    write!(f, " -mattr={}", features.join(","))?;
                }
                if let Some(n) = k.threads {
                    write!(f, " -threads={n}")?;
                }
                Ok(())
            }
            TargetKey::Cuda(k) => {
                f.write_str("cuda")?;
                if let Some(arch) = &k.arch {
                    write!(f, " -arch={arch}")?;
                }
                Ok(())
            }
        }
    }
}

/// What a schedule depends on in a machine: plain data the search reads (the sketch rules
/// and random annotation take vector lanes, threads and, on a GPU, the thread limits from it).
#[derive(Clone, Debug, PartialEq)]
pub enum TargetDesc {
    /// A CPU.
    Cpu(CpuDesc),
    /// An NVIDIA GPU.
    Cuda(CudaDesc),
}

/// A CPU as the search sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuDesc {
    /// Width of the vector registers generated code uses, in bits (512 with AVX-512F).
    pub vector_bits: u32,
    /// Width of what one FMA pipe takes per cycle, in bits: `vector_bits`, except on cores
    /// that run each 512-bit operation as two 256-bit halves ([`vector_unit_bits`]). On
    /// those a half vector costs half a whole one; elsewhere it costs as much, so the search
    /// prefers axes that fill whole vectors.
    pub vector_unit_bits: u32,
    /// Ways of each of the L1 data cache's 64 sets ([`l1_ways`]): how many lines 4 KiB apart
    /// it holds at once.
    pub l1_ways: u32,
    /// Worker threads parallel loops may use (1: no parallel loops).
    pub threads: usize,
    /// Cache sizes, where known.
    pub caches: CacheSizes,
}

/// Data cache sizes in bytes, per core for L1 and L2; `None` where not known.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheSizes {
    /// Level-1 data cache.
    pub l1d: Option<u64>,
    /// Level-2 cache.
    pub l2: Option<u64>,
    /// Last-level cache (shared).
    pub l3: Option<u64>,
}

/// An NVIDIA GPU as the search sees it: filled by the CUDA backend from the device where
/// there is one, else taken from the table of known architectures ([`CudaDesc::for_arch`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaDesc {
    /// The compute capability it describes, e.g. `sm_90` (what errors name).
    pub arch: String,
    /// Threads that execute in lockstep (32 on every NVIDIA GPU so far).
    pub warp_size: u32,
    /// Most threads in one block.
    pub max_threads_per_block: u32,
    /// Shared memory one block may allocate, in bytes.
    pub shared_memory_per_block: u64,
    /// Most 32-bit registers one thread may use.
    pub registers_per_thread: u32,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Level-2 cache, in bytes, shared by every multiprocessor: what a tile that should stay
    /// on chip between blocks is weighed against.
    pub l2_bytes: u64,
}

/// Static shared memory one block may declare on every architecture of the table: 48 KiB.
/// Larger amounts exist only as dynamic shared memory a kernel opts in to at launch
/// (`cudaFuncAttributeMaxDynamicSharedMemorySize`): up to 163 KiB on sm_80, 99 KiB on sm_86
/// and sm_89, 227 KiB on sm_90. The kernels made here declare theirs statically, so the
/// static limit is the one that holds.
pub const STATIC_SHARED_PER_BLOCK: u64 = 48 * 1024;

/// The known architectures, with the multiprocessors and L2 of the part each row stands for
/// (one architecture spans parts of different sizes; the search's estimates need only one).
const ARCHS: &[(&str, u32, u64)] = &[
    // A100 (SXM4 and PCIe, 40 or 80 GB alike): 108 SMs, 40 MiB L2.
    ("sm_80", 108, 40 << 20),
    // A10 (the data-center Ampere part; RTX 30 cards have 28 to 84 SMs): 72 SMs, 6 MiB L2.
    ("sm_86", 72, 6 << 20),
    // L4 (Ada; RTX 40 cards have 24 to 128 SMs): 58 SMs, 48 MiB L2.
    ("sm_89", 58, 48 << 20),
    // H100 SXM5, which H200 shares: 132 SMs, 50 MiB L2 (H100 PCIe has 114 SMs).
    ("sm_90", 132, 50 << 20),
];

impl CudaDesc {
    /// The description of a known architecture (`sm_90`; `sm_90a`, the same chip with its
    /// architecture-specific instructions, reads the row of `sm_90`), or `None` for one not
    /// in the table (see [`CudaDesc::known_archs`]). The per-block limits are those every
    /// part of the architecture shares: warps of 32, 1024 threads a block, 48 KiB of static
    /// shared memory ([`STATIC_SHARED_PER_BLOCK`]), 255 registers a thread.
    pub fn for_arch(arch: &str) -> Option<CudaDesc> {
        let base = arch.strip_suffix('a').unwrap_or(arch);
        let &(_, multiprocessors, l2_bytes) = ARCHS.iter().find(|(name, ..)| *name == base)?;
        Some(CudaDesc {
            arch: arch.to_string(),
            warp_size: 32,
            max_threads_per_block: 1024,
            shared_memory_per_block: STATIC_SHARED_PER_BLOCK,
            // 255, not 256: the last of the 256 register numbers an instruction encodes is the
            // constant zero register.
            registers_per_thread: 255,
            multiprocessors,
            l2_bytes,
        })
    }

    /// The architectures [`CudaDesc::for_arch`] knows, oldest first.
    pub fn known_archs() -> &'static [&'static str] {
        const NAMES: &[&str] = &["sm_80", "sm_86", "sm_89", "sm_90"];
        NAMES
    }
}

impl CudaKey {
    /// The architecture of a GPU whose key names none, when no device is present to ask:
    /// `sm_90`. Where a device is present the backend uses the device's own compute
    /// capability instead, so this is only what code is generated and checked for offline.
    pub const DEFAULT_ARCH: &'static str = "sm_90";

    /// The key's `-arch=`, else [`CudaKey::DEFAULT_ARCH`] (the device's own architecture is
    /// used instead of this default when a device is present).
    pub fn arch_or_default(&self) -> &str {
        self.arch.as_deref().unwrap_or(Self::DEFAULT_ARCH)
    }
}

/// The width in bits of what one FMA pipe of the CPU LLVM names `cpu` takes per cycle, for
/// vectors `vector_bits` wide. AMD Zen 4 (`znver4`) runs 512-bit operations as two 256-bit
/// halves; the Intel cores with AVX-512 and Zen 5 have whole 512-bit pipes. An unknown name
/// counts as whole pipes.
pub fn vector_unit_bits(cpu: &str, vector_bits: u32) -> u32 {
    match cpu {
        "znver4" => vector_bits.min(256),
        _ => vector_bits,
    }
}

/// Ways of the L1 data cache of the CPU LLVM names `cpu`. Every x86 core of the last decade
/// has 64 sets of 64-byte lines, so lines 4 KiB apart share a set; the ways are the L1's
/// size over 4 KiB: 12 on Intel's cores from Ice Lake on and on AMD's Zen 5 (48 KiB), 8 on
/// the others and on an unknown name (32 KiB: Skylake, Zen 1-4).
pub fn l1_ways(cpu: &str) -> u32 {
    match cpu {
        "icelake-client" | "icelake-server" | "tigerlake" | "rocketlake" | "alderlake"
        | "raptorlake" | "meteorlake" | "arrowlake" | "arrowlake-s" | "lunarlake"
        | "pantherlake" | "sapphirerapids" | "emeraldrapids" | "graniterapids"
        | "graniterapids-d" | "diamondrapids" | "znver5" => 12,
        _ => 8,
    }
}

impl TargetDesc {
    /// A CPU whose vectors are `vector_bits` wide, with FMA pipes as wide, `threads` threads,
    /// an L1 of 8 ways and unknown cache sizes.
    pub fn cpu(vector_bits: u32, threads: usize) -> TargetDesc {
        TargetDesc::Cpu(CpuDesc {
            vector_bits,
            vector_unit_bits: vector_bits,
            l1_ways: 8,
            threads: threads.max(1),
            caches: CacheSizes::default(),
        })
    }

    /// The same CPU with an L1 of `ways` ways a set (at least 1); a GPU unchanged.
    pub fn with_l1_ways(mut self, ways: u32) -> TargetDesc {
        if let TargetDesc::Cpu(c) = &mut self {
            c.l1_ways = ways.max(1);
        }
        self
    }

    /// The same CPU with FMA pipes `bits` wide (at most its vector width); a GPU unchanged.
    pub fn with_vector_unit_bits(mut self, bits: u32) -> TargetDesc {
        if let TargetDesc::Cpu(c) = &mut self {
            c.vector_unit_bits = bits.clamp(8, c.vector_bits.max(8));
        }
        self
    }

    /// The kind of machine.
    pub fn kind(&self) -> TargetKind {
        match self {
            TargetDesc::Cpu(_) => TargetKind::Cpu,
            TargetDesc::Cuda(_) => TargetKind::Cuda,
        }
    }

    /// Lanes of one vector register for elements of `dtype` (at least 1); on a GPU, 1 (a
    /// thread works on scalars).
    pub fn vector_lanes(&self, dtype: DType) -> i64 {
        match self {
            TargetDesc::Cpu(c) => {
                ((c.vector_bits as usize / 8) / dtype.bytes().max(1)).max(1) as i64
            }
            TargetDesc::Cuda(_) => 1,
        }
    }

    /// Lanes for elements of `dtype` that one FMA pipe takes per cycle (at most
    /// [`TargetDesc::vector_lanes`]); on a GPU, 1.
    pub fn vector_unit_lanes(&self, dtype: DType) -> i64 {
        match self {
            TargetDesc::Cpu(c) => {
                let bits = c.vector_unit_bits.min(c.vector_bits);
                ((bits as usize / 8) / dtype.bytes().max(1)).max(1) as i64
            }
            TargetDesc::Cuda(_) => 1,
        }
    }

    /// Threads parallel loops may use on a CPU; 1 on a GPU (whose parallelism is bindings).
    pub fn threads(&self) -> usize {
        match self {
            TargetDesc::Cpu(c) => c.threads.max(1),
            TargetDesc::Cuda(_) => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_bad_keys_name_themselves() {
        for text in [
            "llvm",
            "llvm -mcpu=test",
            "llvm -mcpu=znver4 -mattr=+avx2,+avx512f,+fma -threads=1",
            "llvm -mcpu=x86-64 -mattr= -threads=3",
            "cuda",
            "cuda -arch=sm_90",
        ] {
            let key: TargetKey = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(key.to_string(), text);
            assert_eq!(key.to_string().parse::<TargetKey>(), Ok(key));
        }
        let key: TargetKey = "llvm  -threads=2   -mcpu=a"
            .parse()
            .expect("any order parses");
        assert_eq!(key.to_string(), "llvm -mcpu=a -threads=2");
        assert_eq!(key.threads(), 2);
        assert_eq!(key.machine().to_string(), "llvm -mcpu=a");
        assert_eq!(key.with_threads(8).threads(), 8);
        assert_eq!(
            "llvm -mcpu=a".parse::<TargetKey>().map(|k| k.threads()),
            Ok(1)
        );
        let cases = [
            ("", "unknown target ``"),
            ("opencl -x=1", "unknown target `opencl -x=1`"),
            ("llvmx", "unknown target `llvmx`"),
            ("llvm -fast", "target `llvm -fast`: unknown option `-fast`"),
            ("llvm -O3=1", "unknown option `-O3=1`"),
            ("llvm -threads=0", "bad value in `-threads=0`"),
            ("llvm -threads=two", "bad value in `-threads=two`"),
            ("llvm -mattr=avx2", "bad value in `-mattr=avx2`"),
            ("llvm -mcpu=", "bad value in `-mcpu=`"),
            ("llvm -mcpu=a -mcpu=b", "option `-mcpu` given twice"),
            ("cuda -arch=90", "bad value in `-arch=90`"),
            (
                "cuda -threads=2",
                "target `cuda -threads=2`: unknown option `-threads=2`",
            ),
        ];
        for (text, want) in cases {
            let e = text.parse::<TargetKey>().expect_err(text).to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn known_archs_have_descriptions_and_unknown_ones_none() {
        for &arch in CudaDesc::known_archs() {
            let d = CudaDesc::for_arch(arch).unwrap_or_else(|| panic!("{arch} is listed"));
            assert_eq!(d.arch, arch);
            assert_eq!(
                (
                    d.warp_size,
                    d.max_threads_per_block,
                    d.shared_memory_per_block,
                    d.registers_per_thread
                ),
                (32, 1024, 48 * 1024, 255),
                "{arch}"
            );
        }
        assert_eq!(CudaDesc::known_archs().len(), ARCHS.len(), "one list");
        let sms_l2 = |a: &str| CudaDesc::for_arch(a).map(|d| (d.multiprocessors, d.l2_bytes));
        assert_eq!(sms_l2("sm_80"), Some((108, 40 << 20)));
        assert_eq!(sms_l2("sm_86"), Some((72, 6 << 20)));
        assert_eq!(sms_l2("sm_89"), Some((58, 48 << 20)));
        assert_eq!(sms_l2("sm_90"), Some((132, 50 << 20)));
        let a = CudaDesc::for_arch("sm_90a").expect("sm_90a reads sm_90's row");
        assert_eq!((a.arch.as_str(), a.multiprocessors), ("sm_90a", 132));
        for unknown in ["sm_70", "sm_100", "sm_", "", "sm_90aa", "gfx90a", "SM_90"] {
            assert_eq!(CudaDesc::for_arch(unknown), None, "{unknown}");
        }
        // The key's architecture, or the default where it names none.
        let key = |t: &str| match t.parse::<TargetKey>() {
            Ok(TargetKey::Cuda(k)) => k,
            r => panic!("{t}: {r:?}"),
        };
        assert_eq!(key("cuda").arch_or_default(), "sm_90");
        assert_eq!(key("cuda -arch=sm_86").arch_or_default(), "sm_86");
        assert!(CudaDesc::for_arch(key("cuda").arch_or_default()).is_some());
    }

    #[test]
    fn lanes_follow_the_vector_width_and_dtype() {
        let avx512 = TargetDesc::cpu(512, 2);
        assert_eq!(avx512.vector_lanes(DType::F32), 16);
        assert_eq!(avx512.vector_lanes(DType::F64), 8);
        assert_eq!(TargetDesc::cpu(128, 1).vector_lanes(DType::F32), 4);
        assert_eq!(avx512.threads(), 2);
        assert_eq!(TargetDesc::cpu(256, 0).threads(), 1);
        assert_eq!(avx512.kind(), TargetKind::Cpu);
    }

    #[test]
    fn fma_pipes_are_half_vectors_on_zen_4_only() {
        let unit = |key: &str| {
            let key: TargetKey = key.parse().unwrap_or_else(|e| panic!("{key}: {e}"));
            let d = key.cpu_desc().unwrap_or_else(|| panic!("{key} is a CPU"));
            (d.vector_lanes(DType::F32), d.vector_unit_lanes(DType::F32))
        };
        let avx512 = "-mattr=+avx2,+avx512f,+fma -threads=1";
        assert_eq!(unit(&format!("llvm -mcpu=znver4 {avx512}")), (16, 8));
        assert_eq!(unit(&format!("llvm -mcpu=znver5 {avx512}")), (16, 16));
        assert_eq!(
            unit(&format!("llvm -mcpu=sapphirerapids {avx512}")),
            (16, 16)
        );
        assert_eq!(unit(&format!("llvm -mcpu=rocketlake {avx512}")), (16, 16));
        // Zen 4 without AVX-512 in the key: 256-bit registers, whole pipes.
        assert_eq!(unit("llvm -mcpu=znver4 -mattr=+avx2,+fma"), (8, 8));
        assert_eq!(unit("llvm"), (4, 4));
        assert_eq!(TargetDesc::cpu(512, 1).vector_unit_lanes(DType::F64), 8);
        let half = TargetDesc::cpu(512, 1).with_vector_unit_bits(256);
        assert_eq!(half.vector_unit_lanes(DType::F64), 4);
        // Never wider than the registers.
        let wide = TargetDesc::cpu(256, 1).with_vector_unit_bits(1024);
        assert_eq!(wide.vector_unit_lanes(DType::F32), 8);
    }
}
