#!/usr/bin/env python3
"""Writes tests/fixtures/mxfp4/gguf_py.json: rows of f32 values, the MXFP4 bytes the `gguf`
package's reference quantiser (gguf.quants.MXFP4, a port of ggml's quantize_row_mxfp4_ref)
makes of them, and its dequantisation of those bytes. src/quant/mxfp4.rs checks its quantiser and
dequantiser against them bit for bit (no python at test time).

Usage: PATH=build/venv/bin:$PATH python3 scripts/mxfp4_gguf_reference.py
"""
import json
import pathlib

import gguf
import numpy as np
from gguf.quants import quantize, dequantize

rng = np.random.default_rng(39)
rows = []
# Random rows at several magnitudes, a row with an all-zero block, exact grid values and ties
# between two levels (x exactly half-way), tiny and huge scales.
for scale in [1e-6, 1e-2, 0.3, 1.0, 7.0, 1e3, 1e20]:
    rows.append((rng.standard_normal(64) * scale).astype(np.float32))
z = rng.standard_normal(64).astype(np.float32)
z[:32] = 0
rows.append(z)
grid = np.array([0, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, -0.25, -3, 0.125, 0.375, 0.625, 1.25, 1.75, 2.5] * 4, dtype=np.float32)
rows.append(grid)
cases = []
for r in rows:
    q = quantize(r.reshape(1, -1), gguf.GGMLQuantizationType.MXFP4)
    d = dequantize(q, gguf.GGMLQuantizationType.MXFP4).reshape(-1)
    cases.append({
        "x_bits": [int(v) for v in r.view(np.uint32)],
        "q": q.reshape(-1).tobytes().hex(),
        "y_bits": [int(v) for v in d.astype(np.float32).view(np.uint32)],
    })
out = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/mxfp4/gguf_py.json"
out.write_text(json.dumps({"gguf_version": gguf.__version__ if hasattr(gguf, "__version__") else "0.19.0", "cases": cases}) + "\n")
print(f"wrote {out}: {len(cases)} rows")
