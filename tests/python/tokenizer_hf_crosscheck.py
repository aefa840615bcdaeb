#!/usr/bin/env python3
"""Encodes strings with HF `tokenizers` (an independent byte-level BPE implementation) for
tests/tokenizer_hf_crosscheck.rs.

usage: tokenizer_hf_crosscheck.py REQUEST.json
REQUEST: {"vocab": {"tokens": [...], "merges": [...]},
          "pre": "gpt-2" | "qwen2" | "llama-bpe",
          "texts": [...]}
Prints {"ids": [[...] per text]}.
"""
import json
import sys

from tokenizers import Regex, Tokenizer, models, pre_tokenizers

# The expressions of the original tokenizer.json files (with (?i:...) contractions).
PATTERNS = {
    "gpt-2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        req = json.load(f)
    tokens, merges = req["vocab"]["tokens"], req["vocab"]["merges"]
    vocab = {}
    for i, t in enumerate(tokens):
        vocab[t] = i  # the last duplicate wins, as in llama.cpp
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    pre = req["pre"]
    model = models.BPE(vocab=vocab, merges=pairs, ignore_merges=(pre == "llama-bpe"))
    tk = Tokenizer(model)
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERNS[pre]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    ids = [enc.ids for enc in tk.encode_batch(req["texts"], add_special_tokens=False)]
    json.dump({"ids": ids}, sys.stdout)


if __name__ == "__main__":
    main()
