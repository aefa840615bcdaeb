#!/usr/bin/env python3
"""Writes a GGUF file with the reference `gguf` package (PyPI, gguf-py from llama.cpp) and
prints, as JSON on stdout, what it wrote: every metadata value with its GGUF type, and every
tensor's ggml type, dims, raw-byte sha256 and dequantised values (via gguf.quants).

Used by tests/gguf_python.rs to check civetta's reader against an independent writer.
Usage: write_gguf_sample.py OUT.gguf
"""
import hashlib
import json
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q, GGUFValueType as T

ARCH = "civetta-test"


def canon(vtype, value, sub=None):
    """The value in the canonical form the Rust test builds from civetta's MetadataValue."""
    if vtype == T.ARRAY:
        if sub is None:  # nested arrays: element type inferred by gguf from the first item
            return {"t": "array", "v": [canon(*infer(item)) for item in value]}
        return {"t": "array", "v": [canon(sub, item) for item in value]}
    return {"t": TYPE_NAMES[vtype], "v": value}


def infer(item):
    """What gguf.GGUFWriter does for array items without an explicit sub type."""
    t = T.get_type(item)
    return (t, item, None) if t == T.ARRAY else (t, item)


TYPE_NAMES = {
    T.UINT8: "u8", T.INT8: "i8", T.UINT16: "u16", T.INT16: "i16", T.UINT32: "u32", T.INT32: "i32",
    T.FLOAT32: "f32", T.BOOL: "bool", T.STRING: "string", T.UINT64: "u64", T.INT64: "i64", T.FLOAT64: "f64",
}

# (key, GGUF type, value, array element type). Floats are exactly representable in f32.
METADATA = [
    ("test.u8", T.UINT8, 255, None),
    ("test.i8", T.INT8, -128, None),
    ("test.u16", T.UINT16, 65535, None),
    ("test.i16", T.INT16, -32768, None),
    ("test.u32", T.UINT32, 4294967295, None),
    ("test.i32", T.INT32, -2147483648, None),
    ("test.f32", T.FLOAT32, -0.15625, None),
    ("test.bool", T.BOOL, True, None),
    ("test.string", T.STRING, "héllo ✓\n{{ bos_token }}", None),
    ("test.u64", T.UINT64, 18446744073709551615, None),
    ("test.i64", T.INT64, -9223372036854775808, None),
    ("test.f64", T.FLOAT64, 3.141592653589793, None),
    ("tokenizer.ggml.tokens", T.ARRAY, ["<s>", "</s>", "Ġthe", "▁ok", ""], T.STRING),
    ("tokenizer.ggml.token_type", T.ARRAY, [3, 3, 1, 1, 6], T.INT32),
    ("tokenizer.ggml.scores", T.ARRAY, [0.0, -1.5, 2.25], T.FLOAT32),
    ("test.u8_array", T.ARRAY, [0, 1, 255], T.UINT8),
    ("test.u64_array", T.ARRAY, [1, 18446744073709551615], T.UINT64),
    ("test.bool_array", T.ARRAY, [True, False, True], T.BOOL),
    ("test.nested", T.ARRAY, [[1, 2], [3, 4, 5]], None),
]


def main():
    out = sys.argv[1]
    w = gguf.GGUFWriter(out, ARCH)  # adds general.architecture
    w.add_custom_alignment(64)
    expected_meta = [
        ["general.architecture", canon(T.STRING, ARCH)],
        ["general.alignment", canon(T.UINT32, 64)],
    ]
    for key, vtype, value, sub in METADATA:
        w.add_key_value(key, value, vtype, sub_type=sub)
        expected_meta.append([key, canon(vtype, value, sub)])

    rng = np.random.default_rng(1234)
    tensors = [
        ("token_embd.weight", Q.F32, rng.standard_normal((3, 8)).astype(np.float32)),
        ("blk.0.attn_q.weight", Q.F16, rng.standard_normal((2, 16)).astype(np.float32)),
        ("blk.0.ffn_up.weight", Q.Q8_0, rng.standard_normal((4, 64)).astype(np.float32)),
        ("blk.0.ffn_down.weight", Q.BF16, rng.standard_normal((2, 32)).astype(np.float32)),
    ]
    expected_tensors = []
    for name, qtype, values in tensors:
        if qtype == Q.F32:
            raw = values
            w.add_tensor(name, raw)
        elif qtype == Q.F16:
            raw = values.astype(np.float16)
            w.add_tensor(name, raw)
        else:
            raw = gguf.quants.quantize(values, qtype)
            w.add_tensor(name, raw, raw_dtype=qtype)
        dequant = gguf.quants.dequantize(raw.view(np.uint8) if qtype not in (Q.F32, Q.F16) else raw, qtype)
        expected_tensors.append({
            "name": name,
            "type": int(qtype),
            "dims": list(reversed(values.shape)),  # ggml order
            "sha256": hashlib.sha256(raw.tobytes()).hexdigest(),
            "values": [float(x) for x in np.asarray(dequant, dtype=np.float32).flatten()],
        })

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    json.dump({"metadata": expected_meta, "tensors": expected_tensors}, sys.stdout)


if __name__ == "__main__":
    main()
