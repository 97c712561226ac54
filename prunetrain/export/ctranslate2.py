"""CTranslate2 export of pruned translation models (Marian, BART, mBART, M2M-100/NLLB, Pegasus), exact in float32,
checked in the engine itself.

CTranslate2 (OpenNMT's inference engine, `pip install ctranslate2`) reads one query-head count per stack
(`encoder/num_heads`; `decoder/num_heads`, shared by the decoder's self- and cross-attention) and the head size per
layer, so a model whose layers keep different numbers of heads is written **padded**: every attention of a stack gets
the largest head count of that stack (at least one), the added heads having zero query, key and value rows and zero
output-projection columns. Such a head attends somewhere, but its values are zero and its output columns are zero, so
it adds exactly 0 to the layer's output; a layer with no heads left outputs exactly its output projection's bias, as
in PyTorch. The padding is reported (`heads_executed` against `heads_kept`); a layout with the same count in every
encoder layer and the same in every decoder attention runs with none.

FFN neurons need no padding: CTranslate2 builds each layer's FFN from its own weight shapes, so every layer keeps
its pruned width, except that the engine refuses a width of 0: an FFN with no neuron left is written with one zero
neuron (a zero row with zero bias in `linear_0`, a zero column in `linear_1`), which adds exactly 0. That is
reported too (`neurons_executed` against `neurons_kept`, and the widths run per stack, `ffn_widths`).

The weights are mapped by CTranslate2's own transformers loader for BART-style models (its public converter API),
with each family's switches (`prunetrain.export.ctranslate2_families.FAMILIES`: pre-/post-norm, embedding layer
norm, where the position table starts) and what a model trained by prunetrain needs beyond the published checkpoints:
the whole vocabulary is kept in tokenizer order, the decoder starts from its start token's real embedding (Marian's
pad: a tied embedding is trained, so it is not the zero vector OPUS-MT assumes), and the pad token, which
prunetrain's `translate` suppresses, gets an output bias of -inf, so the engine never generates it either. A forced
first token (mBART-50's or NLLB's target language, `generation_config.forced_bos_token_id`) is recorded in
`INFO_FILE` and given to the engine as the target prefix by `translate_ctranslate2`, as CTranslate2 documents it.

Every export is checked before it is moved into place: CTranslate2 scores a probe translation (`score_batch`, the
log-probability of each target token given the source), and in float32 the model's own log-probabilities must agree
within `TOLERANCE`. A quantized type (`int8`, ...) is written from the same checked mapping and its difference is
reported, not bounded.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from prunetrain.engine.heads import find_heads
from prunetrain.export.ctranslate2_families import FAMILIES, decoder_start_id, ffn_width, forced_bos_id, padded_loader
from prunetrain.engine.read_only import modes_kept
from prunetrain.methods.constraints import STACK_OF_KIND
from prunetrain.utils.door import PositiveInt, checked

QUANTIZATIONS = ("float32", "int8", "int8_float32", "int16", "float16", "bfloat16", "int8_float16", "int8_bfloat16")
"""CTranslate2's weight types (`--quantization`); float32 is exact, the others are checked with a looser bound."""
TOLERANCE = 1e-4


@checked
def ctranslate2_reason(model: nn.Module, tokenizer_dir: str | Path | None) -> str | None:
    """None when `model` (with the tokenizer in `tokenizer_dir`) can be written for CTranslate2, else why not."""
    from prunetrain.utils.extras import packages_missing

    missing = packages_missing("ctranslate2")
    if missing:
        return missing
    family_reason = _family_reason(model)
    if family_reason:
        return family_reason
    from prunetrain.engine.mask import attached_masks

    if attached_masks(model):
        return ("the model has head masks attached, which CTranslate2 cannot run; remove the masked heads first "
                "(prunetrain.shrink(model, mask), or `prunetrain shrink`) and export the shrunk model.")
    if tokenizer_dir is None or not (Path(tokenizer_dir) / "tokenizer.json").is_file():
        return ("CTranslate2 needs the model's vocabulary: export from a directory that carries its tokenizer "
                "(tokenizer.json), as save_translation_model and the recipes write it.")
    return None


