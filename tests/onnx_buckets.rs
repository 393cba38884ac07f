//! Dynamic batch by buckets: a model whose batch dimension is dynamic, planned and compiled
//! for each bucket, a batch run on the smallest bucket that holds it (padded with rows that
//! never change the real rows) or in chunks past the largest; `tune-model --buckets` tunes
//! every bucket's tasks and `run-model --buckets` runs a batch with them. Also: a model run
//! again, on buffers its earlier runs gave back, gives the same results.
//!
//! References: the MLP's output written out by hand (`relu(x · W)`), and for a small CNN the
//! same network planned at the exact batch, with no padding.

use std::path::Path;
use std::process::Command;
use tensortune::model::buckets::{bucket_plans, parse_buckets};
use tensortune::model::testing::{random, AttrValue, ModelBuilder};
use tensortune::model::ImportOptions;
use tensortune::model::{testing, BucketedModel, LoadOptions, Model};
use tensortune::ndarray::{ArrayD, Axis, IxDyn};

/// `relu(x · W)` with `W[k][j] = k - j`, the MLP of `testing::mlp_dynamic_batch_bytes`.
fn mlp_by_hand(x: &ArrayD<f32>) -> ArrayD<f32> {
    let n = x.shape()[0];
    ArrayD::from_shape_fn(IxDyn(&[n, 4]), |ix| {
        let (i, j) = (ix[0], ix[1]);
        let h: f32 = (0..3).map(|k| x[[i, k]] * (k as f32 - j as f32)).sum();
        h.max(0.0)
    })
}

/// Conv 3→4 (3×3, pad 1) + bias, ReLU, global average pool, flatten, Gemm 4→5, softmax:
/// `x: [N, 3, 8, 8]` to `y: [N, 5]`.
fn cnn_bytes() -> Vec<u8> {
    let w = random(&[4, 3, 3, 3], 1).into_raw_vec_and_offset().0;
    let b = random(&[4], 2).into_raw_vec_and_offset().0;
    let g = random(&[4, 5], 3).into_raw_vec_and_offset().0;
    let c = random(&[5], 4).into_raw_vec_and_offset().0;
    ModelBuilder::new(13)
        .input("x", &[-1, 3, 8, 8])
        .init("W", &[4, 3, 3, 3], w)
        .init("B", &[4], b)
        .init("G", &[4, 5], g)
        .init("C", &[5], c)
        .node(
            "Conv",
            &["x", "W", "B"],
            &["c"],
            &[("pads", AttrValue::Ints(vec![1, 1, 1, 1]))],
        )
        .node("Relu", &["c"], &["r"], &[])
        .node("GlobalAveragePool", &["r"], &["p"], &[])
        .node("Flatten", &["p"], &["f"], &[])
        .node("Gemm", &["f", "G", "C"], &["l"], &[])
        .node("Softmax", &["l"], &["y"], &[("axis", AttrValue::Int(1))])
        .output("y")
        .build()
}

