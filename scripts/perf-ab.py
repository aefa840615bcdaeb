#!/usr/bin/env python3
"""Interleaved A/B speed comparison for noisy machines (docs/PERF.md).

Runs each configuration once per round, ROUNDS rounds, alternating, and prints the median
tokens/s of pp and tg per configuration. A configuration is either LLAMA (llama-bench from
build/llama.cpp) or a civetta binary path, optionally with environment settings and extra
`civetta bench` options (words starting with "-"):
  scripts/perf-ab.py 8 target/release/civetta LLAMA
  scripts/perf-ab.py 6 /tmp/civetta-before /tmp/civetta-after
  scripts/perf-ab.py 4 "target/release/civetta CIVETTA_SIMD=scalar" target/release/civetta
  scripts/perf-ab.py 4 "target/release/civetta --weights-memory=huge_pages" target/release/civetta
env: MODEL (models/smollm2-135m-instruct-q4_1.gguf), THREADS (2), PP (512), TG (128),
     LLAMA_CPP_DIR (build/llama.cpp)
On the shared 2-vCPU VMs here one run's speed varies by up to 30%; alternating the
configurations spreads that drift over all of them, and the median ignores the outliers.
"""
import json
import os
import statistics
import subprocess
import sys

rounds, configs = int(sys.argv[1]), sys.argv[2:]
model = os.environ.get("MODEL", "models/smollm2-135m-instruct-q4_1.gguf")
threads, pp, tg = os.environ.get("THREADS", "2"), os.environ.get("PP", "512"), os.environ.get("TG", "128")
llama_bench = os.path.join(os.environ.get("LLAMA_CPP_DIR", "build/llama.cpp"), "bin/llama-bench")
samples = {c: {"pp": [], "tg": []} for c in configs}

for _ in range(rounds):
    for c in configs:
        if c == "LLAMA":
            cmd = [llama_bench, "-m", model, "-t", threads, "-p", pp, "-n", tg, "-r", "1", "-o", "json"]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            for r in json.loads(out.stdout):
                samples[c]["tg" if r["n_gen"] > 0 else "pp"] += r["samples_ts"]
            continue
        binary, *settings = c.split()
        env = dict(os.environ, **dict(s.split("=", 1) for s in settings if not s.startswith("-")))
        cmd = [binary, "bench", "-m", model, "-t", threads, "-p", pp, "-n", tg, "-r", "1", "--warmup", "1",
               "--hash-tokens", "0", "--kernel-timing", "off", "-q", "-o", "json"] + [s for s in settings if s.startswith("-")]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        for t in json.loads(out.stdout)["tests"]:
            samples[c][t["kind"]] += t["samples_tps"]

print(f"model {model}, {threads} threads, pp{pp} / tg{tg}, {rounds} interleaved rounds; median t/s (min-max)")
print("| configuration | pp | tg |")
print("|---|---:|---:|")
for c in configs:
    cell = lambda v: f"{statistics.median(v):.1f} ({min(v):.0f}-{max(v):.0f})" if v else "-"
    print(f"| {c} | {cell(samples[c]['pp'])} | {cell(samples[c]['tg'])} |")
if len(configs) == 2:
    a, b = (samples[c] for c in configs)
    ratio = lambda k: statistics.median(a[k]) / statistics.median(b[k]) if a[k] and b[k] else float("nan")
    print(f"\n{configs[0]} / {configs[1]}: pp {ratio('pp'):.2f}x, tg {ratio('tg'):.2f}x")
