//! What a measured time could possibly be: the bound that keeps impossible records (a
//! hand-edited database, a hostile import) out of the ranking, the cutoff and the builds.
//!
//! A record claiming more than a hundred times what its target could ever compute is not a
//! measurement. The bound is loose on purpose, so that no real kernel comes near it: it only
//! needs to catch times that are wrong by orders of magnitude (`0`, `1e-300`, a unit slip).

use tensortune_records::MAX_FLOPS_PER_S;
use tensortune_schedules::expr::DType;
use tensortune_schedules::target::TargetKey;

/// The slack over the target's peak before a time counts as impossible.
const SLACK: f64 = 100.0;

/// A clock no CPU core sustains (GHz): the peak below is an upper bound, not an estimate.
const MAX_CLOCK_GHZ: f64 = 6.0;

/// The most FLOP/s a record of `target_key` may claim: for a CPU key, `SLACK` times
/// threads × vector lanes of f32 × 2 FMA units × 2 flops × `MAX_CLOCK_GHZ` (the key's
/// threads and vector width, as [`TargetKey::cpu_desc`] reads them); for any other key, or
/// text that is not a key, the target-blind limit of the records crate.
pub fn max_flops_per_s(target_key: &str) -> f64 {
    let Some(desc) = target_key
        .parse::<TargetKey>()
        .ok()
        .and_then(|k| k.cpu_desc())
    else {
        return MAX_FLOPS_PER_S;
    };
    let lanes = desc.vector_lanes(DType::F32) as f64;
    let peak = desc.threads() as f64 * lanes * 2.0 * 2.0 * MAX_CLOCK_GHZ * 1e9;
    (SLACK * peak).min(MAX_FLOPS_PER_S)
}

/// True when `median_s` for `flops` on `target_key` could have been measured.
pub fn possible(flops: f64, median_s: f64, target_key: &str) -> bool {
    median_s.is_finite()
        && median_s >= tensortune_records::MIN_LATENCY_S
        && flops <= median_s * max_flops_per_s(target_key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_keys_are_bounded_by_their_lanes_and_threads() {
        let one = max_flops_per_s("llvm -mcpu=znver4 -mattr=+avx2,+avx512f,+fma -threads=1");
        let two = max_flops_per_s("llvm -mcpu=znver4 -mattr=+avx2,+avx512f,+fma -threads=2");
        let avx2 = max_flops_per_s("llvm -mcpu=haswell -mattr=+avx,+avx2,+fma -threads=1");
        assert_eq!(one, 100.0 * 16.0 * 4.0 * 6e9);
        assert_eq!(two, 2.0 * one);
        assert_eq!(avx2, one / 2.0);
        assert_eq!(max_flops_per_s("cuda -arch=sm_90"), MAX_FLOPS_PER_S);
        assert_eq!(max_flops_per_s("not a key"), MAX_FLOPS_PER_S);
        // A key without -mattr promises SSE's 4 lanes; AVX without AVX2 has 8.
        assert_eq!(max_flops_per_s("llvm -mcpu=x86-64"), one / 4.0);
        assert_eq!(
            max_flops_per_s("llvm -mcpu=sandybridge -mattr=+avx"),
            one / 2.0
        );
        // A real matmul 1024³ at 200 GFLOP/s passes; the same at 0 s or 1e-12 s does not.
        let flops = 2.0 * 1024f64.powi(3);
        let key = "llvm -mcpu=znver4 -mattr=+avx512f -threads=1";
        assert!(possible(flops, flops / 200e9, key));
        assert!(!possible(flops, 0.0, key));
        assert!(!possible(flops, 1e-12, key));
        assert!(!possible(flops, -1.0, key));
        assert!(!possible(flops, f64::NAN, key));
    }
}
