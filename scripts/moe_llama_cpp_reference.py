#!/usr/bin/env python3
"""Writes tests/fixtures/moe/<arch>-<quant>.json: llama.cpp's view of civetta's synthetic MoE models.

For each (arch, quant, extra args) case: `civetta model synth --arch ARCH --quant QUANT --seed 1
EXTRA...` (the files are a pure function of these arguments, so tests/moe_llama_cpp.rs
regenerates them and checks the sha256 recorded here), then llama.cpp's greedy driver (scripts/llama_cpp_greedy.cpp, built
against /work/llama.cpp's static libraries as scripts/llama-cpp-reference.sh builds it) from a
fixed 16-token prompt: 32 greedy ids with top-1/top-2 margins, and the prompt's last-position
logits (LLAMA_CPP_GREEDY_PROMPT_LOGITS=1).

usage: moe_llama_cpp_reference.py --civetta target/debug/civetta --greedy build/llama-cpp-greedy-logits
"""
import argparse
import hashlib
import json
import os
import subprocess
import tempfile

# gpt-oss: experts MXFP4 and the rest Q8_0 (as the real files), and all Q8_0; with YaRN
# (factor 32, as the real files) over a 1024-position context, so an original context of 32
# positions: the greedy run (positions 16..47) goes past it, and YaRN's ramp (head_dim 32,
# base 150000) spans pairs 0..3 (pair 0 unscaled, 1 and 2 blended, 3.. interpolated).
GPT_OSS_YARN = ["--context", "1024"]
CASES = [("qwen3moe", "q8_0", []), ("qwen3moe", "q4_k", []), ("qwen2moe", "q8_0", []), ("qwen2moe", "q4_k", []),
         ("gpt-oss", "mxfp4", GPT_OSS_YARN), ("gpt-oss", "q8_0", GPT_OSS_YARN)]
# The prompt of tests/reference_logits.rs: 16 ids from the tiny preset's trained BPE range.
PROMPT = "299,407,280,461,114,501,293,574,312,519,44,274,259,307,105,314"
STEPS = 32
THREADS = 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--civetta", required=True)
    ap.add_argument("--greedy", required=True)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "moe"))
    ap.add_argument("--only", help="comma-separated ARCH-QUANT cases to (re)write, e.g. gpt-oss-mxfp4")
    args = ap.parse_args()
    cases = [c for c in CASES if not args.only or f"{c[0]}-{c[1]}" in args.only.split(",")]
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for arch, quant, extra in cases:
            model = os.path.join(tmp, f"{arch}-{quant}.gguf")
            subprocess.run([args.civetta, "model", "synth", "--arch", arch, "--quant", quant, "--seed", "1", *extra, "-o", model], check=True)
            sha = hashlib.sha256(open(model, "rb").read()).hexdigest()
            env = dict(os.environ, LLAMA_CPP_GREEDY_PROMPT_LOGITS="1")
            out = subprocess.run([args.greedy, model, str(STEPS), PROMPT, str(THREADS)], check=True, capture_output=True, text=True, env=env)
            r = json.loads(out.stdout)
            fixture = {
                "generator": "scripts/moe_llama_cpp_reference.py (llama.cpp CPU build of scripts/llama-cpp-reference.sh, no AMX, "
                + f"{THREADS} threads)",
                "synth": {"arch": arch, "quant": quant, "size": "tiny", "seed": 1, "args": extra, "sha256": sha},
                "prompt": [int(t) for t in PROMPT.split(",")],
                "greedy_steps": STEPS,
                "tokens": r["tokens"],
                "runner_up": r["runner_up"],
                "rel_margins": r["rel_margins"],
                "prompt_logits": r["prompt_logits"],
            }
            path = os.path.join(args.out, f"{arch}-{quant}.json")
            with open(path, "w") as f:
                json.dump(fixture, f, separators=(",", ":"))
                f.write("\n")
            print(f"wrote {path}: greedy {r['tokens'][:8]}..., min rel margin {min(r['rel_margins']):.3g}")


if __name__ == "__main__":
    main()
