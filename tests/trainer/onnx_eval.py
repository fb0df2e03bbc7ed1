"""Checks an ONNX model and runs it with a small numpy interpreter.

Usage: onnx_eval.py MODEL INPUT N C H W OUTPUT

Runs onnx.checker.check_model(full_check=True) (which also infers every
shape in strict mode), then evaluates the graph in float64 on the NCHW
float32 images in INPUT (raw, little-endian) and writes the graph's single
output to OUTPUT as raw float64. Only the operators dlbatch exports are
implemented, from their definitions in the ONNX operator specification
(opset 13); any other operator, attribute value or input count fails loudly.
Exit status 0 on success; 2 if the checker rejects the model; 1 otherwise.
"""

import math
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper


def attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def windows(x, kernel, strides, pads, fill):
    """Yields (i, j, window) over an NCHW input padded with `fill`."""
    top, left, bottom, right = pads
    n, c, h, w = x.shape
    padded = np.full((n, c, h + top + bottom, w + left + right), fill)
    padded[:, :, top:top + h, left:left + w] = x
    kh, kw = kernel
    sh, sw = strides
    out_h = (h + top + bottom - kh) // sh + 1
    out_w = (w + left + right - kw) // sw + 1
    for i in range(out_h):
        for j in range(out_w):
            yield i, j, padded[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw]


def out_size(x, kernel, strides, pads):
    top, left, bottom, right = pads
    return ((x.shape[2] + top + bottom - kernel[0]) // strides[0] + 1,
            (x.shape[3] + left + right - kernel[1]) // strides[1] + 1)


def window_attrs(a, x):
    kernel = list(a["kernel_shape"])
    strides = list(a.get("strides", [1, 1]))
    pads = list(a.get("pads", [0, 0, 0, 0]))
    assert a.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET"), a
    assert list(a.get("dilations", [1, 1])) == [1, 1], a
    assert x.ndim == 4
    return kernel, strides, pads


def conv(node, x, w, b=None):
    a = attrs(node)
    assert a.get("group", 1) == 1, a
    kernel, strides, pads = window_attrs(a, x)
    assert list(w.shape[2:]) == kernel
    oh, ow = out_size(x, kernel, strides, pads)
    y = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for i, j, win in windows(x, kernel, strides, pads, 0.0):
        y[:, :, i, j] = np.einsum("nchw,ochw->no", win, w)
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y


def max_pool(node, x):
    kernel, strides, pads = window_attrs(attrs(node), x)
    oh, ow = out_size(x, kernel, strides, pads)
    y = np.zeros((x.shape[0], x.shape[1], oh, ow))
    for i, j, win in windows(x, kernel, strides, pads, -np.inf):
        y[:, :, i, j] = win.max(axis=(2, 3))
    return y


def average_pool(node, x):
    a = attrs(node)
    kernel, strides, pads = window_attrs(a, x)
    include_pad = a.get("count_include_pad", 0)
    ones = np.ones((1, 1) + x.shape[2:])
    oh, ow = out_size(x, kernel, strides, pads)
    y = np.zeros((x.shape[0], x.shape[1], oh, ow))
    counts = {(i, j): win.sum() for i, j, win in
              windows(ones, kernel, strides, pads, 0.0)}
    for i, j, win in windows(x, kernel, strides, pads, 0.0):
        count = kernel[0] * kernel[1] if include_pad else counts[(i, j)]
        y[:, :, i, j] = win.sum(axis=(2, 3)) / count
    return y


def batch_norm(node, x, scale, bias, mean, var):
    a = attrs(node)
    eps = a.get("epsilon", 1e-5)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return ((x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) *
            scale.reshape(shape) + bias.reshape(shape))


def gemm(node, a_in, b_in, c_in=None):
    a = attrs(node)
    if a.get("transA", 0):
        a_in = a_in.T
    if a.get("transB", 0):
        b_in = b_in.T
    y = a.get("alpha", 1.0) * (a_in @ b_in)
    if c_in is not None:
        y = y + a.get("beta", 1.0) * c_in
    return y


def softmax(node, x):
    axis = attrs(node).get("axis", -1)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def flatten(node, x):
    axis = attrs(node).get("axis", 1)
    return x.reshape(int(np.prod(x.shape[:axis])), -1)


def reshape(node, x, shape):
    assert attrs(node).get("allowzero", 0) == 0
    shape = [x.shape[i] if d == 0 else int(d) for i, d in enumerate(shape)]
    return x.reshape(shape)


def leaky_relu(node, x):
    alpha = attrs(node).get("alpha", 0.01)
    return np.where(x > 0, x, alpha * x)


OPS = {
    "Conv": conv,
    "MaxPool": max_pool,
    "AveragePool": average_pool,
    "GlobalAveragePool": lambda node, x: x.mean(axis=(2, 3), keepdims=True),
    "BatchNormalization": batch_norm,
    "Gemm": gemm,
    "Softmax": softmax,
    "Flatten": flatten,
    "Reshape": reshape,
    "Relu": lambda node, x: np.maximum(x, 0),
    "LeakyRelu": leaky_relu,
    "Identity": lambda node, x: x,
    "Sub": lambda node, x, y: x - y,
    "Div": lambda node, x, y: x / y,
    "Add": lambda node, x, y: x + y,
    "Mul": lambda node, x, y: x * y,
    "Erf": lambda node, x: np.vectorize(math.erf)(x),
    "Concat": lambda node, *xs: np.concatenate(xs, axis=attrs(node)["axis"]),
}


def run(model, images):
    graph = model.graph
    values = {}
    for t in graph.initializer:
        array = numpy_helper.to_array(t)
        values[t.name] = (array.astype(np.float64)
                          if array.dtype == np.float32 else array)
    assert len(graph.input) == 1, [i.name for i in graph.input]
    values[graph.input[0].name] = images.astype(np.float64)
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            raise ValueError("operator domain %r" % node.domain)
        if node.op_type not in OPS:
            raise ValueError("operator %s is not implemented" % node.op_type)
        inputs = [values[name] for name in node.input if name]
        outputs = OPS[node.op_type](node, *inputs)
        values[node.output[0]] = outputs
    assert len(graph.output) == 1
    return values[graph.output[0].name]


def main(argv):
    model_path, input_path = argv[1], argv[2]
    n, c, h, w = (int(v) for v in argv[3:7])
    output_path = argv[7]
    model = onnx.load(model_path)
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # the checker's own error types vary by version
        print("check_model failed: %s" % e, file=sys.stderr)
        return 2
    images = np.fromfile(input_path, dtype="<f4").reshape(n, c, h, w)
    probabilities = run(model, images)
    np.ascontiguousarray(probabilities, dtype="<f8").tofile(output_path)
    print("ok: %d nodes, output %s" % (len(model.graph.node),
                                       list(probabilities.shape)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
