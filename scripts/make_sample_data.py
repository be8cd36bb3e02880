#!/usr/bin/env python
"""Build padpipe's bundled sample data from text that ships with Python itself.

The English text is taken from the docstrings of the public Python standard
library (modules, classes, functions and methods; PSF license).  Nothing is
downloaded.  From that text the script writes, under ``padpipe/data/``:

* ``sample.parquet``      -- ~20k sentence-pair rows (sentence1, sentence2,
                             label, idx) with a long-tail length mix.
* ``corpus.jsonl.gz``     -- ~5k single-text documents {"text", "id"} with
                             long-tail lengths, for packing demos.
* ``tokenizer/``          -- a BERT-style WordPiece tokenizer trained on the text, as a folder that
                             ``transformers.AutoTokenizer.from_pretrained`` loads.
* ``chat_tokenizer/``     -- a byte-level BPE chat tokenizer (ChatML template) trained on the documents.
* ``chats.jsonl.gz``      -- 1,000 conversations {"messages", "id"} made of the documents' sentences
                             (``padpipe.examples.conversations``).
* ``preferences.jsonl.gz`` -- 400 preference pairs {"prompt", "chosen", "rejected", "id"} made of the
                             conversations (``padpipe.examples.preferences``).
* ``README.md``           -- what the files are and how to rebuild them.

Everything is seeded, so running the script twice on the same Python build
(the docstrings differ between Python releases) and the same library versions
gives the same files.

Usage::

    python scripts/make_sample_data.py            # build + print statistics
    python scripts/make_sample_data.py --no-check # build only
"""

from __future__ import annotations

import argparse
import ast
import gzip
import importlib
import inspect
import io
import json
import math
import os
import random
import re
import sys
import sysconfig
import tokenize
import warnings
from pathlib import Path

SEED = 20240607

N_PAIRS = 20_000
N_DOCS = 5_000
N_VERY_LONG = 2  # rows whose sentence1 is ~1000 words
N_CHATS = 1_000
N_PREFERENCES = 400
CHAT_VOCAB_SIZE = 4_096
CHAT_MODEL_MAX_LENGTH = 8_192
CHAT_SPECIAL_TOKENS = [  # the control tokens of the ChatML, Llama 3, Mistral and Gemma templates
    "<|endoftext|>",
    "<|pad|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "<bos>",
    "<start_of_turn>",
    "<end_of_turn>",
]
CHAT_ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]  # one token each, not special (as Qwen's)
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
ROW_GROUP_SIZE = 2_000
VOCAB_SIZE = 8_000
MODEL_MAX_LENGTH = 512
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # ids 0..4

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "padpipe" / "data"
STDLIB = Path(sysconfig.get_paths()["stdlib"])

# Top-level stdlib names that are not worth reading (side effects on import,
# test suites, GUI/IDE code, bundled data, codec boilerplate) or that are
# platform-specific and would make the sample depend on the OS.
SKIP_TOP = {
    "antigravity",
    "this",
    "test",
    "idlelib",
    "turtledemo",
    "ensurepip",
    "pydoc_data",
    "encodings",
    "lib2to3",
    "readline",
    "site",
    "sitecustomize",
    "usercustomize",
    "msilib",
    "msvcrt",
    "winreg",
    "winsound",
    "nt",
    "_winapi",
    "xxsubtype",
    "xxlimited",
    "xxlimited_35",
}
SKIP_PARTS = {"test", "tests", "idle_test", "testdata", "__pycache__", "__main__.py"}


# --------------------------------------------------------------------------
# 1. Harvest docstrings
# --------------------------------------------------------------------------


def _public(name: str) -> bool:
    return not name.startswith("_") and not name.lower().startswith("test")


