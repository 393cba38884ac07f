//! Random decisions for a sketch's holes ("random annotation").
//!
//! Tile factors are mostly perfect factorizations of the loop's extent (each level a random
//! divisor of what is left, innermost first, the innermost within the vector lanes where the
//! hole asks), and with a small probability non-perfect ones that leave a guarded tail.

use super::{Hole, Sketch};
use crate::options::TuneOptions;
use rand::{Rng, RngExt};

/// Divisors of `n`, ascending.
pub fn divisors(n: i64) -> Vec<i64> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut d = 1;
    while d * d <= n {
        if n % d == 0 {
            small.push(d);
            if d * d != n {
                large.push(n / d);
            }
        }
        d += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

/// Random inner factors (outer to inner) for a tile hole.
pub fn sample_tile(
    rng: &mut impl Rng,
    extent: i64,
    parts: usize,
    (max_inner, max_first): (Option<i64>, Option<i64>),
    imperfect_prob: f64,
) -> Vec<i64> {
    let mut factors = vec![1; parts.saturating_sub(1)];
    let mut rest = extent.max(1);
    for level in (0..factors.len()).rev() {
        let cap = level_cap(level, factors.len(), max_inner, max_first);
        let f = if rng.random_bool(imperfect_prob.clamp(0.0, 1.0)) {
            rng.random_range(1..=rest.min(cap).max(1))
        } else {
            let mut divs: Vec<i64> = divisors(rest).into_iter().filter(|&d| d <= cap).collect();
            // A vector-lane level of 1 or 2 wastes most of a SIMD register: keep such
            // levels to one draw in ten where wider ones exist.
            if max_inner.is_some() && level + 1 == parts - 1 && rng.random_bool(0.9) {
                let wide: Vec<i64> = divs.iter().copied().filter(|&d| d >= 4).collect();
                if !wide.is_empty() {
                    divs = wide;
                }
            }
            divs[rng.random_range(0..divs.len())]
        };
        factors[level] = f;
        rest = (rest + f - 1) / f;
    }
    factors
}

/// The largest factor level `level` of `n` may take: `max_inner` for the last, `max_first`
/// for the first (the smaller of the two where one level is both).
pub fn level_cap(level: usize, n: usize, max_inner: Option<i64>, max_first: Option<i64>) -> i64 {
    let mut cap = i64::MAX;
    if level + 1 == n {
        cap = cap.min(max_inner.unwrap_or(i64::MAX));
    }
    if level == 0 {
        cap = cap.min(max_first.unwrap_or(i64::MAX));
    }
    cap
}

/// Random decisions for every hole of `sketch`.
pub fn sample(sketch: &Sketch, rng: &mut impl Rng, opts: &TuneOptions) -> Vec<Vec<i64>> {
    let mut d: Vec<Vec<i64>> = sketch
        .holes
        .iter()
        .map(|h| match h {
            Hole::Tile {
                extent,
                parts,
                max_inner,
                max_first,
            } => sample_tile(
                rng,
                *extent,
                *parts,
                (*max_inner, *max_first),
                opts.imperfect_tile_prob,
            ),
            // An empty list (options that skipped `TuneOptions::validate`) chooses 0: no
            // unrolling, the one value every list may hold.
            Hole::Choice { choices, .. } if choices.is_empty() => vec![0],
            Hole::Choice { choices, .. } => vec![choices[rng.random_range(0..choices.len())]],
        })
        .collect();
    sketch.clamp_to_caps(&mut d, |n| rng.random_range(0..n));
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn the_first_and_last_caps_hold_in_draws_and_mutations() {
        let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(7);
        let mut firsts = std::collections::BTreeSet::new();
        for _ in 0..2000 {
            // block, vthread (at most 8), thread, inner (at most 4): 4096 = 2^12.
            let f = sample_tile(&mut rng, 4096, 4, (Some(4), Some(8)), 0.1);
            assert_eq!(f.len(), 3);
            assert!(f[0] <= 8 && f[2] <= 4, "{f:?}");
            firsts.insert(f[0]);
            if let Some(m) = crate::mutate::mutate_tile(&mut rng, 4096, &f, (Some(4), Some(8))) {
                assert!(m[0] <= 8 && m[2] <= 4, "{f:?} -> {m:?}");
            }
        }
        // Every allowed divisor comes up as the first factor (the cap is a ceiling, not a
        // pin); imperfect draws add the others up to it.
        for d in [1, 2, 4, 8] {
            assert!(firsts.contains(&d), "{firsts:?}");
        }
        assert!(firsts.iter().all(|&f| f <= 8), "{firsts:?}");
        // One level that is both first and last takes the smaller cap.
        assert_eq!(level_cap(0, 1, Some(16), Some(8)), 8);
        assert_eq!(level_cap(0, 2, Some(16), None), i64::MAX);
    }

    #[test]
    fn a_shared_bound_keeps_perfect_tilings_perfect() {
        use crate::sketch::{Hole, ProductCap, Sketch};
        let hole = Hole::Tile {
            extent: 96,
            parts: 4,
            max_inner: None,
            max_first: Some(8),
        };
        let sk = Sketch {
            name: "t".into(),
            steps: Vec::new(),
            holes: vec![hole.clone(), hole],
            caps: vec![ProductCap {
                factors: vec![(0, 0), (1, 0)],
                max: 8,
            }],
        };
        let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(11);
        let opts = TuneOptions {
            imperfect_tile_prob: 0.0,
            ..TuneOptions::default()
        };
        for _ in 0..500 {
            let d = sample(&sk, &mut rng, &opts);
            assert!(d[0][0] * d[1][0] <= 8, "{d:?}");
            for f in &d {
                assert_eq!(96 % f.iter().product::<i64>(), 0, "{d:?}");
            }
        }
        // Clamping moves whole prime factors out, smallest first: 6 * 4 -> within 8.
        let mut d = vec![vec![6, 2, 1], vec![4, 1, 1]];
        sk.clamp_to_caps(&mut d, |_| 0);
        assert!(sk.within_caps(&d));
        assert_eq!((d[0][0], d[1][0]), (1, 4));
    }
}
