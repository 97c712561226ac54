"""Beam search with ONNX Runtime on an `--format onnx` export: the hypotheses `generate(num_beams=k)` gives.

The algorithm is transformers' vectorised beam search (`GenerationMixin._beam_search`, transformers 5), step for
step, so that the same logits give the same hypotheses: at each step, with s_b the running score of beam b,

    candidates  = top_{K'} over (b, t) of  s_b + log softmax(logits_b)_t          (K' = max(2, 1 + #EOS) · k)
    running     = the k best candidates that did not just finish (EOS or length limit)
    finished    = the k best of (finished so far, candidates among the first k that just finished, scored
                  s / (generated length)^length_penalty)

stopping as transformers does (`early_stopping` True / False / "never", its early-stop heuristic). The KV cache of
the export's `decoder_with_past_model.onnx` is reordered with the chosen beams at every step. Logits processors:
`suppress_tokens`, single-token `bad_words_ids`, `min_new_tokens` / `min_length`, `forced_bos_token_id`,
`forced_eos_token_id`; any other generation setting that changes the scores is refused (`BeamSettings`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from prunetrain.utils.validate import check_finite_float, check_int

NEG = -1.0e9  # transformers' "impossible" score


@dataclass(frozen=True)
class LogitRules:
    """The logits processors beam search reproduces (transformers' order, `_process`): banned single tokens
    (`bad_words_ids`), EOS blocked before `min_new_tokens`, forced BOS / EOS, `suppress_tokens`."""

    bad_tokens: tuple[int, ...] = ()
    suppress_tokens: tuple[int, ...] = ()
    min_new_tokens: int = 0
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | None = None


@dataclass(frozen=True)
class BeamSettings:
    """The generation settings beam search reads (from the export's `generation_config.json` and overrides):
    the search (beams, length penalty, early stopping), the special tokens, and the logits processors (`rules`).
    Built by `from_generation_config`."""

    num_beams: int = 4
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    decoder_start_token_id: int | None = None
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    rules: LogitRules = LogitRules()

    @classmethod
    def from_generation_config(cls, config, **overrides) -> "BeamSettings":
        """Settings of a `transformers.GenerationConfig` (or dict) updated with `overrides` (generate's kwargs);
        `ValueError` names a setting this beam search does not reproduce, or a value `generate` would not take
        (a bool or float as a count, a string as a token list, a negative token id, `early_stopping` other than
        True / False / "never"). Token ids are checked against the vocabulary by `check_vocabulary`."""
        from transformers import GenerationConfig

        unknown = sorted(set(overrides) - set(GenerationConfig().to_dict()))
        if unknown:  # a misspelt setting (num_beam=4) would otherwise be ignored; generate() refuses it too
            raise ValueError(f"{unknown[0]}: not a generation setting (see transformers.GenerationConfig).")
        values = dict(config.to_dict() if hasattr(config, "to_dict") else config or {})
        values.update(overrides)
        _check_unsupported(values)
        eos = values.get("eos_token_id")
        return cls(num_beams=check_int("num_beams", _given(values, "num_beams", 1), 1),
                   eos_token_ids=_token_ids("eos_token_id", [] if eos is None else eos if isinstance(eos, (list, tuple))
                                            else [eos]),
                   pad_token_id=_token_id("pad_token_id", values.get("pad_token_id")),
                   decoder_start_token_id=_token_id("decoder_start_token_id", values.get("decoder_start_token_id")),
                   length_penalty=check_finite_float("length_penalty", _given(values, "length_penalty", 1.0)),
                   early_stopping=_early_stopping(_given(values, "early_stopping", False)),
                   rules=LogitRules(bad_tokens=_bad_tokens(values.get("bad_words_ids")),
                                    suppress_tokens=_token_ids("suppress_tokens", _given(values, "suppress_tokens", [])),
                                    min_new_tokens=check_int("min_new_tokens", _given(values, "min_new_tokens", 0), 0),
                                    forced_bos_token_id=_token_id("forced_bos_token_id",
                                                                  values.get("forced_bos_token_id")),
                                    forced_eos_token_id=_token_id("forced_eos_token_id",
                                                                  values.get("forced_eos_token_id"))))

    def check_vocabulary(self, vocab: int) -> None:
        """Every token id of the settings lies in [0, vocab): one named out of range is refused before decoding."""
        named = [("eos_token_id", self.eos_token_ids), ("pad_token_id", (self.pad_token_id,)),
                 ("decoder_start_token_id", (self.decoder_start_token_id,)),
                 ("bad_words_ids", self.rules.bad_tokens), ("suppress_tokens", self.rules.suppress_tokens),
                 ("forced_bos_token_id", (self.rules.forced_bos_token_id,)),
                 ("forced_eos_token_id", (self.rules.forced_eos_token_id,))]
        for argument, ids in named:
            for token in ids:
                if token is not None and token >= vocab:
                    raise ValueError(f"{argument}: {token} is not a token of this model; token ids lie in "
                                     f"[0, {vocab}).")


def _check_unsupported(values: dict) -> None:
    """Refuse a generation setting that changes the scores in a way this beam search does not reproduce."""
    unsupported = {"do_sample": False, "num_return_sequences": 1, "num_beam_groups": 1, "diversity_penalty": 0.0,
                   "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
                   "encoder_no_repeat_ngram_size": 0, "temperature": 1.0, "sequence_bias": None,
                   "begin_suppress_tokens": None, "renormalize_logits": False, "exponential_decay_length_penalty":
                   None, "min_length": 0, "guidance_scale": None, "constraints": None, "force_words_ids": None,
                   "stop_strings": None, "watermarking_config": None, "dola_layers": None, "penalty_alpha": None,
                   "max_time": None, "token_healing": False, "prompt_lookup_num_tokens": None,
                   "assistant_early_exit": None}
    for key, neutral in unsupported.items():
        value = values.get(key, neutral)
        if key == "temperature" and not values.get("do_sample"):
            continue  # transformers ignores temperature without sampling
        if key == "min_length" and value in (None, 0):
            continue
        if value not in (neutral, None) and not (isinstance(value, (list, dict)) and not value):
            raise ValueError(f"{key}: {value!r} is not supported by the ONNX Runtime beam search (it reproduces "
                             f"suppress_tokens, single-token bad_words_ids, min_new_tokens, forced BOS/EOS, "
                             f"length_penalty and early_stopping).")


def _given(values: dict, key: str, default):
    value = values.get(key)
    return default if value is None else value


def _token_id(argument: str, value) -> int | None:
    """None or a token id: an int >= 0 (not a bool, a float or a string)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{argument}: {value!r} is not a token id; expected an integer >= 0 (or None).")
    return value


def _token_ids(argument: str, values) -> tuple[int, ...]:
    """A list of token ids (a string such as '12' is refused, not read digit by digit)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise ValueError(f"{argument}: {values!r} is not a list of token ids; give e.g. [12, 40].")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{argument}: {value!r} in {list(values)!r} is not a token id; expected integers >= 0.")
    return tuple(values)


def _bad_tokens(words_list) -> tuple[int, ...]:
    """`bad_words_ids` as the single tokens it bans: a list of one-token lists (`[[4], [7]]`)."""
    if words_list is None:
        return ()
    if isinstance(words_list, (str, bytes)) or not isinstance(words_list, (list, tuple)):
        raise ValueError(f"bad_words_ids: {words_list!r} is not a list of token lists; give e.g. [[4], [7]].")
    bad = []
    for words in words_list:
        if isinstance(words, (str, bytes)) or not isinstance(words, (list, tuple)):
            raise ValueError(f"bad_words_ids: {words!r} is not a list of token ids; give e.g. [[4], [7]].")
        if not words:
            raise ValueError("bad_words_ids: [] bans nothing; give each banned token as a one-token list, e.g. [[4]].")
        if len(words) != 1:
            raise ValueError(f"bad_words_ids: {words!r} is a sequence of several tokens; the ONNX Runtime beam "
                             f"search bans single tokens only.")
        bad.extend(_token_ids("bad_words_ids", list(words)))
    return tuple(bad)


def _early_stopping(value) -> bool | str:
    """transformers' `early_stopping`: True, False or "never" (not 1, not another string)."""
    if isinstance(value, bool) or value == "never" and isinstance(value, str):
        return value
    raise ValueError(f"early_stopping: {value!r} is not allowed; expected True, False or 'never'.")


def _process(log_probs: torch.Tensor, s: BeamSettings, generated: int, cur_len: int, max_length: int) -> torch.Tensor:
    """transformers' logits processors that beam search applies after log softmax, in its order."""
    rules = s.rules
    if rules.bad_tokens:
        log_probs[:, list(rules.bad_tokens)] = -float("inf")
    if s.eos_token_ids and generated < rules.min_new_tokens:
        log_probs[:, list(s.eos_token_ids)] = -float("inf")
    if rules.forced_bos_token_id is not None and cur_len == 1:
        log_probs[:] = -float("inf")
        log_probs[:, rules.forced_bos_token_id] = 0
    if rules.forced_eos_token_id is not None and cur_len == max_length - 1:
        log_probs[:] = -float("inf")
        log_probs[:, rules.forced_eos_token_id] = 0
    if rules.suppress_tokens:
        log_probs[:, list(rules.suppress_tokens)] = -float("inf")
    return log_probs


def _gather(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """tensor[b, index[b, j], ...] for every batch row b: [batch, beams, ...] → [batch, len(index), ...]."""
    while index.dim() < tensor.dim():
        index = index.unsqueeze(-1)
    return torch.take_along_dim(tensor, index, dim=1)


class _OrtDecoder:
    """One decoding step of the export's KV-cache graph for `batch · beams` rows; `reorder` gathers the cache."""

    def __init__(self, generator, input_ids: np.ndarray, attention_mask: np.ndarray, beams: int):
        self.g = generator
        rows = input_ids.shape[0] * beams
        self.mask = np.repeat(attention_mask, beams, axis=0)
        self.past = {i.name: np.zeros((rows, i.shape[1], 0, i.shape[3]), dtype=np.float32)
                     for i in generator.decoder.get_inputs()[generator.fixed:]}
        self.hidden = None
        if generator.encoder is not None:
            hidden = generator.encoder.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})[0]
            self.hidden = np.repeat(hidden, beams, axis=0)

    def step(self, ids: np.ndarray) -> torch.Tensor:
        """Logits of the last position for each row after feeding `ids` `[rows, n]`; the cache grows by n."""
        if self.hidden is not None:
            feeds = {"decoder_input_ids": ids, "encoder_hidden_states": self.hidden, "encoder_attention_mask": self.mask}
        else:
            if self.past and next(iter(self.past.values())).shape[2] > 0:
                self.mask = np.concatenate([self.mask, np.ones((ids.shape[0], ids.shape[1]), dtype=self.mask.dtype)],
                                           axis=1)
            feeds = {"input_ids": ids, "attention_mask": self.mask}
        got = self.g.decoder.run(self.g.outputs, {**feeds, **self.past})
        self.past = dict(zip(self.g.names[self.g.fixed:], got[1:]))
        return torch.from_numpy(np.ascontiguousarray(got[0][:, -1])).float()

    def reorder(self, rows: np.ndarray) -> None:
        self.past = {name: value[rows] for name, value in self.past.items()}
        if self.hidden is None:
            self.mask = self.mask[rows]


def beam_search(generator, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                settings: BeamSettings) -> torch.Tensor:
    """Beam search over an ONNX export: `[batch, length]` sequences as `generate(num_beams=k)` returns them (the
    prompt and new tokens for a decoder-only model, decoder start and new tokens for an encoder-decoder).

    Args:
        generator: an `OrtGenerator` (its sessions).
        input_ids, attention_mask: `[batch, length]` prompt (left-padded) or source.
        max_new_tokens: the most tokens to generate.
        settings: `BeamSettings` (beams, EOS, pad, processors, length penalty, early stopping).
    """
    s, k = settings, settings.num_beams
    batch = input_ids.shape[0]
    vocab = generator.decoder.get_outputs()[0].shape[-1]
    if isinstance(vocab, int):
        s.check_vocabulary(vocab)
    decoder = _OrtDecoder(generator, input_ids.numpy(), attention_mask.numpy(), k)
    if generator.encoder is not None:
        if s.decoder_start_token_id is None:
            raise ValueError("decoder_start_token_id: an encoder-decoder export needs it (the model config's).")
        prompt = torch.full((batch, 1), int(s.decoder_start_token_id), dtype=torch.long)
    else:
        prompt = input_ids.long()
    prompt_len = cur_len = prompt.shape[1]
    max_length = prompt_len + max_new_tokens
    keep = max(2, 1 + len(s.eos_token_ids)) * k
    top_k_mask = torch.arange(keep) < k
    fill = (s.pad_token_id or s.eos_token_ids[0]) if s.eos_token_ids else -1
    running = torch.full((batch, k, max_length), fill, dtype=torch.long)
    running[:, :, :cur_len] = prompt[:, None, :]
    sequences = running.clone()
    running_scores = torch.zeros(batch, k)
    running_scores[:, 1:] = NEG
    scores = torch.full((batch, k), NEG)
    finished = torch.zeros(batch, k, dtype=torch.bool)
    may_improve = torch.ones(batch, 1, dtype=torch.bool)
    running_beams = torch.full((batch, k, max_new_tokens), -1, dtype=torch.long)
    beam_indices = running_beams.clone()
    logits = decoder.step(np.repeat(prompt.numpy(), k, axis=0))
    s.check_vocabulary(logits.shape[-1])
    while True:
        log_probs = _process(torch.log_softmax(logits, dim=-1), s, cur_len - prompt_len, cur_len, max_length)
        vocab = log_probs.shape[-1]
        log_probs = (log_probs.view(batch, k, vocab) + running_scores[:, :, None]).reshape(batch, k * vocab)
        top_scores, top_index = torch.topk(log_probs, keep)
        from_beam = top_index // vocab
        top_sequences = _gather(running, from_beam)
        top_sequences[:, :, cur_len] = top_index % vocab
        top_beams = _gather(running_beams, from_beam)
        top_beams[:, :, cur_len - prompt_len] = from_beam + torch.arange(batch)[:, None] * k
        last = top_sequences[:, :, cur_len]
        done = torch.full_like(last, cur_len + 1 >= max_length, dtype=torch.bool)
        for eos in s.eos_token_ids:
            done |= last == eos
        alive_scores = top_scores + done.float() * NEG
        pick = torch.topk(alive_scores, k)[1]
        running, running_scores, running_beams = (_gather(top_sequences, pick), _gather(alive_scores, pick),
                                                  _gather(top_beams, pick))
        just_done = done & top_k_mask[None, :]
        final = top_scores / ((cur_len + 1 - prompt_len) ** s.length_penalty)
        final = final + (finished.all(dim=-1, keepdim=True) & (s.early_stopping is True)).float() * NEG
        final = final + (~may_improve).float() * NEG + (~just_done).float() * NEG
        merged = torch.topk(torch.cat((scores, final), dim=1), k)[1]
        sequences = _gather(torch.cat((sequences, top_sequences), dim=1), merged)
        scores = _gather(torch.cat((scores, final), dim=1), merged)
        beam_indices = _gather(torch.cat((beam_indices, top_beams), dim=1), merged)
        finished = _gather(torch.cat((finished, just_done), dim=1), merged)
        cur_len += 1
        length = (max_length if s.early_stopping == "never" and s.length_penalty > 0.0 else cur_len) - prompt_len
        best_running = running_scores[:, :1] / (length ** s.length_penalty)
        worst_final = torch.where(finished, scores.min(dim=1, keepdim=True)[0], torch.tensor(NEG))
        may_improve = may_improve & (best_running > worst_final).any(dim=-1, keepdim=True)
        if not (bool(may_improve.any()) and not (bool(finished.all()) and s.early_stopping is True)
                and not bool(done.all())):
            break
        decoder.reorder(running_beams[..., cur_len - 1 - prompt_len].reshape(-1).numpy())
        logits = decoder.step(running[:, :, cur_len - 1].reshape(-1, 1).numpy())
    generated = int((beam_indices[:, 0] + 1).bool().sum(dim=1).max())
    return sequences[:, 0, :prompt_len + generated]


def beam_generate(directory, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                  num_beams: int = 4, threads: int = 1, generator=None, **generate_kwargs) -> torch.Tensor:
    """Beam search with ONNX Runtime on the export in `directory`, with the settings of its
    `generation_config.json` updated by `generate_kwargs` (as `model.generate(num_beams=..., **generate_kwargs)`).

    Args:
        directory: an `--format onnx` export of a generative model.
        input_ids, attention_mask: `[batch, length]` prompt (left-padded) or source.
        max_new_tokens: the most tokens to generate.
        num_beams: beams per sentence.
        threads: ONNX Runtime intra-op threads (when `generator` is not given).
        generator: an `OrtGenerator` to reuse (its sessions), else one is made.
        generate_kwargs: generation settings (e.g. `suppress_tokens`, `length_penalty`, `min_new_tokens`).
    """
    from prunetrain.export.onnx_runtime import OrtGenerator

    check_int("num_beams", num_beams, 1)
    check_int("max_new_tokens", max_new_tokens, 1)
    check_int("threads", threads, 1)
    generator = generator or OrtGenerator(directory, threads)
    settings = BeamSettings.from_generation_config(generator.generation_config, **generate_kwargs,
                                                   num_beams=num_beams)
    return beam_search(generator, input_ids, attention_mask, max_new_tokens, settings)
