//! Mutators: each changes one decision of a measured or sampled program.
//!
//! A program is its sketch and decisions; a mutator returns new decisions (or `None` when the
//! hole it picked cannot change) and the caller instantiates them again. The kinds and their
//! default weights follow Ansor: tile size (move a factor between two levels of one tile),
//! compute location, unroll step, parallel extent.

use crate::options::MutationWeights;
use crate::sketch::sample::divisors;
use crate::sketch::{ChoiceKind, Hole, Sketch};
use rand::{Rng, RngExt};

/// Which decision a mutation changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MutationKind {
    /// Tile factors.
    TileSize,
    /// A compute location.
    ComputeLocation,
    /// An unroll step, or how far ahead a prefetch fetches.
    Unroll,
    /// A parallel extent.
    Parallel,
}

/// Draws a mutation kind by weight.
pub fn pick_kind(rng: &mut impl Rng, w: &MutationWeights) -> MutationKind {
    let total = w.tile_size + w.compute_location + w.unroll + w.parallel;
    let mut x = rng.random::<f64>() * total.max(1e-12);
    for (k, p) in [
        (MutationKind::TileSize, w.tile_size),
        (MutationKind::ComputeLocation, w.compute_location),
        (MutationKind::Unroll, w.unroll),
    ] {
        if x < p {
            return k;
        }
        x -= p;
    }
    MutationKind::Parallel
}

/// Moves a divisor `d > 1` of one level's extent to another level of the same tile; the
/// outermost level (implicit: the extent over the product of the factors) takes part too.
/// Keeps the innermost factor within `max_inner` and the first within `max_first`.
pub fn mutate_tile(
    rng: &mut impl Rng,
    extent: i64,
    factors: &[i64],
    (max_inner, max_first): (Option<i64>, Option<i64>),
) -> Option<Vec<i64>> {
    let inner: i64 = factors.iter().product();
    let outer = (extent + inner - 1) / inner.max(1);
    let mut levels = vec![outer];
    levels.extend_from_slice(factors);
    for _ in 0..8 {
        let src = rng.random_range(0..levels.len());
        if levels[src] <= 1 {
            continue;
        }
        let divs: Vec<i64> = divisors(levels[src])
            .into_iter()
            .filter(|&d| d > 1)
            .collect();
        let d = divs[rng.random_range(0..divs.len())];
        let dst = rng.random_range(0..levels.len());
        if dst == src {
            continue;
        }
        let mut next = levels.clone();
        next[src] /= d;
        next[dst] *= d;
        let last = next.len() - 1;
        if max_inner.is_some_and(|m| next[last] > m) || max_first.is_some_and(|m| next[1] > m) {
            continue;
        }
        let out: Vec<i64> = next[1..].to_vec();
        if out != factors {
            return Some(out);
        }
    }
    None
}

/// One mutation of `decisions` of `sketch`, of the kind drawn; `None` if nothing changed.
pub fn mutate(
    sketch: &Sketch,
    decisions: &[Vec<i64>],
    rng: &mut impl Rng,
    w: &MutationWeights,
) -> Option<Vec<Vec<i64>>> {
    let kind = pick_kind(rng, w);
    let holes: Vec<usize> = sketch
        .holes
        .iter()
        .enumerate()
        .filter(|(_, h)| match (h, kind) {
            (Hole::Tile { .. }, MutationKind::TileSize) => true,
            // The lanes of a cooperative fetch shape the tile of a copy.
            (
                Hole::Choice {
                    kind: ChoiceKind::Lanes,
                    choices,
                },
                MutationKind::TileSize,
            ) => choices.len() > 1,
            (
                Hole::Choice {
                    kind: ChoiceKind::Location,
                    choices,
                },
                MutationKind::ComputeLocation,
            ) => choices.len() > 1,
            // A prefetch is, like the unroll limit, a choice of how the body is emitted.
            (
                Hole::Choice {
                    kind: ChoiceKind::Unroll | ChoiceKind::Prefetch,
                    choices,
                },
                MutationKind::Unroll,
            ) => choices.len() > 1,
            (
                Hole::Choice {
                    kind: ChoiceKind::Parallel,
                    choices,
                },
                MutationKind::Parallel,
            ) => choices.len() > 1,
            _ => false,
        })
        .map(|(i, _)| i)
        .collect();
    if holes.is_empty() {
        return None;
    }
    let h = holes[rng.random_range(0..holes.len())];
    let mut out = decisions.to_vec();
    match &sketch.holes[h] {
        Hole::Tile {
            extent,
            max_inner,
            max_first,
            ..
        } => {
            out[h] = mutate_tile(rng, *extent, &decisions[h], (*max_inner, *max_first))?;
        }
        Hole::Choice { choices, .. } => {
            let others: Vec<i64> = choices
                .iter()
                .copied()
                .filter(|&c| Some(&c) != decisions[h].first())
                .collect();
            if others.is_empty() {
                return None;
            }
            out[h] = vec![others[rng.random_range(0..others.len())]];
        }
    }
    // A move into a capped level over its shared bound makes a program the verifier
    // rejects: no mutation rather than a wasted measurement.
    sketch.within_caps(&out).then_some(out)
}
