#!/usr/bin/env python3
"""Independent reference forward pass for civetta's reference-logit tests (docs/REFERENCE.md).

Reads a GGUF file with gguf-py (PyPI `gguf`), dequantises every tensor with gguf-py's own
block decoders (gguf.quants.dequantize) and runs llama / qwen2 / qwen3 in float64 numpy,
written from llama.cpp's model definitions (src/models/llama.cpp, qwen2.cpp, qwen3.cpp), not
from civetta's code:

  x = token_embd[tokens]
  per layer:  h = rmsnorm(x) * attn_norm
              q, k, v = Wq h (+ bq), Wk h (+ bk), Wv h (+ bv)           biases: qwen2
              q, k = rmsnorm_per_head(q) * q_norm, ... * k_norm            qwen3 only
              q, k = rope(q), rope(k)      llama: NORM pairs (2i, 2i+1); qwen: NEOX (i, i+D/2)
              x += Wo softmax(q k^T / sqrt(D) + causal) v                  GQA: head h -> kv h/(H/KV)
              h = rmsnorm(x) * ffn_norm;  x += Wdown (silu(Wgate h) * Wup h)
  logits = (output or token_embd) rmsnorm(x) * output_norm

--act-quant emulates what ggml's CPU backend (and civetta) do before a matmul with quantised
weights: the activation row is quantised to Q8_0 (blocks of 32, for Q8_0/Q4_0/Q4_1 weights)
or Q8_K (blocks of 256, for K-quant weights) and the integer block products are scaled back.
Float weights (F32/F16/BF16) keep exact activations.

Usage (JSON on stdout):
  ref_forward.py MODEL --tokens 1,2,3 logits        -> {"logits": [[...vocab] per position]}
  ref_forward.py MODEL --tokens 1,2,3 greedy -n 32  -> {"tokens": [...], "runner_up": [...],
                                                        "margins": [...], "rel_margins": [...]}
  margin = top-1 minus top-2 (runner-up) logit; rel_margin = margin / max |logit| of that step.
"""
import argparse
import json
import sys

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as Q
from gguf.quants import dequantize

Q8_0_ACT = {Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1}
Q8_K_ACT = {Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K}


