"""The tokenizer a model directory carries, written as GGUF metadata (`tokenizer.ggml.*`) for llama.cpp.

Written: byte-level BPE tokenizers (`tokenizer.json` of the `tokenizers` library with a `BPE` model and GPT-2's
byte-level pre-tokenizer: GPT-2, and the small BPE tokenizers trained with `ByteLevelBPETokenizer`) as llama.cpp's
`gpt2` model with the `gpt-2` pre-tokenizer: the token list in id order, the merges and the token types (special
added tokens are control tokens). llama.cpp then splits text with the same regular expression and merges with the
same ranks, so it tokenizes as the `tokenizers` library does (tested on real sentences). Other tokenizers are refused
with one sentence rather than written with a tokenization that differs. A model without a tokenizer is written with
llama.cpp's `none` vocabulary (it runs on token ids).
"""

from __future__ import annotations

import json
from pathlib import Path

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5  # gguf.TokenType


def find_tokenizer(directory: str | Path | None) -> Path | None:
    """The `tokenizer.json` of a model directory (or of its `tokenizer/` folder), None when it has none."""
    if directory is None:
        return None
    for candidate in (Path(directory) / "tokenizer.json", Path(directory) / "tokenizer" / "tokenizer.json"):
        if candidate.is_file():
            return candidate
    return None


def has_other_tokenizer(directory: str | Path | None) -> str | None:
    """The name of a tokenizer file other than `tokenizer.json` in the directory (SentencePiece, vocab files)."""
    if directory is None:
        return None
    for folder in (Path(directory), Path(directory) / "tokenizer"):
        for name in ("tokenizer.model", "spiece.model", "source.spm", "vocab.json", "vocab.txt"):
            if (folder / name).is_file():
                return str(folder / name)
    return None


def read_bpe_vocab(path: Path, vocab_size: int) -> dict:
    """Tokens (id order, padded to `vocab_size`), token types and merges of a byte-level BPE `tokenizer.json`;
    `ValueError` names what llama.cpp's `gpt2` tokenizer cannot reproduce."""
    data = json.loads(path.read_text(encoding="utf-8"))
    model = data.get("model") or {}
    pre = data.get("pre_tokenizer") or {}
    why = None
    if model.get("type") != "BPE":
        why = f"its model is {model.get('type')!r}, not BPE"
    elif pre.get("type") != "ByteLevel" or not pre.get("use_regex", True) or pre.get("add_prefix_space", False):
        why = "its pre-tokenizer is not GPT-2's byte-level split (ByteLevel, use_regex, no prefix space)"
    elif data.get("normalizer") is not None:
        why = f"it has a normalizer ({data['normalizer'].get('type')!r})"
    elif model.get("dropout") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        why = "its BPE model uses dropout or subword prefixes/suffixes"
    if why is not None:
        raise ValueError(f"tokenizer: {str(path)!r} cannot be written for llama.cpp ({why}); llama.cpp would "
                         f"tokenize differently. GGUF export writes byte-level BPE tokenizers (GPT-2 style).")
    by_id: dict[int, str] = {int(i): t for t, i in model["vocab"].items()}
    types = {i: TOKEN_NORMAL for i in by_id}
    for added in data.get("added_tokens") or []:
        by_id[int(added["id"])] = added["content"]
        types[int(added["id"])] = TOKEN_CONTROL if added.get("special") else TOKEN_USER_DEFINED
    if by_id and max(by_id) >= vocab_size:
        raise ValueError(f"tokenizer: {str(path)!r} has token id {max(by_id)}, but the model's vocab_size is "
                         f"{vocab_size}; it is not this model's tokenizer.")
    tokens, token_types = [], []
    for i in range(vocab_size):  # ids the tokenizer never produces: unused placeholders, as llama.cpp's converter
        tokens.append(by_id.get(i, f"[PAD{i}]"))
        token_types.append(types.get(i, TOKEN_UNUSED))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    return {"tokens": tokens, "token_types": token_types, "merges": merges, "path": str(path)}


def write_vocab(writer, directory: str | Path | None, config, vocab_size: int) -> str | None:
    """Write the tokenizer of `directory` (or the `none` vocabulary) into the GGUF `writer`; returns the path of
    the tokenizer written, or None."""
    path = find_tokenizer(directory)
    if path is None:
        other = has_other_tokenizer(directory)
        if other is not None:
            raise ValueError(f"tokenizer: {other!r} is not a tokenizer.json; GGUF export writes byte-level BPE "
                             f"tokenizers (tokenizer.json) only, and would not write one that tokenizes differently.")
        writer.add_tokenizer_model("none")
        writer.add_vocab_size(vocab_size)
        return None
    vocab = read_bpe_vocab(path, vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["token_types"])
    writer.add_token_merges(vocab["merges"])
    for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id),
                     ("pad_token_id", writer.add_pad_token_id)):
        value = getattr(config, key, None)
        if isinstance(value, list):
            value = value[0] if value else None
        if isinstance(value, int) and 0 <= value < vocab_size:
            add(value)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    return vocab["path"]