def _ast_docstrings(tree: ast.Module):
    """Yield docstrings of the module and its public classes/functions, in
    source order.  Descends into class bodies and into top-level if/try/with
    blocks, but not into function bodies."""
    doc = ast.get_docstring(tree, clean=True)
    if doc:
        yield doc

    def walk(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if _public(node.name):
                    d = ast.get_docstring(node, clean=True)
                    if d:
                        yield d
            elif isinstance(node, ast.ClassDef):
                if _public(node.name):
                    d = ast.get_docstring(node, clean=True)
                    if d:
                        yield d
                    yield from walk(node.body)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for field in ("body", "orelse", "finalbody"):
                    yield from walk(getattr(node, field, []) or [])
                for h in getattr(node, "handlers", []) or []:
                    yield from walk(h.body)

    yield from walk(tree.body)


def _source_files(name: str) -> list[Path]:
    single = STDLIB / f"{name}.py"
    if single.is_file():
        return [single]
    pkg = STDLIB / name
    if (pkg / "__init__.py").is_file():
        files = []
        for p in sorted(pkg.rglob("*.py")):
            rel = p.relative_to(STDLIB).parts
            if any(part in SKIP_PARTS for part in rel):
                continue
            if any(part.startswith(("_", "test")) for part in rel[1:] if part != "__init__.py"):
                continue
            files.append(p)
        return files
    return []


def _object_docstrings(mod):
    """Docstrings of a compiled (builtin / extension) module via inspect."""
    doc = mod.__doc__
    if isinstance(doc, str):
        yield inspect.cleandoc(doc)
    for attr in sorted(vars(mod)):
        if not _public(attr):
            continue
        obj = getattr(mod, attr)
        if getattr(obj, "__module__", None) not in (mod.__name__, None):
            continue
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        d = obj.__doc__
        if isinstance(d, str):
            yield inspect.cleandoc(d)
        if inspect.isclass(obj):
            for m in sorted(vars(obj)):
                if not _public(m):
                    continue
                d = getattr(vars(obj)[m], "__doc__", None)
                if isinstance(d, str) and d is not getattr(type(vars(obj)[m]), "__doc__", None):
                    yield inspect.cleandoc(d)


def harvest() -> dict[str, list[str]]:
    """Return {top-level module name: [docstring, ...]} in a stable order,
    plus the help() reference topics under "pydoc_data.topics"."""
    out: dict[str, list[str]] = {}
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in SKIP_TOP:
            continue
        docs: list[str] = []
        files = _source_files(name)
        if files:
            for path in files:
                try:
                    with tokenize.open(path) as fh:
                        src = fh.read()
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        tree = ast.parse(src, filename=str(path))
                except (SyntaxError, UnicodeDecodeError, OSError):
                    continue
                docs.extend(_ast_docstrings(tree))
        else:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    mod = importlib.import_module(name)
            except Exception:  # not built on this platform
                continue
            if getattr(mod, "__file__", None) and str(mod.__file__).endswith(".py"):
                continue
            docs.extend(_object_docstrings(mod))
        if docs:
            out[name] = docs
    # The language-reference topics that `help()` shows (plain-text renderings
    # of the Python docs, bundled as data in pydoc_data): longer prose.
    try:
        from pydoc_data.topics import topics
    except ImportError:
        topics = {}
    if topics:
        out["pydoc_data.topics"] = [topics[k] for k in sorted(topics)]
    return out


# --------------------------------------------------------------------------
# 2. Clean docstrings into paragraphs and sentences
# --------------------------------------------------------------------------

_RST_ROLE = re.compile(r":[a-zA-Z]+(?::[a-zA-Z]+)?:`~?!?([^`<]+?)(?:\s*<[^>]*>)?`")
_RST_RULE = re.compile(r"[-=~^*#+`:_.]{3,}")
_SIGNATURE = re.compile(r"^[A-Za-z_][\w.]*\(.*\)\s*(->.*)?$")
_SENT_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(\[])")
_FIELD = re.compile(r"^:(param|type|return|returns|rtype|raises?|arg|keyword|kwarg|ivar|var)\b[^:]*:\s*")


def clean_paragraphs(doc: str) -> list[str]:
    doc = doc.replace("\r\n", "\n").replace("\r", "\n").expandtabs(8)
    paras = []
    for block in re.split(r"\n[ \t]*\n", doc):
        lines = block.split("\n")
        if not lines[0].strip() or lines[0][:1].isspace():
            continue  # indented block: literal code, parameter table, ...
        if any(line.lstrip().startswith((">>>", "... ", "$ ", ".. ", "%", "#")) for line in lines):
            continue  # doctests, shell sessions, rst directives
        kept = []
        for i, line in enumerate(lines):
            s = line.strip()
            if not s or _RST_RULE.fullmatch(s):
                continue
            if i == 0 and _SIGNATURE.match(s):
                continue  # "S.find(sub[, start[, end]]) -> int" style headers
            s = _FIELD.sub("", s)
            kept.append(s)
        if not kept:
            continue
        text = " ".join(kept)
        text = _RST_ROLE.sub(r"\1", text)
        text = text.replace("``", "").replace("::", ":")
        text = re.sub(r"\s+", " ", text).strip()
        words = text.split()
        if len(words) < 4:
            continue
        if not (text[0].isalpha() or text[0] in "\"'("):
            continue
        visible = text.replace(" ", "")
        if sum(c.isalpha() for c in visible) / len(visible) < 0.75:
            continue
        if not text.isprintable():
            continue
        if "copyright" in text.lower():
            continue
        paras.append(text)
    return paras


def split_sentences(paragraph: str) -> list[str]:
    return [s.strip() for s in _SENT_SPLIT.split(paragraph) if s.strip()]


def build_groups(raw: dict[str, list[str]]):
    """Deduplicate paragraphs and sentences globally.

    Returns (paragraphs, groups) where paragraphs is the ordered list of kept
    paragraphs (tokenizer training text) and groups maps module name ->
    list of (sentence, starts_paragraph)."""
    seen_para: dict[str, None] = {}
    seen_sent: dict[str, None] = {}
    paragraphs: list[str] = []
    groups: dict[str, list[tuple[str, bool]]] = {}
    for name, docs in raw.items():
        sents: list[tuple[str, bool]] = []
        for doc in docs:
            for para in clean_paragraphs(doc):
                if para in seen_para:
                    continue
                seen_para[para] = None
                paragraphs.append(para)
                first = True
                for s in split_sentences(para):
                    if s in seen_sent:
                        continue
                    seen_sent[s] = None
                    sents.append((s, first))
                    first = False
        if sum(len(s.split()) for s, _ in sents) >= 150:
            groups[name] = sents
    return paragraphs, groups


# --------------------------------------------------------------------------
# 3. Sample passages with a long-tail length mix
# --------------------------------------------------------------------------


class Group:
    def __init__(self, name, sents):
        self.name = name
        self.sents = [s for s, _ in sents]
        self.para_start = [p for _, p in sents]
        self.lens = [len(s.split()) for s in self.sents]
        self.words = sum(self.lens)


def passage_target(rng: random.Random, long_share: float) -> tuple[int, int, int]:
    """Return (target, lo, hi) word counts for one passage."""
    u = rng.random()
    if u < long_share:  # long: 200-600 words
        lo, hi = 200, 600
        t = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    elif u < long_share + 0.16:  # medium: 40-200 words
        lo, hi = 40, 200
        t = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    else:  # short: 5-40 words, median ~13
        lo, hi = 5, 40
        t = int(round(rng.lognormvariate(math.log(13), 0.55)))
        t = min(max(t, lo), hi)
    return t, lo, hi


def make_passage(
    rng, group: Group, target: int, lo: int, hi: int, start: int | None = None, sep: str = " "
) -> tuple[str, int, int]:
    """Consecutive sentences of `group` from a random start until `target`
    words.  When that overshoots, cut back to the last sentence end inside
    [lo, soft_hi] (soft_hi ~ 1.6 x target, at most hi); failing that, hard-cut
    at `target` words.  Returns (text, start, n_sentences_used)."""
    n = len(group.sents)
    soft_hi = min(hi, max(lo, int(target * 1.6) + 2))
    if start is None:
        # prefer a start whose first sentence fits, so short passages are
        # mostly whole sentences rather than cut-off fragments
        for _ in range(8):
            start = rng.randrange(n)
            if group.lens[start] <= soft_hi:
                break
    pieces: list[str] = []  # words, with paragraph breaks marked
    ends: list[int] = []  # word counts at sentence ends
    count = 0
    i = start
    while count < target and i - start < n:
        j = i % n
        if pieces and group.para_start[j] and sep != " ":
            pieces.append("\n\n")
        w = group.sents[j].split()
        pieces.extend(w)
        count += len(w)
        ends.append(count)
        i += 1
    if count > soft_hi:
        cut = max((e for e in ends if lo <= e <= soft_hi), default=None)
        cut = cut if cut is not None else target
        kept, c = [], 0
        for p in pieces:
            if c == cut:
                break
            kept.append(p)
            if p != "\n\n":
                c += 1
        pieces = kept
    text = " ".join(pieces).replace(" \n\n ", "\n\n").strip()
    return text, start, i - start


def pick_group(rng, groups: list[Group], weights: list[float], min_words: int, exclude: str | None = None) -> Group:
    while True:
        g = rng.choices(groups, weights=weights, k=1)[0]
        if g.words >= min_words and g.name != exclude:
            return g


def make_pairs(rng, groups: list[Group]):
    weights = [math.sqrt(g.words) for g in groups]
    very_long_rows = set(rng.sample(range(N_PAIRS), N_VERY_LONG))
    s1s, s2s, labels = [], [], []
    seen: dict[str, None] = {}
    seen2: dict[str, None] = {}
    for row in range(N_PAIRS):
        if row in very_long_rows:
            t1 = rng.randint(950, 1100)
            lo1, hi1 = 900, 1150
        else:
            t1, lo1, hi1 = passage_target(rng, long_share=0.035)
        for _attempt in range(20):  # avoid repeating a sentence1 verbatim
            g1 = pick_group(rng, groups, weights, min_words=int(t1 * 1.3))
            s1, start1, used1 = make_passage(rng, g1, t1, lo1, hi1)
            if s1 not in seen:
                break
        seen[s1] = None
        label = int(rng.random() < 0.5)
        t2, lo2, hi2 = passage_target(rng, long_share=0.015)
        if label == 1 and (g1.words < int(t2 * 1.3) + int(t1 * 1.3) or used1 >= len(g1.sents)):
            label = 0  # sentence1's module is too small for a second passage
        for _attempt in range(20):  # avoid repeating a sentence2 verbatim
            if label == 1:
                g2 = g1
                n = len(g1.sents)
                while True:  # start outside sentence1's span
                    start2 = rng.randrange(n)
                    if (start2 - start1) % n >= used1:
                        break
                s2, _, _ = make_passage(rng, g2, t2, lo2, hi2, start=start2)
            else:
                g2 = pick_group(rng, groups, weights, min_words=int(t2 * 1.3), exclude=g1.name)
                s2, _, _ = make_passage(rng, g2, t2, lo2, hi2)
            if s2 not in seen2 and s2 != s1:
                break
        seen2[s2] = None
        s1s.append(s1)
        s2s.append(s2)
        labels.append(label)
    return s1s, s2s, labels


def make_docs(rng, groups: list[Group]):
    weights = [math.sqrt(g.words) for g in groups]
    docs = []
    seen: dict[str, None] = {}
    for _ in range(N_DOCS):
        u = rng.random()
        if u < 0.02:  # a few very long docs
            lo, hi = 1000, 3000
            t = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
        else:  # lognormal, median ~90 words
            lo, hi = 12, 1000
            t = int(round(rng.lognormvariate(math.log(90), 0.85)))
            t = min(max(t, lo), hi)
        for _attempt in range(20):  # avoid repeating a document verbatim
            g = pick_group(rng, groups, weights, min_words=int(t * 1.2))
            text, _, _ = make_passage(rng, g, t, lo, hi, sep="\n\n")
            if text not in seen:
                break
        seen[text] = None
        docs.append(text)
    return docs


# --------------------------------------------------------------------------
# 4. Tokenizer
# --------------------------------------------------------------------------


def train_tokenizer(texts: list[str]):
    """Train a BERT-style WordPiece tokenizer with `tokenizers`, reproducibly.

    `tokenizers`' WordPiece (BPE) trainer gives the "##x" continuation
    symbols ids in hash-map order, and merge ties are broken by id, so two
    runs can learn different vocabularies.  To pin it down, all "##x" symbols
    are registered up front (in sorted order) through `special_tokens`, which
    the trainer inserts before anything else; the alphabet is not truncated
    (it has < 100 symbols after lowercasing).  The tokenizer is then rebuilt
    from the learned vocab so that only the five real special tokens are
    "added tokens"."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
    from tokenizers.models import WordPiece

    def configure(tok):
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
        )
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        return tok

    tok = configure(
        Tokenizer(WordPiece(unk_token="[UNK]", continuing_subword_prefix="##", max_input_chars_per_word=100))
    )
    inner: dict[str, None] = {}
    alphabet: dict[str, None] = {}
    for t in texts:
        for w, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(t)):
            alphabet.update(dict.fromkeys(w))
            inner.update(dict.fromkeys(w[1:]))
    assert len(alphabet) < 1000, "alphabet would be truncated (ties broken arbitrarily)"
    continuation = ["##" + c for c in sorted(inner)]
    trainer = trainers.WordPieceTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS + continuation,
        limit_alphabet=1000,  # larger than the alphabet: nothing is dropped
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    vocab = tok.get_vocab(with_added_tokens=False)

    tok = configure(
        Tokenizer(WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##", max_input_chars_per_word=100))
    )
    tok.add_special_tokens(SPECIAL_TOKENS)
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    assert tok.get_vocab_size() == len(vocab)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return tok


def train_chat_tokenizer(texts: list[str]):
    """A byte-level BPE (as GPT-2's and Qwen's) trained on ``texts``, with every chat template's control tokens.

    ``tokenizers``' BPE trainer is deterministic for the same texts and settings (checked: two runs give
    the same file)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=CHAT_VOCAB_SIZE,
        special_tokens=CHAT_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tok.add_tokens(CHAT_ADDED_TOKENS)
    return tok