fn max_diff(a: &ArrayD<f32>, b: &ArrayD<f32>) -> f32 {
    assert_eq!(a.shape(), b.shape());
    a.iter()
        .zip(b.iter())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn a_batch_runs_on_the_smallest_bucket_that_holds_it_or_in_chunks() {
    let bytes = testing::mlp_dynamic_batch_bytes();
    let bm = BucketedModel::from_bytes(&bytes, &LoadOptions::default(), &[4, 1, 2])
        .expect("a model with a dynamic batch");
    assert_eq!(bm.buckets(), [1, 2, 4]);
    assert_eq!(bm.batched_outputs(), [true]);
    assert_eq!(
        (1..=6).map(|n| bm.bucket_for(n)).collect::<Vec<_>>(),
        [1, 2, 4, 4, 4, 4]
    );
    assert_eq!(bm.model(4).expect("bucket 4").inputs()[0].1, [4, 3]);
    // 3 rows pad to 4; 9 rows run as 4 + 4 + 1.
    for n in [1, 3, 4, 9] {
        let x = random(&[n, 3], n as u64);
        let y = bm.run(&[x.view()]).expect("runs");
        assert_eq!(y.len(), 1);
        assert!(max_diff(&y[0], &mlp_by_hand(&x)) < 1e-5, "batch {n}");
    }
}

#[test]
fn padded_rows_never_change_the_real_rows() {
    let bytes = cnn_bytes();
    let bm = BucketedModel::from_bytes(&bytes, &LoadOptions::default(), &[1, 4])
        .expect("the CNN with a dynamic batch");
    assert_eq!(bm.batched_outputs(), [true]);
    let x = random(&[3, 3, 8, 8], 7);
    let got = bm.run(&[x.view()]).expect("runs")[0].clone();

    // The bucket's own kernels on 4 rows whose last one is garbage: the real rows come out
    // bit for bit as with the zero padding.
    let bucket4 = bm.model(4).expect("bucket 4");
    let mut garbage = random(&[4, 3, 8, 8], 99);
    garbage.mapv_inplace(|v| v * 1e4);
    garbage.slice_axis_mut(Axis(0), (0..3).into()).assign(&x);
    let with_garbage = bucket4.run(&[garbage.view()]).expect("runs")[0].clone();
    assert_eq!(
        with_garbage.slice_axis(Axis(0), (0..3).into()).to_owned(),
        got
    );

    // The same network planned at the exact batch of 3, nothing padded.
    let mut exact = ImportOptions::default();
    exact.input_shapes.insert("x".into(), vec![3, 3, 8, 8]);
    let reference = Model::from_bytes(
        &bytes,
        &LoadOptions {
            import: exact,
            ..LoadOptions::default()
        },
    )
    .expect("the exact batch");
    let want = reference.run(&[x.view()]).expect("runs")[0].clone();
    assert_eq!(got.shape(), [3, 5]);
    assert!(max_diff(&got, &want) < 1e-5, "{got} vs {want}");
    // Each row a softmax: the rows sum to 1, so a wrong row would show.
    for row in got.rows() {
        assert!((row.sum() - 1.0).abs() < 1e-5);
    }

    // Past the largest bucket: 9 rows as 4 + 4 + 1 (the 1 on bucket 1).
    let x9 = random(&[9, 3, 8, 8], 8);
    let got9 = bm.run(&[x9.view()]).expect("runs")[0].clone();
    let mut exact9 = ImportOptions::default();
    exact9.input_shapes.insert("x".into(), vec![9, 3, 8, 8]);
    let want9 = Model::from_bytes(
        &bytes,
        &LoadOptions {
            import: exact9,
            ..LoadOptions::default()
        },
    )
    .expect("the exact batch")
    .run(&[x9.view()])
    .expect("runs")[0]
        .clone();
    assert!(max_diff(&got9, &want9) < 1e-5);
}

#[test]
fn buckets_are_refused_with_a_reason() {
    // A fixed batch.
    let err = BucketedModel::from_bytes(&testing::mlp_bytes(), &LoadOptions::default(), &[1, 2])
        .expect_err("no dynamic batch");
    assert!(err.to_string().contains("dynamic batch"), "{err}");
    assert!(err.is_user_error());
    for bad in ["", "0,1", "1,,2", "two", "1,-2"] {
        assert!(parse_buckets(bad).is_err(), "{bad}");
    }
    assert_eq!(parse_buckets("8, 2,4,2").expect("valid"), [2, 4, 8]);
    // Inputs that disagree on the batch.
    let bm = BucketedModel::from_bytes(
        &testing::mlp_dynamic_batch_bytes(),
        &LoadOptions::default(),
        &[2],
    )
    .expect("loads");
    let x = random(&[2, 3], 1);
    assert!(bm.run(&[x.view(), x.view()]).is_err());
    // Each bucket is its own set of tasks.
    let plans = bucket_plans(&cnn_bytes(), &ImportOptions::default(), &[2, 1]).expect("plans");
    assert_eq!(plans.iter().map(|(b, _)| *b).collect::<Vec<_>>(), [1, 2]);
    let keys =
        |i: usize| -> Vec<String> { plans[i].1.tasks.iter().map(|t| t.key.clone()).collect() };
    assert!(
        keys(0).iter().all(|k| !keys(1).contains(k)),
        "{:?}",
        keys(0)
    );
}

/// A float32 `.npy` file (format 1.0, C order).
fn write_npy(path: &Path, a: &ArrayD<f32>) {
    let shape: Vec<String> = a.shape().iter().map(|d| d.to_string()).collect();
    let shape = if shape.len() == 1 {
        format!("({},)", shape[0])
    } else {
        format!("({})", shape.join(", "))
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend((header.len() as u16).to_le_bytes());
    bytes.extend(header.as_bytes());
    for v in a.iter() {
        bytes.extend(v.to_le_bytes());
    }
    std::fs::write(path, bytes).expect("write npy");
}

fn tensortune(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tensortune"))
        .args(args)
        .output()
        .expect("tensortune runs");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn tune_model_and_run_model_take_buckets() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = dir.path().join("mlp.onnx");
    std::fs::write(&model, testing::mlp_dynamic_batch_bytes()).expect("write model");
    let (m, db) = (model.to_str().expect("UTF-8"), dir.path().join("mlp.db"));
    let db = db.to_str().expect("UTF-8");
    let tuned = tensortune(&[
        "tune-model",
        m,
        "--db",
        db,
        "--trials",
        "12",
        "--batch-size",
        "4",
        "--buckets",
        "1,2,4",
        "--quiet",
    ]);
    for b in ["bucket 1:", "bucket 2:", "bucket 4:"] {
        assert!(tuned.contains(b), "{tuned}");
    }
    assert!(tuned.contains("onnx_matmul:A=4x3,B=3x4"), "{tuned}");
    assert_eq!(tuned.matches("task ").count(), 3, "{tuned}");

    // Runs the model on `x` with `extra` flags; returns the summary and the output.
    let (xp, yp) = (dir.path().join("x.npy"), dir.path().join("y.npy"));
    let run = |x: &ArrayD<f32>, extra: &[&str]| {
        write_npy(&xp, x);
        let (xs, ys) = (xp.to_str().expect("UTF-8"), yp.to_str().expect("UTF-8"));
        let mut args = vec![
            "run-model",
            m,
            "--inputs",
            xs,
            "--output",
            ys,
            "--repeat",
            "2",
        ];
        args.extend_from_slice(extra);
        let ran = tensortune(&args);
        (ran, tensortune::npy::read::<f32>(&yp).expect("the output"))
    };
    let x = random(&[3, 3], 5);
    let (ran, y) = run(&x, &["--db", db, "--buckets", "1,2,4"]);
    assert!(ran.contains("batch 3 on bucket 4"), "{ran}");
    // Bucket 4's one task has records: the scheduler's first pass gives each task a round.
    assert!(
        ran.contains("1 tasks: 1 from records, 0 on their default schedule"),
        "{ran}"
    );
    assert!(max_diff(&y, &mlp_by_hand(&x)) < 1e-5, "{y}");

    // Past the largest bucket, in chunks.
    let x5 = random(&[5, 3], 6);
    let (ran, y5) = run(&x5, &["--buckets", "1,2"]);
    assert!(ran.contains("in chunks of bucket 2"), "{ran}");
    assert!(max_diff(&y5, &mlp_by_hand(&x5)) < 1e-5);

    // A model without a dynamic batch is refused, one line, exit 2.
    let fixed = dir.path().join("fixed.onnx");
    std::fs::write(&fixed, testing::mlp_bytes()).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_tensortune"))
        .args(["tune-model", fixed.to_str().expect("UTF-8"), "--db", db])
        .args(["--trials", "0", "--buckets", "1,2"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("dynamic batch"));
}

#[test]
fn runs_on_reused_buffers_give_the_same_results() {
    let mut exact = ImportOptions::default();
    exact.input_shapes.insert("x".into(), vec![2, 3, 8, 8]);
    let opts = LoadOptions {
        import: exact,
        ..LoadOptions::default()
    };
    let bytes = cnn_bytes();
    let model = Model::from_bytes(&bytes, &opts).expect("loads");
    let (a, b) = (random(&[2, 3, 8, 8], 11), random(&[2, 3, 8, 8], 12));
    let first = model.run(&[a.view()]).expect("runs");
    let other = model.run(&[b.view()]).expect("runs");
    let again = model.run(&[a.view()]).expect("runs");
    assert_eq!(first, again, "a run on pooled buffers");
    assert_ne!(first, other);
    // Against a model that has run nothing before.
    let fresh = Model::from_bytes(&bytes, &opts).expect("loads");
    assert_eq!(fresh.run(&[b.view()]).expect("runs"), other);
}
