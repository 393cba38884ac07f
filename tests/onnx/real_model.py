"""The real model of tests/onnx_models.rs: PP-OCR's text-direction classifier
(ch_ppocr_mobile_v2.0_cls_infer.onnx, a MobileNetV3 exported from PaddlePaddle, Apache-2.0),
as the rapidocr-onnxruntime 1.4.4 wheel ships it, with ONNX Runtime's output for an input.

Usage: real_model.py WHEEL_DIR OUT_DIR. WHEEL_DIR holds the wheel (scripts/setup.sh
--for-tests downloads it there with `pip download --no-deps`). Writes cls.onnx, cls.input.npy
cls.expected.npy and cls.logits.npy into OUT_DIR; exits 3 where the wheel is missing.
"""

import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

MEMBER = "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"


def main():
    wheels = sorted(Path(sys.argv[1]).glob("rapidocr_onnxruntime-1.4.4-*.whl"))
    if not wheels:
        print(f"no rapidocr_onnxruntime-1.4.4 wheel in {sys.argv[1]}")
        sys.exit(3)
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheels[0]) as z:
        model = onnx.load_from_string(z.read(MEMBER))
    # The logits before the final softmax become a second output: two classes' softmax can
    # saturate and hide a difference that the logits show.
    softmax = [n for n in model.graph.node if n.op_type == "Softmax"][-1]
    model.graph.output.append(onnx.helper.make_empty_tensor_value_info(softmax.input[0]))
    onnx.save(model, out / "cls.onnx")
    # The classifier's input: a text line of 48x192 pixels, normalized to [-1, 1].
    x = np.random.default_rng(7).uniform(-1.0, 1.0, (1, 3, 48, 192)).astype(np.float32)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(out / "cls.onnx"), opts, providers=["CPUExecutionProvider"])
    y, logits = sess.run(None, {sess.get_inputs()[0].name: x})
    np.save(out / "cls.input.npy", x)
    np.save(out / "cls.expected.npy", y.astype(np.float32))
    np.save(out / "cls.logits.npy", logits.astype(np.float32))
    print(f"real_model: cls.onnx, outputs {y.shape} and logits {logits.shape}: {y.ravel()}")


if __name__ == "__main__":
    main()
