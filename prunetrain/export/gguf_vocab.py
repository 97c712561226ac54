"""The tokenizer a model directory carries, written as GGUF metadata (`tokenizer.ggml.*`) for llama.cpp.

Written: byte-level BPE tokenizers (`tokenizer.json` of the `tokenizers` library with a `BPE` model and GPT-2's
byte-level pre-tokenizer: GPT-2, and the small BPE tokenizers trained with `ByteLevelBPETokenizer`) as llama.cpp's
`gpt2` model with the `gpt-2` pre-tokenizer: the token list in id order, the merges and the token types (special
added tokens are control tokens). llama.cpp then splits text with the same regular expression and merges with the
same ranks, so it tokenizes as the `tokenizers` library does (tested on real sentences). Other tokenizers are refused
with one sentence rather than written with a tokenization that differs. A model without a tokenizer is written with
llama.cpp's `none` vocabulary (it runs on token ids).

The vocabulary is checked entry by entry before anything is written (`read_bpe_vocab`), because llama.cpp reads
whatever it is given: ids are whole numbers from 0 below the model's vocabulary size, each naming one token (ids the
tokenizer never produces become unused placeholders, as in llama.cpp's converter); added tokens agree with the vocab;
every merge is two non-empty pieces without a space, both in the vocab and their concatenation too, and no merge
appears twice (llama.cpp keeps the first rank of a repeated merge, `tokenizers` the last). A refusal names the file
and the entry.
"""

from __future__ import annotations

from pathlib import Path

from prunetrain.utils.files import check_regular_file, read_json

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5  # gguf.TokenType
ARGUMENT = "tokenizer"


def find_tokenizer(directory: str | Path | None) -> Path | None:
    """The `tokenizer.json` of a model directory (or of its `tokenizer/` folder), None when it has none; a
    `tokenizer.json` that is a directory, a FIFO, a dangling link or a link loop is a `ValueError`."""
    if directory is None:
        return None
    for candidate in (Path(directory) / "tokenizer.json", Path(directory) / "tokenizer" / "tokenizer.json"):
        if candidate.is_file():
            return candidate
        if candidate.is_symlink() or candidate.exists():
            check_regular_file(candidate, ARGUMENT)  # names what it is instead
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


def _refuse(path: Path, what: str) -> ValueError:
    return ValueError(f"{ARGUMENT}: {str(path)!r} {what}; GGUF export writes only a vocabulary llama.cpp reads as "
                      f"the tokenizer does.")


def _kind_problem(data: dict) -> str | None:
    """Why this tokenizer is not one llama.cpp's `gpt2` tokenizer reproduces (None: it is)."""
    model, pre, normalizer = data.get("model"), data.get("pre_tokenizer"), data.get("normalizer")
    if not isinstance(model, dict):
        return f"its 'model' is {str(model)[:40]!r}, not a tokenizer model object"
    if model.get("type") != "BPE":
        return f"its model is {model.get('type')!r}, not BPE"
    if not isinstance(pre, dict) or pre.get("type") != "ByteLevel" or not pre.get("use_regex", True) \
            or pre.get("add_prefix_space", False):
        return "its pre-tokenizer is not GPT-2's byte-level split (ByteLevel, use_regex, no prefix space)"
    if normalizer is not None:
        return f"it has a normalizer ({normalizer.get('type') if isinstance(normalizer, dict) else normalizer!r})"
    if model.get("dropout") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return "its BPE model uses dropout or subword prefixes/suffixes"
    return None


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _vocab_by_id(path: Path, vocab) -> dict[int, str]:
    """{id: token} of `model.vocab`, each id a whole number >= 0 naming one token."""
    if not isinstance(vocab, dict) or not vocab:
        raise _refuse(path, f"has model.vocab {str(vocab)[:40]!r}; expected a non-empty object of token -> id")
    by_id: dict[int, str] = {}
    for token, index in vocab.items():
        if not _is_id(index):
            raise _refuse(path, f"gives the token {token!r} the id {index!r} in model.vocab; ids are whole numbers "
                                f">= 0")
        if index in by_id:
            raise _refuse(path, f"gives the id {index} to both {by_id[index]!r} and {token!r} in model.vocab; each "
                                f"id names one token")
        by_id[index] = token
    return by_id


def _add_added_tokens(path: Path, added, by_id: dict[int, str], types: dict[int, int]) -> None:
    """The `added_tokens` into `by_id`/`types`: each {id, content} consistent with the vocab and the others."""
    if added is None:
        return
    if not isinstance(added, list):
        raise _refuse(path, f"has added_tokens {str(added)[:40]!r}; expected a list")
    ids_of = {token: index for index, token in by_id.items()}
    seen: dict[int, str] = {}
    for k, entry in enumerate(added):
        index = entry.get("id") if isinstance(entry, dict) else None
        content = entry.get("content") if isinstance(entry, dict) else None
        if not _is_id(index) or not isinstance(content, str) or not content:
            raise _refuse(path, f"has added_tokens[{k}] = {str(entry)[:60]!r}; expected an object with a whole "
                                f"number id >= 0 and a non-empty content string")
        if index in seen or content in seen.values():
            raise _refuse(path, f"lists the added token {content!r} (id {index}) twice in added_tokens")
        if index in by_id and by_id[index] != content:
            raise _refuse(path, f"gives the id {index} to the added token {content!r} (added_tokens[{k}]) and to "
                                f"{by_id[index]!r} in model.vocab")
        if ids_of.get(content, index) != index:
            raise _refuse(path, f"gives the added token {content!r} the id {index} (added_tokens[{k}]) but the id "
                                f"{ids_of[content]} in model.vocab")
        seen[index] = content
        by_id[index] = content
        types[index] = TOKEN_CONTROL if entry.get("special") else TOKEN_USER_DEFINED


