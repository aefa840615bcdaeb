#!/usr/bin/env python3
"""Writes tests/fixtures/smollm2/reference.json from llama.cpp (called by llama-cpp-reference.sh).

- tokenizer: for each test string, llama-tokenize's ids (no BOS unless the model asks for it,
  special tokens not parsed), plus the rendered chat prompts with special tokens parsed;
- chat: for each fixed chat prompt, the model's chat template rendered with jinja2 (as
  llama.cpp's --jinja mode does), llama-tokenize's ids for it, and the first N greedy ids that
  llama.cpp's library generates from those ids (llama-cpp-greedy, ignoring end-of-generation),
  with llama.cpp's own top-1/top-2 logit margins so near ties are visible.
- cross-check: llama-simple (stock llama.cpp, greedy sampler) on the rendered text must print
  the same continuation, up to its first end-of-generation token.

Needs python3 with gguf (PyPI gguf) and jinja2.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import jinja2
from gguf import GGUFReader

N_PREDICT = 48

CHAT_PROMPTS = [
    "Write a short poem about the sea.",
    "Explain in two sentences why the sky is blue.",
    "Give me three tips for learning to program in Python.",
]

TOKENIZER_STRINGS = [
    # English
    "The capital of France is",
    "Hello, world! How are you doing today?",
    "I'm sure they'll say it's fine; we've been there, haven't we?",
    "The quick brown fox jumps over the lazy dog. THE END.",
    # numbers
    "In 2024, 3.14159 * 1000 = 3141.59 and 1,234,567 is big.",
    # code
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "fn main() {\n\tlet v: Vec<u8> = vec![0x1f, 0xff];\n\tprintln!(\"{:?}\", v);\n}",
    "<div class=\"x\">&nbsp;</div> // TODO: fix #42 @user",
    # Unicode
    "Café crème brûlée, naïve façade, Straße, Ångström",
    "日本語のテキストと中文文本，以及한국어.",
    "Привет, мир! Γειά σου κόσμε!",
    "Emoji: 🦉🚀👍🏽 and ∑∫√∞ ≠ ≤ ≥",
    # whitespace
    "  leading spaces",
    "trailing spaces   ",
    "tabs\tand\ttabs\t\t",
    "line1\nline2\n\n\nline5\r\nwindows",
    "   \n\n  \t ",
    "a  b   c    d     e",
    # looks like a special token, must stay plain text when specials are not parsed
    "<|im_start|>user is not special here",
]


def gguf_metadata(path):
    r = GGUFReader(path)

    def get(key):
        f = r.fields.get(key)
        return None if f is None else f.contents()

    return {
        "chat_template": get("tokenizer.chat_template"),
        "add_bos": bool(get("tokenizer.ggml.add_bos_token")),
        "tokens": get("tokenizer.ggml.tokens"),
        "token_type": get("tokenizer.ggml.token_type"),
        "eos": get("tokenizer.ggml.eos_token_id"),
    }


def render_chat(template, user_message):
    # HF transformers renders chat templates with trim_blocks and lstrip_blocks on.
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(
        messages=[{"role": "user", "content": user_message}], add_generation_prompt=True
    )


def llama_tokenize(bin_dir, model, text, parse_special):
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        path = f.name
    try:
        # llama-tokenize parses special tokens by default and only accepts --no-parse-special.
        cmd = [os.path.join(bin_dir, "llama-tokenize"), "-m", model, "-f", path, "--ids", "--log-disable"]
        if not parse_special:
            cmd.append("--no-parse-special")
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def gpt2_byte_decoder():
    """Inverse of GPT-2's bytes_to_unicode: token pieces map back to raw bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def detokenize(meta, ids):
    """Token ids to text: control tokens (type 3) as their own text, others via GPT-2 bytes."""
    dec = gpt2_byte_decoder()
    out = bytearray()
    for i in ids:
        piece = meta["tokens"][i]
        if meta["token_type"][i] == 3 or not all(ch in dec for ch in piece):
            out += piece.encode("utf-8")
        else:
            out += bytes(dec[ch] for ch in piece)
    return out.decode("utf-8", errors="replace")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="folder with llama-tokenize, llama-simple, llama-cpp-greedy")
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    meta = gguf_metadata(args.model)
    with open(args.model, "rb") as f:
        model_sha = hashlib.sha256(f.read()).hexdigest()

    tokenizer_cases = []
    for s in TOKENIZER_STRINGS:
        tokenizer_cases.append({"text": s, "parse_special": False,
                                "ids": llama_tokenize(args.bin, args.model, s, False)})

    chats = []
    for msg in CHAT_PROMPTS:
        rendered = render_chat(meta["chat_template"], msg)
        prompt_ids = llama_tokenize(args.bin, args.model, rendered, True)
        tokenizer_cases.append({"text": rendered, "parse_special": True, "ids": prompt_ids})
        greedy = json.loads(subprocess.run(
            [os.path.join(args.bin, "llama-cpp-greedy"), args.model, str(N_PREDICT),
             ",".join(map(str, prompt_ids)), "2"],
            check=True, capture_output=True, text=True).stdout)
        ids = greedy["tokens"]
        text = detokenize(meta, ids)
        # Stock llama-simple (its own greedy sampler, text in, text out) must agree up to EOS.
        simple = subprocess.run(
            [os.path.join(args.bin, "llama-simple"), "-m", args.model, "-n", str(N_PREDICT), rendered],
            check=True, capture_output=True).stdout.decode("utf-8", errors="replace")
        until_eos = ids[: ids.index(meta["eos"])] if meta["eos"] in ids else ids
        expected = detokenize(meta, until_eos)
        if not simple.startswith(rendered + expected):
            sys.exit(f"llama-simple disagrees with llama-cpp-greedy on {msg!r}:\n"
                     f"simple: {simple[len(rendered):]!r}\ngreedy: {expected!r}")
        chats.append({
            "user": msg,
            "rendered": rendered,
            "prompt_ids": prompt_ids,
            "greedy_ids": ids,
            "greedy_text": text,
            "runner_up": greedy["runner_up"],
            "rel_margins": greedy["rel_margins"],
        })
        print(f"{msg!r}: {len(prompt_ids)} prompt tokens -> {text!r}", file=sys.stderr)

    reference = {
        "generator": "scripts/llama-cpp-reference.sh (llama.cpp vendored in llama-cpp-python 0.3.36, CPU, no AMX)",
        "model": {"file": os.path.basename(args.model), "sha256": model_sha},
        "add_bos": meta["add_bos"],
        "greedy_steps": N_PREDICT,
        "tokenizer": tokenizer_cases,
        "chat": chats,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(reference, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
