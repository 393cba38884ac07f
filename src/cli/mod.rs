//! The `tensortune` command line: one module per area, one function per subcommand.
//!
//! `src/bin/tensortune.rs` holds the clap `Command` enum; each variant carries the argument
//! struct of its subcommand (defined here, next to the code that runs it) and dispatches to
//! one function that returns `Result<(), CliError>`. To add a subcommand: write its `Args`
//! struct and function in `src/cli/<area>.rs`, add a variant, add a match arm.
//!
//! Exit status: 0 on success, 2 for errors the user can fix (a bad spec, a missing or bad
//! file, a bad flag), 1 for internal failures. Errors print as one line (plus one line per
//! rejected input line where there are several) on stderr, never as a backtrace.

pub mod codegen;
mod gpu_dry_run;
pub mod inspect;
pub mod model;
pub mod network;
pub mod output;
pub mod plan;
pub mod plot;
pub mod probe;
pub mod records;
pub mod report;
pub mod run;
pub mod tune;

use std::fmt;

/// An error of a subcommand, classified for the exit status.
#[derive(Debug)]
pub enum CliError {
    /// The user can fix it: exit status 2.
    Usage(String),
    /// Something inside failed: exit status 1.
    Internal(String),
}

impl CliError {
    /// The process exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Internal(_) => 1,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage(message) => f.write_str(message),
            CliError::Internal(message) => write!(f, "internal error: {message}"),
        }
    }
}

impl std::error::Error for CliError {}

/// The most threads a flag may ask for: eight per core of this machine (more only queue on
/// the same cores, and thread pools of 100 000 hang the machine rather than fail).
pub fn max_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .saturating_mul(8)
}

/// A `--threads` value: 0 means every core of this machine; otherwise 1 to [`max_threads`].
pub fn resolve_threads(flag: &str, value: usize) -> Result<usize, CliError> {
    if value == 0 {
        return Ok(std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1));
    }
    check_count(flag, value, 0, max_threads())
}

/// `--target` for the host CPU: [`crate::Target::parse`], with the threads a key states
/// (`llvm -threads=N`) held to the same bound as `--threads`.
pub fn parse_cpu_target(target: &str, threads: usize) -> Result<crate::Target, CliError> {
    let t = crate::Target::parse(target, threads).map_err(|e| CliError::Usage(e.to_string()))?;
    check_count("the target's -threads", t.threads(), 1, max_threads())?;
    Ok(t)
}

/// A usage error naming `flag` and the allowed range unless `lo <= value <= hi`.
pub fn check_count(flag: &str, value: usize, lo: usize, hi: usize) -> Result<usize, CliError> {
    if (lo..=hi).contains(&value) {
        Ok(value)
    } else {
        Err(CliError::Usage(format!(
            "{flag} must be between {lo} and {hi}, not {value}"
        )))
    }
}

/// A usage error naming `flag` and the allowed range unless `value` is finite and
/// `lo <= value <= hi`.
pub fn check_real(flag: &str, value: f64, lo: f64, hi: f64) -> Result<f64, CliError> {
    if value.is_finite() && (lo..=hi).contains(&value) {
        Ok(value)
    } else {
        Err(CliError::Usage(format!(
            "{flag} must be a number between {lo} and {hi}, not {value}"
        )))
    }
}

/// A week, in seconds: the longest time budget a flag takes.
pub const MAX_SECONDS: f64 = 7.0 * 24.0 * 3600.0;

impl From<tensortune_records::RecordsError> for CliError {
    fn from(e: tensortune_records::RecordsError) -> CliError {
        if e.is_user_error() {
            CliError::Usage(e.to_string())
        } else {
            CliError::Internal(e.to_string())
        }
    }
}
