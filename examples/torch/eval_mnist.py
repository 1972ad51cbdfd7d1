"""Loads weights that `jetfabric train --save FILE` wrote and measures their
MNIST test accuracy in PyTorch, with no jetfabric code and no safetensors
package: the file is read by hand (8-byte header length, JSON header, data).

usage: python3 eval_mnist.py mlp|cnn WEIGHTS.safetensors MNIST_DIR [cuda|cpu]

MNIST_DIR holds t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz.
Prints one JSON line with the accuracy.
"""
import gzip, json, struct, sys

import numpy as np
import torch
import torch.nn as nn

DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64, "I32": np.int32, "U8": np.uint8}


def read_safetensors(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    data = blob[8 + n:]
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        arr = np.frombuffer(data[b:e], dtype=np.dtype(DTYPES[info["dtype"]]).newbyteorder("<"))
        out[name] = torch.from_numpy(arr.reshape(info["shape"]).copy())
    return out


def model(kind):
    if kind == "mlp":  # jetfabric's: Flatten, then 784-512-512-10 with ReLU
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    return nn.Sequential(  # PyTorch's examples/mnist network, as jetfabric builds it
        nn.Conv2d(1, 32, 3, 1), nn.ReLU(), nn.Conv2d(32, 64, 3, 1), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.25),
        nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 10), nn.LogSoftmax(1))


def idx(path):
    raw = gzip.open(path).read()
    magic, = struct.unpack(">I", raw[:4])
    dims = struct.unpack(">" + "I" * (magic & 0xFF), raw[4:4 + 4 * (magic & 0xFF)])
    return np.frombuffer(raw[4 + 4 * len(dims):], dtype=np.uint8).reshape(dims)


def main():
    kind, weights, data = sys.argv[1], sys.argv[2], sys.argv[3]
    dev = sys.argv[4] if len(sys.argv) > 4 else ("cuda" if torch.cuda.is_available() else "cpu")
    m = model(kind)
    m.load_state_dict(read_safetensors(weights), strict=True)
    m = m.to(dev).eval()
    x = torch.from_numpy(idx(f"{data}/t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
    x = ((x - 0.1307) / 0.3081).reshape(-1, 1, 28, 28).to(dev)
    y = torch.from_numpy(idx(f"{data}/t10k-labels-idx1-ubyte.gz").astype(np.int64)).to(dev)
    with torch.no_grad():
        acc = (m(x).argmax(1) == y).float().mean().item()
    print(json.dumps({"model": kind, "device": dev, "torch": torch.__version__, "test_accuracy": acc, "examples": len(y)}))


if __name__ == "__main__":
    main()
