#!/usr/bin/env python3
"""Measures civetta against the numpy reference over synthetic models (the numbers in
docs/REFERENCE.md). Not run by the tests.

  python3 tests/reference/measure.py [--civetta target/debug/civetta] [--archs ...] [--quants ...]

For each arch and weight type: synthesise the tiny model, let the reference generate 32
greedy tokens after the test prompt (activations quantised like ggml), then compare civetta's
logits over prompt + generated tokens with the reference's, with and without the activation
quantisation emulation. Prints the max relative logit error, the greedy agreement and the
distribution of the reference's top-1/top-2 margins (relative to max |logit|).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_forward  # noqa: E402

PROMPT = [299, 407, 280, 461, 114, 501, 293, 574, 312, 519, 44, 274, 259, 307, 105, 314]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--civetta", default="target/debug/civetta")
    ap.add_argument("--archs", nargs="+", default=["llama", "qwen2", "qwen3"])
    ap.add_argument("--quants", nargs="+", default=["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q5_k", "q6_k"])
    ap.add_argument("-n", type=int, default=32)
    a = ap.parse_args()
    print(f"{'model':12} {'err exact-act':>13} {'err act-quant':>13} {'greedy eq':>9} {'margin min':>10} {'p10':>6} {'median':>6}")
    all_margins = []
    with tempfile.TemporaryDirectory() as d:
        for arch in a.archs:
            for quant in a.quants:
                path = os.path.join(d, f"{arch}-{quant}.gguf")
                subprocess.run([a.civetta, "model", "synth", "--arch", arch, "--quant", quant, "-o", path], check=True, capture_output=True)
                emulated = ref_forward.Model(path, True)
                gen, _, _, rel = emulated.greedy(PROMPT, a.n)
                seq = PROMPT + gen
                out = subprocess.run([a.civetta, "logits", "--model", path, "--tokens", ",".join(map(str, seq))], check=True, capture_output=True)
                ours = np.array(json.loads(out.stdout)["logits"])
                errs = []
                for m in (ref_forward.Model(path, False), emulated):
                    ref = m.forward(seq, [])
                    errs.append((np.abs(ours - ref).max(1) / np.abs(ref).max(1)).max())
                picks = ours[len(PROMPT) - 1 : -1].argmax(1)
                eq = int((picks == np.array(gen)).sum())
                all_margins += rel
                print(f"{arch + ' ' + quant:12} {errs[0]:13.1e} {errs[1]:13.1e} {eq:>6}/{a.n} {min(rel):10.3f} {np.percentile(rel, 10):6.3f} {np.median(rel):6.3f}")
    r = np.array(all_margins)
    print(f"all {len(r)} greedy steps: relative margin min {r.min():.3f}, p1 {np.percentile(r, 1):.3f}, p5 {np.percentile(r, 5):.3f}, median {np.median(r):.3f}; below 1e-2: {(r < 1e-2).sum()}")


if __name__ == "__main__":
    main()
