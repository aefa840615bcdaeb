#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/gpt4o-on-qwen2-vocab.json: llama.cpp's token ids for the
GPT-4o pre-tokenizer (tokenizer.ggml.pre = "gpt-4o", as the real gpt-oss GGUFs say), run on
llama.cpp's Qwen2 test vocabulary (build/vocab-tests/ggml-vocab-qwen2.gguf) with its pre name
rewritten. The merges are Qwen2's, so the ids test the split: the o200k expression (capital and
lower-case letter runs, contractions, up to 3 digits, punctuation taking trailing newlines and
slashes) against Qwen2's. Inputs: the Qwen2 test inputs plus cases aimed at the differences.

Uses llama.cpp's llama-tokenize (add_special=false: --no-bos; parse_special=false) and the gguf
package (build/venv). tests/tokenizer_llama_vectors.rs rewrites the pre name the same way.

usage: gpt4o_tokenizer_reference.py [--vocab-dir build/vocab-tests] [--llama-tokenize PATH]
"""
import argparse
import json
import os
import subprocess
import tempfile

import gguf

SEP = "\n__ggml_vocab_test__\n"
EXTRA = [
    "HELLOworld CamelCaseWord iPhone McDonald's DON'T we'll I'M",
    "path/to/file\n\n//comment\r\n",
    "Éric été ÉTÉ naïve Ωmega ωΩ",
    "a1234567 12 ١٢٣",
    "x  y\t\tz \n  w",
    "ÀÉÎõü ÑandúLLama",
]


def rewrite_pre(src, dst, pre):
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, bytes(r.fields["general.architecture"].parts[-1]).decode())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        t = f.types[0]
        if name == "tokenizer.ggml.pre":
            w.add_string(name, pre)
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(f.parts[-1]).decode())
        elif t == gguf.GGUFValueType.ARRAY and f.types[1] == gguf.GGUFValueType.STRING:
            w.add_array(name, [bytes(f.parts[i]).decode() for i in f.data])
        elif t == gguf.GGUFValueType.ARRAY:
            w.add_array(name, [f.parts[i][0].item() for i in f.data])
        else:
            w.add_key_value(name, f.parts[-1][0].item(), t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    root = os.path.join(os.path.dirname(__file__), "..")
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab-dir", default=os.path.join(root, "build", "vocab-tests"))
    ap.add_argument("--llama-tokenize", default=os.path.join(os.environ.get("LLAMA_CPP_DIR", "/work/llama.cpp"), "bin", "llama-tokenize"))
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "tokenizer", "gpt4o-on-qwen2-vocab.json"))
    args = ap.parse_args()
    inp = open(os.path.join(args.vocab_dir, "ggml-vocab-qwen2.gguf.inp")).read()
    cases, rest = [], inp
    while rest:
        i = rest.find(SEP)
        cases.append(rest if i < 0 else rest[:i])
        rest = "" if i < 0 else rest[i + len(SEP):]
    cases += EXTRA
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        vocab = os.path.join(tmp, "vocab-gpt4o.gguf")
        rewrite_pre(os.path.join(args.vocab_dir, "ggml-vocab-qwen2.gguf"), vocab, "gpt-4o")
        for text in cases:
            path = os.path.join(tmp, "case.txt")
            with open(path, "w") as f:
                f.write(text)
            r = subprocess.run([args.llama_tokenize, "-m", vocab, "-f", path, "--ids", "--no-bos", "--no-parse-special", "--log-disable"],
                               check=True, capture_output=True, text=True)
            last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "[]"
            out.append({"text": text, "ids": json.loads(last)})
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"generator": "scripts/gpt4o_tokenizer_reference.py (llama-tokenize of scripts/llama-cpp-reference.sh)",
                   "vocab": "ggml-vocab-qwen2.gguf with tokenizer.ggml.pre = gpt-4o", "cases": out}, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"wrote {args.out}: {len(out)} cases")


if __name__ == "__main__":
    main()
