//! Ranking quality of predicted scores against measured throughputs.
//!
//! All three compare two slices of equal length, `pred[i]` and `truth[i]` for program `i`:
//! - [`pairwise_accuracy`]: over the pairs with different true throughput, the fraction the
//!   scores order the same way (a tie in the scores counts one half). 0.5 is chance.
//!   [`pairwise_accuracy_apart`]: the same over the pairs more than a factor apart, and
//!   [`share_of_pairs_apart`] how many of the pairs those are.
//! - [`spearman`]: Pearson correlation of the ranks (ties get their average rank).
//! - [`top_k_recall`]: of the `k` truly fastest programs, the fraction among the `k` best
//!   scored (ties broken by position, so a constant predictor gets no free hits).

/// Pairwise ranking accuracy; `None` when no pair has different true values.
pub fn pairwise_accuracy(pred: &[f64], truth: &[f64]) -> Option<f64> {
    pairwise_accuracy_apart(pred, truth, 1.0)
}

/// [`pairwise_accuracy`] over the pairs whose true values differ by more than the factor
/// `ratio` (1.05: more than 5% apart); `None` when there is no such pair. Measured
/// throughputs carry timing noise: pairs closer than it are coin flips for any model, and
/// this says how a model orders the pairs that one timing can tell apart.
pub fn pairwise_accuracy_apart(pred: &[f64], truth: &[f64], ratio: f64) -> Option<f64> {
    let n = pred.len().min(truth.len());
    let mut pairs = 0u64;
    let mut correct = 0.0f64;
    for i in 0..n {
        for j in i + 1..n {
            let (lo, hi) = (truth[i].min(truth[j]), truth[i].max(truth[j]));
            if truth[i] == truth[j] || hi <= lo * ratio {
                continue;
            }
            pairs += 1;
            let t = truth[i] > truth[j];
            if pred[i] == pred[j] {
                correct += 0.5;
            } else if (pred[i] > pred[j]) == t {
                correct += 1.0;
            }
        }
    }
    (pairs > 0).then(|| correct / pairs as f64)
}

/// Of the pairs with different true values, the share more than the factor `ratio` apart;
/// `None` when no pair differs. How much of [`pairwise_accuracy`] rests on pairs that one
/// timing can tell apart: where most of a tuning run's programs lie within a few percent of
/// each other, the rest are coin flips for any model scored against one timing.
pub fn share_of_pairs_apart(truth: &[f64], ratio: f64) -> Option<f64> {
    let mut differ = 0u64;
    let mut apart = 0u64;
    for (i, &a) in truth.iter().enumerate() {
        for &b in &truth[i + 1..] {
            if a == b {
                continue;
            }
            differ += 1;
            if a.max(b) > a.min(b) * ratio {
                apart += 1;
            }
        }
    }
    (differ > 0).then(|| apart as f64 / differ as f64)
}

/// Ranks from 1, ties averaged.
fn ranks(x: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut r = vec![0.0; x.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && x[idx[j + 1]] == x[idx[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for &k in &idx[i..=j] {
            r[k] = avg;
        }
        i = j + 1;
    }
    r
}

/// Spearman's rank correlation; `None` for fewer than two programs or constant truth (0.0
/// for constant scores: they carry no ranking).
pub fn spearman(pred: &[f64], truth: &[f64]) -> Option<f64> {
    let n = pred.len().min(truth.len());
    if n < 2 {
        return None;
    }
    let (rp, rt) = (ranks(&pred[..n]), ranks(&truth[..n]));
    let mean = (n as f64 + 1.0) / 2.0;
    let (mut cov, mut vp, mut vt) = (0.0, 0.0, 0.0);
    for i in 0..n {
        let (a, b) = (rp[i] - mean, rt[i] - mean);
        cov += a * b;
        vp += a * a;
        vt += b * b;
    }
    if vt == 0.0 {
        return None;
    }
    if vp == 0.0 {
        return Some(0.0);
    }
    Some(cov / (vp * vt).sqrt())
}

/// Indices of the `k` largest values, ties broken by position.
fn top_k(x: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&a, &b| x[b].total_cmp(&x[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// Top-`k` recall (with `k` capped at the number of programs); `None` for no programs.
pub fn top_k_recall(pred: &[f64], truth: &[f64], k: usize) -> Option<f64> {
    let n = pred.len().min(truth.len());
    let k = k.min(n);
    if k == 0 {
        return None;
    }
    let t = top_k(&truth[..n], k);
    let p = top_k(&pred[..n], k);
    let hits = p.iter().filter(|i| t.contains(i)).count();
    Some(hits as f64 / k as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_of_pairs_apart_counts_differing_pairs_only() {
        // Pairs (1, 1.01) and (2, 2.04) are within 5%; (1, 2) and the others are not; the
        // tie (2, 2) does not count.
        let t = [1.0, 1.01, 2.0, 2.04, 2.0];
        // Differing pairs: 10 in all less the one tie = 9. Within 5%: (1, 1.01), (2, 2.04)
        // twice (both 2s): 3. Apart: 6 of 9.
        assert_eq!(share_of_pairs_apart(&t, 1.05), Some(6.0 / 9.0));
        assert_eq!(share_of_pairs_apart(&t, 1.0), Some(1.0));
        assert_eq!(share_of_pairs_apart(&[3.0; 4], 1.05), None);
        assert_eq!(share_of_pairs_apart(&[], 1.05), None);
    }

    #[test]
    fn perfect_reversed_and_tied() {
        let t = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(pairwise_accuracy(&t, &t), Some(1.0));
        assert_eq!(pairwise_accuracy(&[4.0, 3.0, 2.0, 1.0], &t), Some(0.0));
        assert_eq!(pairwise_accuracy(&[0.0; 4], &t), Some(0.5));
        assert_eq!(pairwise_accuracy(&t, &[1.0; 4]), None);
        assert!((spearman(&t, &t).unwrap() - 1.0).abs() < 1e-12);
        assert!((spearman(&[4.0, 3.0, 2.0, 1.0], &t).unwrap() + 1.0).abs() < 1e-12);
        assert_eq!(spearman(&[0.0; 4], &t), Some(0.0));
        assert_eq!(top_k_recall(&t, &t, 2), Some(1.0));
        assert_eq!(top_k_recall(&[4.0, 3.0, 2.0, 1.0], &t, 2), Some(0.0));
        assert_eq!(top_k_recall(&t, &t, 10), Some(1.0));
        assert_eq!(top_k_recall(&[], &[], 5), None);
    }

    #[test]
    fn pairs_apart() {
        // 1.0 and 1.03 are 3% apart: left out at 5%, where the one wrong pair is theirs.
        let t = [1.0, 1.03, 2.0, 0.0];
        let p = [2.0, 1.0, 3.0, -1.0];
        assert_eq!(pairwise_accuracy(&p, &t), Some(5.0 / 6.0));
        assert_eq!(pairwise_accuracy_apart(&p, &t, 1.05), Some(1.0));
        // A failed program (throughput 0) is apart from every timed one, not from another
        // failure.
        assert_eq!(
            pairwise_accuracy_apart(&[1.0, 0.0], &[0.0, 0.0], 1.05),
            None
        );
        assert_eq!(
            pairwise_accuracy_apart(&[1.0, 0.0], &[0.0, 1.0], 1.05),
            Some(0.0)
        );
        assert_eq!(pairwise_accuracy_apart(&p, &[1.0; 4], 1.05), None);
    }
}
