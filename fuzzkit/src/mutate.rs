//! The mutator: valid inputs in, plausible broken ones out.
//!
//! Random bytes rarely get past a parser's first check; mutations of valid inputs reach its
//! inner paths. Each input is one seed with one to four mutations stacked on it.

use rand::rngs::ChaCha8Rng;
use rand::seq::IndexedRandom;
use rand::{RngExt, SeedableRng};

/// Inputs longer than this are cut: big enough for deep nesting and long runs, small enough
/// that ten thousand inputs stay fast.
const MAX_LEN: usize = 1 << 18;

/// Numbers at the edges of the integer and float types, as text.
const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "1",
    "-1",
    "2",
    "3",
    "7",
    "255",
    "256",
    "65536",
    "16777216",
    "16777217",
    "2147483647",
    "2147483648",
    "-2147483649",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "340282366920938463463374607431768211456",
    "99999999999999999999999999999999999999999999",
    "1e308",
    "1e309",
    "-1e309",
    "1e-300",
    "5e-324",
    "-1.5",
    "0.5",
    "1.0",
    "NaN",
    "nan",
    "inf",
    "-inf",
    "Infinity",
    "0x10",
    "1_000",
    "+5",
    "00",
    "",
];

/// Bytes and short strings that parsers treat specially.
const SPECIALS: &[&str] = &[
    "\0",
    "\n",
    "\r\n",
    "\r",
    "\t",
    " ",
    "\"",
    "'",
    "\\",
    "\\u0000",
    "\\n",
    "\\ud800",
    ",",
    ":",
    "=",
    ";",
    "-",
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    "null",
    "true",
    "\u{e9}",
    "\u{2028}",
    "\u{202e}",
    "\u{feff}",
    "\u{1d54f}",
    "e\u{301}",
    "\u{ff1a}",
    "\u{fffd}",
];

/// Opening and closing halves for deep nesting.
const NESTS: &[(&str, &str)] = &[
    ("[", "]"),
    ("{\"a\":", "}"),
    ("(", ")"),
    ("[{\"op\":", "}]"),
];

/// A seeded generator of mutated inputs.
pub struct Mutator {
    rng: ChaCha8Rng,
    seeds: Vec<Vec<u8>>,
    tokens: Vec<Vec<u8>>,
    json: bool,
}

impl Mutator {
    /// A mutator over `seeds` (valid inputs of the format), reproducible from `seed`.
    pub fn new(seed: u64, seeds: &[&[u8]]) -> Mutator {
        Mutator {
            rng: ChaCha8Rng::seed_from_u64(seed),
            seeds: seeds.iter().map(|s| s.to_vec()).collect(),
            tokens: Vec::new(),
            json: false,
        }
    }

    /// Treats the inputs as JSON: three in five of them then get structured mutations (one value
    /// changed, the syntax kept) instead of byte mutations.
    pub fn json(mut self, json: bool) -> Mutator {
        self.json = json;
        self
    }

    /// Adds words of the format (keys, names, field names) that mutations may insert.
    pub fn tokens(mut self, tokens: &[&str]) -> Mutator {
        self.tokens
            .extend(tokens.iter().map(|t| t.as_bytes().to_vec()));
        self
    }

    /// The next input: a seed with one to four mutations, one in half of the inputs (stacked
    /// mutations break most inputs early, single ones reach the checks behind the syntax).
    pub fn next_input(&mut self) -> Vec<u8> {
        let mut input = self.pick_seed();
        let mut rounds: usize = 1;
        while rounds < 4 && self.rng.random_bool(0.5) {
            rounds += 1;
        }
        if self.json && self.rng.random_bool(0.6) {
            let donor = self.pick_seed();
            if let Some(changed) = crate::json::mutate(&mut self.rng, &input, &donor, &self.tokens)
            {
                // Mostly valid JSON with one value changed; sometimes a byte mutation on top.
                input = changed;
                rounds = usize::from(self.rng.random_bool(0.2));
            }
        }
        for _ in 0..rounds {
            self.mutate(&mut input);
            input.truncate(MAX_LEN);
        }
        input
    }

    /// A uniformly chosen number in `range` (for callers that build inputs of their own).
    pub fn below(&mut self, bound: usize) -> usize {
        self.rng.random_range(0..bound.max(1))
    }

    fn pick_seed(&mut self) -> Vec<u8> {
        self.seeds
            .choose(&mut self.rng)
            .cloned()
            .unwrap_or_default()
    }

    fn pos(&mut self, input: &[u8]) -> usize {
        self.rng.random_range(0..=input.len())
    }

    /// A range `start..end` inside `input`, biased to short ones.
    fn span(&mut self, input: &[u8]) -> (usize, usize) {
        let start = self.pos(input);
        let room = input.len() - start;
        let len = if self.rng.random_bool(0.8) {
            self.rng.random_range(0..=room.min(8))
        } else {
            self.rng.random_range(0..=room)
        };
        (start, start + len)
    }

