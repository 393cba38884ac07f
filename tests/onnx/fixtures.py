"""Small ONNX models built with onnx.helper, and ONNX Runtime's outputs for them.

Writes, into the folder given as the first argument, for each fixture NAME:
NAME.onnx, NAME.input.npy (the input) and NAME.expected.npy (ONNX Runtime's output on it).
The Rust test tests/onnx_models.rs runs each model through tensortune and compares.
"""

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(23)


def const(name, shape, scale=0.5):
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def positive(name, shape):
    return numpy_helper.from_array(RNG.uniform(0.5, 1.5, shape).astype(np.float32), name)


def batchnorm(prefix, x, y, c):
    inits = [positive(f"{prefix}_g", [c]), const(f"{prefix}_b", [c]), const(f"{prefix}_m", [c]), positive(f"{prefix}_v", [c])]
    node = helper.make_node("BatchNormalization", [x] + [i.name for i in inits], [y], epsilon=1e-5)
    return [node], inits


def mlp():
    """Gemm + Relu, Gemm + Relu, Gemm, Softmax: a classifier head."""
    inits = [const("w1", [64, 32]), const("b1", [64]), const("w2", [48, 64]), const("b2", [48]), const("w3", [10, 48]), const("b3", [10])]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"], transB=1),
        helper.make_node("Relu", ["h1"], ["r1"]),
        helper.make_node("Gemm", ["r1", "w2", "b2"], ["h2"], transB=1),
        helper.make_node("Relu", ["h2"], ["r2"]),
        helper.make_node("Gemm", ["r2", "w3", "b3"], ["h3"], transB=1, alpha=0.5),
        helper.make_node("Softmax", ["h3"], ["y"], axis=-1),
    ]
    return nodes, inits, [4, 32]


