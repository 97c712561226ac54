"""Reading fairseq files without fairseq: checkpoints (`load_fairseq_checkpoint`, `torch.load(..., weights_only=True)`
with a scoped allow-list of the plain-data types fairseq pickles) and dictionaries (`FairseqDictionary`, and which
`dict.<lang>.txt` files a data directory holds for a checkpoint's languages)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import torch

SPECIAL_SYMBOLS = ("<s>", "<pad>", "</s>", "<unk>")
"""fairseq `Dictionary` puts these first: bos=0, pad=1, eos=2, unk=3 (what FSMT's config defaults expect)."""


def _safe_checkpoint_globals() -> list:
    """The harmless non-tensor types fairseq checkpoints pickle, allowed only while `load_fairseq_checkpoint` runs.

    - `argparse.Namespace`: fairseq 0.12 stores `cfg["model"]` (and old versions `args`) as one;
    - omegaconf's `DictConfig`/`ListConfig`, their nodes and metadata, and the types their pickles reference
      (`collections.defaultdict`, `typing.Any`, `int`, `dict`, `list`): checkpoints whose `cfg` was saved as omegaconf
      objects (their state is plain data; no user code runs);
    - numpy arrays, scalars and dtypes (`_reconstruct`, `ndarray`, `scalar`, `dtype`): metrics of some versions.
    """
    import collections
    import typing

    allowed: list = [argparse.Namespace, collections.defaultdict, typing.Any, int, dict, list]
    try:
        from omegaconf import DictConfig, ListConfig, nodes
        from omegaconf.base import ContainerMetadata, Metadata

        allowed += [DictConfig, ListConfig, ContainerMetadata, Metadata]
        allowed += [getattr(nodes, n) for n in ("AnyNode", "StringNode", "IntegerNode", "FloatNode", "BooleanNode",
                                                "BytesNode", "PathNode", "ValueNode") if hasattr(nodes, n)]
    except ImportError:  # pragma: no cover - omegaconf comes with fairseq, not with prunetrain
        pass
    try:
        import numpy as np

        core = getattr(np, "_core", None) or np.core
        allowed += [core.multiarray._reconstruct, core.multiarray.scalar, np.ndarray, np.dtype]
        allowed += [type(np.dtype(t)) for t in (np.float64, np.float32, np.float16, np.int64, np.int32, np.bool_)]
    except (ImportError, AttributeError):  # pragma: no cover
        pass
    return allowed


SAFE_CHECKPOINT_GLOBALS = ("argparse.Namespace", "omegaconf containers, nodes and metadata", "numpy arrays/scalars")
"""Documented form of `_safe_checkpoint_globals()`: everything else pickled in a checkpoint is refused."""


@dataclass
class FairseqCheckpoint:
    """What prunetrain needs from a fairseq checkpoint: the model options (flat, as `--arch` defaults resolved them),
    the task options and the model's tensors."""

    path: Path
    arch: str
    model_cfg: dict
    task_cfg: dict
    state_dict: dict[str, torch.Tensor]
    extra: dict = field(default_factory=dict)

    def option(self, name: str, default: Any = None) -> Any:
        value = self.model_cfg.get(name, default)
        return default if value is None else value


def _plain(obj: Any) -> Any:
    """Namespace / DictConfig / nested containers → plain dicts and lists."""
    if isinstance(obj, argparse.Namespace):
        return {k: _plain(v) for k, v in vars(obj).items()}
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(obj, (DictConfig, ListConfig)):
            return OmegaConf.to_container(obj, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def load_fairseq_checkpoint(path: str | os.PathLike) -> FairseqCheckpoint:
    """Read a fairseq translation checkpoint safely (`weights_only=True`; see the module docstring).

    Raises `ValueError` (one sentence naming `checkpoint`, the value and what is expected) for a missing file, a file
    that is not a torch checkpoint, a checkpoint that is not fairseq's (no `model` state dict, no `cfg`/`args`) and a
    checkpoint that pickles anything besides tensors, containers and the types in `SAFE_CHECKPOINT_GLOBALS`.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"checkpoint: {str(path)!r} does not exist or is not a file; expected a fairseq checkpoint "
                         f"such as checkpoints/checkpoint_best.pt.")
    try:
        with torch.serialization.safe_globals(_safe_checkpoint_globals()):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # every failure becomes one clear sentence
        unsafe = _unsafe_globals(path)
        if unsafe:
            raise ValueError(
                f"checkpoint: {str(path)!r} pickles {', '.join(unsafe[:3])}, which prunetrain does not unpickle "
                f"(it loads with weights_only=True and allows only tensors, containers and "
                f"{'; '.join(SAFE_CHECKPOINT_GLOBALS)}); re-save the checkpoint with plain-data args/cfg."
            ) from error
        raise ValueError(f"checkpoint: {str(path)!r} is not a readable torch checkpoint "
                         f"({type(error).__name__}: {str(error).splitlines()[0][:160]}); expected a fairseq "
                         f"checkpoint*.pt.") from error
    if not isinstance(state, Mapping) or not isinstance(state.get("model"), Mapping):
        keys = ", ".join(map(str, list(state)[:6])) if isinstance(state, Mapping) else type(state).__name__
        raise ValueError(f"checkpoint: {str(path)!r} is not a fairseq checkpoint (expected a dict with 'model' and "
                         f"'cfg' or 'args', got {keys or 'an empty dict'}).")
    cfg = _plain(state.get("cfg")) if state.get("cfg") is not None else None
    args = _plain(state.get("args")) if state.get("args") is not None else None
    if cfg is not None and isinstance(cfg.get("model"), Mapping):
        model_cfg = dict(cfg["model"])
        task_cfg = dict(cfg.get("task") or {})
        arch = model_cfg.get("_name") or model_cfg.get("arch")
    elif args is not None:
        model_cfg, task_cfg = dict(args), dict(args)
        arch = args.get("arch")
    else:
        raise ValueError(f"checkpoint: {str(path)!r} is not a fairseq checkpoint (it has a 'model' state dict but "
                         f"neither 'cfg' with a 'model' section nor 'args', so its architecture is unknown).")
    tensors = {k: v for k, v in state["model"].items() if torch.is_tensor(v)}
    return FairseqCheckpoint(path=path, arch=str(arch), model_cfg=model_cfg, task_cfg=task_cfg, state_dict=tensors)


def _unsafe_globals(path: Path) -> list[str]:
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001 - not a zip checkpoint at all
        return []
    allowed = {f"{t.__module__}.{t.__qualname__}" for t in _safe_checkpoint_globals() if hasattr(t, "__qualname__")}
    return sorted(g for g in found if g not in allowed)


class FairseqDictionary:
    """A fairseq `Dictionary` read from `dict.<lang>.txt` (no fairseq needed): `<s> <pad> </s> <unk>` first, then
    one symbol per line in file order (`symbol count [#fairseq:overwrite]`)."""

    def __init__(self, symbols: Sequence[str]):
        self.symbols = list(symbols)
        self.indices = {s: i for i, s in enumerate(self.symbols)}
        self.bos, self.pad, self.eos, self.unk = (self.indices[s] for s in SPECIAL_SYMBOLS)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "FairseqDictionary":
        symbols = list(SPECIAL_SYMBOLS)
        indices = {s: i for i, s in enumerate(symbols)}
        # split at "\n" only, as fairseq reads the file (str.splitlines would also break at U+2028, form feeds, ...)
        for number, line in enumerate(Path(path).read_text(encoding="utf-8").split("\n"), 1):
            line = line.rstrip("\r")
            if not line.strip():
                continue
            overwrite = line.endswith(" #fairseq:overwrite")
            if overwrite:
                line = line[: -len(" #fairseq:overwrite")]
            word, sep, count = line.rpartition(" ")
            if not sep or not count.lstrip("-").isdigit():
                raise ValueError(f"dict_dir: line {number} of {str(path)!r} is not '<symbol> <count>' "
                                 f"(got {line[:60]!r}); expected a dictionary written by fairseq-preprocess.")
            if word in indices and not overwrite:
                raise ValueError(f"dict_dir: {str(path)!r} repeats the symbol {word!r} (line {number}) without "
                                 f"'#fairseq:overwrite'; expected a dictionary written by fairseq-preprocess.")
            if word not in indices:
                indices[word] = len(symbols)
                symbols.append(word)
        return cls(symbols)

    def __len__(self) -> int:
        return len(self.symbols)

    def encode(self, line: str, append_eos: bool = True) -> list[int]:
        """fairseq's `encode_line`: whitespace tokens → indices (unknown → `<unk>`), then `</s>`."""
        ids = [self.indices.get(token, self.unk) for token in line.split()]
        return ids + [self.eos] if append_eos else ids

    def decode(self, ids: Iterable[int], remove_bpe: str | None = None) -> str:
        """Indices → text, stopping at `</s>` and skipping `<pad>`/`<s>`; `remove_bpe="@@ "` joins subwords."""
        words = []
        for i in ids:
            i = int(i)
            if i == self.eos:
                break
            if i in (self.pad, self.bos):
                continue
            words.append(self.symbols[i])
        text = " ".join(words)
        if remove_bpe:
            text = (text + " ").replace(remove_bpe, "").rstrip()
        return text


def _language_pairs(data_dir: Path) -> set[tuple[str, str]]:
    """Language pairs of fairseq-preprocess output (`train.de-en.de.idx`), as fairseq's `infer_language_pair`."""
    pairs = set()
    for path in data_dir.glob("*.idx"):
        parts = path.name.split(".")
        if len(parts) >= 4 and parts[1].count("-") == 1:
            a, b = parts[1].split("-")
            pairs.add((a, b))
    return pairs


def find_dictionaries(dict_dir, ckpt: FairseqCheckpoint, source_lang, target_lang):
    """`(source_lang, target_lang, source dictionary path, target dictionary path)` in `dict_dir`: the languages given,
    else the checkpoint's, else the one language pair of the binarized data there."""
    if dict_dir is None:
        raise ValueError("dict_dir: None is not allowed; give the fairseq data directory that holds dict.<src>.txt "
                         "and dict.<tgt>.txt (the fairseq-preprocess --destdir).")
    dict_dir = Path(dict_dir)
    if not dict_dir.is_dir():
        raise ValueError(f"dict_dir: {str(dict_dir)!r} is not a directory; give the fairseq data directory that holds "
                         f"dict.<src>.txt and dict.<tgt>.txt (the fairseq-preprocess --destdir).")
    src = source_lang or ckpt.task_cfg.get("source_lang")
    tgt = target_lang or ckpt.task_cfg.get("target_lang")
    found = sorted(p.name for p in dict_dir.glob("dict.*.txt"))
    if not found:
        raise ValueError(f"dict_dir: {str(dict_dir)!r} has no dict.*.txt files; expected the fairseq data directory "
                         f"with dict.<src>.txt and dict.<tgt>.txt as written by fairseq-preprocess.")
    if not src or not tgt:
        pairs = _language_pairs(dict_dir)
        if len(pairs) != 1:
            why = (f"holds several language pairs {sorted(pairs)}" if pairs
                   else "has no binarized data (<split>.<src>-<tgt>.<lang>.idx) to infer them from")
            raise ValueError(f"source_lang/target_lang: the checkpoint does not record them and {str(dict_dir)!r} "
                             f"{why}; pass both, e.g. source_lang='de', target_lang='en' (dictionaries there: "
                             f"{', '.join(found)}).")
        (src, tgt), = pairs
    paths = []
    for role, lang in (("source", src), ("target", tgt)):
        path = dict_dir / f"dict.{lang}.txt"
        if not path.is_file():
            raise ValueError(f"dict_dir: {str(dict_dir)!r} has no dict.{lang}.txt (the {role} dictionary for "
                             f"{role}_lang {lang!r}); it holds {', '.join(found) or 'no dict.*.txt files'}, expected "
                             f"dict.{src}.txt and dict.{tgt}.txt as written by fairseq-preprocess.")
        paths.append(path)
    return str(src), str(tgt), paths[0], paths[1]


__all__ = ["SAFE_CHECKPOINT_GLOBALS", "SPECIAL_SYMBOLS", "FairseqCheckpoint", "FairseqDictionary", "find_dictionaries",
           "load_fairseq_checkpoint"]
