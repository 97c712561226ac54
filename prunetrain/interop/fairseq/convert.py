"""A fairseq checkpoint as the Hugging Face `FSMTForConditionalGeneration` that computes the same thing
(`import_fairseq`, `convert_fairseq` to a directory with word-level tokenizers over the fairseq dictionaries), and
translating or building batches with it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Mapping, Sequence

import torch

from prunetrain.interop.fairseq.checkpoint import (SPECIAL_SYMBOLS, FairseqCheckpoint, FairseqDictionary,
                                                   find_dictionaries, load_fairseq_checkpoint)

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

IMPORT_FILE = "fairseq_import.json"
TARGET_TOKENIZER_DIR = "target_tokenizer"


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
    src, tgt, src_path, tgt_path = find_dictionaries(dict_dir, ckpt, source_lang, target_lang)
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


__all__ = ["ACTIVATIONS", "SUPPORTED_ARCHS", "convert_fairseq", "dictionary_tokenizer", "fsmt_config_from_fairseq",
           "hf_batch_from_fairseq", "import_fairseq", "load_fairseq_tokenizers", "translate"]