def resnet_block():
    """conv-bn-relu, conv-bn, + identity, relu; then a strided conv-bn with a 1x1 shortcut."""
    c = 16
    nodes, inits = [], []
    inits += [const("c1_w", [c, c, 3, 3], 0.2), const("c2_w", [c, c, 3, 3], 0.2)]
    nodes.append(helper.make_node("Conv", ["x", "c1_w"], ["c1"], pads=[1, 1, 1, 1]))
    n, i = batchnorm("bn1", "c1", "b1", c)
    nodes += n
    inits += i
    nodes.append(helper.make_node("Relu", ["b1"], ["r1"]))
    nodes.append(helper.make_node("Conv", ["r1", "c2_w"], ["c2"], pads=[1, 1, 1, 1]))
    n, i = batchnorm("bn2", "c2", "b2", c)
    nodes += n
    inits += i
    nodes.append(helper.make_node("Add", ["b2", "x"], ["s"]))
    nodes.append(helper.make_node("Relu", ["s"], ["r2"]))
    inits += [const("c3_w", [2 * c, c, 3, 3], 0.2), const("c3_b", [2 * c]), const("sc_w", [2 * c, c, 1, 1], 0.3)]
    nodes.append(helper.make_node("Conv", ["r2", "c3_w", "c3_b"], ["c3"], pads=[1, 1, 1, 1], strides=[2, 2]))
    nodes.append(helper.make_node("Conv", ["r2", "sc_w"], ["sc"], strides=[2, 2]))
    nodes.append(helper.make_node("Add", ["c3", "sc"], ["s2"]))
    nodes.append(helper.make_node("Relu", ["s2"], ["r3"]))
    nodes.append(helper.make_node("MaxPool", ["r3"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    return nodes, inits, [1, c, 14, 14]


def depthwise_separable():
    """MobileNet style: depthwise 3x3 (stride 2) + BN + HardSwish, squeeze-excite, pointwise
    1x1 + BN + ReLU6 (Clip), a grouped conv, global average pool, flatten, matmul."""
    c = 12
    nodes, inits = [], []
    inits.append(const("dw_w", [c, 1, 3, 3], 0.4))
    nodes.append(helper.make_node("Conv", ["x", "dw_w"], ["dw"], group=c, pads=[1, 1, 1, 1], strides=[2, 2]))
    n, i = batchnorm("bn1", "dw", "b1", c)
    nodes += n
    inits += i
    nodes.append(helper.make_node("HardSwish", ["b1"], ["h1"]))
    # Squeeze-excite: pool, 1x1 conv + relu, 1x1 conv + hard sigmoid, scale.
    inits += [const("se1_w", [4, c, 1, 1]), const("se1_b", [4]), const("se2_w", [c, 4, 1, 1]), const("se2_b", [c])]
    nodes.append(helper.make_node("GlobalAveragePool", ["h1"], ["p"]))
    nodes.append(helper.make_node("Conv", ["p", "se1_w", "se1_b"], ["se1"]))
    nodes.append(helper.make_node("Relu", ["se1"], ["se1r"]))
    nodes.append(helper.make_node("Conv", ["se1r", "se2_w", "se2_b"], ["se2"]))
    nodes.append(helper.make_node("HardSigmoid", ["se2"], ["gate"], alpha=0.2, beta=0.5))
    nodes.append(helper.make_node("Mul", ["h1", "gate"], ["se"]))
    inits += [const("pw_w", [24, c, 1, 1], 0.3), numpy_helper.from_array(np.array(0.0, np.float32), "zero"), numpy_helper.from_array(np.array(6.0, np.float32), "six")]
    nodes.append(helper.make_node("Conv", ["se", "pw_w"], ["pw"]))
    n, i = batchnorm("bn2", "pw", "b2", 24)
    nodes += n
    inits += i
    nodes.append(helper.make_node("Clip", ["b2", "zero", "six"], ["r6"]))
    inits.append(const("g_w", [24, 6, 3, 3], 0.2))
    nodes.append(helper.make_node("Conv", ["r6", "g_w"], ["g"], group=4, pads=[0, 1, 2, 1]))
    nodes.append(helper.make_node("AveragePool", ["g"], ["ap"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1))
    nodes.append(helper.make_node("GlobalAveragePool", ["ap"], ["gp"]))
    nodes.append(helper.make_node("Flatten", ["gp"], ["f"], axis=1))
    inits.append(const("fc", [24, 5]))
    nodes.append(helper.make_node("MatMul", ["f", "fc"], ["y"]))
    return nodes, inits, [1, c, 20, 24]


def layout_mix():
    """Layout ops between convolutions: Transpose, Pad (constant, non-zero), Slice, Resize
    (nearest), Concat, Reshape, Flatten: what a generated module runs as gathers and joins."""
    c = 4
    inits = [const("lm_w1", [c, c, 3, 3], 0.3), const("lm_w2", [2 * c, 2 * c, 1, 1], 0.3), const("lm_fc", [2 * c * 4 * 8, 3], 0.1)]
    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)
    inits += [
        ints("pads", [0, 0, 1, 0, 0, 0, 3, 2]),
        numpy_helper.from_array(np.array(0.5, np.float32), "padv"),
        ints("starts", [1, 0]),
        ints("ends", [5, 8]),
        ints("axes", [2, 3]),
        numpy_helper.from_array(np.array([1.0, 1.0, 2.0, 2.0], np.float32), "scales"),
        ints("shape", [1, -1]),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "lm_w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["ar"]),
        # [1, 4, 3, 4] -> [1, 4, 4, 3] -> pad -> [1, 4, 8, 5] -> back: a transpose pair around a pad.
        helper.make_node("Transpose", ["ar"], ["t"], perm=[0, 1, 3, 2]),
        helper.make_node("Pad", ["t", "pads", "padv"], ["p"], mode="constant"),
        helper.make_node("Transpose", ["p"], ["pt"], perm=[0, 1, 3, 2]),
        helper.make_node("Slice", ["pt", "starts", "ends", "axes"], ["s"]),
        helper.make_node("Resize", ["x", "", "scales"], ["rz"], mode="nearest"),
        helper.make_node("Slice", ["rz", "starts", "ends", "axes"], ["rs"]),
        helper.make_node("Concat", ["s", "rs"], ["cat"], axis=1),
        helper.make_node("Conv", ["cat", "lm_w2"], ["b"]),
        helper.make_node("Sigmoid", ["b"], ["bs"]),
        helper.make_node("Reshape", ["bs", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "lm_fc"], ["y"]),
    ]
    return nodes, inits, [1, c, 3, 4]


def save(out: Path, name, nodes, inits, shape):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, name, [x], [y], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    # ONNX Runtime checks the model as it loads it (the checker wants an output shape).
    path = out / f"{name}.onnx"
    onnx.save(model, path)
    data = RNG.standard_normal(shape).astype(np.float32)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    (expected,) = sess.run(None, {"x": data})
    np.save(out / f"{name}.input.npy", data)
    np.save(out / f"{name}.expected.npy", expected.astype(np.float32))


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, build in [("mlp", mlp), ("resnet_block", resnet_block), ("depthwise_separable", depthwise_separable), ("layout_mix", layout_mix)]:
        nodes, inits, shape = build()
        save(out, name, nodes, inits, shape)
    print("fixtures: wrote mlp, resnet_block, depthwise_separable, layout_mix")


if __name__ == "__main__":
    main()
