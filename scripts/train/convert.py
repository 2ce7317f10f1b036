#!/usr/bin/env python3
"""Converts train.py's output to a qwen3moe GGUF that llama.cpp runs, with
gguf-py (llama.cpp's own GGUF library): the weights (F16 matrices, F32 norms
and router) and the tokenizer in llama.cpp's conventions (GPT-2 BPE tokens
and merges, pre-tokenizer "qwen2", ChatML special tokens as control tokens,
the chat template), then writes the expected token ids of a corpus's
documents as a fixture for the Rust tokenization test.

Usage: convert.py TRAIN_OUT MODEL.gguf [--fixture-corpus DIR --fixture OUT.json]
"""

import argparse
import json
from pathlib import Path

import gguf
import numpy as np
import torch
from tokenizers import Tokenizer

ARCH = "qwen3moe"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tokenizer_metadata(w, tok_json):
    model = tok_json["model"]
    vocab = model["vocab"]
    added = {t["content"]: t["id"] for t in tok_json["added_tokens"]}
    n = len(vocab) + len([a for a in added if a not in vocab])
    tokens = [None] * n
    for t, i in vocab.items():
        tokens[i] = t
    for t, i in added.items():
        tokens[i] = t
    assert all(t is not None for t in tokens), "token ids are not dense"
    types = [gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(added["<|endoftext|>"])
    w.add_eos_token_id(added["<|im_end|>"])
    w.add_pad_token_id(added["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    return n


# The model's hyperparameters: GGUFWriter.add_<key> of each training-config
# field, in the order the keys are written.
HPARAMS = {
    "context_length": "seq_len", "embedding_length": "hidden", "block_count": "n_layer",
    "feed_forward_length": "expert_ff", "head_count": "n_head", "head_count_kv": "n_kv_head",
    "key_length": "head_dim", "value_length": "head_dim", "layer_norm_rms_eps": "rms_eps",
    "rope_freq_base": "rope_base", "expert_count": "n_expert", "expert_used_count": "top_k",
    "expert_feed_forward_length": "expert_ff",
}

# Each layer's tensors in the order they are written: GGUF name, the state
# dict's key under `blocks.{i}.`, and whether it is stored as f16 (the
# norms and the router stay f32).
LAYER_TENSORS = [
    ("attn_norm.weight", "attn_norm.weight", False), ("attn_q.weight", "attn.q.weight", True),
    ("attn_k.weight", "attn.k.weight", True), ("attn_v.weight", "attn.v.weight", True),
    ("attn_output.weight", "attn.o.weight", True),
    ("attn_q_norm.weight", "attn.q_norm.weight", False),
    ("attn_k_norm.weight", "attn.k_norm.weight", False),
    ("ffn_norm.weight", "ffn_norm.weight", False), ("ffn_gate_inp.weight", "moe.gate.weight", False),
    ("ffn_gate_exps.weight", "moe.w_gate", True), ("ffn_up_exps.weight", "moe.w_up", True),
    ("ffn_down_exps.weight", "moe.w_down", True),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("train_out")
    ap.add_argument("gguf")
    ap.add_argument("--fixture-corpus")
    ap.add_argument("--fixture")
    args = ap.parse_args()
    src = Path(args.train_out)
    log = json.loads((src / "train_log.json").read_text())
    c = log["config"]
    sd = torch.load(src / "model.pt", map_location="cpu")
    tok_json = json.loads((src / "tokenizer.json").read_text())

    w = gguf.GGUFWriter(args.gguf, ARCH)
    w.add_name("moe-census quickstart MoE (trained)")
    # The licence itself (configs/models/quickstart-moe.md, "Use and limits"),
    # which a shipped card copies into its Hugging Face metadata.
    w.add_license("MIT OR Apache-2.0")
    for key, field in HPARAMS.items():
        getattr(w, "add_" + key)(c[field])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    n_vocab = tokenizer_metadata(w, tok_json)
    assert n_vocab == c["vocab_size"], (n_vocab, c["vocab_size"])

    def put(name, t, f16):
        a = t.detach().float().numpy()
        w.add_tensor(name, a.astype(np.float16) if f16 else a.astype(np.float32))

    put("token_embd.weight", sd["embed.weight"], True)
    put("output_norm.weight", sd["norm.weight"], False)
    for i in range(c["n_layer"]):
        p = f"blocks.{i}."
        b = f"blk.{i}."
        for name, key, f16 in LAYER_TENSORS:
            put(b + name, sd[p + key], f16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.gguf} ({Path(args.gguf).stat().st_size} bytes)")

    if args.fixture_corpus:
        write_fixture(Tokenizer.from_file(str(src / "tokenizer.json")),
                      Path(args.fixture_corpus), Path(args.fixture))


def write_fixture(tok, corpus, out):
    """The trained tokenizer's ids of every document of the sample corpus,
    keyed the way the Rust test reads them (file and record number)."""
    docs = {}
    for path in sorted(corpus.iterdir()):
        if path.suffix == ".jsonl":
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
                r = json.loads(line)
                if "messages" in r:
                    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
                                   for m in r["messages"])
                    docs[f"{path.name}:{i + 1}"] = {"chat": True, "ids": tok.encode(text).ids}
                else:
                    docs[f"{path.name}:{i + 1}"] = {"chat": False, "ids": tok.encode(r["text"]).ids}
        elif path.suffix == ".txt":
            parts = [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n")]
            for i, p in enumerate(q for q in parts if q):
                docs[f"{path.name}#{i + 1}"] = {"chat": False, "ids": tok.encode(p).ids}
    out.write_text(json.dumps(docs, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {out} ({len(docs)} documents)")


if __name__ == "__main__":
    main()
