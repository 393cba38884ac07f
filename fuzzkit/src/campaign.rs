//! Running a check over a corpus: panics caught, failures shrunk and reported together.

use std::cell::Cell;
use std::fmt::{Display, Write};
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

use crate::Mutator;

/// Inputs per campaign unless told otherwise: the floor the test suite promises per parser.
const DEFAULT_INPUTS: usize = 10_000;
/// Failures shrunk and shown; the count of the rest is still reported.
const SHOWN_FAILURES: usize = 5;
/// Checks spent shrinking one failure.
const SHRINK_BUDGET: usize = 3_000;

thread_local! {
    /// Set while this thread runs checks, whose panics are expected and reported at the end.
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Keeps the panic messages of checks off the test output (thousands of them would bury the
/// report) while every other panic, in this thread or another test's, prints as usual.
fn install_quiet_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
}

/// `Ok` when `error` renders as one non-empty line: what a command line prints after
/// `tensortune:`.
pub fn one_line(error: &dyn Display) -> Result<(), String> {
    let text = error.to_string();
    if text.trim().is_empty() {
        Err("an error with an empty message".into())
    } else if text.contains(['\n', '\r']) {
        Err(format!("a multi-line error: {}", escape(text.as_bytes())))
    } else {
        Ok(())
    }
}

/// Bytes as a Rust byte-string literal body, cut after 400 bytes: readable in a report and
/// pastable into a regression test.
pub fn escape(bytes: &[u8]) -> String {
    const SHOWN: usize = 400;
    let mut out: String = bytes[..bytes.len().min(SHOWN)]
        .iter()
        .flat_map(|&b| std::ascii::escape_default(b))
        .map(char::from)
        .collect();
    if bytes.len() > SHOWN {
        let _ = write!(out, "... ({} bytes in all)", bytes.len());
    }
    out
}

/// One failing input.
struct Failure {
    /// Which input of the campaign (seeds first, then mutated inputs).
    index: usize,
    input: Vec<u8>,
    why: String,
}

/// A fuzzing campaign over one parser.
pub struct Campaign {
    name: String,
    seeds: Vec<Vec<u8>>,
    tokens: Vec<String>,
    inputs: usize,
    seed: u64,
    json: bool,
}

impl Campaign {
    /// A campaign named `name` (it heads the report) over valid `seeds`.
    pub fn new(name: &str, seeds: &[&[u8]]) -> Campaign {
        Campaign {
            name: name.to_string(),
            seeds: seeds.iter().map(|s| s.to_vec()).collect(),
            tokens: Vec::new(),
            inputs: DEFAULT_INPUTS,
            seed: 0x7e57_f022,
            json: false,
        }
    }

    /// Words of the format that mutations may insert (see [`Mutator::tokens`]).
    pub fn tokens(mut self, tokens: &[&str]) -> Campaign {
        self.tokens.extend(tokens.iter().map(|t| t.to_string()));
        self
    }

    /// How many mutated inputs to run (default 10,000), besides the seeds.
    pub fn inputs(mut self, inputs: usize) -> Campaign {
        self.inputs = inputs;
        self
    }

    /// The inputs are JSON: see [`Mutator::json`].
    pub fn json(mut self) -> Campaign {
        self.json = true;
        self
    }

    /// The generator's seed (each seed gives other inputs, each reproducibly).
    pub fn seed(mut self, seed: u64) -> Campaign {
        self.seed = seed;
        self
    }

    /// Runs `check` on every seed, then on each mutated input; panics (failing the test) with
    /// a report of the failures, each shrunk, when `check` returned `Err` or panicked on any.
    /// The seeds must pass: a campaign whose seeds fail tests nothing beyond them.
    pub fn run(self, check: impl Fn(&[u8]) -> Result<(), String>) {
        install_quiet_hook();
        let seeds: Vec<&[u8]> = self.seeds.iter().map(Vec::as_slice).collect();
        let tokens: Vec<&str> = self.tokens.iter().map(String::as_str).collect();
        let mut mutator = Mutator::new(self.seed, &seeds)
            .tokens(&tokens)
            .json(self.json);
        let mut failures = Vec::new();
        let mut failed = 0;
        let inputs = self
            .seeds
            .iter()
            .cloned()
            .chain((0..self.inputs).map(|_| mutator.next_input()));
        for (index, input) in inputs.enumerate() {
            if let Err(why) = guarded(&check, &input) {
                failed += 1;
                if failures.len() < SHOWN_FAILURES {
                    failures.push(Failure { index, input, why });
                }
            }
        }
        if failures.is_empty() {
            return;
        }
        let mut report = format!(
            "{}: {failed} of {} inputs failed (generator seed {:#x})",
            self.name,
            self.seeds.len() + self.inputs,
            self.seed
        );
        for f in &failures {
            let small = shrink(&check, &f.input);
            let why = guarded(&check, &small)
                .err()
                .unwrap_or_else(|| f.why.clone());
            let _ = write!(
                report,
                "\n- input {}: {}\n  shrunk to b\"{}\"\n  as found: b\"{}\"",
                f.index,
                why,
                escape(&small),
                escape(&f.input)
            );
        }
        panic!("{report}");
    }
}

/// Runs the check with its panics caught and silenced; a panic becomes an `Err` naming it.
fn guarded(check: &impl Fn(&[u8]) -> Result<(), String>, input: &[u8]) -> Result<(), String> {
    QUIET.with(|q| q.set(true));
    let result = panic::catch_unwind(AssertUnwindSafe(|| check(input)));
    QUIET.with(|q| q.set(false));
    match result {
        Ok(outcome) => outcome,
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a non-text payload".into());
            Err(format!("panicked: {message}"))
        }
    }
}

