"""Translating with (pruned) seq2seq models and scoring them with sacreBLEU.

    hyps = translate(model, tokenizer, sources)                     # batched greedy / beam search
    scores = evaluate_bleu(model, tokenizer, pairs)                 # BLEU + chrF with sacreBLEU signatures
    scores = evaluate_directory(run_dir / "pruned", data_dir / "multi30k", "test")

Scores are computed on detokenized text (the tokenizer's decoder gives back plain text), with sacreBLEU's defaults
(BLEU: 13a tokenization, exp smoothing, cased; chrF: n=6, beta=2), so they are comparable with published numbers.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from pathlib import Path
from typing import Iterable, Sequence

import torch
from torch import nn

from prunetrain.utils.device import bf16_is_fast, device_of
from prunetrain.utils.progress import bar
from prunetrain.utils.validate import check_bool, check_int, check_sentences, short_repr

DEFAULT_MAX_LEN_A = 1.5
DEFAULT_MAX_LEN_B = 10


def _use_bf16(autocast_bf16: bool | str, device: torch.device) -> bool:
    """Resolve `autocast_bf16` (True, False or "auto": bf16 only where the hardware has native bf16; without it
    PyTorch emulates bf16 on CPU and generation is several times slower than fp32, see `prunetrain.utils.device`)."""
    if autocast_bf16 == "auto":
        return bf16_is_fast(device)
    if not isinstance(autocast_bf16, bool):
        raise ValueError(f"autocast_bf16 must be True, False or 'auto', not {autocast_bf16!r}.")
    return autocast_bf16


def _length_caps(lengths: Sequence[int], max_new_tokens: int | None, limit: int | None) -> list[int]:
    if max_new_tokens is not None:
        caps = [int(max_new_tokens)] * len(lengths)
    else:
        caps = [math.ceil(DEFAULT_MAX_LEN_A * n) + DEFAULT_MAX_LEN_B for n in lengths]
    return [min(c, limit) if limit else c for c in caps]


def _check_lengths(encoded: Sequence[Sequence[int]], limit: int | None) -> None:
    """A source longer than the model's positions cannot be encoded: one clear error before any generation."""
    if not limit:
        return
    for index, ids in enumerate(encoded):
        if len(ids) > limit:
            raise ValueError(f"sources: sentence {index + 1} has {len(ids)} tokens, more than the model's {limit} "
                             f"positions; shorten it or pass max_source_length={limit} to truncate.")


def _sorted_batches(tokenizer, encoded: Sequence[Sequence[int]], batch_size: int, limit: int | None,
                    max_new_tokens: int | None, desc: str | None = None):
    """The batches both translators run: sources sorted by length (longest first; stable, ties keep input order),
    padded: an iterator of (rows, padded batch, each row's new-token bound `_length_caps`). The lengths are checked
    here, before any batch runs. `desc` shows a progress bar."""
    _check_lengths(encoded, limit)
    caps = _length_caps([len(ids) for ids in encoded], max_new_tokens, limit - 1 if limit else None)
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    starts = range(0, len(order), batch_size)

    def batches():
        for start in (bar(starts, total=len(starts), desc=desc, unit="batch") if desc else starts):
            rows = order[start:start + batch_size]
            yield rows, tokenizer.pad({"input_ids": [encoded[i] for i in rows]}, return_tensors="pt"), \
                [caps[i] for i in rows]

    return batches()


def _check_sources(sources) -> list[str]:
    """The sentences to translate as a list of str (`prunetrain.utils.validate.check_sentences`)."""
    return check_sentences("sources", sources)


def _check_pairs(pairs) -> list[tuple[str, str]]:
    """Sentence pairs as a list of (source, reference) str pairs: a bare string or a pair of another shape is
    refused, never unpacked character by character."""
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Iterable):
        raise ValueError(f"pairs: {short_repr(pairs)} is not a list of (source, reference) pairs.")
    pairs = list(pairs)
    for index, pair in enumerate(pairs):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
            raise ValueError(f"pairs: item {index + 1} is {short_repr(pair)}, not a (source, reference) pair of str.")
    return pairs


