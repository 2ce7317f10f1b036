#!/usr/bin/env python3
"""Trains the quickstart model: a small qwen3moe-shaped MoE language model
and its byte-level BPE tokenizer, on the text gather.py wrote.

CPU only and deterministic given --seed (fixed thread count, seeded torch
and batch order). Writes OUT/tokenizer.json, OUT/model.pt (state dict with
the tensor names of convert.py) and OUT/train_log.json (config, loss curve,
held-out perplexity per domain).

Usage: train.py DATA_DIR OUT_DIR [--steps N] [--seed S] [--threads T]
"""

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

DOMAINS = ("english", "japanese", "code", "chat")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's pre-tokenizer split, which llama.cpp applies for tokenizer.ggml.pre = "qwen2".
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CONFIG = dict(
    vocab_size=8192, hidden=128, n_layer=4, n_head=4, n_kv_head=2, head_dim=32,
    n_expert=32, top_k=4, expert_ff=96, rope_base=10000.0, rms_eps=1e-6,
    seq_len=256, batch=4, lr=2.5e-3, warmup=40, weight_decay=0.05,
    aux_coef=0.01,
)


def render_chat(messages):
    """ChatML, as llama.cpp's llama_chat_apply_template renders the GGUF's template."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def doc_text(domain, rec):
    return render_chat(rec["messages"]) if domain == "chat" else rec["text"]


def read_docs(data, domain, part):
    with open(data / f"{domain}.{part}.jsonl", encoding="utf-8") as f:
        return [doc_text(domain, json.loads(line)) for line in f]


def train_tokenizer(data, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIALS), special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    # 1.5 MB of each domain's training text is plenty for an 8k vocabulary.
    texts = []
    for d in DOMAINS:
        budget = 1_500_000
        for t in read_docs(data, d, "train"):
            if budget <= 0:
                break
            texts.append(t)
            budget -= len(t)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens(SPECIALS)
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    return tok


def token_stream(tok, docs):
    eot = tok.token_to_id("<|endoftext|>")
    ids = []
    for enc in tok.encode_batch(docs):
        ids.extend(enc.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.long)


# --- the model: qwen3moe's tensors -----------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, cos, sin):
    # NEOX style (rotate halves), as llama.cpp's qwen3moe uses.
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        hd = c["head_dim"]
        self.q = nn.Linear(c["hidden"], c["n_head"] * hd, bias=False)
        self.k = nn.Linear(c["hidden"], c["n_kv_head"] * hd, bias=False)
        self.v = nn.Linear(c["hidden"], c["n_kv_head"] * hd, bias=False)
        self.o = nn.Linear(c["n_head"] * hd, c["hidden"], bias=False)
        self.q_norm = RMSNorm(hd, c["rms_eps"])
        self.k_norm = RMSNorm(hd, c["rms_eps"])

    def forward(self, x, cos, sin):
        c = self.c
        b, t, _ = x.shape
        hd = c["head_dim"]
        q = self.q_norm(self.q(x).view(b, t, c["n_head"], hd)).transpose(1, 2)
        k = self.k_norm(self.k(x).view(b, t, c["n_kv_head"], hd)).transpose(1, 2)
        v = self.v(x).view(b, t, c["n_kv_head"], hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        rep = c["n_head"] // c["n_kv_head"]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class MoE(nn.Module):
    """Softmax router over all experts, top-k, weights renormalised (llama.cpp's
    qwen3moe: norm_w = true), SwiGLU experts."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        e, h, f = c["n_expert"], c["hidden"], c["expert_ff"]
        self.gate = nn.Linear(h, e, bias=False)
        self.w_gate = nn.Parameter(torch.randn(e, f, h) * h ** -0.5)
        self.w_up = nn.Parameter(torch.randn(e, f, h) * h ** -0.5)
        self.w_down = nn.Parameter(torch.randn(e, h, f) * f ** -0.5 / math.sqrt(2 * c["n_layer"]))

    def forward(self, x):
        c = self.c
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        n = x.shape[0]
        probs = F.softmax(self.gate(x), dim=-1)
        w, idx = probs.topk(c["top_k"], dim=-1)
        w = w / w.sum(-1, keepdim=True)
        # Switch-style load-balancing loss: E * sum_e (fraction routed to e) * (mean prob of e).
        counts = torch.zeros(c["n_expert"]).index_add_(
            0, idx.reshape(-1), torch.ones(idx.numel()))
        aux = c["n_expert"] * (counts / idx.numel() * probs.mean(0)).sum()
        out = torch.zeros_like(x)
        flat = idx.reshape(-1)
        order = flat.argsort(stable=True)
        tok_of = order // c["top_k"]
        bounds = torch.cumsum(counts.long(), 0).tolist()
        # unbind once: indexing a parameter per expert would give each index a
        # full-size zero gradient to fill and add in the backward pass.
        wg, wu, wd = self.w_gate.unbind(0), self.w_up.unbind(0), self.w_down.unbind(0)
        start = 0
        for e, end in enumerate(bounds):
            if end > start:
                sel = order[start:end]
                t = tok_of[start:end]
                xe = x[t]
                he = F.silu(xe @ wg[e].t()) * (xe @ wu[e].t())
                ye = (he @ wd[e].t()) * w.reshape(-1)[sel].unsqueeze(1)
                out.index_add_(0, t, ye)
            start = end
        return out.reshape(shape), aux, counts


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attn_norm = RMSNorm(c["hidden"], c["rms_eps"])
        self.attn = Attention(c)
        self.ffn_norm = RMSNorm(c["hidden"], c["rms_eps"])
        self.moe = MoE(c)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        y, aux, counts = self.moe(self.ffn_norm(x))
        return x + y, aux, counts


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c["vocab_size"], c["hidden"])
        nn.init.normal_(self.embed.weight, std=0.02)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.norm = RMSNorm(c["hidden"], c["rms_eps"])
        hd = c["head_dim"]
        inv = 1.0 / (c["rope_base"] ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.outer(torch.arange(c["seq_len"]).float(), inv)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.embed(ids)
        cos, sin = self.cos[:t], self.sin[:t]
        aux_total, all_counts = 0.0, []
        for blk in self.blocks:
            x, aux, counts = blk(x, cos, sin)
            aux_total = aux_total + aux
            all_counts.append(counts)
        logits = self.norm(x) @ self.embed.weight.t()  # tied output
        return logits, aux_total / len(self.blocks), torch.stack(all_counts)


def batch_at(streams, gen, c):
    """Two rows per domain, at seeded random offsets of its training stream."""
    rows = []
    per = c["batch"] // len(DOMAINS)
    for d in DOMAINS:
        s = streams[d]
        for _ in range(per):
            o = int(torch.randint(0, len(s) - c["seq_len"] - 1, (1,), generator=gen))
            rows.append(s[o:o + c["seq_len"] + 1])
    b = torch.stack(rows)
    return b[:, :-1], b[:, 1:]


@torch.no_grad()
def heldout_ppl(model, streams, c, windows):
    model.eval()
    out = {}
    for d in DOMAINS:
        s = streams[d]
        n = min(windows, (len(s) - 1) // c["seq_len"])
        nll, cnt = 0.0, 0
        for i in range(0, n, 4):
            xs, ys = [], []
            for j in range(i, min(n, i + 4)):
                w = s[j * c["seq_len"]:(j + 1) * c["seq_len"] + 1]
                xs.append(w[:-1])
                ys.append(w[1:])
            x, y = torch.stack(xs), torch.stack(ys)
            logits, _, _ = model(x)
            nll += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                   reduction="sum").item()
            cnt += y.numel()
        out[d] = {"ppl": math.exp(nll / cnt), "tokens": cnt}
    model.train()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-windows", type=int, default=24)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    c = dict(CONFIG)
    data, out = Path(args.data), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    tok = train_tokenizer(data, c["vocab_size"])
    tok.save(str(out / "tokenizer.json"))
    train = {d: token_stream(tok, read_docs(data, d, "train")) for d in DOMAINS}
    held = {d: token_stream(tok, read_docs(data, d, "heldout")) for d in DOMAINS}
    print(f"tokenizer and streams in {time.time() - t0:.0f} s: "
          + ", ".join(f"{d} {len(train[d])}/{len(held[d])}" for d in DOMAINS), flush=True)

    model = Model(c)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params} parameters", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": c["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=c["lr"], betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed)
    log = []
    t1 = time.time()
    for step in range(args.steps):
        lr = c["lr"] * min(1.0, (step + 1) / c["warmup"])
        if step >= c["warmup"]:
            p = (step - c["warmup"]) / max(1, args.steps - c["warmup"])
            lr = c["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batch_at(train, gen, c)
        logits, aux, counts = model(x)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss = ce + c["aux_coef"] * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or step == args.steps - 1:
            frac = counts / counts.sum(1, keepdim=True)
            rec = {"step": step, "ce": round(ce.item(), 4), "aux": round(aux.item(), 4),
                   "lr": lr, "max_expert_share": round(frac.max().item(), 4),
                   "s": round(time.time() - t1, 1)}
            log.append(rec)
            print(json.dumps(rec), flush=True)
    train_s = time.time() - t1
    ppl = heldout_ppl(model, held, c, args.eval_windows)
    print("held-out:", json.dumps(ppl), flush=True)
    torch.save(model.state_dict(), out / "model.pt")
    (out / "train_log.json").write_text(json.dumps({
        "config": c, "seed": args.seed, "steps": args.steps, "threads": args.threads,
        "parameters": n_params, "training_tokens": args.steps * c["batch"] * c["seq_len"],
        "train_seconds": round(train_s), "final_train_ce": log[-1]["ce"],
        "heldout": ppl, "stream_tokens": {d: {"train": len(train[d]), "heldout": len(held[d])}
                                          for d in DOMAINS},
        "log": log}, indent=1) + "\n")


if __name__ == "__main__":
    main()