/// A smaller input that still fails: removes chunks, halving their size down to single
/// bytes, while the check keeps failing (delta debugging, bounded by [`SHRINK_BUDGET`]).
fn shrink(check: &impl Fn(&[u8]) -> Result<(), String>, input: &[u8]) -> Vec<u8> {
    let mut best = input.to_vec();
    let mut budget = SHRINK_BUDGET;
    let mut chunk = best.len().div_ceil(2).max(1);
    loop {
        let mut start = 0;
        while start < best.len() && budget > 0 {
            let end = (start + chunk).min(best.len());
            let mut candidate = best[..start].to_vec();
            candidate.extend_from_slice(&best[end..]);
            budget -= 1;
            if guarded(check, &candidate).is_err() {
                best = candidate;
            } else {
                start = end;
            }
        }
        if chunk == 1 || budget == 0 {
            return best;
        }
        chunk = chunk.div_ceil(2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A check that panics on inputs holding `!` and fails on those holding a newline.
    fn picky(input: &[u8]) -> Result<(), String> {
        if input.contains(&b'!') {
            panic!("a bang");
        }
        if input.contains(&b'\n') {
            return Err("a newline".into());
        }
        Ok(())
    }

    #[test]
    fn failures_are_caught_shrunk_and_reported() {
        let report = panic::catch_unwind(|| {
            Campaign::new("bang", &[b"hello, world"])
                .tokens(&["!"])
                .inputs(2_000)
                .run(|input| match input.contains(&b'!') {
                    true => panic!("a bang"),
                    false => Ok(()),
                })
        })
        .expect_err("the campaign must fail");
        let report = report
            .downcast_ref::<String>()
            .expect("a text report")
            .clone();
        assert!(report.starts_with("bang: "), "{report}");
        assert!(report.contains("panicked: a bang"), "{report}");
        assert!(report.contains("shrunk to b\"!\""), "{report}");
    }

    #[test]
    fn a_passing_campaign_returns() {
        Campaign::new("anything", &[b"x"])
            .inputs(300)
            .run(|_| Ok(()));
    }

    #[test]
    fn shrinking_keeps_the_failure() {
        let input = b"aaaa\nbbbb!cccc";
        assert_eq!(shrink(&picky, input), b"!");
        let only_newline = b"aaaa\nbbbb";
        assert_eq!(shrink(&picky, only_newline), b"\n");
    }

    #[test]
    fn one_line_rejects_newlines_and_empty_messages() {
        assert!(one_line(&"fine").is_ok());
        assert!(one_line(&"two\nlines").is_err());
        assert!(one_line(&"carriage\rreturn").is_err());
        assert!(one_line(&"  ").is_err());
    }
}
