//! The evolutionary search: proposes the next batch of programs to measure.
//!
//! A program is a sketch with decisions ([`Candidate`]). One round:
//! 1. the initial population is up to `init_from_records` of it from the best measured
//!    programs, the rest random samples of random sketches;
//! 2. each generation is scored by the [`Scorer`] (the cost model), the best unmeasured
//!    programs seen so far are kept, and the next generation is drawn: parents in proportion
//!    to their score, each child a mutation of its parent with probability `mutation_prob`,
//!    else a copy;
//! 3. the batch is the best kept programs by score, plus `eps_greedy` of it drawn from the
//!    random samples, none measured before and none twice, by trace and by the loop IR it
//!    lowers to, and none whose unrolled loops copy out more than `max_unrolled_statements`
//!    statements (slow to compile, and slow).
//!
//! Everything random comes from the caller's generator, so a seed fixes the round.

use crate::mutate::mutate;
use crate::options::TuneOptions;
use crate::sketch::rules::SketchRule;
use crate::sketch::sample::sample;
use crate::sketch::Sketch;
use rand::{Rng, RngExt};
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use tensortune_schedules::schedule::State;
use tensortune_schedules::target::TargetDesc;
use tensortune_schedules::ComputeDag;

/// A program of the search space.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// Index of its sketch; out of range (`usize::MAX`) for a program of no sketch, the
    /// loops as written that a task's first batch measures as its default schedule.
    pub sketch: usize,
    /// The values of the sketch's holes.
    pub decisions: Vec<Vec<i64>>,
    /// The instantiated schedule.
    pub state: State,
}

/// Ranks programs: higher is better. The cost model behind it may fail to score a program
/// (it does not lower, say): it then gets `f64::NEG_INFINITY`.
pub trait Scorer {
    /// One score per state.
    fn score(&mut self, states: &[State]) -> Vec<f64>;
}

/// A stable fingerprint of a program: the hash of its steps alone, so equal programs from
/// different sketches or decisions are one program.
pub fn fingerprint(state: &State) -> u64 {
    // DefaultHasher::new() has fixed keys: the value is the same in every run.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    state.trace().steps_json().hash(&mut h);
    h.finish()
}

/// A fingerprint of the program a state lowers to (its loop IR), so that two traces that make
/// the same program (an unroll limit above the size of every loop nest, a compute location
/// that lowers alike) are measured once. `None` when the state does not lower.
pub fn program_fingerprint(state: &State) -> Option<u64> {
    lowered_program(state).map(|(fp, _)| fp)
}

/// A state's [`program_fingerprint`] and the statements of its loop IR with unrolled loops
/// copied out ([`tensortune_schedules::ir::Stmt::unrolled_copies`]); `None` when the state
/// does not lower.
pub fn lowered_program(state: &State) -> Option<(u64, i64)> {
    let f = tensortune_schedules::lower::lower(state).ok()?;
    Some(program_of(&f))
}

/// [`lowered_program`] of a function already lowered.
fn program_of(f: &tensortune_schedules::ir::LoweredFunc) -> (u64, i64) {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    f.to_string().hash(&mut h);
    (h.finish(), f.body.unrolled_copies())
}

/// The search space of one workload: its DAG and sketches.
#[derive(Clone, Debug)]
pub struct SearchSpace {
    /// The workload's DAG.
    pub dag: ComputeDag,
    /// Its sketches.
    pub sketches: Vec<Sketch>,
    /// On a GPU target, its description: a program the GPU verifier refuses (too many
    /// threads or too much shared memory for a block, a race it can see) is not proposed,
    /// since measuring it would only file a compile error and spend a trial.
    pub gpu: Option<tensortune_schedules::target::CudaDesc>,
}

impl SearchSpace {
    /// The search space of a DAG on the CPU [`crate::sketch::rules::generate`] assumes.
    pub fn new(dag: ComputeDag, opts: &TuneOptions) -> SearchSpace {
        let sketches = crate::sketch::rules::generate(&dag, opts);
        SearchSpace {
            dag,
            sketches,
            gpu: None,
        }
    }

    /// The search space `rules` make of a DAG on `target`.
    pub fn for_target(
        dag: ComputeDag,
        opts: &TuneOptions,
        target: &TargetDesc,
        rules: &[Box<dyn SketchRule>],
    ) -> SearchSpace {
        let sketches = crate::sketch::rules::generate_for(&dag, opts, target, rules);
        let gpu = match target {
            TargetDesc::Cuda(d) => Some(d.clone()),
            TargetDesc::Cpu(_) => None,
        };
        SearchSpace { dag, sketches, gpu }
    }

    /// Instantiates decisions of sketch `k`.
    pub fn candidate(&self, k: usize, decisions: Vec<Vec<i64>>) -> Option<Candidate> {
        let state = self
            .sketches
            .get(k)?
            .instantiate(&self.dag, &decisions)
            .ok()?;
        Some(Candidate {
            sketch: k,
            decisions,
            state,
        })
    }

    /// A random program (a few attempts; `None` if every one fails).
    pub fn random(&self, rng: &mut impl Rng, opts: &TuneOptions) -> Option<Candidate> {
        if self.sketches.is_empty() {
            return None;
        }
        for _ in 0..8 {
            let k = rng.random_range(0..self.sketches.len());
            let d = sample(&self.sketches[k], rng, opts);
            if let Some(c) = self.candidate(k, d) {
                return Some(c);
            }
        }
        None
    }

    /// The candidate a measured state came from, if its trace names one of these sketches.
    pub fn from_state(&self, state: &State) -> Option<Candidate> {
        let r = state.trace().sketch.as_ref()?;
        let k = self.sketches.iter().position(|s| s.name == r.name)?;
        self.candidate(k, r.decisions.clone())
    }

