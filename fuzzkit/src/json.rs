//! Structured mutations of JSON: the input stays JSON, one value in it changes.
//!
//! Byte mutations break the syntax of most JSON inputs, so they exercise the tokenizer; these
//! keep it and reach what a parser checks after the syntax: field types, ranges, lengths,
//! names. A string that holds JSON itself (a model embedded as text) is mutated inside.

use rand::rngs::ChaCha8Rng;
use rand::seq::IndexedRandom;
use rand::RngExt;
use serde_json::{Map, Number, Value};

/// Edge numbers as JSON numbers (no NaN or infinity: JSON has none).
fn edge_number(rng: &mut ChaCha8Rng) -> Value {
    // Small values half the time: they keep indices in range and reach the checks after.
    if rng.random_bool(0.5) {
        return Value::from(rng.random_range(-1..=8));
    }
    match rng.random_range(0..12) {
        0 => Value::from(0),
        1 => Value::from(-1),
        2 => Value::from(i64::MAX),
        3 => Value::from(i64::MIN),
        4 => Value::from(u64::MAX),
        5 => Value::from(u64::from(u32::MAX) + 1),
        6 => Number::from_f64(1e308).map_or(Value::Null, Value::Number),
        7 => Number::from_f64(-0.5).map_or(Value::Null, Value::Number),
        8 => Number::from_f64(5e-324).map_or(Value::Null, Value::Number),
        9 => Value::from(rng.random_range(-3..=3)),
        10 => Value::from(rng.random_range(0..1_000_000)),
        _ => Value::from(1 << 31),
    }
}

fn edge_string(rng: &mut ChaCha8Rng, tokens: &[Vec<u8>]) -> Value {
    let text = match rng.random_range(0..7) {
        0 => String::new(),
        1 => "\n".to_string(),
        2 => "x".repeat(rng.random_range(1..5_000)),
        3 => "\u{0}\u{1b}[2J\u{202e}\u{fffd}".to_string(),
        4 => "-1".to_string(),
        _ => tokens
            .choose(rng)
            .map(|t| {
                String::from_utf8_lossy(t)
                    .trim_matches(['"', ':'])
                    .to_string()
            })
            .unwrap_or_default(),
    };
    Value::String(text)
}

/// The number of values in `v`, itself included.
fn count(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(count).sum(),
        Value::Object(o) => o.values().map(count).sum(),
        _ => 0,
    }
}

/// The `k`-th value of `v` in pre-order (`k < count(v)`).
fn nth(v: &mut Value, mut k: usize) -> Option<&mut Value> {
    if k == 0 {
        return Some(v);
    }
    k -= 1;
    let children: Vec<&mut Value> = match v {
        Value::Array(a) => a.iter_mut().collect(),
        Value::Object(o) => o.values_mut().collect(),
        _ => return None,
    };
    for child in children {
        let n = count(child);
        if k < n {
            return nth(child, k);
        }
        k -= n;
    }
    None
}

/// Changes one value of `root`; `donor` is a copy of some value of a seed, for type
/// confusion and for fields moved between objects.
fn mutate_value(rng: &mut ChaCha8Rng, root: &mut Value, donor: Value, tokens: &[Vec<u8>]) {
    let k = rng.random_range(0..count(root));
    let Some(v) = nth(root, k) else { return };
    match v {
        Value::Number(_) if rng.random_bool(0.8) => *v = edge_number(rng),
        Value::String(s) if rng.random_bool(0.3) => {
            if let Ok(mut inner) = serde_json::from_str::<Value>(s) {
                if inner.is_array() || inner.is_object() {
                    let inner_donor = inner.clone();
                    mutate_value(rng, &mut inner, inner_donor, tokens);
                    *s = inner.to_string();
                    return;
                }
            }
            *v = edge_string(rng, tokens);
        }
        Value::String(_) if rng.random_bool(0.7) => *v = edge_string(rng, tokens),
        Value::Array(a) if !a.is_empty() && rng.random_bool(0.7) => {
            let i = rng.random_range(0..a.len());
            match rng.random_range(0..4) {
                0 => {
                    a.remove(i);
                }
                1 => {
                    let copy = a[i].clone();
                    a.insert(i, copy);
                }
                2 => {
                    let j = rng.random_range(0..a.len());
                    a.swap(i, j);
                }
                _ => a.clear(),
            }
        }
        Value::Object(o) if !o.is_empty() && rng.random_bool(0.7) => {
            let keys: Vec<String> = o.keys().cloned().collect();
            let key = keys.choose(rng).cloned().unwrap_or_default();
            if rng.random_bool(0.5) {
                o.remove(&key);
            } else if let Value::Object(other) = donor {
                merge_one(rng, o, other);
            } else {
                o.insert(key, donor);
            }
        }
        _ => {
            *v = match rng.random_range(0..6) {
                0 => Value::Null,
                1 => Value::Bool(true),
                2 => Value::Array(Vec::new()),
                3 => Value::Object(Map::new()),
                4 => edge_number(rng),
                _ => donor,
            }
        }
    }
}

/// Copies one field of `from` into `into` (replacing a field of that name).
fn merge_one(rng: &mut ChaCha8Rng, into: &mut Map<String, Value>, from: Map<String, Value>) {
    let fields: Vec<(String, Value)> = from.into_iter().collect();
    if let Some((k, v)) = fields.choose(rng).cloned() {
        into.insert(k, v);
    }
}

/// `input` with one value changed (sometimes two or three), if `input` is JSON.
pub(crate) fn mutate(
    rng: &mut ChaCha8Rng,
    input: &[u8],
    donor_seed: &[u8],
    tokens: &[Vec<u8>],
) -> Option<Vec<u8>> {
    let mut root: Value = serde_json::from_slice(input).ok()?;
    let mut donors: Value = serde_json::from_slice(donor_seed).unwrap_or(Value::Null);
    let mut rounds = 1;
    while rounds < 3 && rng.random_bool(0.3) {
        rounds += 1;
    }
    for _ in 0..rounds {
        let k = rng.random_range(0..count(&donors));
        let donor = nth(&mut donors, k)
            .map(|d| d.clone())
            .unwrap_or(Value::Null);
        mutate_value(rng, &mut root, donor, tokens);
    }
    serde_json::to_vec(&root).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn json_stays_json_and_changes() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let seed = br#"{"steps":[{"op":"split","factors":[2,4]}],"inner":"{\"a\":[1,2]}"}"#;
        let mut changed = 0;
        for _ in 0..200 {
            let out = mutate(&mut rng, seed, seed, &[]).expect("a JSON seed");
            serde_json::from_slice::<Value>(&out).expect("still JSON");
            changed += usize::from(
                serde_json::from_slice::<Value>(&out).ok()
                    != serde_json::from_slice::<Value>(seed).ok(),
            );
        }
        assert!(changed > 150, "{changed} of 200 changed");
        assert!(mutate(&mut rng, b"{not json", seed, &[]).is_none());
    }
}
