//! [`SketchBuilder`]: a sketch under construction, applied as it grows to a scratch state so a
//! rule reads stage and loop positions as they are after the steps before it.

use super::RuleError;
use crate::sketch::{ChoiceKind, Hole, ProductCap, Sketch, SketchStep};
use tensortune_schedules::schedule::State;
use tensortune_schedules::trace::Step;
use tensortune_schedules::{ComputeDag, TensorId};

/// A sketch being built by the rules, stage by stage.
#[derive(Clone)]
pub struct SketchBuilder {
    /// The scratch state: every structural step applied, tile holes with factors of 1 (the
    /// same loop structure as any decision gives).
    pub state: State,
    steps: Vec<SketchStep>,
    holes: Vec<Hole>,
    caps: Vec<ProductCap>,
    /// Annotation steps, applied after every structural step (they name stages by tensor, so
    /// stages inserted later do not move them).
    deferred: Vec<SketchStep>,
    /// `STAGE:VARIANT` per stage a rule took, outputs first.
    names: Vec<String>,
    /// Stages a consumer's variant needs computed into a buffer, not inlined.
    materialized: Vec<TensorId>,
}

impl SketchBuilder {
    /// An empty sketch of `dag`.
    pub fn new(dag: &ComputeDag) -> SketchBuilder {
        SketchBuilder {
            state: State::new(dag),
            steps: Vec::new(),
            holes: Vec::new(),
            caps: Vec::new(),
            deferred: Vec::new(),
            names: Vec::new(),
            materialized: Vec::new(),
        }
    }

    /// Asks the rules of the stage computing `t` (not yet applied: stages are visited
    /// outputs first) to compute it into a buffer rather than inline it.
    pub fn keep_materialized(&mut self, t: TensorId) {
        if !self.materialized.contains(&t) {
            self.materialized.push(t);
        }
    }

    /// True if a consumer's variant asked for `t` in a buffer ([`Self::keep_materialized`]).
    pub fn must_materialize(&self, t: TensorId) -> bool {
        self.materialized.contains(&t)
    }

    /// Appends a step with no hole.
    pub fn fixed(&mut self, step: Step) -> Result<(), RuleError> {
        self.state.apply(&step)?;
        self.steps.push(SketchStep::Fixed(step));
        Ok(())
    }

    /// Adds a hole; returns its index.
    pub fn hole(&mut self, h: Hole) -> usize {
        self.holes.push(h);
        self.holes.len() - 1
    }

    /// Adds a choice hole of `kind` over `choices`; returns its index.
    pub fn choice(&mut self, choices: Vec<i64>, kind: ChoiceKind) -> usize {
        self.hole(Hole::Choice { choices, kind })
    }

    /// Appends a structural step that reads a hole, already applied to the scratch state by
    /// the caller.
    pub fn push(&mut self, step: SketchStep) {
        self.steps.push(step);
    }

    /// Appends an annotation step (applied after every structural step).
    pub fn defer(&mut self, step: SketchStep) {
        self.deferred.push(step);
    }

    /// Splits loop `iter` of `stage` into `parts` loops with a tile hole (the innermost at
    /// most `max_inner` long, if given); returns the hole.
    pub fn split(
        &mut self,
        stage: u32,
        iter: u32,
        parts: usize,
        max_inner: Option<i64>,
    ) -> Result<usize, RuleError> {
        self.split_capped(stage, iter, parts, max_inner, None)
    }

    /// [`Self::split`] with the first factor (the level just inside the outermost) at most
    /// `max_first`, if given.
    pub fn split_capped(
        &mut self,
        stage: u32,
        iter: u32,
        parts: usize,
        max_inner: Option<i64>,
        max_first: Option<i64>,
    ) -> Result<usize, RuleError> {
        let extent = self
            .state
            .stage(stage as usize)
            .and_then(|s| s.leaf(iter as usize))
            .map(|l| l.extent)
            .ok_or(RuleError::NoLoop { stage, iter })?;
        let hole = self.hole(Hole::Tile {
            extent,
            parts,
            max_inner,
            max_first,
        });
        self.state.split(stage, iter, &vec![1; parts - 1])?;
        self.steps.push(SketchStep::Split { stage, iter, hole });
        Ok(hole)
    }

    /// Bounds the product of the tile factors `factors` (each a tile hole and an index into
    /// its decision) by `max`: see [`ProductCap`].
    pub fn cap_product(&mut self, factors: Vec<(usize, usize)>, max: i64) {
        self.caps.push(ProductCap { factors, max });
    }

    /// Splits loop `iter` of `stage` as another stage's tile `hole` is split: one new inner
    /// loop per range of the hole's factors.
    pub fn follow(
        &mut self,
        stage: u32,
        iter: u32,
        hole: usize,
        ranges: Vec<(usize, usize)>,
    ) -> Result<(), RuleError> {
        self.state.split(stage, iter, &vec![1; ranges.len()])?;
        self.steps.push(SketchStep::FollowSplit {
            stage,
            iter,
            hole,
            ranges,
        });
        Ok(())
    }

    /// A compute-location hole over `choices` (loop positions of `target`, -1 for the root)
    /// for `stage`; the scratch state takes the first choice.
    pub fn compute_at(
        &mut self,
        stage: u32,
        target: u32,
        choices: Vec<i64>,
    ) -> Result<(), RuleError> {
        let first = choices.first().copied().unwrap_or(-1);
        let hole = self.choice(choices, ChoiceKind::Location);
        if first >= 0 {
            self.state.compute_at(stage, target, first as u32)?;
        }
        self.steps.push(SketchStep::ComputeAt {
            stage,
            target,
            hole,
        });
        Ok(())
    }

    /// The position of the stage computing `t`.
    pub fn pos(&self, t: TensorId) -> Result<u32, RuleError> {
        self.state
            .position_of(t)
            .map(|p| p as u32)
            .ok_or(RuleError::NoStageOf(t))
    }

    /// The tensor the stage at position `stage` computes.
    pub fn tensor(&self, stage: u32) -> Result<TensorId, RuleError> {
        self.state
            .stage(stage as usize)
            .map(|s| s.tensor)
            .ok_or(RuleError::NoStage(stage))
    }

    /// The number of loops of the stage at position `stage`.
    pub fn stage_leaves(&self, stage: u32) -> Result<usize, RuleError> {
        self.state
            .stage(stage as usize)
            .map(|s| s.leaves.len())
            .ok_or(RuleError::NoStage(stage))
    }

    /// The extent of loop `iter` of the stage at position `stage`.
    pub fn loop_extent(&self, stage: u32, iter: u32) -> Result<i64, RuleError> {
        self.state
            .stage(stage as usize)
            .and_then(|s| s.leaf(iter as usize))
            .map(|l| l.extent)
            .ok_or(RuleError::NoLoop { stage, iter })
    }

    /// Records that the stage named `stage` took `variant`.
    pub fn name(&mut self, stage: &str, variant: &str) {
        self.names.push(format!("{stage}:{variant}"));
    }

    /// The finished sketch: named after the variants, inputs first; annotations last.
    pub fn finish(self) -> Sketch {
        let mut names = self.names;
        names.reverse();
        let mut steps = self.steps;
        steps.extend(self.deferred);
        Sketch {
            name: names.join(","),
            steps,
            holes: self.holes,
            caps: self.caps,
        }
    }
}