    /// One round of evolutionary search: up to `n` new programs, best first. `measured` holds
    /// the [`fingerprint`]s and [`program_fingerprint`]s of the programs measured before;
    /// none of them is proposed again.
    pub fn propose(
        &self,
        scorer: &mut dyn Scorer,
        measured: &HashSet<u64>,
        best_measured: &[Candidate],
        n: usize,
        opts: &TuneOptions,
        rng: &mut impl Rng,
    ) -> Vec<Candidate> {
        let pop_size = opts.population.max(n).max(1);
        let mut population: Vec<Candidate> = best_measured
            .iter()
            .take((opts.init_from_records * pop_size as f64) as usize)
            .cloned()
            .collect();
        let mut randoms = Vec::new();
        let mut tries = 0;
        while population.len() < pop_size && tries < pop_size * 4 {
            tries += 1;
            if let Some(c) = self.random(rng, opts) {
                randoms.push(c.clone());
                population.push(c);
            }
        }
        // The best unmeasured programs seen in any generation, by fingerprint.
        let mut kept: HashMap<u64, (f64, Candidate)> = HashMap::new();
        // Scores by fingerprint: copies and re-found programs are scored once per round
        // (lowering and featurizing dominate the search's time).
        let mut scored: HashMap<u64, f64> = HashMap::new();
        for gen in 0..opts.generations.max(1) {
            let fps: Vec<u64> = population.iter().map(|c| fingerprint(&c.state)).collect();
            let mut todo: Vec<usize> = Vec::new();
            let mut seen: HashSet<u64> = HashSet::new();
            for (i, fp) in fps.iter().enumerate() {
                if !scored.contains_key(fp) && seen.insert(*fp) {
                    todo.push(i);
                }
            }
            let states: Vec<State> = todo.iter().map(|&i| population[i].state.clone()).collect();
            for (&i, s) in todo.iter().zip(scorer.score(&states)) {
                scored.insert(fps[i], s);
            }
            let scores: Vec<f64> = fps
                .iter()
                .map(|fp| scored.get(fp).copied().unwrap_or(f64::NEG_INFINITY))
                .collect();
            for ((c, &s), &fp) in population.iter().zip(&scores).zip(&fps) {
                if s.is_finite() && !measured.contains(&fp) {
                    kept.entry(fp).or_insert((s, c.clone()));
                }
            }
            if gen + 1 == opts.generations.max(1) {
                break;
            }
            population = self.next_generation(&population, &scores, pop_size, opts, rng);
        }
        let mut ranked: Vec<(u64, f64, Candidate)> =
            kept.into_iter().map(|(fp, (s, c))| (fp, s, c)).collect();
        // Ties broken by fingerprint so the order does not depend on hash-map iteration.
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let n_random = ((n as f64) * opts.eps_greedy).round() as usize;
        let mut out = Vec::with_capacity(n);
        let mut taken: HashSet<u64> = HashSet::new();
        // A new trace may still make a program measured before, or one already taken; a
        // program over `max_unrolled_statements` is not proposed at all.
        let gpu = self.gpu.as_ref();
        let new_program = |c: &Candidate, taken: &mut HashSet<u64>| {
            let Ok(f) = tensortune_schedules::lower::lower(&c.state) else {
                // Measured anyway: the lowering error becomes its record.
                return true;
            };
            let (p, size) = program_of(&f);
            opts.max_unrolled_statements.is_none_or(|m| size <= m)
                && gpu.is_none_or(|d| tensortune_schedules::gpu::verify::verify_gpu(&f, d).is_ok())
                && !measured.contains(&p)
                && taken.insert(p)
        };
        for (fp, _, c) in ranked {
            if out.len() + n_random >= n {
                break;
            }
            if taken.insert(fp) && new_program(&c, &mut taken) {
                out.push(c);
            }
        }
        for c in randoms {
            if out.len() >= n {
                break;
            }
            let fp = fingerprint(&c.state);
            if !measured.contains(&fp) && taken.insert(fp) && new_program(&c, &mut taken) {
                out.push(c);
            }
        }
        out
    }

    fn next_generation(
        &self,
        population: &[Candidate],
        scores: &[f64],
        size: usize,
        opts: &TuneOptions,
        rng: &mut impl Rng,
    ) -> Vec<Candidate> {
        // Roulette weights: scores shifted to be positive; programs that could not be scored
        // are never parents.
        let finite: Vec<f64> = scores.iter().copied().filter(|s| s.is_finite()).collect();
        let lo = finite.iter().copied().fold(f64::INFINITY, f64::min);
        let weights: Vec<f64> = scores
            .iter()
            .map(|&s| if s.is_finite() { s - lo + 1e-6 } else { 0.0 })
            .collect();
        let total: f64 = weights.iter().sum();
        if total <= 0.0 || population.is_empty() {
            return population.to_vec();
        }
        let mut cumulative = Vec::with_capacity(weights.len());
        let mut acc = 0.0;
        for w in &weights {
            acc += w;
            cumulative.push(acc);
        }
        let mut next = Vec::with_capacity(size);
        for _ in 0..size {
            let x = rng.random::<f64>() * total;
            let i = cumulative
                .partition_point(|&c| c < x)
                .min(population.len() - 1);
            let parent = &population[i];
            let child = if rng.random_bool(opts.mutation_prob.clamp(0.0, 1.0)) {
                // A candidate of no sketch (the loops as written) has nothing to mutate.
                self.sketches.get(parent.sketch).and_then(|sk| {
                    mutate(sk, &parent.decisions, rng, &opts.mutation_weights)
                        .and_then(|d| self.candidate(parent.sketch, d))
                })
            } else {
                None
            };
            next.push(child.unwrap_or_else(|| parent.clone()));
        }
        next
    }
}