def scalar(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.parts[f.data[0]]
    if f.types[0].name == "STRING":
        return bytes(v).decode()
    return v[0].item()


def quantize_act_q8_0(x):
    """ggml quantize_row_q8_0: per 32 values d = amax/127 (stored as f16), q = round(x/d)."""
    b = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    d = np.abs(b).max(-1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = np.round(b * inv)  # half-to-even like ggml's SIMD paths; exact ties do not occur in practice
    return (q * d.astype(np.float16).astype(np.float64)).reshape(x.shape)


def quantize_act_q8_k(x):
    """ggml quantize_row_q8_K_ref: per 256 values iscale = -127/max (max = the value with the
    largest magnitude, sign kept), q = min(127, round(iscale x)), d = 1/iscale (f32)."""
    b = x.reshape(x.shape[0], -1, 256).astype(np.float32)
    mx = np.take_along_axis(b, np.abs(b).argmax(-1)[..., None], -1)
    iscale = np.divide(np.float32(-127), mx, out=np.zeros_like(mx), where=mx != 0)
    q = np.minimum(127, np.round(iscale * b))
    d = np.divide(np.float32(1), iscale, out=np.zeros_like(iscale), where=iscale != 0)
    return (q * d).reshape(x.shape)


def act_quant(x, weight_type):
    if weight_type in Q8_0_ACT:
        return quantize_act_q8_0(x)
    if weight_type in Q8_K_ACT:
        return quantize_act_q8_k(x)
    return x


class Model:
    def __init__(self, path, emulate_act_quant=False):
        r = GGUFReader(path)
        a = self.arch = scalar(r, "general.architecture")
        if a not in ("llama", "qwen2", "qwen3"):
            sys.exit(f"{path}: unsupported architecture {a!r}")
        self.n_head = scalar(r, f"{a}.attention.head_count")
        self.n_kv = scalar(r, f"{a}.attention.head_count_kv", self.n_head)
        self.dim = scalar(r, f"{a}.embedding_length")
        self.n_layer = scalar(r, f"{a}.block_count")
        self.head_dim = scalar(r, f"{a}.attention.key_length", self.dim // self.n_head)
        self.eps = scalar(r, f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
        self.base = scalar(r, f"{a}.rope.freq_base", 10000.0)
        self.neox = a != "llama"  # llama.cpp: LLAMA_ROPE_TYPE_NORM for llama, NEOX for qwen2/qwen3
        self.emulate = emulate_act_quant
        self.w, self.wtype = {}, {}
        for t in r.tensors:
            shape = [int(n) for n in reversed(t.shape)]  # ggml dims are [row length, rows]
            self.w[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
            self.wtype[t.name] = t.tensor_type
        self.out_name = "output.weight" if "output.weight" in self.w else "token_embd.weight"
        self.n_vocab = self.w["token_embd.weight"].shape[0]

    def linear(self, x, name):
        if self.emulate:
            x = act_quant(x, self.wtype[name])
        return x @ self.w[name].T

    def rmsnorm(self, x, weight):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + self.eps) * weight

    def rope(self, x, pos):
        """x: (T, heads, D); rotates pairs by pos * base^(-2i/D)."""
        D = x.shape[-1]
        ang = pos[:, None] * self.base ** (-2.0 * np.arange(D // 2) / D)[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        if self.neox:
            x0, x1 = x[..., : D // 2], x[..., D // 2 :]
        else:
            x0, x1 = x[..., 0::2], x[..., 1::2]
        r0, r1 = x0 * cos - x1 * sin, x0 * sin + x1 * cos
        out = np.empty_like(x)
        if self.neox:
            out[..., : D // 2], out[..., D // 2 :] = r0, r1
        else:
            out[..., 0::2], out[..., 1::2] = r0, r1
        return out

    def forward(self, tokens, cache):
        """Logits for `tokens`, which follow the len(cache[0][0]) tokens already in `cache`
        (a list of per-layer [K, V], extended in place)."""
        T, H, KV, D = len(tokens), self.n_head, self.n_kv, self.head_dim
        past = len(cache[0][0]) if cache else 0
        pos = np.arange(past, past + T, dtype=np.float64)
        causal = np.where(np.arange(past + T)[None, :] > pos[:, None], -np.inf, 0.0)
        x = self.w["token_embd.weight"][np.array(tokens)]
        for i in range(self.n_layer):
            p = f"blk.{i}."
            h = self.rmsnorm(x, self.w[p + "attn_norm.weight"])
            q, k, v = (self.linear(h, p + f"attn_{n}.weight") for n in "qkv")
            if p + "attn_q.bias" in self.w:
                q, k, v = q + self.w[p + "attn_q.bias"], k + self.w[p + "attn_k.bias"], v + self.w[p + "attn_v.bias"]
            q, k, v = q.reshape(T, H, D), k.reshape(T, KV, D), v.reshape(T, KV, D)
            if p + "attn_q_norm.weight" in self.w:
                q = self.rmsnorm(q, self.w[p + "attn_q_norm.weight"])
                k = self.rmsnorm(k, self.w[p + "attn_k_norm.weight"])
            q, k = self.rope(q, pos), self.rope(k, pos)
            if len(cache) <= i:
                cache.append([np.zeros((0, KV, D)), np.zeros((0, KV, D))])
            cache[i][0] = K = np.concatenate([cache[i][0], k])
            cache[i][1] = V = np.concatenate([cache[i][1], v])
            K, V = np.repeat(K, H // KV, axis=1), np.repeat(V, H // KV, axis=1)  # query head h reads kv head h // (H/KV)
            s = np.einsum("thd,shd->hts", q, K) / np.sqrt(D) + causal
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            attn = np.einsum("hts,shd->thd", s, V).reshape(T, H * D)
            x = x + self.linear(attn, p + "attn_output.weight")
            h = self.rmsnorm(x, self.w[p + "ffn_norm.weight"])
            gate, up = self.linear(h, p + "ffn_gate.weight"), self.linear(h, p + "ffn_up.weight")
            x = x + self.linear(gate / (1.0 + np.exp(-gate)) * up, p + "ffn_down.weight")
        return self.linear(self.rmsnorm(x, self.w["output_norm.weight"]), self.out_name)

    def greedy(self, prompt, steps):
        """Greedy continuation: tokens, runner-up tokens and each step's top-1/top-2 margin
        (absolute and relative to max |logit|)."""
        cache, out, second, margins, rel = [], [], [], [], []
        logits = self.forward(prompt, cache)[-1]
        for _ in range(steps):
            i2, i1 = np.argsort(logits)[-2:]
            margins.append(float(logits[i1] - logits[i2]))
            rel.append(margins[-1] / float(np.abs(logits).max()))
            out.append(int(i1))
            second.append(int(i2))
            logits = self.forward([out[-1]], cache)[-1]
        return out, second, margins, rel


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True, help="comma-separated prompt token ids")
    ap.add_argument("--act-quant", action="store_true", help="quantise activations like ggml before quantised matmuls")
    ap.add_argument("mode", choices=["logits", "greedy"])
    ap.add_argument("-n", type=int, default=32, help="greedy steps")
    a = ap.parse_args()
    m = Model(a.model, a.act_quant)
    toks = [int(t) for t in a.tokens.split(",") if t.strip()]
    if not toks or not all(0 <= t < m.n_vocab for t in toks):
        sys.exit(f"--tokens must be non-empty ids below the vocabulary size {m.n_vocab}")
    if a.mode == "logits":
        json.dump({"logits": m.forward(toks, []).tolist()}, sys.stdout)
    else:
        tokens, second, margins, rel = m.greedy(toks, a.n)
        json.dump({"tokens": tokens, "runner_up": second, "margins": margins, "rel_margins": rel}, sys.stdout)


if __name__ == "__main__":
    main()
