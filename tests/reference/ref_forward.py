#!/usr/bin/env python3
"""Independent reference forward pass for civetta's reference-logit tests.

Reads a GGUF file with gguf-py (PyPI `gguf`), dequantises with gguf-py's own block decoders,
and runs llama / qwen2 / qwen3 in float64 numpy, following llama.cpp's model definitions:
RMSNorm, RoPE (NORM pairs (2i, 2i+1) for llama, NEOX halves for qwen2/qwen3), q/k/v biases
(qwen2), per-head q/k RMSNorm (qwen3), causal GQA attention, SwiGLU, tied output.

--act-quant emulates what llama.cpp (and civetta) do before a quantised matmul: the
activation row is quantised to Q8_0 (blocks of 32) or Q8_K (blocks of 256) and back.

Usage:
  ref_forward.py MODEL --tokens 1,2,3 logits        -> {"logits": [[...] per position]}
  ref_forward.py MODEL --tokens 1,2,3 greedy -n 32  -> {"tokens": [...], "margins": [...]}
"""
import argparse
import json
import sys

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as Q
from gguf.quants import dequantize

Q8_0_TYPES = {Q.Q8_0, Q.Q4_0, Q.Q4_1}
Q8_K_TYPES = {Q.Q4_K, Q.Q5_K, Q.Q6_K}


def field(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    v = f.parts[f.data[0]]
    if f.types[0].name == "STRING":
        return bytes(v).decode()
    return v[0].item()


def f16_round(x):
    return x.astype(np.float16).astype(np.float64)


def act_quant(x, qtype):
    """Quantise rows of x like ggml's quantize_row_q8_0 / q8_K, then dequantise."""
    if qtype in Q8_0_TYPES:
        b = x.reshape(x.shape[0], -1, 32).astype(np.float32)
        amax = np.abs(b).max(-1, keepdims=True)
        d = amax / 127.0
        idv = np.where(d != 0, 1.0 / np.where(d == 0, 1, d), 0.0).astype(np.float32)
        q = np.round(b * idv)  # numpy rounds half to even; ties are measure-zero for real data
        return (q * f16_round(d)).reshape(x.shape)
    if qtype in Q8_K_TYPES:
        b = x.reshape(x.shape[0], -1, 256).astype(np.float32)
        idx = np.abs(b).argmax(-1)
        mx = np.take_along_axis(b, idx[..., None], -1)
        iscale = np.where(mx != 0, np.float32(-127.0) / np.where(mx == 0, 1, mx), 0).astype(np.float32)
        q = np.minimum(127, np.round(iscale * b))
        d = np.where(mx != 0, (1.0 / np.where(iscale == 0, 1, iscale)).astype(np.float32), 0)
        return (q * d).reshape(x.shape)
    return x


class Model:
    def __init__(self, path, emulate_act_quant):
        r = GGUFReader(path)
        self.arch = field(r, "general.architecture")
        a = self.arch
        self.n_head = field(r, f"{a}.attention.head_count")
        self.n_kv = field(r, f"{a}.attention.head_count_kv", self.n_head)
        self.dim = field(r, f"{a}.embedding_length")
        self.n_layer = field(r, f"{a}.block_count")
        self.head_dim = field(r, f"{a}.attention.key_length", self.dim // self.n_head)
        self.eps = field(r, f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
        self.base = field(r, f"{a}.rope.freq_base", 10000.0)
        self.rope_style = "norm" if a == "llama" else "neox"
        self.emulate = emulate_act_quant
        self.w = {}
        self.qtype = {}
        for t in r.tensors:
            self.w[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64).reshape([int(d) for d in reversed(t.shape)])
            self.qtype[t.name] = t.tensor_type

    def linear(self, x, name):
        if self.emulate:
            x = act_quant(x, self.qtype[name])
        y = x @ self.w[name].T
        return y

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):
        d = x.shape[-1]
        half = d // 2
        inv = self.base ** (-2.0 * np.arange(half) / d)
        ang = pos[:, None] * inv[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        out = np.empty_like(x)
        if self.rope_style == "norm":
            x0, x1 = x[..., 0::2], x[..., 1::2]
            out[..., 0::2] = x0 * cos - x1 * sin
            out[..., 1::2] = x0 * sin + x1 * cos
        else:
            x0, x1 = x[..., :half], x[..., half:]
            out[..., :half] = x0 * cos - x1 * sin
            out[..., half:] = x0 * sin + x1 * cos
        return out

    def forward(self, tokens):
        T = len(tokens)
        pos = np.arange(T, dtype=np.float64)
        emb = self.w["token_embd.weight"]
        x = emb[np.array(tokens)]
        H, KV, D = self.n_head, self.n_kv, self.head_dim
        mask = np.triu(np.full((T, T), -np.inf), 1)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            h = self.rmsnorm(x, self.w[p + "attn_norm.weight"])
            q, k, v = self.linear(h, p + "attn_q.weight"), self.linear(h, p + "attn_k.weight"), self.linear(h, p + "attn_v.weight")
            if p + "attn_q.bias" in self.w:
                q, k, v = q + self.w[p + "attn_q.bias"], k + self.w[p + "attn_k.bias"], v + self.w[p + "attn_v.bias"]
            q, k, v = q.reshape(T, H, D), k.reshape(T, KV, D), v.reshape(T, KV, D)
            if p + "attn_q_norm.weight" in self.w:
                q = self.rmsnorm(q, self.w[p + "attn_q_norm.weight"])
                k = self.rmsnorm(k, self.w[p + "attn_k_norm.weight"])
            q, k = self.rope(q, pos), self.rope(k, pos)
            group = H // KV
            out = np.empty((T, H, D))
            for hh in range(H):
                g = hh // group
                s = q[:, hh, :] @ k[:, g, :].T / np.sqrt(D) + mask
                s = np.exp(s - s.max(-1, keepdims=True))
                s /= s.sum(-1, keepdims=True)
                out[:, hh, :] = s @ v[:, g, :]
            x = x + self.linear(out.reshape(T, H * D), p + "attn_output.weight")
            h = self.rmsnorm(x, self.w[p + "ffn_norm.weight"])
            gte, up = self.linear(h, p + "ffn_gate.weight"), self.linear(h, p + "ffn_up.weight")
            x = x + self.linear(gte / (1 + np.exp(-gte)) * up, p + "ffn_down.weight")
        x = self.rmsnorm(x, self.w["output_norm.weight"])
        out_name = "output.weight" if "output.weight" in self.w else "token_embd.weight"
        return self.linear(x, out_name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--act-quant", action="store_true")
    ap.add_argument("mode", choices=["logits", "greedy"])
    ap.add_argument("-n", type=int, default=32)
    a = ap.parse_args()
    m = Model(a.model, a.act_quant)
    toks = [int(t) for t in a.tokens.split(",")]
    if a.mode == "logits":
        json.dump({"logits": m.forward(toks).tolist()}, sys.stdout)
        return
    gen, margins, scales = [], [], []
    for _ in range(a.n):
        last = m.forward(toks + gen)[-1]
        top2 = np.sort(last)[-2:]
        margins.append(float(top2[1] - top2[0]))
        scales.append(float(np.abs(last).max()))
        gen.append(int(np.argmax(last)))
    json.dump({"tokens": gen, "margins": margins, "scales": scales}, sys.stdout)


if __name__ == "__main__":
    main()