def _family_reason(model: nn.Module) -> str | None:
    """None when `model`'s family and settings map exactly onto CTranslate2's Transformer spec, else why not."""
    from ctranslate2.converters.transformers import _SUPPORTED_ACTIVATIONS

    config = model.config
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        return (f"CTranslate2 export covers the encoder-decoder translation models {', '.join(sorted(FAMILIES))} "
                f"(model_type); {type(model).__name__} ({model_type or '?'}) is not one.")
    if getattr(model, "lm_head", None) is None or getattr(getattr(model, "model", None), "decoder", None) is None:
        return (f"CTranslate2 translates with the model's language-model head; {type(model).__name__} has none "
                f"(export the ...ForConditionalGeneration / MarianMTModel class).")
    if getattr(config, "decoder_vocab_size", None) not in (None, config.vocab_size):
        return (f"the model has a separate target vocabulary (decoder_vocab_size {config.decoder_vocab_size} against "
                f"vocab_size {config.vocab_size}); the CTranslate2 export writes one shared vocabulary.")
    if model_type == "marian" and getattr(config, "normalize_before", False):
        return "CTranslate2 export covers post-norm Marian models; this one is pre-norm."
    if config.activation_function not in _SUPPORTED_ACTIVATIONS:
        return (f"CTranslate2 has no activation {config.activation_function!r} (it runs "
                f"{', '.join(sorted(_SUPPORTED_ACTIVATIONS))}).")
    start = decoder_start_id(model)
    if start is None or not isinstance(config.pad_token_id, int):
        return "the model states no decoder start token or no pad token, which the CTranslate2 export maps."
    if FAMILIES[model_type].positions_after_pad and start == config.pad_token_id:
        return ("an M2M-100 decoder that starts from the pad token numbers its positions from the next token on, "
                "which CTranslate2 cannot do: set decoder_start_token_id to another token (M2M-100 uses eos).")
    if forced_bos_id(model) == config.pad_token_id:
        return "the model forces the pad token as its first output, which the CTranslate2 export never generates."
    return None


def stack_heads(model: nn.Module) -> dict[str, int]:
    """The query-head count CTranslate2 runs per stack: the largest count kept in it (at least one)."""
    counts = {"encoder": 1, "decoder": 1}
    for site in find_heads(model):
        stack = STACK_OF_KIND[site.kind]
        counts[stack] = max(counts[stack], site.num_heads)
    return counts


def stack_head_dims(model: nn.Module) -> dict[str, int]:
    """The head size of each stack (CTranslate2 reads one per stack here)."""
    dims = {}
    for site in find_heads(model):
        dims.setdefault(STACK_OF_KIND[site.kind], site.head_dim)
    return dims


STACKS = ("encoder", "decoder")


def _layers(model: nn.Module, stack: str) -> list[nn.Module]:
    """The layers of `model`'s "encoder" or "decoder" (`model.model.encoder.layers`, ...)."""
    return list(getattr(model.model, stack).layers)


def stack_ffn_widths(model: nn.Module) -> dict[str, list[int]]:
    """The FFN width CTranslate2 runs in each layer, per stack: the layer's own, at least one (`ffn_width`)."""
    return {stack: [ffn_width(layer) for layer in _layers(model, stack)] for stack in STACKS}


def padding_report(model: nn.Module) -> dict:
    """Heads kept by the model and heads CTranslate2 executes once every attention of a stack is padded; FFN neurons
    kept and executed (one zero neuron in each FFN with none left), and the FFN widths run per stack."""
    counts = stack_heads(model)
    sites = list(find_heads(model))
    widths = stack_ffn_widths(model)
    return {"heads_kept": sum(s.num_heads for s in sites),
            "heads_executed": sum(counts[STACK_OF_KIND[s.kind]] for s in sites),
            "num_heads": counts,
            "neurons_kept": sum(int(layer.fc1.weight.shape[0]) for stack in STACKS for layer in _layers(model, stack)),
            "neurons_executed": sum(sum(w) for w in widths.values()),
            "ffn_widths": widths}


@checked
def export_ctranslate2(model: nn.Module, out: Path, tokenizer_dir: str | Path,
                       quantization: str = "float32") -> dict[str, float | None]:
    """Write `model` to `out` as a CTranslate2 model directory (heads padded per stack, each layer's FFN at its own
    width, at least one neuron) and check it in CTranslate2.

    The float32 conversion is always written and checked first (the weight mapping must be exact: log-probabilities
    within `TOLERANCE`, else nothing is written); a quantized type is then written over it and its difference is
    measured and reported, not bounded (quantization changes the model by design; benchmarks/bench_ctranslate2.py
    measures its BLEU).

    Args:
        model: a (pruned) Marian, BART, mBART, M2M-100 or Pegasus model for conditional generation (see
            `ctranslate2_families.FAMILIES`); it must carry no attached masks.
        out: the directory to create (it must not exist).
        tokenizer_dir: the directory holding the model's tokenizer.json.
        quantization: one of `QUANTIZATIONS`.

    Returns:
        {"max_abs_diff": float32 |Δ log p|, "max_abs_diff_quantized": the quantized type's, or None}.
    """
    from prunetrain.utils.validate import check_choice

    check_choice("quantization", quantization, QUANTIZATIONS)
    reason = ctranslate2_reason(model, tokenizer_dir)
    if reason:
        raise ValueError(f"format: {reason}")
    tokenizer = _load_tokenizer(tokenizer_dir)
    with modes_kept(model):  # the checks run the model in eval mode; the caller's modes are put back
        return _convert_and_check(model, Path(out), tokenizer, quantization)