def _merge_pieces(path: Path, k: int, merge) -> tuple[str, str]:
    if isinstance(merge, str):
        pieces = merge.split(" ")
    elif isinstance(merge, list) and all(isinstance(p, str) for p in merge):
        pieces = merge
    else:
        pieces = []
    if len(pieces) != 2 or not all(pieces) or any(" " in p for p in pieces):
        raise _refuse(path, f"has the merge {merge!r} at model.merges[{k}]; a merge is two non-empty pieces "
                            f"without spaces ('a b' or ['a', 'b'])")
    return pieces[0], pieces[1]


def _checked_merges(path: Path, merges, vocab: dict) -> list[str]:
    """`model.merges` as GGUF's "a b" strings: well-formed, resolvable in the vocab, none repeated."""
    if merges is None:
        return []
    if not isinstance(merges, list):
        raise _refuse(path, f"has model.merges {str(merges)[:40]!r}; expected a list")
    out, rank = [], {}
    for k, merge in enumerate(merges):
        first, second = _merge_pieces(path, k, merge)
        for piece in (first, second, first + second):
            if piece not in vocab:
                raise _refuse(path, f"has the merge {merge!r} at model.merges[{k}], but {piece!r} is not in "
                                    f"model.vocab")
        text = f"{first} {second}"
        if text in rank:
            raise _refuse(path, f"repeats the merge {text!r} (model.merges[{rank[text]}] and [{k}]); llama.cpp and "
                                f"the tokenizers library would rank it differently")
        rank[text] = k
        out.append(text)
    return out


def read_bpe_vocab(path: Path, vocab_size: int) -> dict:
    """Tokens (id order, padded to `vocab_size`), token types and merges of a byte-level BPE `tokenizer.json`;
    `ValueError` names what llama.cpp's `gpt2` tokenizer cannot reproduce, or the entry that is malformed."""
    data = read_json(path, ARGUMENT)
    why = _kind_problem(data)
    if why is not None:
        raise ValueError(f"tokenizer: {str(path)!r} cannot be written for llama.cpp ({why}); llama.cpp would "
                         f"tokenize differently. GGUF export writes byte-level BPE tokenizers (GPT-2 style).")
    model = data["model"]
    by_id = _vocab_by_id(path, model.get("vocab"))
    types = {i: TOKEN_NORMAL for i in by_id}
    merges = _checked_merges(path, model.get("merges"), model["vocab"])
    _add_added_tokens(path, data.get("added_tokens"), by_id, types)
    if max(by_id) >= vocab_size:
        raise ValueError(f"tokenizer: {str(path)!r} has token id {max(by_id)}, but the model's vocab_size is "
                         f"{vocab_size}; it is not this model's tokenizer.")
    tokens, token_types, where = [], [], {}
    for i in range(vocab_size):  # ids the tokenizer never produces: unused placeholders, as llama.cpp's converter
        token = by_id.get(i, f"[PAD{i}]")
        if token in where:
            raise _refuse(path, f"holds the token {token!r} at ids {where[token]} and {i}")
        try:
            token.encode("utf-8")
        except UnicodeEncodeError:
            raise _refuse(path, f"holds the token {token!r} (id {i}), which is not valid Unicode text") from None
        where[token] = i
        tokens.append(token)
        token_types.append(types.get(i, TOKEN_UNUSED))
    return {"tokens": tokens, "token_types": token_types, "merges": merges, "path": str(path)}


def read_vocab(directory: str | Path | None, vocab_size: int) -> dict | None:
    """The checked vocabulary of `directory`'s tokenizer (`read_bpe_vocab`), None for a directory without a
    tokenizer; a tokenizer of another kind is a `ValueError`. Called before anything is written."""
    path = find_tokenizer(directory)
    if path is not None:
        return read_bpe_vocab(path, vocab_size)
    other = has_other_tokenizer(directory)
    if other is not None:
        raise ValueError(f"tokenizer: {other!r} is not a tokenizer.json; GGUF export writes byte-level BPE "
                         f"tokenizers (tokenizer.json) only, and would not write one that tokenizes differently.")
    return None


def write_vocab(writer, vocab: dict | None, config, vocab_size: int) -> str | None:
    """Write `vocab` (from `read_vocab`; None: llama.cpp's `none` vocabulary) into the GGUF `writer`; returns the
    path of the tokenizer written, or None."""
    if vocab is None:
        writer.add_tokenizer_model("none")
        writer.add_vocab_size(vocab_size)
        return None
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
