//! [`Target`]: where kernels run, and the key their records are filed under. It is also the
//! CPU [`crate::backend::Backend`] (see [`crate::backend::cpu`]).

use crate::codegen::HostTarget;
use crate::runtime::CacheFlush;
use tensortune_schedules::target::{TargetKey, TargetKind};

/// Where kernels run.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Target {
    /// The host CPU through LLVM, with this many threads for parallel loops.
    Llvm {
        /// Worker threads (1: serial).
        threads: usize,
        /// When tuning's measurements evict the kernel's buffers from the caches first
        /// ([`Target::with_cache_flush`]). Not part of the key.
        flush: CacheFlush,
    },
}

impl Target {
    /// The host CPU with `threads` threads.
    pub fn host(threads: usize) -> Target {
        Target::Llvm {
            threads: threads.max(1),
            flush: CacheFlush::default(),
        }
    }

    /// This target with tuning's measurements evicting the kernel's buffers from the caches
    /// as `flush` says. [`CacheFlush::PastLastLevel`] (the default) measures a kernel as it
    /// runs in a loop of its own; [`CacheFlush::Always`] as it runs inside a network, where
    /// the layers between two runs of it have pushed its weights out of the caches (what
    /// `tune-model` uses: a layer whose weights are megabytes is then tuned for reading them
    /// from memory).
    pub fn with_cache_flush(self, flush: CacheFlush) -> Target {
        match self {
            Target::Llvm { threads, .. } => Target::Llvm { threads, flush },
        }
    }

    /// See [`Target::with_cache_flush`].
    pub fn cache_flush(&self) -> CacheFlush {
        match self {
            Target::Llvm { flush, .. } => *flush,
        }
    }

    /// Parses an `llvm` key (what the CLI's `--target` takes): `llvm`, `llvm -threads=N`, or
    /// a key naming the host CPU as [`Target::key`] writes it; `threads` where the key states
    /// none. Code is generated for this CPU, so a key naming another CPU or other features is
    /// refused.
    pub fn parse(s: &str, threads: usize) -> Result<Target, UnknownTarget> {
        let unknown = || UnknownTarget(s.to_string());
        let key: TargetKey = s.parse().map_err(|_| unknown())?;
        let TargetKey::Llvm(k) = &key else {
            return Err(unknown());
        };
        let host = match HostTarget::host().target_key(1) {
            TargetKey::Llvm(h) => h,
            TargetKey::Cuda(_) => return Err(unknown()),
        };
        let names_other = k.cpu.as_ref().is_some_and(|c| Some(c) != host.cpu.as_ref())
            || k.features
                .as_ref()
                .is_some_and(|f| Some(f) != host.features.as_ref());
        if key.kind() != TargetKind::Cpu || names_other {
            return Err(unknown());
        }
        Ok(Target::host(k.threads.unwrap_or(threads)))
    }

    /// The key records are filed under, naming the CPU model and features.
    pub fn key(&self) -> String {
        self.target_key().to_string()
    }

    /// [`Target::key`], parsed.
    pub fn target_key(&self) -> TargetKey {
        match self {
            Target::Llvm { threads, .. } => HostTarget::host().target_key(*threads),
        }
    }

    /// Threads for parallel loops.
    pub fn threads(&self) -> usize {
        match self {
            Target::Llvm { threads, .. } => *threads,
        }
    }
}

/// A target string that is not an `llvm` key of this CPU.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown target `{}`: expected `llvm`, `llvm -threads=N`, or this CPU's full key",
    tensortune_schedules::text::single_line(.0)
)]
pub struct UnknownTarget(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by `fuzz_inputs`: a target string holding a line break was quoted as written,
    /// so the error took two lines.
    #[test]
    fn unknown_targets_are_quoted_on_one_line() {
        for text in ["\n", "\r", "llvm -threads=\n2", "cu\nda", "\u{1b}[2J"] {
            let e = Target::parse(text, 1).unwrap_err().to_string();
            assert!(!e.contains(['\n', '\r', '\u{1b}']), "{e:?}");
        }
        assert_eq!(
            Target::parse("cu\nda", 1).unwrap_err().to_string(),
            "unknown target `cu\\nda`: expected `llvm`, `llvm -threads=N`, or this CPU's full key"
        );
    }

    /// The flush mode reaches tuning's and the final re-measurement's options, and is not
    /// part of the key records are filed under.
    #[test]
    fn the_cache_flush_is_a_measurement_setting_not_a_key() {
        use crate::backend::Purpose;
        let warm = Target::host(1);
        let cold = Target::host(1).with_cache_flush(CacheFlush::Always);
        assert_eq!(warm.cache_flush(), CacheFlush::PastLastLevel);
        for purpose in [Purpose::Tuning, Purpose::Final] {
            assert_eq!(
                cold.measure_options(purpose, 0).flush_cache,
                CacheFlush::Always
            );
            assert_eq!(
                warm.measure_options(purpose, 0).flush_cache,
                CacheFlush::PastLastLevel
            );
        }
        assert_eq!(warm.key(), cold.key());
    }
}
