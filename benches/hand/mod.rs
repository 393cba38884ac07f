//! Hand-written schedules shared by the benchmarks and the tests that check them.

use tensortune_schedules::ir::Scope;
use tensortune_schedules::schedule::{ScheduleError, State};
use tensortune_schedules::ComputeDag;

/// A register-tiled matmul (`matmul:M,N,K`, stages A, B, C) for AVX-512:
///
/// ```text
/// for jo in 0..N/nr:                 // a column panel of B (K x nr) stays in L2 over all io
///   for io in 0..M/mr:
///     acc[mr, nr] (local)            // cache_write: the accumulator tile, in registers
///     for k in 0..K:
///       for ii in 0..mr (unrolled):  // mr rows: mr * nr/16 independent FMA chains
///         for j in 0..nr (vector):   // acc[ii, :] += A[i, k] (broadcast) * B[k, j:] (contiguous)
///     C[tile] = acc
/// ```
///
/// With mr = 8 and nr = 32 the tile is 16 zmm accumulators, enough to hide the FMA latency
/// (4 cycles, 2 pipes); B's row segment is loaded once per k and reused over the 8 rows.
pub fn matmul_register_tiled(dag: &ComputeDag, mr: i64, nr: i64) -> Result<State, ScheduleError> {
    let mut s = State::new(dag);
    let c = (s.stages().len() - 1) as u32;
    let acc = s.cache_write(c, Scope::Local)?;
    let c = acc + 1;
    // C: i, j -> i.o, i.i, j.o, j.i -> j.o, i.o, i.i, j.i
    s.split(c, 0, &[mr])?;
    s.split(c, 2, &[nr])?;
    s.reorder(c, &[2, 0, 1, 3])?;
    s.vectorize(c, 3)?;
    // acc: the same tiling (its outer loops have one iteration once bound inference sizes
    // the attached tile): i.o, i.i, j.o, j.i, k -> i.o, j.o, k, i.i, j.i
    s.split(acc, 0, &[mr])?;
    s.split(acc, 2, &[nr])?;
    s.reorder(acc, &[0, 2, 4, 1, 3])?;
    s.unroll(acc, 3)?;
    s.vectorize(acc, 4)?;
    s.compute_at(acc, c, 1)?;
    Ok(s)
}