def save_chat_folder(tok, folder: Path):
    """The folder ``AutoTokenizer.from_pretrained`` loads: tokenizer.json, its config and the ChatML template."""
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": CHAT_MODEL_MAX_LENGTH,
        "padding_side": "right",
        "truncation_side": "right",
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "eos_token": "<|endoftext|>",
        "pad_token": "<|pad|>",
    }
    _write_json(folder / "tokenizer_config.json", config)
    (folder / "chat_template.jinja").write_text(CHATML, encoding="utf-8")


def write_chats(path: Path, corpus: Path):
    """``padpipe.examples.conversations(N_CHATS, seed=0)`` on ``corpus``, as gzipped JSON Lines."""
    sys.path.insert(0, str(ROOT))  # this checkout's padpipe, whichever one is installed
    from padpipe.examples import conversations

    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        for row in conversations(N_CHATS, seed=0, corpus=corpus):
            gz.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
    path.write_bytes(buf.getvalue())


def write_preferences(path: Path):
    """``padpipe.examples.preferences(N_PREFERENCES, seed=0)`` (pairs made of the conversations), as gzipped JSON
    Lines."""
    sys.path.insert(0, str(ROOT))
    from padpipe.examples import preferences

    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        for row in preferences(N_PREFERENCES, seed=0):
            gz.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
    path.write_bytes(buf.getvalue())


