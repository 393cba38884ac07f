//! tensortune-fuzzkit: deterministic mutation fuzzing on the stable toolchain (dev-only).
//!
//! `cargo fuzz` needs a nightly compiler; these campaigns run inside `cargo test` instead.
//! A campaign starts from valid inputs of a format (the *seeds*), derives mutated inputs from
//! them with a seeded generator ([`Mutator`]: byte flips, truncations, splices, huge and
//! negative numbers, deep nesting, unicode, NUL and newlines, tokens of the format), runs a
//! check on each under [`std::panic::catch_unwind`] and fails with every failing input, shrunk
//! to a small reproducer ([`Campaign::run`]). The same seed gives the same inputs on every
//! machine, so a failure reproduces from the test alone.
//!
//! A check returns `Err` when a property fails; the usual property of a parser of outside
//! input is "a value, or a typed error whose message is one line" ([`one_line`]).
//!
//! ```
//! use tensortune_fuzzkit::{one_line, Campaign};
//! let seeds: &[&[u8]] = &[b"12", b"-7"];
//! Campaign::new("i64 from text", seeds).inputs(500).run(|bytes| {
//!     let text = String::from_utf8_lossy(bytes);
//!     match text.trim().parse::<i64>() {
//!         Ok(n) if n.to_string().parse::<i64>() == Ok(n) => Ok(()),
//!         Ok(n) => Err(format!("{n} does not re-parse")),
//!         Err(e) => one_line(&e),
//!     }
//! });
//! ```

#![warn(missing_docs)]

mod campaign;
mod json;
mod mutate;

pub use campaign::{escape, one_line, Campaign};
pub use mutate::Mutator;
