#!/usr/bin/env python3
"""Writes the quickstart's sample corpus (configs/sample_corpus) from the
held-out part of gather.py's output: text the model never trained on.

Records are taken in a fixed order (sha256 of their group) until each
domain's character budget is spent; the English documents, the chats and
the evaluation set come from different groups, so the corpus stage's
near-duplicate filter keeps them all.

Usage: make_sample.py DATA_DIR OUT_DIR TOKENIZER.json
"""

import argparse
import hashlib
import json
from pathlib import Path

from tokenizers import Tokenizer

DOC_CHARS = 1500  # characters kept of one document
BUDGET = {"english": 28000, "japanese": 9000, "code": 13000, "chat": 16000, "eval": 4000}


def order(recs):
    return sorted(recs, key=lambda r: (hashlib.sha256(r["group"].encode()).hexdigest(), r["source"]))


def cut(text, n=DOC_CHARS):
    """The beginning of `text`, ending at a line break where there is one."""
    if len(text) <= n:
        return text.strip()
    head = text[:n]
    i = head.rfind("\n")
    return (head[:i] if i > n // 2 else head).strip()


def load(data, domain):
    with open(data / f"{domain}.heldout.jsonl", encoding="utf-8") as f:
        return order(json.loads(line) for line in f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("out")
    ap.add_argument("tokenizer")
    args = ap.parse_args()
    data, out = Path(args.data), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_file(args.tokenizer)
    used_groups = set()
    tokens = {}

    def take(recs, budget, skip_used=True):
        got, spent = [], 0
        for r in recs:
            if spent >= budget:
                break
            if skip_used and r["group"] in used_groups:
                continue
            got.append(r)
            spent += len(cut(r["text"])) if "text" in r else sum(len(cut(m["content"])) for m in r["messages"])
        for r in got:
            used_groups.add(r["group"])
        return got

    english = take(load(data, "english"), BUDGET["english"])
    evals = take(load(data, "english"), BUDGET["eval"])
    chats = take(load(data, "chat"), BUDGET["chat"])
    code = take(load(data, "code"), BUDGET["code"], skip_used=False)
    japanese = take(load(data, "japanese"), BUDGET["japanese"], skip_used=False)

    def write_jsonl(name, rows):
        with open(out / name, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")

    write_jsonl("english.jsonl", [{"topic": r["group"], "source": r["source"], "text": cut(r["text"])}
                                  for r in english])
    # The evaluation set also holds the first English document less its last
    # line: the corpus stage's near-duplicate rule then drops that document
    # from the calibration data, as a run should show.
    first = cut(english[0]["text"])
    evals_out = [{"source": r["source"], "text": cut(r["text"])} for r in evals]
    evals_out.append({"source": english[0]["source"] + " (less its last line)",
                      "text": first[:first.rfind("\n")].strip()})
    write_jsonl("eval.jsonl", evals_out)
    write_jsonl("code.jsonl", [{"module": r["group"], "source": r["source"], "text": cut(r["text"])}
                               for r in code])
    write_jsonl("chat.jsonl", [{"task": r["group"], "source": r["source"],
                                "messages": [dict(m, content=cut(m["content"])) for m in r["messages"]]}
                               for r in chats])
    # Japanese: one manual page per paragraph (its own paragraphs joined by
    # line breaks), pages separated by a blank line.
    ja_docs = [cut(r["text"]).replace("\n\n", "\n") for r in japanese]
    (out / "japanese.txt").write_text("\n\n".join(ja_docs) + "\n", encoding="utf-8")

    def count(texts):
        return sum(len(e.ids) for e in tok.encode_batch(texts))

    def chat_text(r):
        return "".join(f"<|im_start|>{m['role']}\n{cut(m['content'])}<|im_end|>\n" for m in r["messages"])

    tokens["english"] = count([cut(r["text"]) for r in english])
    tokens["japanese"] = count(ja_docs)
    tokens["code"] = count([cut(r["text"]) for r in code])
    tokens["chat"] = count([chat_text(r) for r in chats])
    total = sum(tokens.values())
    print(json.dumps({d: {"records": n, "tokens": t, "share": round(t / total, 3)}
                      for (d, t), n in zip(tokens.items(),
                                           (len(english), len(ja_docs), len(code), len(chats)))},
                     indent=1))
    print("eval records:", len(evals))


if __name__ == "__main__":
    main()
