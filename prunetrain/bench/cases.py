"""The measured cases of a benchmark: the models' inputs (`make_inputs`), the timed call of each model for one
(task, batch size, sequence length) case, the untimed instrumented round (FLOPs, memory, the forced generation
length) and the interleaved timed rounds that give one row per variant (`bench_case`)."""

from __future__ import annotations

import statistics
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from prunetrain.bench.config import BenchConfig
from prunetrain.bench.flops import count_flops
from prunetrain.bench.profiling import peak_memory
from prunetrain.bench.report import ideal_columns
from prunetrain.bench.timing import alternate, compare_times, summarize
from prunetrain.utils.validate import check_int


def _text_config(model: nn.Module):
    config = model.config
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def is_seq2seq(model: nn.Module) -> bool:
    """An encoder-decoder model (its inputs include decoder inputs; its generated sequences start with one)."""
    return bool(getattr(model.config, "is_encoder_decoder", False))


def can_generate(model: nn.Module) -> bool:
    """Whether `model.generate` can run (transformers' `can_generate`, else whether the model has `generate`)."""
    can = getattr(model, "can_generate", None)
    return bool(can()) if callable(can) else hasattr(model, "generate")


def make_inputs(model: nn.Module, batch: int, seq_len: int, tgt_len: int | None = None, seed: int = 0,
                device: torch.device | str | None = None, for_generate: bool = False) -> dict[str, torch.Tensor]:
    """Random token inputs of shape `[batch, seq_len]` (no padding) for `model`.

    Ids are drawn from `[4, vocab_size)` to avoid the usual special tokens. Seq2seq models also get
    `decoder_input_ids` of length `tgt_len` (default `seq_len`) unless `for_generate`.

    Args:
        model: the model (its config gives the vocabulary).
        batch: sequences.
        seq_len: tokens per sequence.
        tgt_len: decoder length for seq2seq models (default seq_len).
        seed: the generator's seed.
        device: where the tensors go.
        for_generate: leave out decoder inputs (generation makes its own).
    """
    check_int("batch", batch, 1)
    check_int("seq_len", seq_len, 1)
    vocab = int(getattr(_text_config(model), "vocab_size"))
    low = 4 if vocab > 8 else 0
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(low, vocab, (batch, seq_len), generator=gen)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if is_seq2seq(model) and not for_generate:
        t = tgt_len or seq_len
        inputs["decoder_input_ids"] = torch.randint(low, vocab, (batch, t), generator=gen)
    if device is not None:
        inputs = {k: v.to(device) for k, v in inputs.items()}
    return inputs


def param_info(model: nn.Module) -> dict:
    """Size of a model for the report: class, parameters, bytes, attention backend, heads (None when not found)."""
    params = list(model.parameters())
    buffers = list(model.buffers())
    info = {
        "class": type(model).__name__,
        "params": int(sum(p.numel() for p in params)),
        "param_bytes": int(sum(p.numel() * p.element_size() for p in params)),
        "buffer_bytes": int(sum(b.numel() * b.element_size() for b in buffers)),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "heads": None,
        "heads_summary": None,
    }
    try:
        from prunetrain.engine.heads import find_heads

        layout = find_heads(model)
        info["heads"] = layout.total_heads
        info["heads_summary"] = layout.summary()
    except (ValueError, AttributeError):
        pass
    return info


def check_compatible(a: nn.Module, b: nn.Module, label: str) -> None:
    """Refuse a variant that cannot take the baseline's inputs (another model type or vocabulary)."""
    ta, tb = _text_config(a), _text_config(b)
    if getattr(a.config, "model_type", None) != getattr(b.config, "model_type", None):
        raise ValueError(f"model_b[{label!r}]: model_type {b.config.model_type!r} differs from model_a's "
                         f"{a.config.model_type!r}; both models must take the same inputs.")
    if getattr(ta, "vocab_size", None) != getattr(tb, "vocab_size", None):
        raise ValueError(f"model_b[{label!r}]: vocab_size {tb.vocab_size} differs from model_a's {ta.vocab_size}.")


def _autocast(dtype: str, device: torch.device):
    if dtype == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return nullcontext()


def _generate_kwargs(mode: str, new_tokens: int) -> dict:
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    if mode == "greedy":
        kwargs["num_beams"] = 1
    else:
        kwargs["num_beams"] = int(mode[len("beam"):])
        kwargs["early_stopping"] = False
    return kwargs


def _pad_token_kwargs(model: nn.Module) -> dict:
    """Generation of a randomly initialised model: make sure a pad token exists (HF warns and guesses otherwise)."""
    gc_ = getattr(model, "generation_config", None)
    if gc_ is not None and gc_.pad_token_id is None:
        eos = gc_.eos_token_id
        eos = eos[0] if isinstance(eos, (list, tuple)) else eos
        if eos is not None:
            return {"pad_token_id": eos}
    return {}


@dataclass(frozen=True)
class BenchCase:
    """One measured combination: the task ("forward", "greedy", "beam4"), batch size and sequence length."""

    task: str
    batch: int
    seq_len: int

    @property
    def generates(self) -> bool:
        return self.task != "forward"


