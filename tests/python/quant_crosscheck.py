#!/usr/bin/env python3
"""Independent (de)quantisation with PyPI `gguf` (gguf-py's numpy reference code) for
tests/quant_python_crosscheck.rs.

Usage: quant_crosscheck.py JOBS.json
Each job: {"op": "dequantize"|"quantize", "type": "Q4_K", "input": path, "output": path, "n": N}
- dequantize: input = raw row bytes of `type`, output = n little-endian f32.
- quantize:   input = n little-endian f32, output = raw row bytes of `type`.
Exit status 3 with a message on stderr when numpy or gguf is missing.
"""
import json
import sys

try:
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize
except ImportError as e:  # pragma: no cover - reported by the Rust test
    print(f"missing python package: {e}", file=sys.stderr)
    sys.exit(3)


def main() -> None:
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    for job in jobs:
        qtype = GGMLQuantizationType[job["type"]]
        n = job["n"]
        if job["op"] == "dequantize":
            data = np.fromfile(job["input"], dtype=np.uint8)
            out = dequantize(data, qtype).astype("<f4", copy=False).reshape(-1)
            assert out.size == n, (job, out.size)
        elif job["op"] == "quantize":
            x = np.fromfile(job["input"], dtype="<f4").reshape(1, n)
            out = np.ascontiguousarray(quantize(x, qtype)).view(np.uint8).reshape(-1)
        else:
            raise SystemExit(f"unknown op {job['op']}")
        out.tofile(job["output"])


if __name__ == "__main__":
    main()
