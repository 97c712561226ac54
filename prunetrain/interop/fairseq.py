"""fairseq interoperability: prune fairseq-trained Transformer translation models (GitHub issue 8).

Two ways in:

1. **Import** a fairseq checkpoint into Hugging Face `FSMTForConditionalGeneration`, the class transformers ported
   from fairseq's WMT19 Transformer, so every prunetrain tool applies to it:

       model = import_fairseq("checkpoints/checkpoint_best.pt", "data-bin/iwslt14.de-en")   # in memory
       convert_fairseq("checkpoints/checkpoint_best.pt", "data-bin/iwslt14.de-en", "hf-model")  # to a directory

   FSMT computes exactly what fairseq's post-norm `TransformerModel` computes: sinusoidal positions offset by the
   padding index (fairseq's table and `make_positions`), `sqrt(d)` embedding scale (or none with
   `--no-scale-embedding`), post-norm layers without a final encoder/decoder layer norm, separate source/target
   vocabularies, an output projection (tied to every embedding with `--share-all-embeddings`), relu/gelu, q scaled by
   `head_dim**-0.5` after its bias. Marian does *not*: its sinusoids use another frequency base, its positions start
   at 0, and its position table is not saved. FSMT has no pre-norm variant, so `--encoder-normalize-before` /
   `--decoder-normalize-before` models are refused with a clear error (as are learned positions, layernorm_embedding,
   adaptive softmax and differing encoder/decoder widths).

2. **Use the head engine inside fairseq** (no import): `wrap_fairseq(model)` gives an `nn.Module` view that shares
   the fairseq model's modules and that `find_heads`, `HeadMask`, `head_importance` and `shrink` accept; masks act
   through forward pre-hooks on fairseq's own `MultiheadAttention.out_proj`, so fairseq's `SequenceGenerator` and
   training loop see them. `fairseq_importance(model, samples)` computes Michel et al.'s importance from fairseq
   samples. Site names are those of the imported FSMT model (`model.encoder.layers.0.self_attn`, ...), so scores
   and masks carry over between the two worlds unchanged.

Checkpoints are read with `torch.load(..., weights_only=True)` only. fairseq 0.12 stores `cfg` as plain containers
except `cfg["model"]`, an `argparse.Namespace`; older checkpoints store `args` as a Namespace, and some hold
omegaconf `DictConfig` objects or numpy scalars. Those (and only those, see `SAFE_CHECKPOINT_GLOBALS`) are allowed for the
duration of the load through `torch.serialization.safe_globals`, a scoped allow-list: nothing is added to the
process-wide list, and any other pickled global makes the load fail with a `ValueError` naming it.

Tokens: fairseq dictionaries are over the (BPE'd) tokens fairseq-preprocess saw. `convert_fairseq` writes a
whitespace word-level tokenizer per side (source at the top of the directory, target in `target_tokenizer/`): give
it text that went through the same tokenizer/BPE as your training data (e.g. `subword-nmt apply-bpe -c codes`),
and remove the BPE from the output (`translate(..., remove_bpe="@@ ")`, like fairseq's `--remove-bpe`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterable, Mapping, Sequence

import torch
from torch import nn

from prunetrain.engine.families import LinearAttentionAdapter, register
from prunetrain.engine.families.core import declared_subclass, define_subclass, switch_class

SUPPORTED_ARCHS = (
    "transformer",
    "transformer_tiny",
    "transformer_iwslt_de_en",
    "transformer_wmt_en_de",
    "transformer_vaswani_wmt_en_de_big",
    "transformer_vaswani_wmt_en_fr_big",
    "transformer_wmt_en_de_big",
)
"""fairseq `--arch` values that build `TransformerModel` with post-norm defaults. (`transformer_wmt_en_de_big_t2t`
is pre-norm and therefore refused, like any model trained with `--encoder/decoder-normalize-before`.)"""

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_accurate": "gelu_new", "gelu_fast": "gelu_new",
               "tanh": "tanh", "linear": "linear"}
"""fairseq `--activation-fn` → transformers `ACT2FN` name (fairseq's gelu is the exact erf form, `gelu_accurate`
the tanh approximation = transformers' `gelu_new`)."""

SPECIAL_SYMBOLS = ("<s>", "<pad>", "</s>", "<unk>")
"""fairseq `Dictionary` puts these first: bos=0, pad=1, eos=2, unk=3 (what FSMT's config defaults expect)."""

IMPORT_FILE = "fairseq_import.json"
TARGET_TOKENIZER_DIR = "target_tokenizer"
FAIRSEQ_MODEL_TYPE = "fairseq_transformer"


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


# ---------------------------------------------------------------------------------------------------------------------
# reading checkpoints and dictionaries
# ---------------------------------------------------------------------------------------------------------------------
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


def _find_dictionaries(dict_dir, ckpt: FairseqCheckpoint, source_lang, target_lang):
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


# ---------------------------------------------------------------------------------------------------------------------
# fairseq options → FSMTConfig, fairseq tensors → FSMT tensors
# ---------------------------------------------------------------------------------------------------------------------
def _check_architecture(ckpt: FairseqCheckpoint) -> None:
    if ckpt.arch not in SUPPORTED_ARCHS:
        raise ValueError(f"checkpoint: architecture {ckpt.arch!r} (in {str(ckpt.path)!r}) is not supported; "
                         f"supported fairseq architectures: {', '.join(SUPPORTED_ARCHS)} (post-norm Transformer "
                         f"translation models).")
    o = ckpt.option
    refused = [
        (o("encoder_normalize_before", False), "encoder_normalize_before=True (pre-norm; FSMT is post-norm)"),
        (o("decoder_normalize_before", False), "decoder_normalize_before=True (pre-norm; FSMT is post-norm)"),
        (o("layernorm_embedding", False), "layernorm_embedding=True"),
        (o("encoder_learned_pos", False), "encoder_learned_pos=True (FSMT has sinusoidal positions)"),
        (o("decoder_learned_pos", False), "decoder_learned_pos=True (FSMT has sinusoidal positions)"),
        (o("no_token_positional_embeddings", False), "no_token_positional_embeddings=True"),
        (o("adaptive_softmax_cutoff"), "adaptive_softmax_cutoff (adaptive softmax)"),
        (o("no_cross_attention", False), "no_cross_attention=True"),
        (o("cross_self_attention", False), "cross_self_attention=True"),
        (o("encoder_layers_to_keep") or o("decoder_layers_to_keep"), "encoder/decoder_layers_to_keep"),
        (o("activation_fn", "relu") not in ACTIVATIONS,
         f"activation_fn={o('activation_fn')!r} (supported: {', '.join(ACTIVATIONS)})"),
    ]
    d = o("encoder_embed_dim", 512)
    widths = {n: o(n, d) for n in ("decoder_embed_dim", "decoder_output_dim", "decoder_input_dim")}
    if any(w != d for w in widths.values()):
        refused.append((True, f"differing widths (encoder_embed_dim={d}, "
                              + ", ".join(f"{k}={v}" for k, v in widths.items()) + ")"))
    bad = [text for flag, text in refused if flag]
    if bad:
        raise ValueError(f"checkpoint: {str(ckpt.path)!r} (arch {ckpt.arch!r}) uses {'; '.join(bad)}, which "
                         f"FSMTForConditionalGeneration cannot reproduce; supported are post-norm Transformers with "
                         f"sinusoidal positions and equal encoder/decoder widths.")


def fsmt_config_from_fairseq(ckpt: FairseqCheckpoint, src_dict: FairseqDictionary, tgt_dict: FairseqDictionary,
                             langs: tuple[str, str]):
    """The `FSMTConfig` that reproduces `ckpt`'s model (options already checked by `_check_architecture`)."""
    from transformers import FSMTConfig

    o = ckpt.option
    d = int(o("encoder_embed_dim", 512))
    shared = bool(o("share_all_embeddings", False))
    return FSMTConfig(
        langs=list(langs),
        src_vocab_size=len(src_dict),
        tgt_vocab_size=len(tgt_dict),
        activation_function=ACTIVATIONS[o("activation_fn", "relu")],
        d_model=d,
        max_position_embeddings=int(max(o("max_source_positions", 1024), o("max_target_positions", 1024))),
        encoder_ffn_dim=int(o("encoder_ffn_embed_dim", 2048)),
        encoder_layers=int(o("encoder_layers", 6)),
        encoder_attention_heads=int(o("encoder_attention_heads", 8)),
        encoder_layerdrop=float(o("encoder_layerdrop", 0.0)),
        decoder_ffn_dim=int(o("decoder_ffn_embed_dim", o("encoder_ffn_embed_dim", 2048))),
        decoder_layers=int(o("decoder_layers", 6)),
        decoder_attention_heads=int(o("decoder_attention_heads", 8)),
        decoder_layerdrop=float(o("decoder_layerdrop", 0.0)),
        dropout=float(o("dropout", 0.1)),
        attention_dropout=float(o("attention_dropout", 0.0)),
        activation_dropout=float(o("activation_dropout", o("relu_dropout", 0.0))),
        scale_embedding=not bool(o("no_scale_embedding", False)),
        tie_word_embeddings=shared,
        pad_token_id=tgt_dict.pad,
        bos_token_id=tgt_dict.bos,
        eos_token_id=tgt_dict.eos,
        decoder_start_token_id=tgt_dict.eos,  # fairseq's decoder input starts with </s>
        forced_eos_token_id=tgt_dict.eos,
        num_beams=5,
        max_length=200,
        # FSMT's forward only builds the causal mask when use_cache is off: a plain forward with decoder_input_ids
        # must not silently attend to the future. generate() still uses the cache (generation_config.use_cache).
        use_cache=False,
        architectures=["FSMTForConditionalGeneration"],
    )


def _fairseq_state_to_fsmt(ckpt: FairseqCheckpoint) -> dict[str, torch.Tensor]:
    state = dict(ckpt.state_dict)
    if "decoder.output_projection.weight" not in state:  # fairseq < 0.10 naming, or a shared projection
        if "decoder.embed_out" in state:
            state["decoder.output_projection.weight"] = state.pop("decoder.embed_out")
        elif ckpt.option("share_decoder_input_output_embed", False) or ckpt.option("share_all_embeddings", False):
            state["decoder.output_projection.weight"] = state["decoder.embed_tokens.weight"]
    out = {}
    for key, value in state.items():
        if key.endswith(("embed_positions._float_tensor", ".version")):
            continue  # sinusoidal positions are computed; version markers are fairseq bookkeeping
        out[f"model.{key}"] = value
    return out


def import_fairseq(
    checkpoint: str | os.PathLike | FairseqCheckpoint,
    dict_dir: str | os.PathLike,
    *,
    source_lang: str | None = None,
    target_lang: str | None = None,
):
    """Build the `FSMTForConditionalGeneration` (eval mode) that computes what the fairseq checkpoint computes.

    `dict_dir` holds `dict.<source_lang>.txt` and `dict.<target_lang>.txt` (fairseq-preprocess `--destdir`); the
    languages come from the checkpoint's task options unless given. Returns the model; its source/target
    dictionaries are attached as `model.fairseq_dictionaries = (src, tgt)` (plain Python, not saved).
    """
    from transformers import FSMTForConditionalGeneration, GenerationConfig

    ckpt = checkpoint if isinstance(checkpoint, FairseqCheckpoint) else load_fairseq_checkpoint(checkpoint)
    _check_architecture(ckpt)
    src, tgt, src_path, tgt_path = _find_dictionaries(dict_dir, ckpt, source_lang, target_lang)
    src_dict, tgt_dict = FairseqDictionary.load(src_path), FairseqDictionary.load(tgt_path)
    for role, dictionary, key, path in (("source", src_dict, "encoder.embed_tokens.weight", src_path),
                                        ("target", tgt_dict, "decoder.embed_tokens.weight", tgt_path)):
        rows = ckpt.state_dict.get(key)
        if rows is None:
            raise ValueError(f"checkpoint: {str(ckpt.path)!r} has no {key!r}; expected the tensors of a fairseq "
                             f"TransformerModel.")
        if rows.shape[0] != len(dictionary):
            raise ValueError(f"dict_dir: {str(path)!r} has {len(dictionary)} symbols (with the 4 specials) but the "
                             f"checkpoint's {role} embedding has {rows.shape[0]} rows; give the dictionaries the "
                             f"model was trained with.")
        if dictionary.symbols[:4] != list(SPECIAL_SYMBOLS):  # pragma: no cover - FairseqDictionary guarantees it
            raise ValueError(f"dict_dir: {str(path)!r} does not start with {SPECIAL_SYMBOLS}.")
    config = fsmt_config_from_fairseq(ckpt, src_dict, tgt_dict, (src, tgt))
    model = FSMTForConditionalGeneration(config)
    tensors = _fairseq_state_to_fsmt(ckpt)
    expected = {k for k in model.state_dict() if not k.endswith("embed_positions.weight")}
    missing = sorted(expected - set(tensors))
    unexpected = sorted(set(tensors) - set(model.state_dict()))
    if missing or unexpected:
        raise ValueError(f"checkpoint: {str(ckpt.path)!r} does not hold a standard fairseq TransformerModel "
                         f"(missing {[m.removeprefix('model.') for m in missing[:3]]}, unexpected "
                         f"{[u.removeprefix('model.') for u in unexpected[:3]]}).")
    with torch.no_grad():
        params = model.state_dict()
        for key, value in tensors.items():
            if params[key].shape != value.shape:
                raise ValueError(f"checkpoint: tensor {key.removeprefix('model.')!r} has shape {tuple(value.shape)}, "
                                 f"but the options say {tuple(params[key].shape)}.")
            params[key].copy_(value.to(params[key].dtype))
    model.generation_config = GenerationConfig(
        decoder_start_token_id=tgt_dict.eos, bos_token_id=tgt_dict.bos, eos_token_id=tgt_dict.eos,
        pad_token_id=tgt_dict.pad, forced_eos_token_id=tgt_dict.eos,
        # fairseq-generate's defaults: beam 5, max_len_b 200 (+ the forced </s>), min_len 1
        num_beams=5, max_new_tokens=201, min_new_tokens=1,
        suppress_tokens=[tgt_dict.pad],  # fairseq never generates <pad>
        use_cache=True,
    )
    model.eval()
    model.fairseq_dictionaries = (src_dict, tgt_dict)
    return model


# ---------------------------------------------------------------------------------------------------------------------
# tokenizers and a directory on disk
# ---------------------------------------------------------------------------------------------------------------------
def dictionary_tokenizer(dictionary: FairseqDictionary):
    """A transformers fast tokenizer equal to fairseq's `encode_line` on whitespace tokens: word-level over the
    dictionary's symbols, unknown → `<unk>`, `</s>` appended, ids identical to the dictionary's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({s: i for i, s in enumerate(dictionary.symbols)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A $B </s>",
                                                        special_tokens=[("</s>", dictionary.eos)])
    core.decoder = decoders.WordPiece(prefix="\u0000", cleanup=False)  # join tokens with single spaces
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>", padding_side="right")


def convert_fairseq(
    checkpoint: str | os.PathLike,
    dict_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    source_lang: str | None = None,
    target_lang: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the imported model as a directory that both `FSMTForConditionalGeneration.from_pretrained` and
    `prunetrain.load_pruned` read: `config.json`, `model.safetensors`, `generation_config.json`,
    `prunetrain_layout.json`, the source tokenizer (top level, `AutoTokenizer.from_pretrained(out_dir)`), the target
    tokenizer in `target_tokenizer/`, copies of both `dict.*.txt` and `fairseq_import.json` (where it came from).
    """
    from prunetrain.engine.persist import save_pruned

    model = import_fairseq(checkpoint, dict_dir, source_lang=source_lang, target_lang=target_lang)
    src_dict, tgt_dict = model.fairseq_dictionaries
    src, tgt = model.config.langs
    out = save_pruned(model, out_dir, overwrite=overwrite)
    dictionary_tokenizer(src_dict).save_pretrained(out)
    dictionary_tokenizer(tgt_dict).save_pretrained(out / TARGET_TOKENIZER_DIR)
    for lang in (src, tgt):
        shutil.copyfile(Path(dict_dir) / f"dict.{lang}.txt", out / f"dict.{lang}.txt")
    ckpt_path = Path(checkpoint.path if isinstance(checkpoint, FairseqCheckpoint) else checkpoint)
    (out / IMPORT_FILE).write_text(json.dumps({
        "format": "prunetrain.fairseq_import/1",
        "checkpoint": str(ckpt_path.resolve()),
        "source_lang": src, "target_lang": tgt,
        "tokens": "whitespace tokens of the fairseq dictionaries: apply the training tokenizer/BPE before, "
                  "remove the BPE after (e.g. remove_bpe='@@ ')",
    }, indent=1))
    return out


def load_fairseq_tokenizers(path: str | os.PathLike):
    """`(source_tokenizer, target_tokenizer)` of a directory written by `convert_fairseq`."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not (path / TARGET_TOKENIZER_DIR).is_dir():
        raise ValueError(f"path: {str(path)!r} has no {TARGET_TOKENIZER_DIR}/; expected a directory written by "
                         f"prunetrain.interop.fairseq.convert_fairseq.")
    return AutoTokenizer.from_pretrained(path), AutoTokenizer.from_pretrained(path / TARGET_TOKENIZER_DIR)


def translate(model, sentences: Sequence[str], source_tokenizer, target_tokenizer, *, num_beams: int | None = None,
              max_new_tokens: int | None = None, remove_bpe: str | None = None, batch_size: int = 32) -> list[str]:
    """Translate pre-tokenized (BPE'd) `sentences` with an imported model; `remove_bpe="@@ "` undoes subword-nmt.

    `num_beams` / `max_new_tokens` default to the model's generation config (fairseq-generate's 5 and 200 + `</s>`).
    """
    options = {k: v for k, v in (("num_beams", num_beams), ("max_new_tokens", max_new_tokens)) if v is not None}
    device = next(model.parameters()).device
    out: list[str] = []
    for start in range(0, len(sentences), batch_size):
        batch = source_tokenizer(list(sentences[start:start + batch_size]), return_tensors="pt", padding=True)
        with torch.no_grad():
            generated = model.generate(input_ids=batch["input_ids"].to(device),
                                       attention_mask=batch["attention_mask"].to(device),
                                       **options)
        for row in generated[:, 1:]:  # drop the decoder start token (</s>)
            text = target_tokenizer.decode(row, skip_special_tokens=True)
            if remove_bpe:
                text = (text + " ").replace(remove_bpe, "").rstrip()
            out.append(text)
    return out


def hf_batch_from_fairseq(sample: Mapping, pad: int = 1) -> dict[str, torch.Tensor]:
    """A fairseq translation sample → the equivalent transformers batch for an imported model.

    Source rows are moved to right padding (fairseq left-pads sources; positions count non-pad tokens in both, so
    the real tokens see the same positions), `decoder_input_ids` are fairseq's `prev_output_tokens` (`</s>` first),
    and `labels` are the targets with `<pad>` → -100.
    """
    net = sample["net_input"]
    src = net["src_tokens"]
    real = src.ne(pad)
    order = torch.argsort((~real).to(torch.int8), dim=1, stable=True)  # real tokens first, in order
    input_ids = src.gather(1, order)
    target = sample["target"]
    return {
        "input_ids": input_ids,
        "attention_mask": input_ids.ne(pad).long(),
        "decoder_input_ids": net["prev_output_tokens"],
        "labels": target.masked_fill(target.eq(pad), -100),
    }


# ---------------------------------------------------------------------------------------------------------------------
# head engine directly on fairseq models
# ---------------------------------------------------------------------------------------------------------------------
_CONFIG_ATTR = "_prunetrain_head_config"


class FairseqHeadConfig(SimpleNamespace):
    """The little `config` prunetrain's engine reads (`model_type`, `is_encoder_decoder`, head counts); `shrink`
    records the kept heads on it like on a transformers config."""


class FairseqTransformer(nn.Module):
    """A view of a fairseq encoder-decoder model that prunetrain's engine accepts (`find_heads`, `HeadMask`,
    `head_importance`, `shrink`, ...). It *shares* the fairseq model's modules (as `.model`): masks attached to the
    view hook fairseq's own `out_proj` modules and act in `fairseq_model(...)`, `SequenceGenerator` and training;
    `shrink(view, mask)` shrinks the fairseq model in place. `forward` is fairseq's.

    Site names are `model.encoder.layers.{i}.self_attn`, `model.decoder.layers.{i}.self_attn` and
    `model.decoder.layers.{i}.encoder_attn`, the names of the same sites in the imported FSMT model.
    """

    def __init__(self, fairseq_model: nn.Module):
        super().__init__()
        encoder, decoder = getattr(fairseq_model, "encoder", None), getattr(fairseq_model, "decoder", None)
        if encoder is None or decoder is None or not hasattr(encoder, "layers") or not hasattr(decoder, "layers"):
            raise ValueError(f"model: {type(fairseq_model).__name__} is not a fairseq encoder-decoder Transformer "
                             f"(expected .encoder.layers and .decoder.layers, as fairseq's TransformerModel has).")
        self.model = fairseq_model
        attentions = [m for m in fairseq_model.modules() if _is_fairseq_attention(m)]
        if not attentions:
            raise ValueError(f"model: {type(fairseq_model).__name__} has no fairseq MultiheadAttention modules.")
        for module in attentions:
            # fairseq's fast path (F.multi_head_attention_forward) reads out_proj.weight directly, so hooks on
            # out_proj would not fire there, and it cannot run with fewer heads; this flag selects fairseq's own
            # Python path (the one fairseq's head pruning uses).
            if hasattr(module, "skip_embed_dim_check"):
                module.skip_embed_dim_check = True
        enc_heads = [m.num_heads for m in encoder.modules() if _is_fairseq_attention(m)]
        dec_heads = [m.num_heads for m in decoder.modules() if _is_fairseq_attention(m)]
        args = getattr(fairseq_model, "args", None) or getattr(fairseq_model, "cfg", None)
        config = fairseq_model.__dict__.get(_CONFIG_ATTR)
        if config is None:  # kept on the fairseq model, so that every view shares shrink's record of kept heads
            config = FairseqHeadConfig(
                model_type=FAIRSEQ_MODEL_TYPE,
                is_encoder_decoder=True,
                encoder_attention_heads=int(getattr(args, "encoder_attention_heads", None)
                                            or max(enc_heads, default=0)),
                decoder_attention_heads=int(getattr(args, "decoder_attention_heads", None)
                                            or max(dec_heads, default=0)),
            )
            fairseq_model.__dict__[_CONFIG_ATTR] = config
        self.config = config

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)


def _is_fairseq_attention(module: nn.Module) -> bool:
    """fairseq's `MultiheadAttention` (or our empty form of it); torch's own `nn.MultiheadAttention` is not."""
    cls = type(module)
    return cls.__name__ in FairseqAdapter.module_classes and any(
        c.__module__.startswith("fairseq.") for c in cls.__mro__)


def wrap_fairseq(fairseq_model: nn.Module) -> FairseqTransformer:
    """The engine view of a fairseq Transformer (see `FairseqTransformer`); cheap, shares every module."""
    if isinstance(fairseq_model, FairseqTransformer):
        return fairseq_model
    return FairseqTransformer(fairseq_model)


def _empty_forward(self, query, key=None, value=None, *args, **kwargs):
    """Every head removed: the site adds only its output-projection bias (`out_proj` of a `[T, B, 0]` input, so
    hooks on `out_proj` still run). Nothing is cached; the inherited incremental-state methods see empty buffers."""
    tgt_len, bsz, _ = query.size()  # fairseq is time-first: [T, B, E]
    return self.out_proj(query.new_zeros(tgt_len, bsz, 0)), None


def _multihead_attention() -> type:
    from fairseq.modules.multihead_attention import MultiheadAttention

    return MultiheadAttention


EMPTY_FAIRSEQ = define_subclass("EmptyFairseqAttention", _multihead_attention, forward=_empty_forward)
"""`EmptyFairseqAttention`: fairseq's `MultiheadAttention` for a site with no heads left (fairseq's forward cannot
reshape zero heads), declared with the engine's one class-switch mechanism (`prunetrain.engine.families.core`);
built lazily because fairseq is optional, and resolvable by name for pickles."""


def __getattr__(name: str):
    """The lazily built attention subclasses, by name (so that pickles of shrunk models find them)."""
    if name == EMPTY_FAIRSEQ:
        return declared_subclass(name)
    if name in ("PrunableFSMTAttention", "FSMTAdapter"):  # moved to prunetrain.engine.families.fsmt
        from prunetrain.engine.families import fsmt

        return getattr(fsmt, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@register
class FairseqAdapter(LinearAttentionAdapter):
    """fairseq's `MultiheadAttention` (via `wrap_fairseq`): `q_proj/k_proj/v_proj/out_proj`, reshapes with
    `num_heads`, output width `embed_dim` (both updated on shrink, as fairseq's own head pruning does)."""

    name = "fairseq"
    model_types = (FAIRSEQ_MODEL_TYPE,)
    time_first = True
    module_classes = ("MultiheadAttention", "EmptyFairseqAttention")
    count_attrs = ("num_heads",)
    width_attrs = ("embed_dim",)

    def sites(self, model):
        return [s for s in super().sites(model) if _is_fairseq_attention(s.module)]

    def original_num_heads(self, model, kind):
        c = model.config
        return c.encoder_attention_heads if kind == "encoder_self" else c.decoder_attention_heads

    def remove_heads(self, site, keep, select):
        super().remove_heads(site, keep, select)
        if len(keep) == 0:
            # fairseq's MultiheadAttention cannot reshape zero heads (`view(-1, 0, d)`): same object, new class
            switch_class(site.module, EMPTY_FAIRSEQ)


def fairseq_loss(model: nn.Module, sample: Mapping) -> tuple[torch.Tensor, float]:
    """`(mean token NLL, number of target tokens)` of a fairseq translation sample: the unsmoothed cross-entropy over
    non-pad targets (the loss an imported model's `labels` give). Usable as `loss_fn` of `prunetrain.methods.importance`."""
    net = model.model if isinstance(model, FairseqTransformer) else model
    device = next(net.parameters()).device
    net_input = {k: v.to(device) if torch.is_tensor(v) else v for k, v in sample["net_input"].items()}
    target = sample["target"].to(device)
    pad = net.decoder.dictionary.pad() if hasattr(net.decoder, "dictionary") else 1
    output = net(**net_input)
    lprobs = net.get_normalized_probs(output, log_probs=True)
    n = int(target.ne(pad).sum())
    loss = nn.functional.nll_loss(lprobs.reshape(-1, lprobs.size(-1)).float(), target.reshape(-1),
                                  ignore_index=pad, reduction="sum")
    return loss / max(n, 1), float(n)


def fairseq_importance(fairseq_model: nn.Module, samples: Iterable[Mapping], **options):
    """Michel et al. (2019) head importance of a fairseq Transformer from fairseq samples (`net_input` + `target`),
    computed by `prunetrain.importance.head_importance` through hooks on fairseq's `out_proj` modules.

    `options` are `head_importance`'s (`normalize`, `reduction`, `max_batches`, `autocast`, ...); `per="example"` is
    refused because fairseq's attention is time-first. Returns `HeadScores` whose site names equal the imported FSMT
    model's, so they compare (and select masks) directly.
    """
    from prunetrain.methods.importance import head_importance

    if options.get("per", "batch") != "batch":
        raise ValueError(f"per: {options['per']!r} is not supported for fairseq models (time-first attention); "
                         f"use per='batch'.")
    options.pop("per", None)
    loss_fn = options.pop("loss_fn", fairseq_loss)
    return head_importance(wrap_fairseq(fairseq_model), samples, loss_fn=loss_fn, per="batch", **options)


__all__ = [
    "ACTIVATIONS",
    "FSMTAdapter",
    "FairseqAdapter",
    "FairseqCheckpoint",
    "FairseqDictionary",
    "FairseqTransformer",
    "SAFE_CHECKPOINT_GLOBALS",
    "SUPPORTED_ARCHS",
    "convert_fairseq",
    "dictionary_tokenizer",
    "fairseq_importance",
    "fairseq_loss",
    "fsmt_config_from_fairseq",
    "hf_batch_from_fairseq",
    "import_fairseq",
    "load_fairseq_checkpoint",
    "load_fairseq_tokenizers",
    "translate",
    "wrap_fairseq",
]