def _case_inputs(model_a: nn.Module, case: BenchCase, config: BenchConfig, dev: torch.device) -> dict:
    if config.inputs is not None:
        return {k: (v.to(dev) if torch.is_tensor(v) else v) for k, v in dict(config.inputs(case.batch,
                                                                                           case.seq_len)).items()}
    return make_inputs(model_a, case.batch, case.seq_len, config.tgt_len, seed=config.seed, device=dev,
                       for_generate=case.generates)


def _case_call(model: nn.Module, case: BenchCase, config: BenchConfig, inputs: dict, dev: torch.device):
    """The timed call of one model for `case`."""
    if case.generates:
        kwargs = {**_generate_kwargs(case.task, config.new_tokens), **_pad_token_kwargs(model)}

        def run():
            with torch.inference_mode(), _autocast(config.dtype, dev):
                return model.generate(**inputs, **kwargs)
    else:
        def run():
            with torch.inference_mode(), _autocast(config.dtype, dev):
                return model(**inputs)
    return run


def _instrumented_round(models, fns, case: BenchCase, config: BenchConfig, inputs: dict, dev) -> tuple[dict, dict]:
    """The first warm-up round: FLOP counter and memory profiler, one call per model (in the rotation's first
    order); with warmup=0 these calls happen anyway, untimed, before the timed rounds. Also checks that generation
    produced exactly the forced number of tokens."""
    flop_counts: dict[str, int | None] = {}
    mems: dict[str, dict | None] = {}
    for label, fn in fns.items():
        outputs = []

        def instrumented(fn=fn, outputs=outputs, label=label):
            if config.flops:
                flop_counts[label] = count_flops(lambda: outputs.append(fn())).total
            else:
                outputs.append(fn())

        if config.memory:
            mems[label] = peak_memory(instrumented, models[label], dev)
        else:
            instrumented()
            mems[label] = None
        flop_counts.setdefault(label, None)
        if case.generates:  # the forced length must really hold, otherwise tokens/s compares different work
            out = outputs[0]
            sequences = out.sequences if hasattr(out, "sequences") else out
            seq2seq = is_seq2seq(models[label])
            produced = sequences.shape[-1] - (0 if seq2seq else inputs["input_ids"].shape[-1])
            expected = config.new_tokens + (1 if seq2seq else 0)  # a seq2seq output starts with the decoder start
            if produced != expected:
                raise RuntimeError(f"generate: model {label!r} produced {produced} tokens per sequence, expected "
                                   f"{expected}; the benchmark needs a fixed length.")
        del outputs[:]
    return flop_counts, mems


def bench_case(models: dict, case: BenchCase, config: BenchConfig, dev: torch.device, info: dict) -> list[dict]:
    label_a = config.label_a
    model_a = models[label_a]
    inputs = _case_inputs(model_a, case, config, dev)
    fns = {label: _case_call(m, case, config, inputs, dev) for label, m in models.items()}
    flop_counts, mems = _instrumented_round(models, fns, case, config, inputs, dev)
    alt = alternate(fns, warmup=max(config.warmup - 1, 0), repeats=config.repeats, order=config.order, device=dev)
    alt.warmup_order.insert(0, list(fns))

    if case.generates:
        tokens = case.batch * config.new_tokens
    else:
        tokens = sum(int(v.numel()) for k, v in inputs.items()
                     if k in ("input_ids", "decoder_input_ids") and torch.is_tensor(v))
        tokens = tokens or case.batch * case.seq_len

    def side(label: str) -> dict:
        s = summarize(alt.times[label])
        cpu = alt.cpu_times[label]
        return {**s, "times": alt.times[label], "tokens_per_s": tokens / s["median"],
                "sequences_per_s": case.batch / s["median"], "cpu_times": cpu, "cpu_median": statistics.median(cpu),
                "cpu_per_wall": statistics.median(c / w for c, w in zip(cpu, alt.times[label]))}

    rows = []
    a = side(label_a)
    for label in models:
        if label == label_a:
            continue
        cmp = compare_times(alt.times[label_a], alt.times[label])
        fa, fb = flop_counts[label_a], flop_counts[label]
        ideal = fa / fb if fa and fb else None
        rows.append({
            "variant": label,
            "baseline": label_a,
            "task": case.task,
            "batch": case.batch,
            "seq_len": case.seq_len,
            "tgt_len": (config.tgt_len or case.seq_len) if (not case.generates and is_seq2seq(model_a)) else None,
            "new_tokens": config.new_tokens if case.generates else None,
            "tokens_per_call": tokens,
            "dtype": config.dtype,
            "a": a,
            "b": side(label),
            **cmp,
            "speedup_cpu_time": (statistics.median(alt.cpu_times[label_a]) / statistics.median(alt.cpu_times[label])
                                 if dev.type == "cpu" else None),
            "flops_a": fa,
            "flops_b": fb,
            "flop_ideal_speedup": ideal,
            **ideal_columns(cmp["speedup"], cmp["speedup_pair_median"], ideal),
            "params_a": info[label_a]["params"],
            "params_b": info[label]["params"],
            "heads_a": info[label_a]["heads"],
            "heads_b": info[label]["heads"],
            "memory_a": mems[label_a],
            "memory_b": mems[label],
            "order": alt.order,
            "order_string": alt.order_string(),
            "warmup_order": alt.warmup_order,
        })
    return rows


__all__ = ["BenchCase", "bench_case", "can_generate", "check_compatible", "is_seq2seq", "make_inputs", "param_info"]