def _convert_and_check(model: nn.Module, out: Path, tokenizer, quantization: str) -> dict[str, float | None]:
    """`export_ctranslate2` once its arguments are checked. CTranslate2 is only ever given copies of `model`'s
    tensors: its quantization (int8, int16) rescales the arrays it is given in place."""
    from ctranslate2.converters.converter import Converter

    if any(p.dtype != torch.float32 for p in model.parameters()):  # in float32 (each conversion runs on a copy)
        model = copy.deepcopy(model).float()
    model.eval()
    loader = padded_loader(stack_heads(model), stack_head_dims(model), model)

    class _Converter(Converter):
        def _load(self):
            # from a copy: CTranslate2 quantizes (int8, int16) the tensors it is given in place (its
            # specs/model_spec.py: `value *= scale`), and the embeddings and output projection it is given are the
            # model's own: without it an int8 export would change the caller's model (and measure against that)
            return loader(copy.deepcopy(model), tokenizer)

    _Converter().convert(str(out), quantization="float32")
    _write_extras(out, model, tokenizer, quantization)
    diff = score_difference(model, tokenizer, out)
    if not diff <= TOLERANCE:
        raise ValueError(f"format: the CTranslate2 model's log-probabilities differ from the model's by {diff:.3g} "
                         f"(allowed {TOLERANCE:g} in float32); nothing was written.")
    if quantization == "float32":
        return {"max_abs_diff": diff, "max_abs_diff_quantized": None}
    _Converter().convert(str(out), quantization=quantization, force=True)  # replaces the float32 directory
    _write_extras(out, model, tokenizer, quantization)
    return {"max_abs_diff": diff, "max_abs_diff_quantized": score_difference(model, tokenizer, out)}


def _load_tokenizer(directory: str | Path):
    """The fast tokenizer saved in `directory` (local files only)."""
    from transformers import PreTrainedTokenizerFast

    try:
        return PreTrainedTokenizerFast.from_pretrained(str(directory), local_files_only=True)
    except Exception as err:  # a damaged file: json, tokenizers and transformers raise their own types
        raise ValueError(f"source: the tokenizer in {str(directory)!r} could not be read ({type(err).__name__}: "
                         f"{' '.join(str(err).split())[:200]}).") from err


INFO_FILE = "prunetrain_ctranslate2.json"


def _write_extras(out: Path, model: nn.Module, tokenizer, quantization: str) -> None:
    """The tokenizer (CTranslate2 takes tokens; it turns text into them) and what the engine cannot say itself: the
    position limit, the weight type, the forced first target token (`target_prefix`, a token or null) and the
    padding of heads and FFN neurons (`padding_report`, in `INFO_FILE`)."""
    import json

    tokenizer.save_pretrained(out)
    forced = forced_bos_id(model)
    info = {"max_position_embeddings": model.config.max_position_embeddings, "quantization": quantization,
            "target_prefix": None if forced is None else tokenizer.convert_ids_to_tokens(forced),
            **padding_report(model)}
    (out / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


PROBE_SOURCES = ("Ein Mann fährt mit dem Fahrrad durch die Stadt.", "Zwei Hunde spielen im Schnee.")


def score_difference(model: nn.Module, tokenizer, directory: Path) -> float:
    """max |Δ| between CTranslate2's per-token log-probabilities (`score_batch`) and the model's, on the model's own
    greedy translation of `PROBE_SOURCES` (log-softmax with the pad token suppressed, as CTranslate2 runs it)."""
    import ctranslate2

    translator = ctranslate2.Translator(str(directory), device="cpu", inter_threads=1, intra_threads=1)
    batch = tokenizer(list(PROBE_SOURCES), return_tensors="pt", padding=True)
    with torch.no_grad():
        generated = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=16,
                                   suppress_tokens=[model.config.pad_token_id])[:, 1:]
    worst = 0.0
    for i in range(len(PROBE_SOURCES)):
        source_ids = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()
        target_ids = generated[i].tolist()
        if model.config.eos_token_id in target_ids:
            target_ids = target_ids[: target_ids.index(model.config.eos_token_id)]
        target_ids = [t for t in target_ids if t != model.config.pad_token_id]
        ours = _log_probs(model, source_ids, target_ids + [model.config.eos_token_id])
        scored = translator.score_batch([tokenizer.convert_ids_to_tokens(source_ids)],
                                        [tokenizer.convert_ids_to_tokens(target_ids)])[0]
        theirs = torch.tensor(scored.log_probs, dtype=torch.float64)
        if theirs.shape != ours.shape:
            return math.inf
        worst = max(worst, float((theirs - ours).abs().max()))
    return worst


