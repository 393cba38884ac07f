//! Every sketch of every op instantiates, with random decisions, to a schedule that lowers and
//! computes what the direct evaluator computes; mutations keep that true. And the sketches
//! have the structures the rules promise (packing, transposed copies, padding by region).

use rand::rngs::ChaCha8Rng;
use rand::SeedableRng;
use tensortune_schedules::data::NdData;
use tensortune_schedules::expr::{BinOp, DType, Expr};
use tensortune_schedules::ir::{ForKind, PrefetchLevel, Stmt};
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::target::TargetKey;
use tensortune_schedules::{eval, interp, lower::lower, ComputeDag};
use tensortune_tuner::mutate::mutate;
use tensortune_tuner::sketch::{rules, sample::sample};
use tensortune_tuner::TuneOptions;

fn check(dag: &ComputeDag, state: &tensortune_schedules::schedule::State, seed: u64) {
    let f = lower(state).unwrap_or_else(|e| panic!("lower: {e}\n{state}"));
    let ins: Vec<NdData> = dag
        .inputs()
        .iter()
        .enumerate()
        .map(|(i, &t)| NdData::random(&dag.op(t).shape, dag.op(t).dtype, seed + i as u64).unwrap())
        .collect();
    let want = eval::evaluate(dag, &ins).unwrap();
    let got = interp::run(&f, &ins).unwrap_or_else(|e| panic!("interp: {e}\n{state}\n{f}"));
    for (w, g) in want.iter().zip(&got) {
        let d = g.max_rel_diff(w).unwrap();
        assert!(d < 1e-4, "mismatch {d}\n{}\n{f}", state.trace());
    }
}

#[test]
fn sketches_of_every_op_are_correct() {
    let specs = [
        ("matmul:M=12,N=20,K=9", 1),
        ("batch_matmul:B=2,M=6,N=8,K=5", 1),
        ("dense_bias_relu:M=6,N=10,K=7", 1),
        ("conv2d:N=1,C=3,H=7,W=7,K=4,R=3,S=3,pad=1", 1),
        // Output channels fill vectors and the width does not: the channel-vector sketch.
        ("conv2d:N=1,C=3,H=6,W=6,K=32,R=3,S=3,pad=1", 1),
        // A stride of 2 and output rows of whole vectors (16 pixels): the channel-vector
        // sketch as well, broadcasting the input read two pixels apart.
        ("conv2d:N=1,C=2,H=4,W=32,K=32,R=3,S=3,stride=2,pad=1", 1),
        // Weights stored output channels last: the channel-vector sketch reads them in place.
        ("conv2d_hwio:N=1,C=3,H=6,W=6,K=32,R=3,S=3,pad=1", 1),
        // A 1x1 layer of stride 1: its pixel axes fused into one (the `+flat` sketch).
        ("conv2d:N=2,C=5,H=3,W=20,K=4,R=1,S=1", 1),
        ("depthwise_conv2d:N=1,C=3,H=8,W=8,R=3,S=3,stride=2,pad=1", 1),
        ("softmax:M=4,N=24", 1),
        ("reduce_sum:M=3,N=40", 2),
        ("matmul:M=16,N=16,K=16", 4),
        // bf16 pairs: the interleaving stage kept or inlined, the pairs' dot products tiled.
        ("matmul:M=6,N=20,K=14,dtype=bf16", 1),
        ("dense_bias_relu:M=4,N=18,K=10,dtype=bf16", 1),
    ];
    for (spec, threads) in specs {
        let dag = WorkloadSpec::parse(spec).unwrap().build().unwrap();
        let opts = TuneOptions {
            threads,
            imperfect_tile_prob: 0.3,
            ..TuneOptions::default()
        };
        let sketches = rules::generate(&dag, &opts);
        assert!(!sketches.is_empty(), "{spec}");
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for sk in &sketches {
            let mut ok = 0;
            for case in 0..12 {
                let d = sample(sk, &mut rng, &opts);
                let st = sk
                    .instantiate(&dag, &d)
                    .unwrap_or_else(|e| panic!("{spec} {}: {e}", sk.name));
                check(&dag, &st, case);
                ok += 1;
                if let Some(m) = mutate(sk, &d, &mut rng, &opts.mutation_weights) {
                    assert!(sk.fits(&m));
                    let st = sk.instantiate(&dag, &m).unwrap();
                    check(&dag, &st, case + 100);
                }
            }
            assert_eq!(ok, 12);
        }
        eprintln!(
            "{spec}: {:?}",
            sketches.iter().map(|s| s.name.as_str()).collect::<Vec<_>>()
        );
    }
}

