#!/usr/bin/env python3
"""Gathers the training text of the quickstart model from files on a Debian
machine, records each source with its licence, and splits it into a training
part and a held-out part (from which the sample corpus is drawn).

Domains (one JSONL file each, records {"group", "source", "text"} or, for
chat, {"group", "source", "messages"}):
  english  - English manual pages (Debian `manpages`, the Linux man-pages
             project) and the docstrings of Python's standard library
  japanese - Japanese manual pages (Debian `manpages-ja`, JM project)
  code     - Python standard library sources and the Rust sources of the
             crates listed in scripts/train/data_manifest.json (those the
             workspace's Cargo.lock pinned when the model was trained), read
             from the cargo registry: its unpacked sources, else the .crate
             archive `cargo fetch` downloads; a crate in neither is an error
  chat     - conversations built from the same real text: a templated
             question about a command, function or crate, answered with the
             page's or docstring's own text (English and Japanese)

The held-out split is by group (a manual page name, a Python module, a
crate): sha256("heldout:" + group) mod 10 == 0, so a page's English and
Japanese text and the chats about it land on the same side.

Usage: gather.py OUT_DIR [--crates MANIFEST]
Writes OUT_DIR/{english,japanese,code,chat}.{train,heldout}.jsonl and
OUT_DIR/manifest.json (sources, licences, package versions, counts, hashes).
"""

import argparse
import ast
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path, PurePosixPath

MAX_DOC = 6000  # characters kept of one document (its beginning)
HELDOUT_MOD = 10


def heldout(group):
    h = hashlib.sha256(("heldout:" + group).encode()).digest()
    return int.from_bytes(h[:8], "big") % HELDOUT_MOD == 0


def deb_version(pkg):
    try:
        return subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", pkg],
            capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return None


def deb_files(pkg):
    out = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    return sorted(p for p in out if p.endswith(".gz") and "/man/" in p
                  and os.path.isfile(p))


# --- roff to plain text --------------------------------------------------

ESCAPES = [
    (r"\(em", "—"), (r"\(en", "–"), (r"\(aq", "'"), (r"\(dq", '"'),
    (r"\(lq", "“"), (r"\(rq", "”"), (r"\(oq", "‘"), (r"\(cq", "’"),
    (r"\(bu", "•"), (r"\(co", "©"), (r"\(rg", "®"), (r"\(mu", "×"),
    (r"\(>=", "≥"), (r"\(<=", "≤"), (r"\(ti", "~"), (r"\(ha", "^"),
    (r"\(ga", "`"), (r"\(rs", "\\"), (r"\(hy", "-"), (r"\(at", "@"),
    (r"\*(lq", "“"), (r"\*(rq", "”"), (r"\*(Tm", "™"), (r"\*R", "®"),
    (r"\-", "-"), (r"\e", "\\"), (r"\ ", " "), (r"\~", " "), (r"\0", " "),
    (r"\&", ""), (r"\,", ""), (r"\/", ""), (r"\%", ""), (r"\:", ""),
    (r"\|", ""), (r"\^", ""), (r"\c", ""), (r"\)", ""),
]
FONT = re.compile(r"\\f(\(..|\[[^\]]*\]|.)")
OTHER = re.compile(r"\\(\(..|\[[^\]]*\]|\*\(..|\*.|s[-+]?\d|[a-zA-Z](?:'[^']*')?)")
MACRO_TEXT = {"B", "I", "BR", "BI", "IB", "IR", "RB", "RI", "SM", "SB", "UR",
              "MT", "OP"}
BREAK = {"PP", "LP", "P", "TP", "IP", "HP", "sp", "br", "SH", "SS", "TQ",
         "EX", "EE", "nf", "fi", "RS", "RE", "in", "Bl", "El", "It", "Pp"}


def unescape(s):
    s = FONT.sub("", s)
    for a, b in ESCAPES:
        s = s.replace(a, b)
    return OTHER.sub("", s)


def macro_args(rest):
    args = re.findall(r'"([^"]*)"|(\S+)', rest)
    return [a or b for a, b in args]


def roff_text(src):
    """The running text of a man page: headings, paragraphs, no macros."""
    paras, cur = [], []

    def flush():
        if cur:
            paras.append(" ".join(cur).strip())
            cur.clear()

    for line in src.split("\n"):
        if line.startswith(('.\\"', "'\\\"", '\\"')) or line in (".", "'"):
            continue
        if line.startswith((".", "'")):
            m = re.match(r"[.'](\S+)\s*(.*)", line)
            if not m:
                continue
            name, rest = m.group(1), m.group(2)
            if name in ("SH", "SS"):
                flush()
                if rest:
                    paras.append(unescape(" ".join(macro_args(rest))))
                continue
            if name in BREAK:
                flush()
                if name == "IP" and rest:
                    a = macro_args(rest)
                    if a and a[0] not in ("\\(bu", "*", "-"):
                        cur.append(unescape(a[0]))
                continue
            if name in MACRO_TEXT:
                a = macro_args(rest)
                sep = "" if len(name) == 2 and name not in ("SM", "SB", "UR", "MT", "OP") else " "
                cur.append(unescape(sep.join(a)))
            continue
        t = unescape(line).strip()
        if t:
            cur.append(t)
    flush()
    return "\n\n".join(p for p in paras if p)