def save_hf_folder(tok, folder: Path):
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    vocab = tok.get_vocab()
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    assert [i for _, i in by_id] == list(range(len(by_id)))
    (folder / "vocab.txt").write_text("".join(t + "\n" for t, _ in by_id), encoding="utf-8")
    special = {
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "mask_token": "[MASK]",
    }
    config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": True,
        "tokenize_chinese_chars": True,
        "strip_accents": None,
        "clean_up_tokenization_spaces": True,
        "model_max_length": MODEL_MAX_LENGTH,
        "padding_side": "right",
        "truncation_side": "right",
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
        **special,
    }
    _write_json(folder / "tokenizer_config.json", config)
    _write_json(folder / "special_tokens_map.json", special)


def _write_json(path: Path, obj):
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------
# 5. Writers
# --------------------------------------------------------------------------


def write_parquet(path: Path, s1, s2, labels):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "sentence1": pa.array(s1, type=pa.string()),
            "sentence2": pa.array(s2, type=pa.string()),
            "label": pa.array(labels, type=pa.int64()),
            "idx": pa.array(range(len(s1)), type=pa.int64()),
        }
    )
    pq.write_table(table, str(path), row_group_size=ROW_GROUP_SIZE, compression="zstd", compression_level=19)


def write_corpus(path: Path, docs):
    buf = io.BytesIO()
    # mtime=0 and an empty file name keep the gzip header reproducible
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        for i, text in enumerate(docs):
            gz.write((json.dumps({"text": text, "id": i}, ensure_ascii=False) + "\n").encode("utf-8"))
    path.write_bytes(buf.getvalue())