def _log_probs(model: nn.Module, source_ids: list[int], target_ids: list[int]) -> torch.Tensor:
    """log p(target_t | source, target_<t) for each target token (the decoder starts from its start token)."""
    start = decoder_start_id(model)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([source_ids]),
                       decoder_input_ids=torch.tensor([[start] + target_ids[:-1]])).logits[0].double()
    logits[:, model.config.pad_token_id] = -math.inf
    return logits.log_softmax(-1).gather(1, torch.tensor(target_ids).unsqueeze(1)).squeeze(1)


@checked
def translate_ctranslate2(directory: str | Path, sources: Iterable[str], num_beams: PositiveInt = 1,
                          max_new_tokens: PositiveInt | None = None,
                          batch_size: PositiveInt = 32, threads: PositiveInt = 1, length_penalty: float = 1.0,
                          compute_type: str = "default") -> list[str]:
    """Translate `sources` (a list of sentences, or any iterable of them: read once, as `translate` reads them) with
    a CTranslate2 directory written by `export_ctranslate2` (its tokenizer inside): `num_beams` and `length_penalty`
    as in `translate`; `max_new_tokens` (None: as many as the model's positions
    allow, at most 256) bounds every output; `compute_type` is CTranslate2's (e.g. "int8" on a float32 export). A
    forced first token (mBART-50's or NLLB's target language) is given as the target prefix, as `generate` forces it;
    an output may be empty, as in `generate` (CTranslate2's own default, `min_decoding_length=1`, forbids eos first)."""
    import ctranslate2

    from prunetrain.utils.files import read_json
    from prunetrain.utils.validate import check_sentences

    sources = check_sentences("sources", sources)

    info = read_json(Path(directory) / INFO_FILE, "directory")
    positions = info.get("max_position_embeddings")
    if isinstance(positions, bool) or not isinstance(positions, int) or positions < 2:
        raise ValueError(f"directory: {str(Path(directory) / INFO_FILE)!r} states max_position_embeddings "
                         f"{positions!r}; expected a whole number ≥ 2 (written by export_ctranslate2).")
    max_new_tokens = min(max_new_tokens or 256, positions - 1)
    tokenizer = _load_tokenizer(directory)
    translator = ctranslate2.Translator(str(directory), device="cpu", inter_threads=1, intra_threads=threads,
                                        compute_type=compute_type)
    tokens = [tokenizer.convert_ids_to_tokens(tokenizer(s)["input_ids"]) for s in sources]
    prefix = info.get("target_prefix")
    if prefix is not None and not isinstance(prefix, str):
        raise ValueError(f"directory: {str(Path(directory) / INFO_FILE)!r} states target_prefix {prefix!r}; "
                         f"expected a token or null (written by export_ctranslate2).")
    results = translator.translate_batch(tokens, beam_size=num_beams, max_decoding_length=max_new_tokens,
                                         min_decoding_length=0,  # the engine's default 1 forbids eos first
                                         max_batch_size=batch_size, length_penalty=length_penalty,
                                         target_prefix=None if prefix is None else [[prefix]] * len(tokens))
    texts = tokenizer.batch_decode([tokenizer.convert_tokens_to_ids(r.hypotheses[0]) for r in results],
                                   skip_special_tokens=True, clean_up_tokenization_spaces=False)
    return [text.strip() for text in texts]  # as `translate` detokenizes


__all__ = ["QUANTIZATIONS", "ctranslate2_reason", "export_ctranslate2", "padding_report", "stack_ffn_widths",
           "stack_head_dims", "stack_heads", "translate_ctranslate2"]