def man_name(path):
    base = os.path.basename(path)[:-3]  # drop .gz
    return base.rsplit(".", 1)[0]


def man_summary(text):
    """(one-line NAME description, first DESCRIPTION paragraph)."""
    paras = text.split("\n\n")
    line, desc = None, None
    for i, p in enumerate(paras):
        if p in ("NAME", "名前") and i + 1 < len(paras):
            line = paras[i + 1]
        if p in ("DESCRIPTION", "説明") and i + 1 < len(paras) and desc is None:
            desc = paras[i + 1]
    return line, desc


def read_man(path):
    with gzip.open(path, "rb") as f:
        raw = f.read().decode("utf-8", "replace")
    if raw.lstrip().startswith(".so "):
        return None  # a link to another page
    return roff_text(raw)


# --- sources ---------------------------------------------------------------

def python_stdlib():
    d = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in d.glob("*.py"))
    for sub in ("json", "email", "http", "urllib", "xml/dom", "xml/etree",
                "concurrent/futures", "asyncio", "importlib", "logging",
                "multiprocessing", "sqlite3", "unittest", "wsgiref", "html",
                "collections", "dbm", "ctypes", "curses", "zoneinfo", "tomllib"):
        files += sorted((d / sub).glob("*.py"))
    return d, files


def docstrings(path):
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except Exception:
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                             ast.AsyncFunctionDef)):
            ds = ast.get_docstring(node)
            if ds and len(ds) >= 120:
                name = getattr(node, "name", None)
                out.append((name, ds))
    return out


def pinned_crates(manifest):
    """(name, version) of each crate the manifest of the committed model
    lists ("name-version (licence)"), in its order."""
    listed = []
    for src in json.loads(Path(manifest).read_text())["sources"]:
        for entry in src.get("crates", []):
            m = re.match(r"^(.+?)-(\d+\.\d+\.\d+\S*) \(", entry)
            if m is None:
                sys.exit(f"gather: {manifest}: crate entry {entry!r} is not 'name-version (licence)'")
            listed.append((m.group(1), m.group(2)))
    return listed


class CrateFiles:
    """The files of one crate version from the cargo registry: its unpacked
    sources when cargo unpacked them, else its .crate archive (what `cargo
    fetch` downloads), read the same way."""

    def __init__(self, name, version):
        home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
        self.dir, self.archive = None, None
        for reg in sorted((home / "registry" / "src").glob("*")):
            if (reg / f"{name}-{version}").is_dir():
                self.dir = reg / f"{name}-{version}"
                return
        for reg in sorted((home / "registry" / "cache").glob("*")):
            if (reg / f"{name}-{version}.crate").is_file():
                self.archive = tarfile.open(reg / f"{name}-{version}.crate", "r:gz")
                self.prefix = f"{name}-{version}/"
                return
        sys.exit(f"gather: crate {name}-{version} is in neither the cargo registry's "
                 f"sources nor its cache; run `cargo fetch` in the repository")

    def read(self, rel):
        """Text of the file at `rel` (a PurePosixPath), or None."""
        if self.dir is not None:
            f = self.dir / rel
            return f.read_text(encoding="utf-8", errors="replace") if f.is_file() else None
        try:
            member = self.archive.getmember(self.prefix + str(rel))
        except KeyError:
            return None
        data = self.archive.extractfile(member) if member.isfile() else None
        return data.read().decode("utf-8", errors="replace") if data else None

    def rust_sources(self):
        """Paths under src/ ending in .rs, relative, in pathlib's order."""
        if self.dir is not None:
            src = self.dir / "src"
            if not src.is_dir():
                return []
            return [PurePosixPath(f.relative_to(self.dir).as_posix()) for f in sorted(src.rglob("*.rs"))]
        names = [PurePosixPath(m.name[len(self.prefix):]) for m in self.archive.getmembers()
                 if m.isfile() and m.name.startswith(self.prefix + "src/") and m.name.endswith(".rs")]
        return sorted(names)