README = """\
# padpipe sample data

Small, offline data files used by padpipe's examples, tests and benchmarks.
They are generated by `scripts/make_sample_data.py`; do not edit them by hand.

| file | what it is |
| --- | --- |
| `sample.parquet` | {n_pairs:,} sentence-pair rows with columns `sentence1` (str), `sentence2` (str), `label` (int64, 1 when both passages come from the same stdlib module, else 0; roughly balanced) and `idx` (int64, 0..n-1). zstd-compressed, row groups of {rg:,} rows. Lengths are long-tailed on purpose: most passages are 5-40 words, some 40-200, a few percent 200-600, and {n_vl} rows have a ~1000-word `sentence1`, so padding every batch to a global maximum wastes most of the compute. |
| `corpus.jsonl.gz` | {n_docs:,} single-text documents, one JSON object per line: `{{"text": str, "id": int}}`. Long-tailed lengths (median ~100 words, about 2% of 1000-3000 words) for packing / pretraining demos. Paragraphs are separated by blank lines. |
| `chats.jsonl.gz` | {n_chats:,} conversations, one JSON object per line: `{{"messages": [{{"role": str, "content": str}}, ...], "id": int}}` (`pp.examples.CHATS_JSONL`), made of the documents' sentences by `pp.examples.conversations({n_chats}, seed=0)`: 3 in 10 open with a system message, then 1 to 8 user/assistant exchanges (most have 1 or 2); an answer's sentence count has a long tail. For the SFT examples (`.chat()`, `padpipe.recipes.sft`). |
| `preferences.jsonl.gz` | 400 preference pairs in TRL's conversational format, one JSON object per line: `{{"prompt": [...], "chosen": [{{"role": "assistant", ...}}], "rejected": [...], "id": int}}` (`pp.examples.PREFERENCES_JSONL`), made by `pp.examples.preferences(400, seed=0)`: each conversation's messages before its last answer are the prompt, that answer is chosen, the next conversation's last answer is rejected. For the DPO examples (`.preference()`, `padpipe.recipes.dpo`). |
| `chat_tokenizer/` | A byte-level BPE chat tokenizer trained on the documents, as a Hugging Face folder (`pp.examples.CHAT_TOKENIZER_DIR`, `pp.examples.chat_tokenizer()`): `tokenizer.json`, `tokenizer_config.json` (EOS `<|endoftext|>`, pad `<|pad|>`) and `chat_template.jinja` (ChatML, no `{{% generation %}}` markers, as most models ship). Vocab {chat_vocab:,} and 4 added tokens (`<tool_call>`, `</tool_call>`, `<think>`, `</think>`: `len(tok)` is {chat_len:,}); the control tokens of the ChatML, Llama 3, Mistral and Gemma templates are special tokens, so any of those templates can be passed as `chat_template=`. |
| `tokenizer/` | BERT-style WordPiece tokenizer trained on the same text, as a Hugging Face folder: `tokenizer.json` (the `tokenizers` file; `pp.examples.TOKENIZER_JSON`), `vocab.txt`, `tokenizer_config.json`, `special_tokens_map.json`. Vocab {vocab:,}, lowercasing `BertNormalizer`, `BertPreTokenizer`, special tokens `[PAD]`=0, `[UNK]`=1, `[CLS]`=2, `[SEP]`=3, `[MASK]`=4, post-processor `[CLS] $A [SEP]` / `[CLS] $A [SEP] $B:1 [SEP]:1`, WordPiece decoder; no padding or truncation baked in. `transformers.AutoTokenizer.from_pretrained("padpipe/data/tokenizer")` loads it as a fast BERT tokenizer offline (`model_max_length` {mml}). |

## Where the text comes from

All text is taken from the docstrings of the public modules, classes, functions
and methods of the Python {pyver} standard library (Python source files read
with `ast`, compiled modules such as `builtins` and `math` read with
`inspect`), plus the language-reference topics that `help()` shows
(`pydoc_data.topics`, treated as one more "module"). Private names, test
suites, `idlelib`, `turtledemo`, `lib2to3`, `encodings` and platform-specific
modules are skipped; doctests, code blocks and reST markup are dropped;
whitespace is normalized and paragraphs and sentences are de-duplicated. That
leaves about 200k words, so passages (runs of consecutive sentences from one
module) reuse the same sentences many times across rows, but whole passages
and documents are almost never repeated verbatim. The tokenizer is trained on the
de-duplicated paragraphs. The Python documentation and source are distributed
under the Python Software Foundation License (PSF-2.0).

## Regenerating

```
python scripts/make_sample_data.py
```

The script is seeded (seed {seed}) and deterministic: with the same Python
version ({pyver}) and the same `tokenizers`/`pyarrow` versions it reproduces
these files exactly. A different Python release has different docstrings and
so gives a different (but equally shaped) sample.
"""