#[test]
fn sketch_structures() {
    let names = |spec: &str| {
        let dag = WorkloadSpec::parse(spec).unwrap().build().unwrap();
        let sk = rules::generate(&dag, &TuneOptions::default());
        (dag, sk)
    };
    let (_, mm) = names("matmul:M=64,N=64,K=64");
    let mm: Vec<&str> = mm.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(mm, ["C:tile", "C:tile+pack"]);

    // bf16 pairs: the interleaving stage inlined into the product, or a stage of its own.
    let (_, bf) = names("matmul:M=64,N=64,K=64,dtype=bf16");
    let bf: Vec<&str> = bf.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(bf, ["B_pairs:inline,C:tile", "B_pairs:root,C:tile"]);

    // dense reads W[j, k]: its packed copy is stored with j (the tile's vector axis) last and
    // the copy's innermost loop runs along j, vectorized.
    let (dag, sk) = names("dense_bias_relu:M=64,N=64,K=48");
    let pack = sk
        .iter()
        .find(|s| s.name.contains("tile+fuse+pack"))
        .unwrap_or_else(|| panic!("{:?}", sk.iter().map(|s| &s.name).collect::<Vec<_>>()));
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let opts = TuneOptions::default();
    let st = pack
        .instantiate(&dag, &sample(pack, &mut rng, &opts))
        .unwrap();
    let text = st.trace().to_string();
    assert!(text.contains("reorder_storage(s2, [1, 0])"), "{text}");
    let f = lower(&st).unwrap().to_string();
    let copy = f
        .lines()
        .skip_while(|l| !l.contains("vectorized for ax0.1"))
        .nth(1)
        .unwrap_or_else(|| panic!("no copy vectorized along j:\n{f}"));
    assert!(copy.trim_start().starts_with("W.local["), "{f}");
    check(&dag, &st, 1);

    // conv2d with a width of 28 (not whole vectors) and 32 output channels: a sketch
    // vectorizes the output channels, stores the accumulator tile with them last and packs the
    // weights W[k, c, r, s] with k last.
    let (dag, sk) = names("conv2d:N=1,C=8,H=28,W=28,K=32,R=3,S=3,pad=1");
    let names_of: Vec<&str> = sk.iter().map(|s| s.name.as_str()).collect();
    let vec = sk
        .iter()
        .find(|s| s.name.ends_with("tile+vec1"))
        .unwrap_or_else(|| panic!("{names_of:?}"));
    let st = vec
        .instantiate(&dag, &sample(vec, &mut rng, &opts))
        .unwrap();
    let text = st.trace().to_string();
    assert!(text.contains("reorder_storage(s2, [1, 2, 3, 0])"), "{text}");
    assert!(text.contains("reorder_storage(s3, [0, 2, 3, 1])"), "{text}");
    check(&dag, &st, 2);
    // Its padding is always in a buffer (an inlined one would put a bounds check on every
    // broadcast) and its weights are packed once, at the root: the copy (s2, as above) is
    // never computed at a loop of the tile.
    assert_eq!(
        sk.iter().filter(|s| s.name.contains("+vec")).count(),
        1,
        "{names_of:?}"
    );
    assert!(vec.name.starts_with("pad:root"), "{names_of:?}");
    for seed in 0..8 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let st = vec
            .instantiate(&dag, &sample(vec, &mut rng, &opts))
            .unwrap();
        let text = st.trace().to_string();
        assert!(text.contains("reorder_storage(s2, [1, 2, 3, 0])"), "{text}");
        assert!(!text.contains("compute_at(s2,"), "{text}");
        check(&dag, &st, 10 + seed);
    }
    // With threads, that root copy runs in parallel too.
    let threads = TuneOptions {
        threads: 2,
        ..TuneOptions::default()
    };
    let sk = rules::generate(&dag, &threads);
    let vec = sk
        .iter()
        .find(|s| s.name.contains("+vec"))
        .unwrap_or_else(|| panic!("{:?}", sk.iter().map(|s| &s.name).collect::<Vec<_>>()));
    for seed in 0..4 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let st = vec
            .instantiate(&dag, &sample(vec, &mut rng, &threads))
            .unwrap();
        let f = lower(&st).unwrap().to_string();
        let copy_loop = f
            .lines()
            .find(|l| l.starts_with("  ") && l.trim_start().contains("for ax0.0"))
            .unwrap_or_else(|| panic!("no root copy loop:\n{f}"));
        assert!(copy_loop.starts_with("  parallel for"), "{f}");
        check(&dag, &st, 20 + seed);
    }
    // A width of 56 fills 3.5 registers of 16 lanes. On a core whose FMA pipes take whole
    // 512-bit vectors (the default target) the channels are offered as the vector axis; on
    // one that runs them as two 256-bit halves (Zen 4), 56 fills whole halves and they are
    // not.
    let wide = "conv2d:N=1,C=8,H=56,W=56,K=32,R=3,S=3,pad=1";
    let (dag, sk) = names(wide);
    assert!(sk.iter().any(|s| s.name.ends_with("tile+vec1")));
    let zen4: TargetKey = "llvm -mcpu=znver4 -mattr=+avx2,+avx512f,+fma -threads=1"
        .parse()
        .unwrap();
    let zen4 = zen4.cpu_desc().unwrap();
    assert_eq!(zen4.vector_unit_lanes(DType::F32), 8);
    let sk = rules::generate_for(&dag, &opts, &zen4, &rules::cpu_rules());
    assert!(!sk.is_empty());
    assert!(sk.iter().all(|s| !s.name.contains("+vec")));

    // Rows of whole vectors read with a stride of 2 (ResNet-50's first layer: 112 output
    // pixels a row, 7x7, stride 2): the output channels are offered as the vector axis, so the
    // strided input is broadcast rather than gathered; at stride 1 they are not. A depthwise
    // layer's input moves with its channels, so they are never its vector axis.
    let stem = |stride: i64| {
        let (_, sk) = names(&format!(
            "conv2d:N=1,C=3,H=224,W=224,K=64,R=7,S=7,stride={stride},pad=3"
        ));
        sk.iter().any(|s| s.name.ends_with("+vec1"))
    };
    assert!(stem(2));
    assert!(!stem(1));
    let (_, dw) = names("depthwise_conv2d:N=1,C=64,H=64,W=64,R=3,S=3,stride=2,pad=1");
    assert!(dw.iter().all(|s| !s.name.contains("+vec")));

    // conv2d's padding, when computed inside the tile, is vectorized over its region.
    let (dag, sk) = names("conv2d:N=1,C=8,H=14,W=14,K=8,R=3,S=3,pad=1");
    let root = sk.iter().find(|s| s.name.starts_with("pad:root")).unwrap();
    let st = root
        .instantiate(&dag, &sample(root, &mut rng, &opts))
        .unwrap();
    assert!(
        st.trace()
            .to_string()
            .contains("vectorize_up_to_64(s2, l3)"),
        "{}",
        st.trace()
    );
}