def crate_licence(files):
    m = re.search(r'^license\s*=\s*"([^"]+)"', files.read(PurePosixPath("Cargo.toml")) or "", re.M)
    return m.group(1) if m else "see crate"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--crates", default=str(Path(__file__).resolve().parent / "data_manifest.json"),
                    help="the manifest whose crate list is gathered (default: the committed model's)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    docs = {d: [] for d in ("english", "japanese", "code", "chat")}
    sources = []

    # English manual pages (man-pages project) and Japanese ones (JM project).
    en_pages, ja_pages = {}, {}
    for pkg, store in (("manpages", en_pages), ("manpages-dev", en_pages),
                       ("manpages-ja", ja_pages)):
        ver = deb_version(pkg)
        if ver is None:
            sys.exit(f"gather: Debian package {pkg} is not installed "
                     f"(apt-get install {pkg})")
        n = 0
        for p in deb_files(pkg):
            t = read_man(p)
            if not t or len(t) < 200:
                continue
            store[os.path.basename(p)[:-3]] = (p, t)
            n += 1
        sources.append({"source": f"debian:{pkg}={ver}", "pages": n,
                        "licence": "per page (see /usr/share/doc/%s/copyright): "
                        "Linux man-pages verbatim/GPL-style notices" % pkg
                        if pkg != "manpages-ja" else
                        "per page, JM project translations of the same "
                        "licences (see /usr/share/doc/manpages-ja/copyright)"})
    for key, (p, t) in sorted(en_pages.items()):
        docs["english"].append({"group": "man:" + man_name(p), "source": p,
                                "text": t[:MAX_DOC]})
    for key, (p, t) in sorted(ja_pages.items()):
        docs["japanese"].append({"group": "man:" + man_name(p), "source": p,
                                 "text": t[:MAX_DOC]})

    # Python standard library: docstrings (English) and sources (code).
    stdlib, files = python_stdlib()
    pyver = sys.version.split()[0]
    for f in files:
        rel = str(f.relative_to(stdlib))
        mod = rel[:-3].replace("/", ".")
        ds = docstrings(f)
        if ds:
            text = "\n\n".join(d for _, d in ds)
            docs["english"].append({"group": "py:" + mod, "source": f"python{pyver}:{rel} (docstrings)",
                                    "text": text[:MAX_DOC]})
        src = f.read_text(encoding="utf-8", errors="replace")
        if len(src) > 300:
            docs["code"].append({"group": "py:" + mod, "source": f"python{pyver}:{rel}",
                                 "text": src[:MAX_DOC]})
        for name, d in ds[:4]:
            if name is None:
                continue
            para = d.split("\n\n")[0].strip()
            if len(para) < 60:
                continue
            docs["chat"].append({"group": "py:" + mod, "source": f"python{pyver}:{rel}",
                                 "messages": [
                                     {"role": "system", "content": "You are a helpful assistant for Python programmers."},
                                     {"role": "user", "content": f"What does `{name}` in the Python module `{mod}` do?"},
                                     {"role": "assistant", "content": para}]})
    sources.append({"source": f"python {pyver} standard library ({stdlib})",
                    "files": len(files), "licence": "PSF-2.0"})

    # Rust sources of the crates the committed model was trained on (the
    # list is pinned: the workspace's Cargo.lock moves on, and cargo unpacks
    # only the crates a build needed).
    used = []
    for name, version in pinned_crates(args.crates):
        files = CrateFiles(name, version)
        lic = crate_licence(files)
        for rel in files.rust_sources()[:6]:
            src = files.read(rel)
            if src is not None and len(src) > 300:
                docs["code"].append({"group": f"crate:{name}", "source": f"crate:{name}-{version}/{rel}",
                                     "text": src[:MAX_DOC]})
        t = files.read(PurePosixPath("README.md"))
        if t is not None and len(t) > 300:
            docs["english"].append({"group": f"crate:{name}", "source": f"crate:{name}-{version}/README.md",
                                    "text": t[:MAX_DOC]})
        used.append(f"{name}-{version} ({lic})")
    sources.append({"source": "crates pinned by Cargo.lock (cargo registry)",
                    "crates": used, "licence": "each crate's own (listed)"})

    # Chats about manual pages, in English and Japanese.
    for store, lang in ((en_pages, "en"), (ja_pages, "ja")):
        for key, (p, t) in sorted(store.items()):
            line, desc = man_summary(t)
            if not line or not desc or len(desc) < 40:
                continue
            name = man_name(p)
            if lang == "en":
                msgs = [{"role": "system", "content": "You are a helpful assistant for Linux users."},
                        {"role": "user", "content": f"What is {name}?"},
                        {"role": "assistant", "content": f"{line}\n\n{desc}"}]
            else:
                msgs = [{"role": "system", "content": "あなたは Linux の使い方を教える親切なアシスタントです。"},
                        {"role": "user", "content": f"{name} とは何ですか？"},
                        {"role": "assistant", "content": f"{line}\n\n{desc}"}]
            docs["chat"].append({"group": "man:" + name, "source": p, "messages": msgs})

    manifest = {"heldout_rule": "sha256('heldout:' + group) mod %d == 0" % HELDOUT_MOD,
                "max_doc_chars": MAX_DOC, "sources": sources, "domains": {}}
    for dom, recs in docs.items():
        parts = {"train": [], "heldout": []}
        for r in recs:
            parts["heldout" if heldout(r["group"]) else "train"].append(r)
        for part, rs in parts.items():
            path = out / f"{dom}.{part}.jsonl"
            with open(path, "w", encoding="utf-8") as f:
                for r in rs:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
            data = path.read_bytes()
            manifest["domains"].setdefault(dom, {})[part] = {
                "records": len(rs), "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest()}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps(manifest["domains"], indent=1))


if __name__ == "__main__":
    main()
