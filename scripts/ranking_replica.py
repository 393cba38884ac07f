#!/usr/bin/env python3
"""Held-out ranking of the cost model's rows, in Python: a replica of `tensortune model eval
--held-out` for trying feature transforms and objectives without rebuilding.

Reads PREFIX.rows.csv (and PREFIX.random.csv for --relative random-*) as written by
`cargo run --release --example feature_rows -- DB PREFIX`. For each held-out workload it trains
XGBoost on every other workload's rows (one query group per workload, labels the throughput
over the workload's best, the parameters of `GbdtOptions::default()`: rank:pairwise, 100
rounds, eta 0.05, depth 6, 32 bins, 64 pairs per program) and scores the held-out rows by
pairwise accuracy over all pairs of differing throughput and over pairs more than 5% apart,
as `model eval` does (a tie in the prediction counts half).

  python3 scripts/ranking_replica.py PREFIX [--only 0,2,4] [--held-out 0,2] \
      [--relative none|group-percentile|group-median|random-percentile|random-median] \
      [--rounds 100] [--param max_depth=8 ...] [--extra PREFIX.hot.csv]

--only keeps those workloads (indices that feature_rows printed) and drops the rest;
--held-out scores those only (the others still train). --relative appends to each row its
columns relative to a reference per workload: the workload's own rows (group-*: what the
evaluated set itself looks like, known at ranking time but shifting as a search goes on) or
its random programs (random-*: fixed by the workload alone); percentile places each value
among the reference's, median subtracts the reference's median (the columns are log2
scaled, so that is a ratio). --extra appends the columns of a CSV with one line per row (as
`cargo run --release --example hot_loops -- DB PREFIX` writes: what the compiler made of
each record's hottest loop), log2 scaled as the rows are, plus their ratios to its first
column (per FMA). Needs numpy and xgboost (pip install numpy xgboost).
"""
import argparse
import sys

import numpy as np
import xgboost as xgb


def pairwise(pred, truth, ratio=1.0):
    """Share of pairs with truths more than `ratio` apart that `pred` orders the same way."""
    t, tt = truth[:, None], truth[None, :]
    n = len(pred)
    hi, lo = np.maximum(t, tt), np.minimum(t, tt)
    mask = np.triu(np.ones((n, n), bool), 1) & (t != tt) & ~(hi <= lo * ratio)
    diff = pred[:, None] - pred[None, :]
    right = np.where(diff == 0, 0.5, ((diff > 0) == (t > tt)).astype(float))
    return right[mask].sum() / max(mask.sum(), 1)


def relative(x, ref, how):
    """x's columns placed against the reference rows `ref`."""
    if how.endswith("median"):
        return x - np.median(ref, 0)
    srt = np.sort(ref, 0)
    return np.stack(
        [np.searchsorted(srt[:, j], x[:, j], side="right") / len(ref) for j in range(x.shape[1])],
        1,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prefix")
    ap.add_argument("--only", default="")
    ap.add_argument("--held-out", default="")
    ap.add_argument(
        "--relative",
        default="none",
        choices=["none", "group-percentile", "group-median", "random-percentile", "random-median"],
    )
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--param", action="append", default=[])
    ap.add_argument("--extra", default="")
    a = ap.parse_args()
    ints = lambda s: [int(v) for v in s.split(",") if v.strip()]

    rows = a.prefix + ".rows.csv"
    try:
        data = np.loadtxt(rows, delimiter=",", dtype=np.float64, ndmin=2)
    except OSError as e:
        sys.exit(f"ranking_replica: cannot read {rows} ({e.strerror or e}); write it with "
                 "`cargo run --release --example feature_rows -- DB PREFIX`")
    except ValueError as e:
        sys.exit(f"ranking_replica: {rows} is not a CSV of numbers: {e}")
    if a.extra:
        try:
            extra = np.loadtxt(a.extra, delimiter=",", dtype=np.float64, ndmin=2)
        except (OSError, ValueError) as e:
            sys.exit(f"ranking_replica: cannot read {a.extra} as a CSV of numbers ({e})")
        if len(extra) != len(data):
            sys.exit(f"ranking_replica: {a.extra} has {len(extra)} lines, {rows} {len(data)}")
        per_fma = extra[:, 1:] / np.maximum(extra[:, :1], 1)
        extra = np.concatenate([extra, per_fma], 1)
        data = np.concatenate([data, np.sign(extra) * np.log2(1 + np.abs(extra))], 1)
    if a.only:
        data = data[np.isin(data[:, 0].astype(int), ints(a.only))]
    if len(np.unique(data[:, 0])) < 2:
        sys.exit("ranking_replica: fewer than two workloads to hold out and train on")
    w = data[:, 0].astype(int)
    thr = data[:, 1]
    x = data[:, 2:].astype(np.float32)
    if a.relative != "none":
        if a.relative.startswith("random"):
            try:
                rnd = np.loadtxt(a.prefix + ".random.csv", delimiter=",", dtype=np.float32,
                                 ndmin=2)
            except OSError as e:
                sys.exit(f"ranking_replica: cannot read {a.prefix}.random.csv ({e.strerror or e})")
        rel = np.zeros_like(x)
        for k in np.unique(w):
            m = w == k
            ref = x[m] if a.relative.startswith("group") else rnd[rnd[:, 0].astype(int) == k][:, 1:]
            if len(ref) == 0:
                sys.exit(f"no random rows of workload {k} in {a.prefix}.random.csv")
            rel[m] = relative(x[m], ref, a.relative)
        x = np.concatenate([x, rel], 1)

    label = np.zeros_like(thr)
    for k in np.unique(w):
        m = w == k
        best = thr[m].max()
        label[m] = thr[m] / best if best > 0 else 0.0

    params = dict(
        objective="rank:pairwise", base_score=0, tree_method="hist", max_depth=6, max_bin=32,
        eta=0.05, gamma=0.001, min_child_weight=0, seed=0, nthread=1,
        lambdarank_pair_method="mean", lambdarank_num_pair_per_sample=64,
    )
    for kv in a.param:
        k, v = kv.split("=", 1)
        try:
            params[k] = int(v)
        except ValueError:
            try:
                params[k] = float(v)
            except ValueError:
                params[k] = v

    held = ints(a.held_out) or sorted(set(w.tolist()))
    missing = sorted(set(held) - set(w.tolist()))
    if missing:
        sys.exit(f"ranking_replica: no rows of workload(s) {missing} to hold out")
    all_pairs, apart = [], []
    for k in held:
        train = w != k
        order = np.argsort(w[train], kind="stable")
        d = xgb.DMatrix(x[train][order], label=label[train][order])
        d.set_group(np.unique(w[train][order], return_counts=True)[1])
        booster = xgb.train(params, d, a.rounds)
        pred = booster.predict(xgb.DMatrix(x[w == k]))
        all_pairs.append(pairwise(pred, thr[w == k]))
        apart.append(pairwise(pred, thr[w == k], 1.05))
        print(f"{k}\t{all_pairs[-1]:.3f}\t{apart[-1]:.3f}")
    all_pairs, apart = np.array(all_pairs), np.array(apart)
    print(
        f"mean {all_pairs.mean():.4f}  >5% {apart.mean():.4f}  worst {all_pairs.min():.4f}  "
        f"at 0.85 or more {(all_pairs >= 0.85).sum()}/{len(all_pairs)}"
    )


if __name__ == "__main__":
    main()
