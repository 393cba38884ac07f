//! [`Target`]: where kernels run, and the key their records are filed under.

use crate::codegen::HostTarget;

/// Where kernels run.
#[derive(Clone, Debug, PartialEq, Eq)]
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
                let host = HostTarget::host().key(1);
                for p in parts {
                    if let Some(v) = p.strip_prefix("-threads=") {
                        t = v.parse().map_err(|_| UnknownTarget(s.to_string()))?;
                    } else if !host.split_whitespace().any(|h| h == p) {
                        // Code is compiled for and measured on this CPU only: an option that
                        // names another CPU or feature set would be silently ignored.
                        return Err(UnknownTarget(s.to_string()));
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
#[error(
    "unknown target `{}`: expected `llvm` or `llvm -threads=N` (options naming a CPU must \
     name this one: kernels are compiled for and measured on the CPU tensortune runs on)",
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
            "unknown target `cu\\nda`: expected `llvm` or `llvm -threads=N` (options naming a \
             CPU must name this one: kernels are compiled for and measured on the CPU \
             tensortune runs on)"
        );
    }
}
