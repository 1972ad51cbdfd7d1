"""Loads a jetfabric safetensors file into PyTorch without the safetensors
package and checks that the model gives jetfabric's output.

usage: torch_check.py MODEL_FILE IO_FILE SPEC

MODEL_FILE is written by nn.Save; IO_FILE holds "x" (the input) and "y"
(jetfabric's output for it); SPEC lists the layers of the Sequential, e.g.
"linear:6:5,gelu,layernorm:5,linear:5:3". Prints the largest difference and
exits 1 if it is over the tolerance or if anything does not load strictly.
"""

import json
import struct
import sys

import numpy as np
import torch

DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
    "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert n % 8 == 0, f"header of {n} bytes is not padded to 8"
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", None)
    at = 0
    out = {}
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        begin, end = info["data_offsets"]
        assert begin == at, f"{name}: gap or overlap at {begin}, want {at}"
        at = end
        dt = np.dtype(DTYPES[info["dtype"]]).newbyteorder("<")
        arr = np.frombuffer(data[begin:end], dtype=dt).reshape(info["shape"])
        out[name] = torch.from_numpy(arr.copy())
    assert at == len(data), f"data buffer of {len(data)} bytes, tensors cover {at}"
    return out, meta


def build(spec):
    layers = []
    for item in spec.split(","):
        kind, *args = item.split(":")
        a = [int(v) for v in args]
        if kind == "linear":
            layers.append(torch.nn.Linear(a[0], a[1]))
        elif kind == "conv":  # in, out, k, stride, padding
            layers.append(torch.nn.Conv2d(a[0], a[1], a[2], stride=a[3], padding=a[4]))
        elif kind == "maxpool":
            layers.append(torch.nn.MaxPool2d(a[0]))
        elif kind == "avgpool":
            layers.append(torch.nn.AvgPool2d(a[0]))
        elif kind == "layernorm":
            layers.append(torch.nn.LayerNorm(a))
        elif kind == "embedding":
            layers.append(torch.nn.Embedding(a[0], a[1]))
        elif kind == "relu":
            layers.append(torch.nn.ReLU())
        elif kind == "gelu":
            layers.append(torch.nn.GELU())
        elif kind == "silu":
            layers.append(torch.nn.SiLU())
        elif kind == "flatten":
            layers.append(torch.nn.Flatten())
        else:
            raise SystemExit(f"unknown layer {kind}")
    return torch.nn.Sequential(*layers)


def main():
    model_file, io_file, spec = sys.argv[1:4]
    state, meta = read_safetensors(model_file)
    assert meta == {"format": "pt"}, f"metadata {meta}"
    model = build(spec)
    model.load_state_dict(state, strict=True)
    io, _ = read_safetensors(io_file)
    with torch.no_grad():
        y = model(io["x"])
    diff = (y - io["y"]).abs().max().item()
    print(f"max |torch - jetfabric| = {diff:.3g} over {tuple(y.shape)}")
    if not torch.allclose(y, io["y"], rtol=1e-5, atol=1e-5):
        sys.exit(1)


main()