#[test]
fn weights_stored_output_channels_last_are_read_in_place() {
    // conv2d_hwio's weights are [R, S, C, K]: the channel-vector sketch reads them along K as
    // they are, with no copy, and its accumulator keeps the channels last as with conv2d.
    let opts = TuneOptions::default();
    let dag = WorkloadSpec::parse("conv2d_hwio:N=1,C=8,H=28,W=28,K=32,R=3,S=3,pad=1")
        .unwrap()
        .build()
        .unwrap();
    let sk = rules::generate(&dag, &opts);
    let names_of: Vec<&str> = sk.iter().map(|s| s.name.as_str()).collect();
    let vec = sk
        .iter()
        .find(|s| s.name.ends_with("tile+vec1"))
        .unwrap_or_else(|| panic!("{names_of:?}"));
    for seed in 0..8 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let st = vec
            .instantiate(&dag, &sample(vec, &mut rng, &opts))
            .unwrap();
        let text = st.trace().to_string();
        assert!(!text.contains("cache_read"), "{text}");
        assert!(text.contains("reorder_storage("), "{text}");
        let f = lower(&st).unwrap().to_string();
        assert!(!f.contains("weight.local"), "{f}");
        // The register tile's weight load is one vector along K: the innermost vectorized
        // loop indexes the weights with coefficient 1.
        let inner = f
            .lines()
            .rev()
            .find(|l| l.contains("weight["))
            .unwrap_or_else(|| panic!("no weight read:\n{f}"));
        let vloop = f
            .lines()
            .rev()
            .find(|l| l.trim_start().starts_with("vectorized for k."))
            .unwrap_or_else(|| panic!("no vectorized loop over k:\n{f}"));
        let var = vloop
            .trim_start()
            .trim_start_matches("vectorized for ")
            .split(' ')
            .next()
            .unwrap();
        assert!(
            inner.contains(&format!(" + {var}]")),
            "{var} is not the weights' last term:\n{f}"
        );
        check(&dag, &st, 30 + seed);
    }
}

