//! [`Target`]: where kernels run, and the key their records are filed under.

use crate::codegen::HostTarget;

/// Where kernels run.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Target {
    /// The host CPU through LLVM, with this many threads for parallel loops.
    Llvm {
        /// Worker threads (1: serial).
        threads: usize,
    },
}

impl Target {
    /// The host CPU with `threads` threads.
    pub fn host(threads: usize) -> Target {
        Target::Llvm {
            threads: threads.max(1),
        }
    }

    /// Parses `llvm` or `llvm -threads=N` (what the CLI's `--target` takes).
    pub fn parse(s: &str, threads: usize) -> Result<Target, UnknownTarget> {
        let mut parts = s.split_whitespace();
        match parts.next() {
            Some("llvm") => {
                let mut t = threads;
                for p in parts {
                    if let Some(v) = p.strip_prefix("-threads=") {
                        t = v.parse().map_err(|_| UnknownTarget(s.to_string()))?;
                    }
                }
                Ok(Target::host(t))
            }
            _ => Err(UnknownTarget(s.to_string())),
        }
    }

    /// The key records are filed under, naming the CPU model and features.
    pub fn key(&self) -> String {
        match self {
            Target::Llvm { threads } => HostTarget::host().key(*threads),
        }
    }

    /// Threads for parallel loops.
    pub fn threads(&self) -> usize {
        match self {
            Target::Llvm { threads } => *threads,
        }
    }
}

/// A target string that is not `llvm` or `llvm -threads=N`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown target `{0}`: expected `llvm` or `llvm -threads=N`")]
pub struct UnknownTarget(pub String);