def _check_decoding(batch_size, num_beams, max_new_tokens=None, max_source_length=None, suppress_pad=True) -> None:
    """The decoding settings `translate` and `translate_onnx` share: counts are ints (not bools) >= 1."""
    check_int("batch_size", batch_size, 1)
    check_int("num_beams", num_beams, 1)
    if max_new_tokens is not None:
        check_int("max_new_tokens", max_new_tokens, 1)
    if max_source_length is not None:
        check_int("max_source_length", max_source_length, 1)
    check_bool("suppress_pad", suppress_pad)


def _torch_device(device) -> torch.device:
    """`device` as a torch.device, or one line naming the argument (torch's own error lists its whole grammar)."""
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device: {device!r} is not a device; expected e.g. 'cpu', 'cuda' or 'cuda:0'.") from None


def _decode_rows(tokenizer, outputs: list, rows: Sequence[int], pieces) -> None:
    """Detokenize `pieces` (token id lists) into `outputs` at their input positions `rows`."""
    texts = tokenizer.batch_decode(pieces, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    for i, text in zip(rows, texts):
        outputs[i] = text.strip()


def translate(model: nn.Module, tokenizer, sources: Sequence[str], *, batch_size: int = 64, num_beams: int = 1,
              max_new_tokens: int | None = None, autocast_bf16: bool | str = False,
              device: str | torch.device | None = None, max_source_length: int | None = None,
              suppress_pad: bool = True, **generate_kwargs) -> list[str]:
    """Translate `sources` with `model.generate`; returns detokenized strings in the order of `sources`.

    - Sentences are sorted by source length (longest first) and run in batches of `batch_size`, so each batch
      holds little padding; the output is put back in the input order.
    - `max_new_tokens=None` gives each sentence its own bound, ceil(1.5 · source tokens) + 10 (capped by the
      model's `max_position_embeddings`). With greedy search (`num_beams=1`) a sentence's output is exactly what
      it would be alone (greedy is prefix-consistent, so a batch runs to its longest bound and each row is cut to
      its own; models whose generation config forces EOS at the length limit, like converted OPUS-MT checkpoints,
      may differ in the last token of a truncated output). With beam search the batch's largest bound is used.
    - `suppress_pad` (default): the pad token, which Marian uses as decoder start, is never generated (Marian's
      own checkpoints do the same with `bad_words_ids=[[pad]]`).
    - `autocast_bf16=True` runs under `torch.autocast(dtype=torch.bfloat16)`: about 1.35× faster on an AMD CPU
      with `avx512_bf16` (2 cores), but several times *slower* on an AVX2-only CPU; `"auto"` uses it only where the
      hardware has native bf16 (`prunetrain.utils.device.bf16_is_fast`: avx512_bf16/AMX CPUs, bf16-capable CUDA).
    - The model runs under `torch.inference_mode()` in eval mode; its train/eval mode (and, if `device` moved it,
      its device) is restored afterwards. Extra keyword arguments go to `generate` (e.g. `min_new_tokens`).
    Any attached `HeadMask` hooks stay active, so `with mask.applied(model): translate(...)` scores a masked model.
    """
    sources = _check_sources(sources)
    _check_decoding(batch_size, num_beams, max_new_tokens, max_source_length, suppress_pad)
    if not sources:
        return []
    if tokenizer.pad_token_id is None:
        raise ValueError("translate: the tokenizer has no pad token; batched generation needs one.")
    if not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        raise ValueError(f"translate: needs an encoder-decoder model (e.g. MarianMTModel), not {type(model).__name__}.")
    original_device = device_of(model)
    device = _torch_device(device) if device is not None else original_device
    was_training = model.training

    encoded = tokenizer(sources, truncation=max_source_length is not None, max_length=max_source_length,
                        return_attention_mask=False, verbose=False)["input_ids"]
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    batches = _sorted_batches(tokenizer, encoded, batch_size, limit, max_new_tokens, desc="translate")
    kwargs = dict(num_beams=num_beams, do_sample=False)
    if suppress_pad and "suppress_tokens" not in generate_kwargs and "bad_words_ids" not in generate_kwargs:
        kwargs["suppress_tokens"] = [tokenizer.pad_token_id]
    kwargs.update(generate_kwargs)
    autocast_bf16 = _use_bf16(autocast_bf16, device)
    autocast = (torch.autocast(device_type=device.type, dtype=torch.bfloat16) if autocast_bf16
                else contextlib.nullcontext())
    outputs: list[str | None] = [None] * len(sources)
    try:
        if device != original_device:
            model.to(device)
        model.eval()
        with torch.inference_mode(), autocast:
            for rows, batch, row_caps in batches:
                batch = {k: v.to(device) for k, v in batch.items()}
                bound = max(row_caps)
                extra = {}
                if "min_new_tokens" in kwargs:
                    extra["min_new_tokens"] = min(kwargs["min_new_tokens"], bound)
                generated = model.generate(**batch, **{**kwargs, **extra}, max_new_tokens=bound)
                generated = generated[:, 1:]  # drop the decoder start token
                if num_beams == 1:  # exact per-sentence bound (greedy is prefix-consistent)
                    pieces = [generated[j, :cap] for j, cap in enumerate(row_caps)]
                else:
                    pieces = list(generated)
                _decode_rows(tokenizer, outputs, rows, [p.tolist() for p in pieces])
    finally:
        if device != original_device:
            model.to(original_device)
        model.train(was_training)
    return outputs  # type: ignore[return-value]


def translate_onnx(directory: str | os.PathLike, tokenizer, sources: Sequence[str], *, batch_size: int = 64,
                   decoder_start_token_id: int, eos_token_id: int, max_position_embeddings: int | None = None,
                   threads: int = 1, suppress_pad: bool = True, num_beams: int = 1,
                   early_stopping: bool = False, beam_engine: str = "auto") -> list[str]:
    """Translation with ONNX Runtime from an `--format onnx` export (`prunetrain.export.onnx.OrtGenerator`),
    sentence for sentence what `translate(..., num_beams=num_beams)` does with the PyTorch model: the same
    length-sorted batches, the same per-sentence bound ceil(1.5 · source tokens) + 10 (greedy: output cut at the first
    EOS; beam search: `prunetrain.export.onnx_beam`, transformers' beam search with the export's generation config,
    bound = the batch's largest), the pad token never generated.

    Args:
        directory: the ONNX export (encoder_model.onnx + decoder_with_past_model.onnx).
        tokenizer: the model's tokenizer.
        sources: sentences to translate.
        batch_size: sentences per batch.
        decoder_start_token_id, eos_token_id, max_position_embeddings: from the model's config.
        threads: ONNX Runtime intra-op threads.
        suppress_pad: never generate the pad token (as `translate`).
        num_beams: 1 (greedy) or the beams of beam search.
        early_stopping: transformers' `early_stopping` for beam search (True: a sentence ends once it has
            `num_beams` finished hypotheses; False, generate's default: its length heuristic).
        beam_engine: beam search by ONNX Runtime's BeamSearch operator ("operator": the export's
            `beam_search_model.onnx`, `prunetrain.export.onnx_beam_op`; a batch in which a hypothesis reached the
            length limit is decoded again by the loop, whose scoring of such hypotheses is transformers'), by the
            Python loop over the KV-cache graph ("loop", `prunetrain.export.onnx_beam`), or "auto": the faster of
            the two that reproduces `generate` — the operator with `early_stopping=True` where the export has it,
            else the loop (with `early_stopping=False` the operator's stop check reads another sentence's scores
            and decodes most batches to the length limit: docs/export.md).
    """
    from prunetrain.export.onnx import OrtGenerator
    from prunetrain.export.onnx_beam import beam_generate

    sources = _check_sources(sources)
    _check_decoding(batch_size, num_beams, suppress_pad=suppress_pad)
    check_int("threads", threads, 1)
    for argument, token in (("decoder_start_token_id", decoder_start_token_id), ("eos_token_id", eos_token_id)):
        check_int(argument, token, 0)
    if max_position_embeddings is not None:
        check_int("max_position_embeddings", max_position_embeddings, 1)
    if not sources:
        return []
    check_bool("early_stopping", early_stopping)
    operator = _beam_operator(directory, beam_engine, threads, num_beams, early_stopping)
    generator = OrtGenerator(directory, threads=threads)
    encoded = tokenizer(sources, return_attention_mask=False, verbose=False)["input_ids"]
    suppress = [tokenizer.pad_token_id] if suppress_pad else []
    outputs: list[str | None] = [None] * len(sources)
    for rows, batch, row_caps in _sorted_batches(tokenizer, encoded, batch_size, max_position_embeddings, None):
        if num_beams > 1:  # as translate: one bound per batch, hypotheses as generate returns them
            generated = None
            if operator is not None:
                generated = operator.generate_or_none(batch["input_ids"], batch["attention_mask"], max(row_caps),
                                                      num_beams=num_beams, suppress_tokens=suppress,
                                                      decoder_start_token_id=decoder_start_token_id,
                                                      early_stopping=early_stopping)
            if generated is None:
                generated = beam_generate(directory, batch["input_ids"], batch["attention_mask"], max(row_caps),
                                          num_beams=num_beams, generator=generator, suppress_tokens=suppress,
                                          decoder_start_token_id=decoder_start_token_id,
                                          early_stopping=early_stopping)
            _decode_rows(tokenizer, outputs, rows, [row.tolist() for row in generated[:, 1:]])
            continue
        generated = generator.greedy(batch["input_ids"], batch["attention_mask"], max(row_caps),
                                     decoder_start_token_id, suppress_tokens=suppress)[:, 1:]
        pieces = []
        for j, cap in enumerate(row_caps):
            row = generated[j, :cap].tolist()
            pieces.append(row[: row.index(eos_token_id) + 1] if eos_token_id in row else row)
        _decode_rows(tokenizer, outputs, rows, pieces)
    return outputs  # type: ignore[return-value]


def _beam_operator(directory, beam_engine: str, threads: int, num_beams: int, early_stopping: bool):
    """The `OrtBeamSearch` of the export for `beam_engine` ("auto", "operator", "loop"), or None for the loop."""
    from prunetrain.export.onnx_beam_op import FILE, OrtBeamSearch

    if beam_engine not in ("auto", "operator", "loop"):
        raise ValueError(f"beam_engine: {beam_engine!r} is not allowed; expected 'auto', 'operator' or 'loop'.")
    present = (Path(directory) / FILE).is_file()
    if beam_engine == "operator" and not present:
        raise ValueError(f"beam_engine: 'operator' needs {FILE} in {directory} (an `--format onnx` export of an "
                         f"encoder-decoder model with a decoder self-attention head writes it); 'loop' decodes "
                         f"this export.")
    if beam_engine == "operator" and num_beams > 1 and not early_stopping:
        raise ValueError("early_stopping: False is not taken by beam_engine 'operator' (ONNX Runtime's stop check "
                         "for it reads another sentence's scores); use early_stopping=True or beam_engine 'loop'.")
    if num_beams == 1 or beam_engine == "loop" or not present or (beam_engine == "auto" and not early_stopping):
        return None
    return OrtBeamSearch(directory, threads)


def score_translations(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """Corpus BLEU and chrF of detokenized `hypotheses` against one reference each, with sacreBLEU signatures."""
    from sacrebleu.metrics import BLEU, CHRF

    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise ValueError(f"score_translations: {len(hypotheses)} hypotheses but {len(references)} references.")
    if not references:
        raise ValueError("score_translations: nothing to score (no sentences).")
    bleu, chrf = BLEU(), CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": float(bleu_score.score),
        "bleu_signature": str(bleu.get_signature()),
        "bleu_detail": str(bleu_score),  # precisions, brevity penalty, lengths
        "chrf": float(chrf_score.score),
        "chrf_signature": str(chrf.get_signature()),
        "num_sentences": len(references),
    }


def evaluate_bleu(model: nn.Module, tokenizer, pairs: Sequence[tuple[str, str]], *, batch_size: int = 64,
                  num_beams: int = 1, max_new_tokens: int | None = None, autocast_bf16: bool | str = False,
                  device: str | torch.device | None = None, return_hypotheses: bool = False,
                  sentence_stats: bool = False, **generate_kwargs) -> dict:
    """Translate the sources of `pairs` and score them against the targets.

    Returns `bleu`, `bleu_signature`, `bleu_detail`, `chrf`, `chrf_signature`, `num_sentences`, `seconds`
    (translation time), `sentences_per_second`, the decoding settings (`num_beams`, `batch_size`, `autocast_bf16`),
    with `return_hypotheses=True` the `hypotheses` in input order, and with `sentence_stats=True` BLEU's
    per-sentence statistics (`prunetrain.mt.evaluation.bleu_stats`, for paired bootstrap tests) as `sentence_stats`.
    """
    pairs = _check_pairs(pairs)
    check_bool("return_hypotheses", return_hypotheses)
    check_bool("sentence_stats", sentence_stats)
    if not pairs:
        raise ValueError("evaluate_bleu: no sentence pairs to evaluate.")
    sources = [s for s, _ in pairs]
    references = [t for _, t in pairs]
    if autocast_bf16 == "auto":
        autocast_bf16 = _use_bf16("auto", torch.device(device) if device is not None else device_of(model))
    start = time.perf_counter()
    hypotheses = translate(model, tokenizer, sources, batch_size=batch_size, num_beams=num_beams,
                           max_new_tokens=max_new_tokens, autocast_bf16=autocast_bf16, device=device,
                           **generate_kwargs)
    seconds = time.perf_counter() - start
    result = score_translations(hypotheses, references)
    result.update(seconds=seconds, sentences_per_second=len(pairs) / seconds if seconds > 0 else float("inf"),
                  num_beams=num_beams, batch_size=batch_size, autocast_bf16=autocast_bf16)
    if return_hypotheses:
        result["hypotheses"] = hypotheses
    if sentence_stats:
        from prunetrain.methods.significance import SENTENCE_STATS
        from prunetrain.mt.evaluation.bleu_stats import bleu_sentence_stats

        result[SENTENCE_STATS] = bleu_sentence_stats(hypotheses, references)
    return result


def save_translation_model(model: nn.Module, tokenizer, path: str | os.PathLike, overwrite: bool = False) -> Path:
    """`prunetrain.save_pruned(model, path)` and the tokenizer into the same directory (what `evaluate_directory`
    reads), both written into one staging directory that replaces `path` only when complete (an existing non-empty
    `path` needs `overwrite=True`, which replaces only an empty directory or one prunetrain wrote; it stays whole
    until then). Works for full and pruned models."""
    from prunetrain.engine.persist import save_pruned
    from prunetrain.utils.output_paths import check_output_dir, output_lock, replace_directory, staging_directory

    path = Path(path)
    with output_lock(path, flag="path"):  # one writer at a time; `overwrite` replaces what the CLI's --overwrite does
        check_output_dir(path, overwrite=overwrite, flag="path", overwrite_flag="overwrite=True")
        with staging_directory(path) as staging:
            save_pruned(model, staging / "model")
            tokenizer.save_pretrained(staging / "model")
            replace_directory(staging / "model", path, kind="model")
    return path


def load_translation_model(model_path: str | os.PathLike, device: str | torch.device | None = None) -> nn.Module:
    """A saved full or pruned model in eval mode (`prunetrain.engine.model_dir.load_model_dir`: the directory is checked
    file by file, then loaded with `load_pruned` or the Hugging Face class its config names).

    Args:
        model_path: the model directory.
        device: move the model there.
    """
    from prunetrain.engine.model_dir import load_model_dir

    return load_model_dir(model_path, device=device)


def find_tokenizer_dir(model_path: str | os.PathLike) -> Path:
    """Where the tokenizer of a saved model is: the model directory itself (where `save_translation_model` puts it)
    or its `tokenizer/` subfolder. Never outside the model directory: a neighbour's tokenizer would silently give
    wrong translations, so pass `tokenizer_path` (CLI: `--tokenizer`) for one kept elsewhere.

    Args:
        model_path: the model directory.
    """
    model_path = Path(model_path)
    for candidate in (model_path, model_path / "tokenizer"):
        if (candidate / "tokenizer.json").is_file():
            return candidate
    raise ValueError(f"tokenizer: no tokenizer.json in {str(model_path)!r} or its tokenizer/ folder; save the "
                     f"tokenizer with the model (save_translation_model) or name it with --tokenizer "
                     f"(tokenizer_path=).")


def load_model_tokenizer(model_path: str | os.PathLike, tokenizer_path: str | os.PathLike | None = None):
    """The tokenizer of a saved model: from `tokenizer_path` if given, else `find_tokenizer_dir(model_path)`.

    Args:
        model_path: the model directory.
        tokenizer_path: an explicit tokenizer directory (one with `tokenizer.json`).
    """
    from prunetrain.mt.text.data import load_tokenizer

    tokenizer = load_tokenizer(Path(tokenizer_path) if tokenizer_path is not None else find_tokenizer_dir(model_path))
    check_tokenizer_fits(tokenizer, model_path, "--tokenizer" if tokenizer_path is not None else "tokenizer")
    return tokenizer


def check_tokenizer_fits(tokenizer, model_path: str | os.PathLike, argument: str = "tokenizer") -> None:
    """A tokenizer whose ids reach past the model's vocabulary (`vocab_size` in its config.json) is another
    model's: refused before any id is looked up in the embedding.

    Args:
        tokenizer: the loaded tokenizer.
        model_path: the model directory (its config.json is read; without one nothing is checked).
        argument: how the message names the tokenizer.
    """
    from prunetrain.engine.model_dir import CONFIG_FILE, config_dict

    if not (Path(model_path) / CONFIG_FILE).is_file():
        return
    config = config_dict(model_path)
    vocab = config.get("vocab_size")
    if isinstance(vocab, int) and len(tokenizer) > vocab:
        raise ValueError(f"{argument}: it has {len(tokenizer)} tokens but the model in {str(model_path)!r} has a "
                         f"vocabulary of {vocab} (config.json vocab_size); it is another model's tokenizer.")


def evaluate_directory(model_path: str | os.PathLike, data_dir: str | os.PathLike, split: str = "test", *,
                       src: str = "de", tgt: str = "en", limit: int | None = None,
                       tokenizer_path: str | os.PathLike | None = None, device: str | torch.device | None = None,
                       **evaluate_kwargs) -> dict:
    """Score a saved full or pruned model on `data_dir/{split}.{src,tgt}` (see `evaluate_bleu` for the keys).

    The tokenizer is read from `tokenizer_path`, else from the model directory (where `save_translation_model`
    puts it) or its `tokenizer/` folder — never from outside the model directory (`find_tokenizer_dir`). The result
    also has `model_path`, `split`, `heads` (attention heads left) and `parameters`. Everything is checked (model
    files, data files, sentence lengths) before the first sentence is translated.
    """
    from prunetrain.engine.heads import find_heads
    from prunetrain.engine.model_dir import check_model_dir
    from prunetrain.mt.text.data import read_parallel

    model_path = check_model_dir(model_path)
    pairs = read_parallel(data_dir, split, src, tgt, limit)
    tokenizer = load_model_tokenizer(model_path, tokenizer_path)
    model = load_translation_model(model_path, device=device)
    result = evaluate_bleu(model, tokenizer, pairs, device=device, **evaluate_kwargs)
    result.update(model_path=str(model_path), split=split, heads=find_heads(model).total_heads,
                  parameters=sum(p.numel() for p in model.parameters()))
    return result


__all__ = ["check_tokenizer_fits", "evaluate_bleu", "evaluate_directory", "find_tokenizer_dir", "load_model_tokenizer", "load_translation_model",
           "save_translation_model", "score_translations", "translate"]
