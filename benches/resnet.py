"""A ResNet-18 or ResNet-50 for ImageNet as an ONNX file, for the whole-model benchmark
(benches/resnet_floor.sh): the graph a PyTorch export of torchvision's model in eval mode gives
(batch norms folded into the convolutions' weights and biases), with random weights instead of
trained ones, so that it needs no download. The timing of a convolution does not depend on its
weights' values; the weights are scaled (He's initialisation) so that activations stay finite
through fifty layers and the outputs can be compared with ONNX Runtime's.

  python3 benches/resnet.py {18|50} OUT_DIR [--batch 1]

Writes OUT_DIR/resnetNN.onnx and OUT_DIR/resnetNN.input.npy (one 224x224 RGB image per batch
element, standard normal). Needs numpy and onnx.
"""

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class Net:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.n = [], [], 0

    def name(self, kind):
        self.n += 1
        return f"{kind}{self.n}"

    def conv(self, x, cin, cout, k, stride=1, relu=True, gain=1.0):
        """Conv with bias (a folded batch norm), optionally followed by Relu."""
        w, b, y = self.name("w"), self.name("b"), self.name("conv")
        std = gain * np.sqrt(2.0 / (cin * k * k))
        self.inits.append(numpy_helper.from_array((self.rng.standard_normal([cout, cin, k, k]) * std).astype(np.float32), w))
        self.inits.append(numpy_helper.from_array((self.rng.standard_normal([cout]) * 0.05).astype(np.float32), b))
        pad = k // 2
        self.nodes.append(helper.make_node("Conv", [x, w, b], [y], kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4))
        return self.relu(y) if relu else y

    def relu(self, x):
        y = self.name("relu")
        self.nodes.append(helper.make_node("Relu", [x], [y]))
        return y

    def add_relu(self, a, b):
        y = self.name("add")
        self.nodes.append(helper.make_node("Add", [a, b], [y]))
        return self.relu(y)


def basic_block(net, x, cin, cout, stride):
    h = net.conv(x, cin, cout, 3, stride)
    # The residual branch's last layer scaled down, as a trained network's last batch norm
    # of a block tends to be, so that the sum stays of the input's size.
    h = net.conv(h, cout, cout, 3, 1, relu=False, gain=0.5)
    short = x if stride == 1 and cin == cout else net.conv(x, cin, cout, 1, stride, relu=False)
    return net.add_relu(h, short)


def bottleneck(net, x, cin, width, stride):
    cout = width * 4
    h = net.conv(x, cin, width, 1)
    h = net.conv(h, width, width, 3, stride)
    h = net.conv(h, width, cout, 1, relu=False, gain=0.5)
    short = x if stride == 1 and cin == cout else net.conv(x, cin, cout, 1, stride, relu=False)
    return net.add_relu(h, short)


def resnet(depth):
    net = Net(depth)
    x = net.conv("x", 3, 64, 7, 2)
    y = net.name("pool")
    net.nodes.append(helper.make_node("MaxPool", [x], [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    x, c = y, 64
    if depth == 18:
        for stage, width in enumerate([64, 128, 256, 512]):
            for i in range(2):
                stride = 2 if stage > 0 and i == 0 else 1
                x = basic_block(net, x, c, width, stride)
                c = width
    else:
        for stage, (width, blocks) in enumerate(zip([64, 128, 256, 512], [3, 4, 6, 3])):
            for i in range(blocks):
                stride = 2 if stage > 0 and i == 0 else 1
                x = bottleneck(net, x, c, width, stride)
                c = width * 4
    g, f = net.name("gap"), net.name("flat")
    net.nodes.append(helper.make_node("GlobalAveragePool", [x], [g]))
    net.nodes.append(helper.make_node("Flatten", [g], [f], axis=1))
    w, b = net.name("fc_w"), net.name("fc_b")
    net.inits.append(numpy_helper.from_array((net.rng.standard_normal([1000, c]) / np.sqrt(c)).astype(np.float32), w))
    net.inits.append(numpy_helper.from_array(np.zeros([1000], np.float32), b))
    net.nodes.append(helper.make_node("Gemm", [f, w, b], ["y"], transB=1))
    return net


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("depth", type=int, choices=[18, 50])
    ap.add_argument("out", type=Path)
    ap.add_argument("--batch", type=int, default=1)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    net = resnet(a.depth)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [a.batch, 3, 224, 224])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [a.batch, 1000])
    graph = helper.make_graph(net.nodes, f"resnet{a.depth}", [x], [y], initializer=net.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    name = f"resnet{a.depth}"
    onnx.save(model, a.out / f"{name}.onnx")
    data = np.random.default_rng(1).standard_normal([a.batch, 3, 224, 224]).astype(np.float32)
    np.save(a.out / f"{name}.input.npy", data)
    print(a.out / f"{name}.onnx")


if __name__ == "__main__":
    main()