#[test]
fn a_1x1_layers_pixels_are_fused_into_one_axis_read_linearly() {
    let opts = TuneOptions {
        imperfect_tile_prob: 0.3,
        ..TuneOptions::default()
    };
    let spec = "conv2d:N=1,C=8,H=3,W=20,K=8,R=1,S=1";
    let dag = WorkloadSpec::parse(spec).unwrap().build().unwrap();
    let sk = rules::generate(&dag, &opts);
    let names: Vec<&str> = sk.iter().map(|s| s.name.as_str()).collect();
    let flat = sk
        .iter()
        .find(|s| s.name.ends_with("tile+flat"))
        .unwrap_or_else(|| panic!("{names:?}"));
    // It replaces the plain tiling, whose vectors would run along rows of 20.
    assert!(!names.iter().any(|n| n.ends_with(":tile")), "{names:?}");
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for case in 0..16 {
        let st = flat
            .instantiate(&dag, &sample(flat, &mut rng, &opts))
            .unwrap();
        let text = st.trace().to_string();
        assert!(text.contains("fuse(s2, [2, 3])"), "{text}");
        assert!(text.contains("fuse(s3, [2, 3])"), "{text}");
        // The fused loop's row and column, `p / 20` and `p % 20`, fold back into `p`: no
        // address divides a vector loop's variable, so its lanes are consecutive elements.
        // (Outer loops' variables may be divided: the row a tile starts at.)
        let f = lower(&st).unwrap();
        assert_eq!(vector_addresses_that_divide(&f.body), 0, "{text}\n{f}");
        check(&dag, &st, 40 + case);
    }
    let names_of = |spec: &str| -> Vec<String> {
        let dag = WorkloadSpec::parse(spec).unwrap().build().unwrap();
        rules::generate(&dag, &opts)
            .into_iter()
            .map(|s| s.name)
            .collect()
    };
    // Rows of whole vectors are fused too (tiles need not be whole rows), and rows of 16. The
    // output channels stay a vector axis beside it where the fused pixels are no whole number
    // of vectors (5 x 20), and not where they are (4 x 20 = 5 x 16).
    for (spec, vec) in [
        ("conv2d:N=1,C=8,H=3,W=32,K=8,R=1,S=1", false),
        ("conv2d:N=1,C=8,H=3,W=16,K=8,R=1,S=1", false),
        ("conv2d:N=1,C=8,H=5,W=20,K=32,R=1,S=1", true),
        ("conv2d:N=1,C=8,H=4,W=20,K=32,R=1,S=1", false),
    ] {
        let names = names_of(spec);
        assert!(
            names.iter().any(|n| n.ends_with("+flat")),
            "{spec}: {names:?}"
        );
        assert_eq!(
            names.iter().any(|n| n.ends_with("+vec1")),
            vec,
            "{spec}: {names:?}"
        );
    }
    // Not where an input's row is wider than the output's (padding, a 3x3 window), nor with
    // a stride, nor where rows of the accumulator would be padded (7 stored as 8), nor for
    // a matmul.
    for spec in [
        "conv2d:N=1,C=8,H=6,W=20,K=8,R=3,S=3,pad=1",
        "conv2d:N=1,C=8,H=6,W=20,K=8,R=3,S=3",
        "conv2d:N=1,C=8,H=6,W=20,K=8,R=1,S=1,stride=2",
        "conv2d:N=1,C=8,H=7,W=7,K=8,R=1,S=1",
        "matmul:M=8,N=24,K=8",
        "batch_matmul:B=2,M=6,N=24,K=5",
    ] {
        let names = names_of(spec);
        assert!(!names.is_empty(), "{spec}");
        assert!(
            names.iter().all(|n| !n.contains("+flat")),
            "{spec}: {names:?}"
        );
    }
}

