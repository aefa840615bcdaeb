#!/usr/bin/env python3
"""Writes tests/fixtures/gemma3/reference.json from llama.cpp (llama-cpp-reference.sh gemma3).

On the real Gemma 3 270M Q4_K_M file (scripts/fetch-gemma3.sh; Gemma Terms of Use):
- tokenizer: llama-tokenize's ids for test strings with special tokens parsed and not parsed
  (BOS added as the model asks, add_bos_token = true);
- prompts: 3 raw prompts and 2 user messages in Gemma's chat format (the file carries no
  tokenizer.chat_template; this is the format of Gemma's published template:
  "<start_of_turn>user\\n{msg}<end_of_turn>\\n<start_of_turn>model\\n"), each with
  llama.cpp's prompt ids, its first N greedy ids (llama-cpp-greedy over llama.cpp's library,
  ignoring end-of-generation), top-1/top-2 margins, and the logits at the last prompt position
  sampled at llama.cpp's top 64 ids and at every 256th id (the whole vector is 262,144 floats),
  with the full vector's max |logit| and RMS.

Needs python3 with numpy and gguf.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGUFReader

N_PREDICT = 32
TOP = 64
STRIDE = 256

RAW_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]

CHAT_MESSAGES = [
    "Write a short poem about the sea.",
    "Explain in two sentences why the sky is blue.",
]

TOKENIZER_STRINGS = [
    "The capital of France is",
    "Hello, world! How are you doing today?",
    "I'm sure they'll say it's fine; we've been there, haven't we?",
    "In 2024, 3.14159 * 1000 = 3141.59 and 1,234,567 is big.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Café crème brûlée, naïve façade, Straße, Ångström",
    "日本語のテキストと中文文本，以及한국어.",
    "Emoji: 🦉🚀👍🏽 and ∑∫√∞ ≠ ≤ ≥",
    "  leading spaces",
    "trailing spaces   ",
    "tabs\tand\ttabs\t\t",
    "line1\nline2\n\n\nline5\r\nwindows",
    "a  b   c    d     e",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text after a literal bos <eos> and <pad>",
]


def chat_prompt(msg):
    return f"<start_of_turn>user\n{msg}<end_of_turn>\n<start_of_turn>model\n"


def llama_tokenize(bin_dir, model, text, parse_special):
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        path = f.name
    try:
        cmd = [os.path.join(bin_dir, "llama-tokenize"), "-m", model, "-f", path, "--ids", "--log-disable"]
        if not parse_special:
            cmd.append("--no-parse-special")
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="folder with llama-tokenize and llama-cpp-greedy")
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    r = GGUFReader(args.model)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    n_vocab = len(tokens)
    with open(args.model, "rb") as f:
        model_sha = hashlib.sha256(f.read()).hexdigest()

    tokenizer_cases = []
    for s in TOKENIZER_STRINGS:
        for parse_special in (False, True):
            tokenizer_cases.append({"text": s, "parse_special": parse_special,
                                    "ids": llama_tokenize(args.bin, args.model, s, parse_special)})

    prompts = [("raw", p) for p in RAW_PROMPTS] + [("chat", chat_prompt(m)) for m in CHAT_MESSAGES]
    cases = []
    for kind, text in prompts:
        prompt_ids = llama_tokenize(args.bin, args.model, text, True)
        with tempfile.TemporaryDirectory() as tmp:
            logits_path = os.path.join(tmp, "logits.f32")
            greedy = json.loads(subprocess.run(
                [os.path.join(args.bin, "llama-cpp-greedy"), args.model, str(N_PREDICT),
                 ",".join(map(str, prompt_ids)), "2", logits_path],
                check=True, capture_output=True, text=True).stdout)
            logits = np.fromfile(logits_path, dtype="<f4")
        assert logits.size == n_vocab, (logits.size, n_vocab)
        top = np.argsort(-logits, kind="stable")[:TOP]
        ids = sorted(set(top.tolist()) | set(range(0, n_vocab, STRIDE)))
        cases.append({
            "kind": kind,
            "text": text,
            "prompt_ids": prompt_ids,
            "greedy_ids": greedy["tokens"],
            "greedy_text": "".join(tokens[i] for i in greedy["tokens"]).replace("\u2581", " "),
            "runner_up": greedy["runner_up"],
            "rel_margins": greedy["rel_margins"],
            "last_logits": {
                "ids": ids,
                "values": [float(logits[i]) for i in ids],
                "max_abs": float(np.abs(logits).max()),
                "rms": float(np.sqrt(np.mean(logits.astype(np.float64) ** 2))),
            },
        })
        print(f"{kind} {text!r}: {len(prompt_ids)} prompt ids -> {cases[-1]['greedy_text']!r}", file=sys.stderr)

    reference = {
        "generator": "scripts/llama-cpp-reference.sh gemma3 (llama.cpp vendored in llama-cpp-python 0.3.36, CPU, no AMX, 2 threads)",
        "model": {"file": os.path.basename(args.model), "sha256": model_sha,
                  "license": "Gemma Terms of Use (the model file is not in this repository)"},
        "greedy_steps": N_PREDICT,
        "tokenizer": tokenizer_cases,
        "prompts": cases,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(reference, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