# --------------------------------------------------------------------------
# 6. Checks / statistics
# --------------------------------------------------------------------------


def _pct(sorted_vals, q):
    if not sorted_vals:
        return 0
    k = min(len(sorted_vals) - 1, max(0, int(math.ceil(q / 100 * len(sorted_vals))) - 1))
    return sorted_vals[k]


def report(out: Path):
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer" / "tokenizer.json"))
    pf = pq.ParquetFile(str(out / "sample.parquet"))
    table = pf.read()
    s1 = table.column("sentence1").to_pylist()
    s2 = table.column("sentence2").to_pylist()
    labels = table.column("label").to_pylist()

    def words(xs):
        return sorted(len(x.split()) for x in xs)

    print(
        f"sample.parquet: {table.num_rows} rows, {pf.num_row_groups} row groups, "
        f"label mean {sum(labels) / len(labels):.3f}"
    )
    for name, xs in (("sentence1", s1), ("sentence2", s2)):
        w = words(xs)
        n = len(w)
        short = sum(5 <= v <= 40 for v in w) / n
        long_ = sum(200 <= v <= 600 for v in w) / n
        print(
            f"  {name} words: p50={_pct(w, 50)} p90={_pct(w, 90)} p99={_pct(w, 99)} "
            f"max={w[-1]}  share 5-40={short:.1%}  200-600={long_:.1%}  >600={sum(v > 600 for v in w)}"
        )

    enc = tok.encode_batch(list(zip(s1, s2)))
    lens = [len(e.ids) for e in enc]
    sl = sorted(lens)
    n = len(lens)
    print(
        f"  pair tokens:  p50={_pct(sl, 50)} p90={_pct(sl, 90)} p99={_pct(sl, 99)} max={sl[-1]} "
        f"mean={sum(lens) / n:.1f}  >128: {sum(v > 128 for v in lens) / n:.1%}  "
        f">512: {sum(v > 512 for v in lens)}"
    )
    single = sorted(len(e.ids) for e in tok.encode_batch(s1))
    print(f"  sentence1 tokens: p50={_pct(single, 50)} p90={_pct(single, 90)} p99={_pct(single, 99)} max={single[-1]}")

    real128 = sum(min(v, 128) for v in lens)
    print(f"  padding waste, pad to max_length=128 (truncating): {1 - real128 / (n * 128):.1%}")
    real512 = sum(min(v, 512) for v in lens)
    print(f"  padding waste, pad to max_length=512 (truncating): {1 - real512 / (n * 512):.1%}")
    print(f"  padding waste, pad to global max ({sl[-1]}):         {1 - sum(lens) / (n * sl[-1]):.1%}")
    for bs in (32,):
        tot = 0
        for i in range(0, n, bs):
            b = [min(v, 512) for v in lens[i : i + bs]]
            tot += max(b) * len(b)
        print(f"  padding waste, dynamic per-batch (bs={bs}, file order, trunc 512): {1 - real512 / tot:.1%}")
    print("  padding waste, each row to its own length:        0.0%")

    with gzip.open(out / "corpus.jsonl.gz", "rt", encoding="utf-8") as fh:
        docs = [json.loads(line) for line in fh]
    dl = sorted(len(e.ids) for e in tok.encode_batch([d["text"] for d in docs]))
    print(
        f"corpus.jsonl.gz: {len(docs)} docs, tokens p50={_pct(dl, 50)} p90={_pct(dl, 90)} "
        f"p99={_pct(dl, 99)} max={dl[-1]} total={sum(dl):,}"
    )
    unk = tok.token_to_id("[UNK]")
    n_unk = sum(e.ids.count(unk) for e in enc)
    print(f"tokenizer: vocab {tok.get_vocab_size()}, [UNK] rate on sample {n_unk / sum(lens):.4%}")
    for f in sorted(out.rglob("*")):
        if f.is_file():
            print(f"  {f.relative_to(out.parent.parent)}: {f.stat().st_size:,} bytes")