/// How many addresses inside a vectorized loop divide (or take the remainder of) an expression
/// of that loop's variable.
fn vector_addresses_that_divide(body: &Stmt) -> usize {
    let mut found = 0;
    body.visit(&mut |s| {
        let Stmt::For {
            var,
            kind: ForKind::Vectorized,
            body,
            ..
        } = s
        else {
            return;
        };
        let divides = |e: &Expr| {
            let mut n = 0;
            e.visit(&mut |x| {
                if let Expr::Bin(BinOp::Div | BinOp::Mod, a, _) = x {
                    n += usize::from(a.uses_var(var.id));
                }
            });
            n
        };
        body.visit(&mut |t| {
            if let Stmt::Store { index, value, .. } = t {
                found += divides(index);
                value.visit(&mut |x| {
                    if let Expr::BufLoad { index, .. } = x {
                        found += divides(index);
                    }
                });
            }
        });
    });
    found
}

/// A 1x1 conv2d with a bias and a relu after it, as a model's layer is: its pixels are fused
/// in the relu (the outer levels) as in the conv2d, and the result is right.
#[test]
fn a_1x1_layer_with_its_relu_fused_is_flattened_in_both() {
    use tensortune_schedules::expr::{max, sum, Const};
    use tensortune_schedules::te::Graph;
    let (c, h, w, k) = (6, 3, 20, 8);
    let mut g = Graph::default();
    let data = g.placeholder("data", &[1, c, h, w], DType::F32);
    let weight = g.placeholder("weight", &[k, c], DType::F32);
    let bias = g.placeholder("bias", &[k], DType::F32);
    let rc = g.reduce_axis(c, "rc");
    let conv = g.compute("conv", &[1, k, h, w], &["n", "k", "y", "x"], |ax| {
        sum(
            data.at([ax[0].clone(), rc.expr(), ax[2].clone(), ax[3].clone()])
                * weight.at([ax[1].clone(), rc.expr()]),
            [&rc],
        )
    });
    let out = g.compute("relu", &[1, k, h, w], &["n", "k", "y", "x"], |ax| {
        let v = conv.at([ax[0].clone(), ax[1].clone(), ax[2].clone(), ax[3].clone()])
            + bias.at([ax[1].clone()]);
        max(v, Expr::Const(Const::zero(DType::F32)))
    });
    let dag = ComputeDag::new(&g, &[out]).unwrap();
    let opts = TuneOptions {
        imperfect_tile_prob: 0.3,
        ..TuneOptions::default()
    };
    let sk = rules::generate(&dag, &opts);
    let flat = sk
        .iter()
        .find(|s| s.name.ends_with("tile+fuse+flat"))
        .unwrap_or_else(|| panic!("{:?}", sk.iter().map(|s| &s.name).collect::<Vec<_>>()));
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    for case in 0..12 {
        let st = flat
            .instantiate(&dag, &sample(flat, &mut rng, &opts))
            .unwrap();
        let text = st.trace().to_string();
        assert_eq!(text.matches(", [2, 3])").count(), 2, "{text}");
        let f = lower(&st).unwrap();
        assert_eq!(vector_addresses_that_divide(&f.body), 0, "{text}\n{f}");
        check(&dag, &st, 60 + case);
    }
}

