//! The importer and planner on models written in Rust: what must fail, and with which error;
//! what identical layers, folding and fusion make of a graph.

use tensortune_model::testing::{AttrValue, ModelBuilder};
use tensortune_model::{import, plan, ImportOptions, ModelError};

fn conv_relu(opset: i64) -> ModelBuilder {
    ModelBuilder::new(opset)
        .input("x", &[1, 4, 8, 8])
        .init("w", &[4, 4, 3, 3], vec![0.1; 144])
        .init("b", &[4], vec![0.5; 4])
        .node(
            "Conv",
            &["x", "w", "b"],
            &["c1"],
            &[("pads", AttrValue::Ints(vec![1; 4]))],
        )
        .node("Relu", &["c1"], &["r1"], &[])
        .node(
            "Conv",
            &["r1", "w", "b"],
            &["c2"],
            &[("pads", AttrValue::Ints(vec![1; 4]))],
        )
        .node("Relu", &["c2"], &["y"], &[])
        .output("y")
}

#[test]
fn identical_layers_are_one_task_weighted_by_count() {
    let p = plan(import(&conv_relu(13).build(), &ImportOptions::default()).unwrap()).unwrap();
    assert_eq!(p.tasks.len(), 1);
    assert_eq!(p.tasks[0].count, 2);
    assert_eq!(p.tasks[0].ops, "Conv+Relu");
    assert!(
        p.tasks[0]
            .key
            .starts_with("onnx_conv2d_hwio:N=1,C=4,H=8,W=8,K=4,G=1,R=3,S=3"),
        "{}",
        p.tasks[0].key
    );
    assert!(
        p.tasks[0].key.contains("epilogue=max(add(acc;x0);0.0)"),
        "{}",
        p.tasks[0].key
    );
    assert_eq!(p.steps.len(), 2);
}

#[test]
fn batchnorm_folds_into_the_convolution() {
    let bytes = ModelBuilder::new(13)
        .input("x", &[1, 2, 4, 4])
        .init("w", &[2, 2, 1, 1], vec![1.0, 0.0, 0.0, 1.0])
        .init("g", &[2], vec![2.0, 3.0])
        .init("beta", &[2], vec![0.5, -0.5])
        .init("m", &[2], vec![1.0, 1.0])
        .init("v", &[2], vec![1.0, 4.0])
        .node("Conv", &["x", "w"], &["c"], &[])
        .node(
            "BatchNormalization",
            &["c", "g", "beta", "m", "v"],
            &["y"],
            &[("epsilon", AttrValue::Float(0.0))],
        )
        .output("y")
        .build();
    let g = import(&bytes, &ImportOptions::default()).unwrap();
    assert_eq!(g.nodes.len(), 1, "the normalization is gone");
    let conv = &g.nodes[0];
    let w = g.constant(conv.inputs[1].unwrap()).unwrap().to_f32s();
    let b = g.constant(conv.inputs[2].unwrap()).unwrap().to_f32s();
    // scale = gamma / sqrt(var): 2 and 1.5; bias = (0 - mean)·scale + beta.
    assert_eq!(w, vec![2.0, 0.0, 0.0, 1.5]);
    assert_eq!(b, vec![-1.5, -2.0]);
}

