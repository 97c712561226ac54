"""Sequence-level knowledge distillation (Kim & Rush 2016, §3.2): the student is trained on the teacher's beam-search
translations of the training sources instead of (or beside) the references,

    L_seq-KD = − Σ_x log p_student(ŷ(x) | x),      ŷ(x) ≈ argmax_y p_teacher(y | x)   (beam search, k beams),

the mode of the teacher's sequence distribution standing in for the whole of it. Kim & Rush measured +4.2 / +1.7 BLEU
(greedy / beam) over the same student trained on the references; it is what the small losses at large compression in
translation are obtained with (Kasai et al. 2021; Behnke & Heafield 2020). Word-level distillation
(`prunetrain.training.distillation.DistillationCallback`) may be added on top (their "Word-KD + Seq-KD").

`distilled_targets(teacher, tokenizer, sources, cache_dir)` translates the sources once and keeps the translations
on disk, in `cache_dir/<key>/`, where the key is a sha256 of everything that decides them:

- the teacher: its tensors (names, shapes, dtypes, bytes), its config and generation config (without the fields
  that do not change the function: its path, the transformers version);
- the tokenizer (its `tokenizer.json` serialisation);
- the settings: engine, beams, `max_new_tokens`, length penalty, bf16;
- the sources: their number and a sha256 of the sentences.

A changed teacher, tokenizer, setting or source list has another key and so another directory: translations are
never reused for anything but what made them. They are written in chunks of `chunk_size` sentences, each file
written whole or not at all (a temporary file renamed), so an interrupted call continues at the first missing chunk.

Engines: `"transformers"` (`prunetrain.mt.evaluation.translation.translate`, the model's `generate`, on its device)
or `"ctranslate2"` (the teacher exported by `prunetrain.export.ctranslate2.export_ctranslate2`, checked exact in
float32, then `translate_ctranslate2`; about 2.7× faster on a 2-core CPU). The two decode by their own rules, so
their outputs may differ in a few sentences; the engine is part of the key.

The teacher's cost is counted beside the student's training: the measured seconds of every chunk (whenever it was
translated) and an estimate of its FLOPs,

    Σ_sentences  F(k, S, T) − (k − 1) · E(S),

F the teacher's forward FLOPs for k rows of source length S and output length T (the exact polynomial of
`prunetrain.bench.step_flops`), E(S) its encoder's FLOPs for one source (counted by `FlopCounterMode`, once per
length): k beams decoding the chosen output, the encoder run once. It is an estimate of beam search with a key/value
cache, not a count: self-attention is priced over T² positions instead of T(T+1)/2 (over), and beams that ran longer
than the chosen output are not priced (under).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Sequence

import torch
from torch import nn

from prunetrain.utils.door import Bounds, PositiveInt, checked
from prunetrain.utils.validate import check_sentences

ENGINES = ("transformers", "ctranslate2")
TARGETS = ("references", "teacher", "both")
IDENTITY_FILE = "identity.json"
FORMAT_VERSION = 1
_FREE_CONFIG_FIELDS = frozenset({"_name_or_path", "transformers_version", "architectures"})


@dataclass
class DistilledTargets:
    """The teacher's translations of the sources, in their order, and how they were made (`record`: the key, the
    settings, the teacher's seconds and estimated FLOPs, how many sentences this call translated and how many it
    read back, how many outputs are empty)."""

    translations: list[str]
    record: dict


def teacher_digest(teacher: nn.Module) -> str:
    """sha256 of the teacher's tensors (parameters and buffers: names, shapes, dtypes, bytes), its config and its
    generation config (without `_FREE_CONFIG_FIELDS`)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(teacher.state_dict().items()):
        data = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{tuple(data.shape)}|{data.dtype}|".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    for config in (getattr(teacher, "config", None), getattr(teacher, "generation_config", None)):
        if config is not None:
            fields = {k: v for k, v in config.to_dict().items() if k not in _FREE_CONFIG_FIELDS}
            digest.update(json.dumps(fields, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def tokenizer_digest(tokenizer) -> str:
    """sha256 of a fast tokenizer's serialisation (vocabulary, normalisation, pre-tokenisation, model,
    post-processing), without the truncation and padding state that each call's arguments set."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"tokenizer: {type(tokenizer).__name__} is not a fast tokenizer (no backend_tokenizer); "
                         f"sequence-level distillation keys its translations by tokenizer.json, so give a fast one.")
    rules = json.loads(backend.to_str())
    for transient in ("truncation", "padding"):  # set by each call's arguments, not part of what it tokenizes to
        rules.pop(transient, None)
    return hashlib.sha256(json.dumps(rules, sort_keys=True).encode()).hexdigest()


def sources_digest(sources: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for sentence in sources:
        digest.update(sentence.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def _check_teacher(teacher) -> None:
    from prunetrain.engine.mask import attached_masks

    if not isinstance(teacher, nn.Module) or not getattr(getattr(teacher, "config", None), "is_encoder_decoder",
                                                           False):
        raise ValueError(f"teacher: {type(teacher).__name__} is not an encoder-decoder model (e.g. MarianMTModel); "
                         f"sequence-level distillation translates the sources with it.")
    if attached_masks(teacher):
        raise ValueError("teacher: it has attached head or neuron masks; shrink it first (prunetrain.shrink) or "
                         "detach them, so the translations are those of one model that can be named by its weights.")


@checked
def distilled_targets(teacher: nn.Module, tokenizer, sources: Sequence[str], cache_dir: str | os.PathLike, *,
                      num_beams: PositiveInt = 4, max_new_tokens: PositiveInt | None = None,
                      length_penalty: float = 1.0, engine: Literal["transformers", "ctranslate2"] = "transformers",
                      batch_size: PositiveInt = 64, chunk_size: PositiveInt = 2000, autocast_bf16: bool = False,
                      progress=None) -> DistilledTargets:
    """The teacher's beam-search translations of `sources`, made once and kept in `cache_dir` (module docstring).

    Args:
        teacher: a trained encoder-decoder model (no attached masks); it is left as it was given (mode, device).
        tokenizer: its fast tokenizer (the student's: the student trains on these token ids).
        sources: the training source sentences.
        cache_dir: where the translations are kept (created if missing); one subdirectory per key.
        num_beams, max_new_tokens, length_penalty: beam search as in `translate` (`max_new_tokens=None`: each
            sentence's own bound there; at most 256 in CTranslate2).
        engine: "transformers" or "ctranslate2" (needs the `ctranslate2` extra; float32 export, checked).
        batch_size: sentences per batch; chunk_size: sentences per file (the unit of resuming).
        autocast_bf16: translate under bf16 autocast (transformers engine only; part of the key).
        progress: receives one line per chunk translated (None: silent).

    Returns:
        `DistilledTargets`: the translations in the order of `sources` and the record.
    """
    sources = check_sentences("sources", sources)
    _check_teacher(teacher)
    if engine == "ctranslate2" and autocast_bf16:
        raise ValueError("autocast_bf16: True is for engine='transformers'; CTranslate2 translates the float32 "
                         "export (give compute_type through prunetrain.export.translate_ctranslate2 instead).")
    settings = {"engine": engine, "num_beams": num_beams, "max_new_tokens": max_new_tokens,
                "length_penalty": float(length_penalty), "autocast_bf16": autocast_bf16}
    identity = {"format": FORMAT_VERSION, "teacher": teacher_digest(teacher), "tokenizer": tokenizer_digest(tokenizer),
                "settings": settings, "sources": {"count": len(sources), "sha256": sources_digest(sources)},
                "chunk_size": chunk_size}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]
    directory = Path(cache_dir) / key
    _claim(directory, identity)
    chunks = [(start, sources[start:start + chunk_size]) for start in range(0, len(sources), chunk_size)]
    translator = _Translator(teacher, tokenizer, settings, batch_size)
    translations, seconds, flops, made, reused = [], 0.0, 0, 0, 0
    try:
        for index, (start, part) in enumerate(chunks):
            path = directory / f"part-{index:05d}.json"
            record = _read_chunk(path, start, len(part))
            if record is None:
                record = translator.chunk(start, part)
                _write_atomically(path, record)
                made += len(part)
                if progress is not None:
                    progress(f"teacher translations: {start + len(part)} of {len(sources)} sentences "
                             f"({record['seconds']:.0f} s for this chunk)")
            else:
                reused += len(part)
            translations += record["translations"]
            seconds += record["seconds"]
            flops = None if flops is None or record["flops"] is None else flops + record["flops"]
    finally:
        translator.close()
    return DistilledTargets(translations, {
        "key": key, "directory": str(directory), **settings, "sentences": len(sources),
        "translated_now": made, "read_back": reused, "empty": sum(1 for t in translations if not t),
        "seconds": seconds, "generation_flops_estimate": flops})


def length_ratio_outlier(source: str, translation: str, max_length_ratio: float) -> bool:
    """Whether a translation's length is out of proportion to its source's: more than `max_length_ratio` times its
    words, or fewer than 1/`max_length_ratio` of them (the ratio filter of parallel-corpus cleaning, as in Moses'
    `clean-corpus-n.perl`; words split on white space, an empty source counted as one word, so an empty translation
    is always out of proportion). It catches the repetition loops of beam search ("a man a man a man …") and empty
    or truncated outputs."""
    ratio = len(translation.split()) / max(len(source.split()), 1)
    return ratio > max_length_ratio or ratio < 1 / max_length_ratio


@checked
def distilled_pairs(pairs: Sequence[tuple[str, str]], translations: Sequence[str],
                    targets: Literal["references", "teacher", "both"] = "teacher",
                    max_length_ratio: Annotated[float, Bounds(minimum=1)] | None = None) -> list[tuple[str, str]]:
    """The training pairs of sequence-level distillation: `"teacher"` (source, teacher's translation) for each pair;
    `"both"` the references and then those (Kim & Rush's Seq-Inter uses the teacher's only; the union keeps the
    references' words); `"references"` the pairs as they are. `max_length_ratio` (None: keep all) leaves out each
    teacher's pair whose translation is out of proportion to its source (`length_ratio_outlier`); the references
    are never filtered."""
    if len(translations) != len(pairs):
        raise ValueError(f"translations: {len(translations)} translations for {len(pairs)} pairs; give the "
                         f"teacher's translation of every source, in order.")
    taught = [(source, translation) for (source, _), translation in zip(pairs, translations)
              if max_length_ratio is None or not length_ratio_outlier(source, translation, max_length_ratio)]
    return {"references": list(pairs), "teacher": taught, "both": [*pairs, *taught]}[targets]


def _claim(directory: Path, identity: dict) -> None:
    """Create `directory` with its identity, or check the identity it holds (a key is a prefix of a sha256: a
    collision would be refused, never reused)."""
    path = directory / IDENTITY_FILE
    if path.is_file():
        try:
            held = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"cache_dir: {str(path)!r} is not readable JSON ({err}); remove {str(directory)!r} "
                             f"to translate again.") from None
        if held != identity:
            raise ValueError(f"cache_dir: {str(directory)!r} holds translations of another teacher, tokenizer, "
                             f"setting or source list under the same key; remove it to translate again.")
        return
    directory.mkdir(parents=True, exist_ok=True)
    _write_atomically(path, identity)


def _read_chunk(path: Path, start: int, count: int) -> dict | None:
    """A chunk written before (whole: it was renamed into place), or None when it is missing."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # cannot happen for a renamed file; translated again rather than trusted
    good = (isinstance(record, dict) and record.get("first") == start and isinstance(record.get("translations"), list)
            and len(record["translations"]) == count and all(isinstance(t, str) for t in record["translations"])
            and isinstance(record.get("seconds"), (int, float)) and "flops" in record)
    return record if good else None


def _write_atomically(path: Path, record: dict) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(record, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


class _Translator:
    """Translates chunks with one engine, set up at the first chunk that needs it (nothing when every chunk is
    read back); prices each chunk's generation by the teacher's forward polynomial."""

    def __init__(self, teacher: nn.Module, tokenizer, settings: dict, batch_size: int):
        self.teacher, self.tokenizer, self.settings, self.batch_size = teacher, tokenizer, settings, batch_size
        self._ct2_dir: tempfile.TemporaryDirectory | None = None
        self._flop_model = None
        self._flops_counted = True
        self._encoder_flops_by_length: dict[int, int] = {}

    def chunk(self, start: int, sources: list[str]) -> dict:
        began = time.perf_counter()
        translations = self._translate(sources)
        seconds = time.perf_counter() - began
        return {"first": start, "translations": translations, "seconds": seconds,
                "flops": self._flops(sources, translations)}

    def _translate(self, sources: list[str]) -> list[str]:
        s = self.settings
        if s["engine"] == "ctranslate2":
            from prunetrain.export.ctranslate2 import translate_ctranslate2

            return translate_ctranslate2(self._exported(), sources, num_beams=s["num_beams"],
                                         max_new_tokens=s["max_new_tokens"], batch_size=self.batch_size,
                                         threads=max(1, torch.get_num_threads()), length_penalty=s["length_penalty"])
        from prunetrain.mt.evaluation.translation import translate

        return translate(self.teacher, self.tokenizer, sources, batch_size=self.batch_size,
                         num_beams=s["num_beams"], max_new_tokens=s["max_new_tokens"],
                         autocast_bf16=s["autocast_bf16"], length_penalty=s["length_penalty"])

    def _exported(self) -> str:
        """The teacher in CTranslate2 (float32, checked exact by the exporter), written once per call."""
        if self._ct2_dir is None:
            from prunetrain.export.ctranslate2 import export_ctranslate2

            self._ct2_dir = tempfile.TemporaryDirectory(prefix="prunetrain-teacher-")
            tokenizer_dir = Path(self._ct2_dir.name) / "tokenizer"
            self.tokenizer.save_pretrained(tokenizer_dir)
            export_ctranslate2(self.teacher, Path(self._ct2_dir.name) / "model", tokenizer_dir)
        return str(Path(self._ct2_dir.name) / "model")

    def _flops(self, sources: list[str], translations: list[str]) -> int | None:
        """Σ F(k, S, T) over the chunk's sentences (module docstring), or None when the teacher's forward is not
        countable from shapes."""
        from prunetrain.bench.step_flops import BatchShape

        if not self._flops_counted:
            return None
        source_ids = self.tokenizer(sources, return_attention_mask=False)["input_ids"]
        target_ids = self.tokenizer(text_target=translations, return_attention_mask=False)["input_ids"]
        if self._flop_model is None:
            self._flop_model = self._fit(source_ids[0], target_ids[0])
            if self._flop_model is None:
                self._flops_counted = False
                return None
        k = self.settings["num_beams"]
        return sum(self._flop_model(BatchShape(k, len(s), len(t))) - (k - 1) * self._encoder_flops(s)
                   for s, t in zip(source_ids, target_ids))

    def _encoder_flops(self, source: list[int]) -> int:
        """E(S): the teacher's encoder on one source of this length, counted once per length."""
        from prunetrain.bench.flops import flop_counter
        from prunetrain.engine.read_only import modes_kept

        cache = self._encoder_flops_by_length
        if len(source) not in cache:
            device = next(self.teacher.parameters()).device
            counter = flop_counter()
            with modes_kept(self.teacher), counter, torch.no_grad():
                self.teacher.eval()  # no dropout: the caller's random stream is not drawn from
                self.teacher.get_encoder()(input_ids=torch.tensor([source], device=device))
            cache[len(source)] = int(counter.get_total_flops())
        return cache[len(source)]

    def _fit(self, source: list[int], target: list[int]):
        """The teacher's forward-FLOP polynomial, fitted with its parameters frozen (forward only) and its
        `requires_grad` flags and mode put back."""
        from prunetrain.bench.step_flops import StepFlopModel
        from prunetrain.engine.read_only import modes_kept

        example = {"input_ids": torch.tensor([source]), "labels": torch.tensor([target])}
        device = next(self.teacher.parameters()).device
        example = {k: v.to(device) for k, v in example.items()}
        flags = [(p, p.requires_grad) for p in self.teacher.parameters()]
        try:
            with modes_kept(self.teacher):
                self.teacher.eval()
                for parameter, _ in flags:
                    parameter.requires_grad_(False)
                return StepFlopModel.fit(self.teacher, example)
        except ValueError:
            return None
        finally:
            for parameter, flag in flags:
                parameter.requires_grad_(flag)

    def close(self) -> None:
        if self._ct2_dir is not None:
            self._ct2_dir.cleanup()
            self._ct2_dir = None


__all__ = ["DistilledTargets", "ENGINES", "TARGETS", "distilled_pairs", "distilled_targets", "length_ratio_outlier",
           "sources_digest", "teacher_digest", "tokenizer_digest"]