/// Softmax's row-at-a-time sketch has a prefetch hole on `exp` (none, the input's next row
/// into L1, or that and the row after into L2), and each choice gives a correct program.
#[test]
fn softmax_rows_may_prefetch_the_next_one() {
    use tensortune_tuner::sketch::{ChoiceKind, Hole};
    let spec = "softmax:M=6,N=40";
    let dag = WorkloadSpec::parse(spec).unwrap().build().unwrap();
    let opts = TuneOptions::default();
    let sketches = rules::generate(&dag, &opts);
    let rows: Vec<_> = sketches
        .iter()
        .filter(|s| s.name.contains("exp:row"))
        .collect();
    assert!(
        !rows.is_empty(),
        "{:?}",
        sketches.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for sk in rows {
        let holes: Vec<usize> = sk
            .holes
            .iter()
            .enumerate()
            .filter(|(_, h)| {
                matches!(
                    h,
                    Hole::Choice {
                        kind: ChoiceKind::Prefetch,
                        ..
                    }
                )
            })
            .map(|(i, _)| i)
            .collect();
        assert_eq!(holes.len(), 1, "{}: {:?}", sk.name, sk.holes);
        for ahead in [0, 1, 2] {
            let mut d = sample(sk, &mut rng, &opts);
            d[holes[0]] = vec![ahead];
            let st = sk.instantiate(&dag, &d).unwrap();
            let f = lower(&st).unwrap();
            let mut levels = Vec::new();
            f.body.visit(&mut |s| {
                if let Stmt::Prefetch { level, .. } = s {
                    levels.push(*level)
                }
            });
            let want = [PrefetchLevel::L1, PrefetchLevel::L2];
            assert_eq!(levels, want[..ahead as usize], "{}\n{f}", sk.name);
            let text = st.trace().to_string();
            assert_eq!(text.matches("prefetch(").count(), ahead as usize, "{text}");
            assert_eq!(text.contains(", +2, to l2)"), ahead == 2, "{text}");
            check(&dag, &st, ahead as u64);
        }
    }
}

/// Where whole registers divide the row, the row-wise sketch's `exp` always runs them (no
/// hole for narrower vectors); elsewhere its lanes are a hole (softmax of 40 columns).
#[test]
fn softmax_rows_of_whole_vectors_run_whole_registers() {
    let opts = TuneOptions::default();
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    for (spec, fixed) in [("softmax:M=3,N=64", true), ("softmax:M=3,N=40", false)] {
        let dag = WorkloadSpec::parse(spec).unwrap().build().unwrap();
        let sketches = rules::generate(&dag, &opts);
        let sk = sketches
            .iter()
            .find(|s| s.name.contains("exp:row"))
            .unwrap_or_else(|| panic!("{spec}: no row-wise sketch"));
        let mut widths = std::collections::BTreeSet::new();
        for _ in 0..16 {
            let st = sk.instantiate(&dag, &sample(sk, &mut rng, &opts)).unwrap();
            let f = lower(&st).unwrap();
            // The extent of the vectorized loop around `exp`'s store.
            fn find(s: &Stmt, f: &tensortune_schedules::ir::LoweredFunc, w: &mut Option<i64>) {
                if let Stmt::For {
                    extent,
                    kind: ForKind::Vectorized,
                    body,
                    ..
                } = s
                {
                    let mut here = false;
                    body.visit(&mut |x| {
                        here |= matches!(x, Stmt::Store { buf, .. } if f.buffer(*buf).name == "exp")
                    });
                    if here {
                        *w = Some(*extent);
                    }
                }
            }
            let mut w = None;
            f.body.visit(&mut |s| find(s, &f, &mut w));
            widths.insert(w.unwrap_or(1));
            check(&dag, &st, 3);
        }
        if fixed {
            assert_eq!(widths.len(), 1, "{spec}: {widths:?}");
            let w = *widths.first().unwrap();
            assert!(w >= 4 && 64 % w == 0, "{spec}: {w}");
        } else {
            assert!(widths.len() > 1, "{spec}: {widths:?}");
        }
    }
}