#[test]
fn an_unsupported_op_is_named_with_its_node() {
    let bytes = ModelBuilder::new(13)
        .input("x", &[2, 3])
        .node("Erf", &["x"], &["y"], &[])
        .output("y")
        .build();
    match import(&bytes, &ImportOptions::default()) {
        Err(ModelError::Unsupported { node, op, .. }) => {
            assert_eq!(op, "Erf");
            assert_eq!(node, "erf_0");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_dynamic_input_needs_a_shape_and_takes_the_one_given() {
    let bytes = ModelBuilder::new(13)
        .input("x", &[0, 3])
        .node("Relu", &["x"], &["y"], &[])
        .output("y")
        .build();
    let err = import(&bytes, &ImportOptions::default()).unwrap_err();
    assert!(matches!(err, ModelError::InputShape { .. }), "{err}");
    assert!(err.to_string().contains("--input-shape x="), "{err}");
    let mut opts = ImportOptions::default();
    opts.input_shapes.insert("x".into(), vec![5, 3]);
    let g = import(&bytes, &opts).unwrap();
    assert_eq!(g.value(g.outputs[0]).shape, vec![5, 3]);
    opts.input_shapes.insert("x".into(), vec![5, 4]);
    assert!(matches!(
        import(&bytes, &opts),
        Err(ModelError::InputShape { .. })
    ));
    opts.input_shapes.clear();
    opts.input_shapes.insert("nope".into(), vec![1]);
    assert!(matches!(
        import(&bytes, &opts),
        Err(ModelError::InputShape { .. })
    ));
}

#[test]
fn shape_arithmetic_folds_to_a_constant_reshape() {
    // Flatten as exporters write it: Shape, Gather(0), Unsqueeze, Concat with -1, Reshape.
    let bytes = ModelBuilder::new(13)
        .input("x", &[2, 3, 4])
        .init_i64("zero", &[], vec![0])
        .init_i64("axes", &[1], vec![0])
        .init_i64("minus", &[1], vec![-1])
        .node("Shape", &["x"], &["s"], &[])
        .node("Gather", &["s", "zero"], &["n"], &[])
        .node("Unsqueeze", &["n", "axes"], &["n1"], &[])
        .node(
            "Concat",
            &["n1", "minus"],
            &["shape"],
            &[("axis", AttrValue::Int(0))],
        )
        .node("Reshape", &["x", "shape"], &["y"], &[])
        .output("y")
        .build();
    let g = import(&bytes, &ImportOptions::default()).unwrap();
    assert_eq!(g.nodes.len(), 1);
    assert_eq!(g.nodes[0].op, "Reshape");
    assert_eq!(g.value(g.outputs[0]).shape, vec![2, 12]);
}

#[test]
fn malformed_and_hostile_files_are_errors() {
    assert!(matches!(
        import(b"not a model at all", &ImportOptions::default()),
        Err(ModelError::Decode(_))
    ));
    assert!(matches!(
        import(&[], &ImportOptions::default()),
        Err(ModelError::Malformed(_))
    ));
    let mut bytes = conv_relu(13).build();
    bytes.truncate(bytes.len() / 2);
    assert!(import(&bytes, &ImportOptions::default()).is_err());
    // An initializer that declares a huge shape but holds four floats.
    let huge = ModelBuilder::new(13)
        .input("x", &[2])
        .init("w", &[1 << 40, 1 << 20], vec![1.0; 4])
        .node("Add", &["x", "w"], &["y"], &[])
        .output("y")
        .build();
    assert!(matches!(
        import(&huge, &ImportOptions::default()),
        Err(ModelError::Malformed(_))
    ));
    // A node reading a value nothing defines.
    let dangling = ModelBuilder::new(13)
        .input("x", &[2])
        .node("Relu", &["ghost"], &["y"], &[])
        .output("y")
        .build();
    assert!(matches!(
        import(&dangling, &ImportOptions::default()),
        Err(ModelError::Malformed(_))
    ));
    // Every prefix of a valid file: an error or a model, never a panic.
    let good = conv_relu(13).build();
    for n in 0..good.len() {
        let _ = import(&good[..n], &ImportOptions::default()).and_then(plan);
    }
}

#[test]
fn a_residual_add_fuses_into_the_second_convolution() {
    let bytes = ModelBuilder::new(13)
        .input("x", &[1, 4, 6, 6])
        .init("w", &[4, 4, 1, 1], vec![0.25; 16])
        .node("Conv", &["x", "w"], &["c1"], &[])
        .node("Relu", &["c1"], &["r1"], &[])
        .node("Conv", &["r1", "w"], &["c2"], &[])
        .node("Add", &["c2", "x"], &["s"], &[])
        .node("Relu", &["s"], &["y"], &[])
        .output("y")
        .build();
    let p = plan(import(&bytes, &ImportOptions::default()).unwrap()).unwrap();
    let ops: Vec<&str> = p.tasks.iter().map(|t| t.ops.as_str()).collect();
    assert_eq!(ops, vec!["Conv+Relu", "Conv+Add+Relu"]);
}

#[test]
fn hardswish_spelled_as_a_diamond_fuses_into_its_convolution() {
    // x · clip(x + 3, 0, 6) / 6, `x` read twice, as PaddlePaddle and others export HardSwish;
    // then a squeeze-excite multiply, whose scale depends on the layer itself: not fused.
    let bytes = ModelBuilder::new(13)
        .input("x", &[1, 4, 6, 6])
        .init("w", &[4, 4, 1, 1], vec![0.25; 16])
        .init("three", &[], vec![3.0])
        .init("zero", &[], vec![0.0])
        .init("six", &[], vec![6.0])
        .node("Conv", &["x", "w"], &["c"], &[])
        .node("Add", &["c", "three"], &["a"], &[])
        .node("Clip", &["a", "zero", "six"], &["k"], &[])
        .node("Mul", &["c", "k"], &["m"], &[])
        .node("Div", &["m", "six"], &["h"], &[])
        .node("GlobalAveragePool", &["h"], &["p"], &[])
        .node("Sigmoid", &["p"], &["s"], &[])
        .node("Mul", &["h", "s"], &["y"], &[])
        .output("y")
        .build();
    let p = plan(import(&bytes, &ImportOptions::default()).unwrap()).unwrap();
    let ops: Vec<&str> = p.tasks.iter().map(|t| t.ops.as_str()).collect();
    assert_eq!(
        ops,
        vec!["Conv+Add+Clip+Mul+Div", "GlobalAveragePool+Sigmoid", "Mul"]
    );
}

/// Sizes from a model file are checked before anything is sized by them: each of these asked
/// for terabytes (or wrapped an integer into a small, wrong window) before the bounds.
#[test]
fn hostile_sizes_are_errors_before_anything_is_allocated() {
    let x = |b: ModelBuilder| b.input("x", &[1, 2, 4, 4]).output("y");
    let huge = 1i64 << 40;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "ConstantOfShape of 2^40 x 2^40",
            x(ModelBuilder::new(13))
                .init_i64("s", &[2], vec![huge, huge])
                .node("ConstantOfShape", &["s"], &["z"], &[])
                .node("Add", &["x", "z"], &["y"], &[])
                .build(),
        ),
        (
            "ConstantOfShape of 2^34 elements, each extent allowed",
            x(ModelBuilder::new(13))
                .init_i64("s", &[2], vec![1 << 17, 1 << 17])
                .node("ConstantOfShape", &["s"], &["z"], &[])
                .node("Add", &["x", "z"], &["y"], &[])
                .build(),
        ),
        (
            "Expand to 2^31 rows",
            x(ModelBuilder::new(13))
                .init_i64("s", &[4], vec![1 << 31, 2, 4, 4])
                .node("Expand", &["x", "s"], &["y"], &[])
                .build(),
        ),
        (
            "Pad by 2^40",
            x(ModelBuilder::new(13))
                .init_i64("p", &[8], vec![0, 0, huge, 0, 0, 0, 0, 0])
                .node("Pad", &["x", "p"], &["y"], &[])
                .build(),
        ),
        (
            "Pad by i64::MAX (its output extent wrapped)",
            x(ModelBuilder::new(13))
                .init_i64("p", &[8], vec![0, 0, i64::MAX, 0, 0, 0, i64::MAX, 0])
                .node("Pad", &["x", "p"], &["y"], &[])
                .build(),
        ),
        (
            "Conv with pads of i64::MAX",
            x(ModelBuilder::new(13))
                .init("w", &[2, 2, 3, 3], vec![0.5; 36])
                .node(
                    "Conv",
                    &["x", "w"],
                    &["y"],
                    &[("pads", AttrValue::Ints(vec![i64::MAX, 0, i64::MAX, 0]))],
                )
                .build(),
        ),
        (
            "Conv with dilations of 2^62 (the window wrapped to 1)",
            x(ModelBuilder::new(13))
                .init("w", &[2, 2, 5, 5], vec![0.5; 100])
                .node(
                    "Conv",
                    &["x", "w"],
                    &["y"],
                    &[("dilations", AttrValue::Ints(vec![1 << 62, 1 << 62]))],
                )
                .build(),
        ),
        (
            "MaxPool with pads of i64::MAX",
            x(ModelBuilder::new(13))
                .node(
                    "MaxPool",
                    &["x"],
                    &["y"],
                    &[
                        ("kernel_shape", AttrValue::Ints(vec![2, 2])),
                        ("pads", AttrValue::Ints(vec![i64::MAX, 0, i64::MAX, 0])),
                    ],
                )
                .build(),
        ),
    ];
    for (what, bytes) in cases {
        match import(&bytes, &ImportOptions::default()).and_then(plan) {
            Err(e @ ModelError::Invalid { .. }) => {
                let m = e.to_string();
                assert!(
                    m.contains("at most") || m.contains("to 16777216") || m.contains("within"),
                    "{what}: {m}"
                );
            }
            other => panic!("{what}: {:?}", other.map(|p| p.tasks.len())),
        }
    }
    // An input declared 2^40 long, which `run-model` would fill with random numbers.
    let big_input = ModelBuilder::new(13)
        .input("x", &[huge, 2, 4, 4])
        .node("Relu", &["x"], &["y"], &[])
        .output("y")
        .build();
    assert!(matches!(
        import(&big_input, &ImportOptions::default()),
        Err(ModelError::InputShape { .. })
    ));
}