def check_transformers(out: Path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import transformers
        from transformers import AutoTokenizer
    except ImportError:
        print("transformers not installed; skipping AutoTokenizer check")
        return
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(out / "tokenizer" / "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    assert hf.is_fast, type(hf)
    assert hf.pad_token == "[PAD]" and hf.pad_token_id == 0
    assert (hf.cls_token, hf.sep_token, hf.unk_token, hf.mask_token) == ("[CLS]", "[SEP]", "[UNK]", "[MASK]")
    assert hf.model_max_length == MODEL_MAX_LENGTH
    assert list(hf.model_input_names) == ["input_ids", "token_type_ids", "attention_mask"]
    r = raw.encode("a b", "c d")
    h = hf("a b", "c d")
    assert h["input_ids"] == r.ids, (h["input_ids"], r.ids)
    assert h["token_type_ids"] == r.type_ids == [0, 0, 0, 0, 1, 1, 1], (h["token_type_ids"], r.type_ids)
    # identical encodings on the whole sample (pairs and singles)
    import pyarrow.parquet as pq

    t = pq.read_table(str(out / "sample.parquet"))
    s1 = t.column("sentence1").to_pylist()
    s2 = t.column("sentence2").to_pylist()
    hp = hf(s1, s2, verbose=False)["input_ids"]
    rp = [e.ids for e in raw.encode_batch(list(zip(s1, s2)))]
    hs = hf(s1, verbose=False)["input_ids"]
    rs = [e.ids for e in raw.encode_batch(s1)]
    assert hp == rp and hs == rs, "transformers and tokenizers disagree"
    print(
        f"transformers {transformers.__version__}: AutoTokenizer -> {type(hf).__name__} "
        f"(fast), encodings identical to tokenizers on {len(s1)} pairs"
    )

    chat = AutoTokenizer.from_pretrained(str(out / "chat_tokenizer"))
    assert chat.is_fast and (chat.eos_token, chat.pad_token) == ("<|endoftext|>", "<|pad|>")
    assert all(chat.convert_tokens_to_ids(t) == i for i, t in enumerate(CHAT_SPECIAL_TOKENS))
    with gzip.open(out / "chats.jsonl.gz", "rt", encoding="utf-8") as fh:
        chats = [json.loads(line)["messages"] for line in fh]
    cl = sorted(len(chat.apply_chat_template(c, tokenize=True, return_dict=True)["input_ids"]) for c in chats)
    print(
        f"chats.jsonl.gz: {len(chats)} conversations, {sum(map(len, chats)):,} messages; ChatML tokens "
        f"p50={_pct(cl, 50)} p90={_pct(cl, 90)} p99={_pct(cl, 99)} max={cl[-1]} total={sum(cl):,}"
    )


# --------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: padpipe/data)")
    ap.add_argument("--no-check", action="store_true", help="skip statistics and the transformers check")
    args = ap.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    raw = harvest()
    paragraphs, group_map = build_groups(raw)
    groups = [Group(n, s) for n, s in group_map.items()]
    print(
        f"harvested {sum(len(v) for v in raw.values()):,} docstrings from {len(raw)} modules; "
        f"{len(paragraphs):,} unique paragraphs "
        f"({sum(len(p.split()) for p in paragraphs):,} words); {len(groups)} modules kept"
    )

    rng = random.Random(SEED)
    s1, s2, labels = make_pairs(rng, groups)
    docs = make_docs(random.Random(SEED + 1), groups)

    tok = train_tokenizer(paragraphs)
    save_hf_folder(tok, out / "tokenizer")  # its tokenizer.json is the one copy (pp.examples.TOKENIZER_JSON)
    write_parquet(out / "sample.parquet", s1, s2, labels)
    write_corpus(out / "corpus.jsonl.gz", docs)
    save_chat_folder(train_chat_tokenizer(docs), out / "chat_tokenizer")
    write_chats(out / "chats.jsonl.gz", out / "corpus.jsonl.gz")
    write_preferences(out / "preferences.jsonl.gz")
    (out / "README.md").write_text(
        README.format(
            n_pairs=N_PAIRS,
            rg=ROW_GROUP_SIZE,
            n_vl=N_VERY_LONG,
            n_docs=N_DOCS,
            n_chats=N_CHATS,
            chat_vocab=CHAT_VOCAB_SIZE,
            chat_len=CHAT_VOCAB_SIZE + len(CHAT_ADDED_TOKENS),
            vocab=tok.get_vocab_size(),
            mml=MODEL_MAX_LENGTH,
            seed=SEED,
            pyver=f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}",
        ),
        encoding="utf-8",
    )
    if not args.no_check:
        report(out)
        check_transformers(out)


if __name__ == "__main__":
    main()