    fn mutate(&mut self, input: &mut Vec<u8>) {
        match self.rng.random_range(0..12) {
            0 => self.flip_bit(input),
            1 => self.set_byte(input),
            2 => {
                let at = self.pos(input);
                input.truncate(at);
            }
            3 => {
                let (start, end) = self.span(input);
                input.drain(start..end);
            }
            4 => {
                let (start, end) = self.span(input);
                let chunk = input[start..end].to_vec();
                let at = self.pos(input);
                input.splice(at..at, chunk);
            }
            5 => self.splice_seed(input),
            6 => {
                let token = self.token();
                let at = self.pos(input);
                input.splice(at..at, token);
            }
            7 | 8 => self.replace_number(input),
            9 => {
                let special = SPECIALS.choose(&mut self.rng).copied().unwrap_or("\0");
                let at = self.pos(input);
                input.splice(at..at, special.bytes());
            }
            10 => self.nest(input),
            _ => self.repeat(input),
        }
    }

    fn flip_bit(&mut self, input: &mut [u8]) {
        if !input.is_empty() {
            let at = self.rng.random_range(0..input.len());
            input[at] ^= 1 << self.rng.random_range(0..8);
        }
    }

    fn set_byte(&mut self, input: &mut [u8]) {
        if !input.is_empty() {
            let at = self.rng.random_range(0..input.len());
            input[at] = *[0u8, 0xff, 0x7f, 0x80, b'\n', b'"', b'9', b'-', b' ', 0xc3]
                .choose(&mut self.rng)
                .unwrap_or(&0);
        }
    }

    /// Keeps a prefix of `input` and ends it with a suffix of another seed: fields of one
    /// valid input in the frame of another.
    fn splice_seed(&mut self, input: &mut Vec<u8>) {
        let other = self.pick_seed();
        let cut = self.pos(input);
        let from = self.rng.random_range(0..=other.len());
        input.truncate(cut);
        input.extend_from_slice(&other[from..]);
    }

    fn token(&mut self) -> Vec<u8> {
        if !self.tokens.is_empty() && self.rng.random_bool(0.5) {
            self.tokens
                .choose(&mut self.rng)
                .cloned()
                .unwrap_or_default()
        } else {
            NUMBERS
                .choose(&mut self.rng)
                .map(|n| n.as_bytes().to_vec())
                .unwrap_or_default()
        }
    }

    /// Replaces one run of digits (with its sign and fraction) by an edge number; inserts one
    /// where the input has none.
    fn replace_number(&mut self, input: &mut Vec<u8>) {
        let starts: Vec<usize> = (0..input.len())
            .filter(|&i| input[i].is_ascii_digit() && (i == 0 || !input[i - 1].is_ascii_digit()))
            .collect();
        let number = NUMBERS.choose(&mut self.rng).copied().unwrap_or("0");
        let Some(&start) = starts.choose(&mut self.rng) else {
            let at = self.pos(input);
            input.splice(at..at, number.bytes());
            return;
        };
        let start = if start > 0 && input[start - 1] == b'-' {
            start - 1
        } else {
            start
        };
        let mut end = start + 1;
        while end < input.len() && (input[end].is_ascii_digit() || b".eE+-".contains(&input[end])) {
            end += 1;
        }
        input.splice(start..end, number.bytes());
    }

    /// Wraps a span in many levels of brackets: the stack depth of recursive parsers.
    fn nest(&mut self, input: &mut Vec<u8>) {
        let (open, close) = NESTS.choose(&mut self.rng).copied().unwrap_or(("[", "]"));
        let depth = *[2usize, 40, 200, 5_000, 50_000]
            .choose(&mut self.rng)
            .unwrap_or(&2);
        let (start, end) = self.span(input);
        let inner = input[start..end].to_vec();
        let mut nested = open.repeat(depth).into_bytes();
        nested.extend_from_slice(&inner);
        nested.extend_from_slice(close.repeat(depth).as_bytes());
        input.splice(start..end, nested);
    }

    /// Repeats a span many times: long names, long lists, many items.
    fn repeat(&mut self, input: &mut Vec<u8>) {
        let (start, end) = self.span(input);
        if start == end {
            return;
        }
        let times = *[2usize, 10, 1_000, 20_000]
            .choose(&mut self.rng)
            .unwrap_or(&2);
        let times = times.min(MAX_LEN / (end - start));
        let chunk = input[start..end].repeat(times);
        input.splice(start..end, chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_inputs_and_mutations_change_them() {
        let seeds: &[&[u8]] = &[b"matmul:M=4,N=8,K=2", b"{\"a\":[1,2,3]}"];
        let run = |seed| {
            let mut m = Mutator::new(seed, seeds).tokens(&["dtype"]);
            (0..200).map(|_| m.next_input()).collect::<Vec<_>>()
        };
        let first = run(7);
        assert_eq!(first, run(7));
        assert_ne!(first, run(8));
        let changed = first
            .iter()
            .filter(|i| !seeds.contains(&i.as_slice()))
            .count();
        assert!(
            changed > 150,
            "only {changed} of 200 inputs differ from the seeds"
        );
        assert!(first.iter().all(|i| i.len() <= MAX_LEN));
    }

    #[test]
    fn numbers_are_replaced_by_edge_values() {
        let mut m = Mutator::new(1, &[b"M=64"]);
        let mut seen_other = false;
        for _ in 0..50 {
            let mut input = b"M=64".to_vec();
            m.replace_number(&mut input);
            assert!(
                input.starts_with(b"M="),
                "{:?}",
                String::from_utf8_lossy(&input)
            );
            seen_other |= input != b"M=64";
        }
        assert!(seen_other);
    }
}
