#!/usr/bin/env python3
"""Writes tests/fixtures/chat/gpt-oss-harmony.json: gpt-oss's chat template (the harmony format,
as the real gpt-oss-20b/120b GGUFs carry it in tokenizer.chat_template; this copy is llama.cpp's
models/templates/openai-gpt-oss-120b.jinja) and what it renders for a few conversations with
jinja2 set up as HF transformers' apply_chat_template sets it up (sandboxed environment,
trim_blocks, lstrip_blocks, loopcontrols, raise_exception, strftime_now, a json.dumps tojson).

strftime_now returns the fixed date 2000-01-01 here; src/tokenizer/tests.rs substitutes its
own date. Needs jinja2 (pip install jinja2) only to regenerate the fixture.

usage: harmony_template_reference.py [--template PATH] [--out PATH]
"""
import argparse
import json
import os

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_DATE = "2000-01-01"
CASES = [
    {"messages": [{"role": "user", "content": "What is 2+2?"}], "add_generation_prompt": True},
    {
        "messages": [
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Bonjour"},
            {"role": "user", "content": "Thanks"},
        ],
        "add_generation_prompt": True,
    },
    {
        "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "add_generation_prompt": False,
    },
]


def render(template, case):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: FIXED_DATE
    # The GGUF's bos/eos (<|startoftext|>, <|return|>); the template does not use them.
    return env.from_string(template).render(
        messages=case["messages"], add_generation_prompt=case["add_generation_prompt"], bos_token="<|startoftext|>", eos_token="<|return|>"
    )


def main():
    llama = os.environ.get("LLAMA_CPP_DIR", "/work/llama.cpp")
    ap = argparse.ArgumentParser()
    ap.add_argument("--template", default=os.path.join(llama, "src", "models", "templates", "openai-gpt-oss-120b.jinja"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "chat", "gpt-oss-harmony.json"))
    args = ap.parse_args()
    template = open(args.template).read()
    out = {
        "generator": f"scripts/harmony_template_reference.py (jinja2 {jinja2.__version__}, HF transformers' environment)",
        "template_source": "llama.cpp models/templates/openai-gpt-oss-120b.jinja (the tokenizer.chat_template of openai/gpt-oss-120b)",
        "fixed_date": FIXED_DATE,
        "template": template,
        "cases": [dict(case, expected=render(template, case)) for case in CASES],
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    for c in out["cases"]:
        print(repr(c["expected"][:400]))


if __name__ == "__main__":
    main()
