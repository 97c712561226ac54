"""ONNX export of a (shrunk) model for ONNX Runtime, with the TorchScript-based exporter (`dynamo=False`).

Graphs (file names after Hugging Face Optimum's; inputs and outputs as listed here):
- encoder-only (BERT, ...): `model.onnx`, (input_ids, attention_mask) → logits (or last_hidden_state);
- decoder-only (GPT-2, Llama, ...): `model.onnx`, (input_ids, attention_mask) → logits, and
  `decoder_with_past_model.onnx`, (input_ids, attention_mask, past_key_values.{i}.key/value) → (logits,
  present.{i}.key/value), the KV cache graph for generation (the past may have length 0: one graph for the prompt
  and each new token; `greedy_generate` runs it). Each layer's cache has its own number of key/value heads;
- encoder-decoder (Marian, T5, ...): the split graphs ONNX Runtime generation uses, `encoder_model.onnx`
  (input_ids, attention_mask) → last_hidden_state, `decoder_model.onnx` (decoder_input_ids,
  encoder_hidden_states, encoder_attention_mask) → logits, and `decoder_with_past_model.onnx` (the same plus
  past_key_values.{i}.decoder.key/value → logits, present.{i}.decoder.key/value): the decoder self-attention cache;
  cross-attention keys/values are recomputed from encoder_hidden_states at each step.
Batch and sequence axes are dynamic. `check_onnx` runs ONNX Runtime (CPU) on a probe input and compares with
PyTorch (max |Δ| ≤ 1e-4), so a graph that computes something else is never left behind.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from prunetrain.export.onnx_runtime import (  # noqa: F401 (the names this module has always offered)
    OPSET,
    TOLERANCE,
    OrtGenerator,
    greedy_generate,
    read_generation_config,
    session,
)
from prunetrain.export.probe import first_output, probe_inputs
from prunetrain.utils.door import checked


# The wrappers are put in eval mode: the exporter restores the mode it found on the module it exports, and would
# otherwise switch the model itself (dropout on) to training mode afterwards.
class _Logits(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return first_output(self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False))


class _Encoder(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_ids, attention_mask):
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask)[0]


class _Decoder(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, decoder_input_ids, encoder_hidden_states, encoder_attention_mask):
        out = self.model(decoder_input_ids=decoder_input_ids, encoder_outputs=(encoder_hidden_states,),
                         attention_mask=encoder_attention_mask, use_cache=False)
        return first_output(out)


class _DecoderWithPast(nn.Module):
    """(input_ids, attention_mask, past k/v per layer) → (logits, present k/v per layer). The past may be empty
    (length 0): one graph for the prompt and every generated token. Each layer's cache holds that layer's number of
    key/value heads (0 at a head-less site, whose cache layer counts positions from the position axis). Positions
    are those `generate` gives (cumsum of the attention mask − 1, 0 at padding), so a left-padded prompt generates
    as in PyTorch also for models with absolute positions (GPT-2)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        import inspect

        from prunetrain.engine.heads import attention_sites

        self.model = model
        self.takes_positions = "position_ids" in inspect.signature(model.forward).parameters
        self.headless = [getattr(s.module, "layer_idx", i) for i, s in enumerate(attention_sites(model))
                         if s.info.num_heads == 0]

    def forward(self, input_ids, attention_mask, *past):
        from transformers import DynamicCache

        from prunetrain.engine.kv_cache import headless_layer_class

        cache = DynamicCache()
        for i in range(len(past) // 2):
            cache.update(past[2 * i], past[2 * i + 1], i)
        for i in self.headless:
            cache.layers[i].__class__ = headless_layer_class()
        extra = {}
        if self.takes_positions:  # as GenerationMixin._prepare_position_ids_for_generation
            positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
            extra["position_ids"] = positions[:, attention_mask.shape[1] - input_ids.shape[1]:]
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True,
                         **extra)
        present = []
        for layer in out.past_key_values.layers:
            present += [layer.keys, layer.values]
        return (out.logits, *present)


class _Seq2SeqDecoderWithPast(nn.Module):
    """(decoder_input_ids, encoder_hidden_states, encoder_attention_mask, past decoder self-attention k/v per
    layer) → (logits, present k/v per layer); the cross-attention keys/values are computed from
    `encoder_hidden_states` in every call (they are not cached). The past may be empty."""

    def __init__(self, model: nn.Module):
        super().__init__()
        from prunetrain.engine.heads import attention_sites

        self.model = model
        self.headless = [getattr(s.module, "layer_idx", i) for i, s in
                         enumerate(x for x in attention_sites(model) if x.info.kind == "decoder_self")
                         if s.info.num_heads == 0]

    def forward(self, decoder_input_ids, encoder_hidden_states, encoder_attention_mask, *past):
        from transformers import DynamicCache, EncoderDecoderCache

        from prunetrain.engine.kv_cache import headless_layer_class

        self_cache = DynamicCache()
        for i in range(len(past) // 2):
            self_cache.update(past[2 * i], past[2 * i + 1], i)
        for i in self.headless:
            self_cache.layers[i].__class__ = headless_layer_class()
        out = self.model(decoder_input_ids=decoder_input_ids, encoder_outputs=(encoder_hidden_states,),
                         attention_mask=encoder_attention_mask, use_cache=True,
                         past_key_values=EncoderDecoderCache(self_cache, DynamicCache()))
        present = []
        for layer in out.past_key_values.self_attention_cache.layers:
            present += [layer.keys, layer.values]
        return (out.logits, *present)


def _cached_sites(model: nn.Module) -> list:
    from prunetrain.engine.heads import find_heads

    kind = "decoder_self" if getattr(model.config, "is_encoder_decoder", False) else "self"
    return [s for s in find_heads(model) if s.kind == kind]


def past_names(model: nn.Module) -> tuple[list[str], list[str]]:
    """Input names of the past keys/values and output names of the present ones, layer by layer
    (`past_key_values.{i}.key`, or `past_key_values.{i}.decoder.key` for an encoder-decoder)."""
    part = ".decoder" if getattr(model.config, "is_encoder_decoder", False) else ""
    n = len(_cached_sites(model))
    past = [f"past_key_values.{i}{part}.{kv}" for i in range(n) for kv in ("key", "value")]
    return past, [name.replace("past_key_values", "present") for name in past]


def empty_past(model: nn.Module, batch: int) -> list[torch.Tensor]:
    """The past of length 0 (for the prompt): `[batch, kv heads of the layer, 0, head_dim]` per key and value."""
    return [torch.zeros(batch, s.num_kv_heads, 0, s.head_dim) for s in _cached_sites(model) for _ in range(2)]


def _has_kv_cache_graph(model: nn.Module) -> bool:
    from prunetrain.engine.heads import find_heads

    kinds = {s.kind for s in find_heads(model)}
    if getattr(model.config, "is_encoder_decoder", False):
        return "decoder_self" in kinds
    return model.can_generate() and kinds == {"self"}


def _prefill_past(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, hidden=None, enc_mask=None) -> list:
    with torch.no_grad():
        if hidden is None:
            out = model(input_ids=ids, attention_mask=mask, use_cache=True)
            layers = out.past_key_values.layers
        else:
            out = model(decoder_input_ids=ids, encoder_outputs=(hidden,), attention_mask=enc_mask, use_cache=True)
            layers = out.past_key_values.self_attention_cache.layers
    past = []
    for layer in layers:
        past += [layer.keys, layer.values]
    return past


def _is_encoder_only(model: nn.Module) -> bool:
    from prunetrain.engine.heads import find_heads

    return not getattr(model.config, "is_decoder", False) and "decoder" not in type(model).__name__.lower() and \
        not any(name in type(model).__name__ for name in ("CausalLM", "LMHeadModel")) and \
        all(s.kind == "self" for s in find_heads(model))


def graphs(model: nn.Module) -> dict[str, tuple[nn.Module, tuple, list[str], list[str], dict]]:
    """{file name: (module, example args, input names, output names, dynamic axes)} for `model`."""
    inputs = probe_inputs(model)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    seq = {0: "batch", 1: "sequence"}
    if getattr(model.config, "is_encoder_decoder", False):
        with torch.no_grad():
            hidden = model.get_encoder()(input_ids=ids, attention_mask=mask)[0]
        dec = inputs["decoder_input_ids"]
        past_in, present_out = past_names(model)
        axes = {"decoder_input_ids": {0: "batch", 1: "decoder_sequence"}, "encoder_hidden_states": seq,
                "encoder_attention_mask": seq, "logits": {0: "batch", 1: "decoder_sequence"},
                **{n: {0: "batch", 2: "past_decoder_sequence"} for n in past_in},
                **{n: {0: "batch", 2: "total_decoder_sequence"} for n in present_out}}
        with_past = {"decoder_with_past_model.onnx": (
            _Seq2SeqDecoderWithPast(model).eval(),
            (dec[:, 2:], hidden, mask, *_prefill_past(model, dec[:, :2], None, hidden, mask)),
            ["decoder_input_ids", "encoder_hidden_states", "encoder_attention_mask", *past_in],
            ["logits", *present_out], axes)} if _has_kv_cache_graph(model) else {}
        return {**with_past,
            "encoder_model.onnx": (_Encoder(model).eval(), (ids, mask), ["input_ids", "attention_mask"],
                                   ["last_hidden_state"], {"input_ids": seq, "attention_mask": seq,
                                                           "last_hidden_state": seq}),
            "decoder_model.onnx": (_Decoder(model).eval(), (dec, hidden, mask),
                                   ["decoder_input_ids", "encoder_hidden_states", "encoder_attention_mask"],
                                   ["logits"], {"decoder_input_ids": {0: "batch", 1: "decoder_sequence"},
                                                "encoder_hidden_states": seq, "encoder_attention_mask": seq,
                                                "logits": {0: "batch", 1: "decoder_sequence"}}),
        }
    out = {"model.onnx": (_Logits(model).eval(), (ids, mask), ["input_ids", "attention_mask"], ["logits"],
                          {"input_ids": seq, "attention_mask": seq, "logits": seq})}
    if _has_kv_cache_graph(model):
        past_in, present_out = past_names(model)
        cut = ids.shape[1] - 3  # traced with a past and a query of several tokens: no single-token shortcut
        axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "total_sequence"},
                "logits": {0: "batch", 1: "sequence"}, **{n: {0: "batch", 2: "past_sequence"} for n in past_in},
                **{n: {0: "batch", 2: "total_sequence"} for n in present_out}}
        out["decoder_with_past_model.onnx"] = (
            _DecoderWithPast(model).eval(), (ids[:, cut:], mask, *_prefill_past(model, ids[:, :cut], mask[:, :cut])),
            ["input_ids", "attention_mask", *past_in], ["logits", *present_out], axes)
    return out


@checked
def export_onnx(model: nn.Module, directory: str | Path) -> list[str]:
    """Write `model`'s ONNX graph(s) into `directory` and check each with ONNX Runtime; returns the file names.

    Args:
        model: a (shrunk) transformers model; exported in eval mode with eager attention, its own modes and attention
            implementation left as they were.
        directory: an existing directory.
    """
    import warnings
    from contextlib import ExitStack

    from prunetrain.engine.read_only import attention_kept, modes_kept

    directory = Path(directory)
    kept = ExitStack()  # the caller's model is left as given: its modes and attention implementation(s)
    kept.enter_context(modes_kept(model))
    kept.enter_context(attention_kept(model.config))
    model.eval()
    model.config._attn_implementation = "eager"
    try:
        written = []
        for name, (module, args, in_names, out_names, axes) in graphs(model).items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                error = _run_isolated(lambda: torch.onnx.export(
                    module, args, str(directory / name), input_names=in_names, output_names=out_names,
                    dynamic_axes=axes, opset_version=OPSET, dynamo=False, do_constant_folding=True))
                if error is not None:  # the exporter's own errors are long; one line names the graph
                    _raise_write_failure(error, directory / name)  # a full or read-only disk: the OSError it was
                    raise ValueError(f"format: {type(model).__name__} could not be exported to ONNX ({name}: "
                                     f"{error}).")
            written.append(name)
        check_onnx(model, directory)
        if getattr(model.config, "is_encoder_decoder", False) and _has_kv_cache_graph(model):
            written += _beam_search_graph(model, directory)
        return written
    finally:
        kept.close()


def _beam_search_graph(model: nn.Module, directory: Path) -> list[str]:
    """`beam_search_model.onnx` (ONNX Runtime's BeamSearch operator, `prunetrain.export.onnx_beam_op`), checked
    against PyTorch. It is an addition to the graphs the export is made of: where the operator cannot run the model
    (no decoder self-attention head left) or its subgraphs cannot be traced or differ from PyTorch, it is not
    written (a warning says why; the Python loop of `prunetrain.export.onnx_beam` decodes the export)."""
    import warnings

    from prunetrain.export.onnx_beam_op import FILE, cache_order, check_beam_search, export_beam_search

    try:
        cache_order(model)
    except ValueError:
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        error = _run_isolated(lambda: export_beam_search(model, directory))
    if error is None:
        try:
            check_beam_search(model, directory)
            return [FILE]
        except ValueError as err:
            error = str(err)
    _raise_write_failure(error, directory / FILE)  # a full or read-only disk is the export's failure
    (directory / FILE).unlink(missing_ok=True)
    warnings.warn(f"{FILE} not written ({type(model).__name__}: {error}); beam search runs with "
                  f"prunetrain.export.onnx_beam's loop.", stacklevel=3)
    return []


def _raise_write_failure(error: str, path: Path) -> None:
    """The child's error line of a failed write (`[Errno 28] No space left on device`) raised again as that
    `OSError`, so the caller reports it as the output's (`prunetrain.utils.write_errors`)."""
    import os
    import re

    from prunetrain.utils.write_errors import REASONS

    found = re.search(r"\[Errno (\d+)\]", error)
    if found and int(found.group(1)) in REASONS:  # the exporter writes only the graph file
        raise OSError(int(found.group(1)), os.strerror(int(found.group(1))), str(path))


def _run_isolated(fn) -> str | None:
    """Run `fn()` in a forked child (POSIX) and return None, or the first line of its error. The TorchScript
    exporter can crash the whole process (e.g. SIGFPE on a zero-width reshape of a head-less site); in a child such
    a crash becomes an error message. The child runs torch with one thread (OpenMP cannot be used across fork).
    Without `os.fork`, `fn` runs here."""
    import os

    def first_line(err: BaseException) -> str:
        return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]

    if not hasattr(os, "fork"):  # pragma: no cover - Windows
        try:
            fn()
            return None
        except Exception as err:
            return first_line(err)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: export, report, exit without running the parent's cleanup
        os.close(read)
        # OpenMP's thread pool does not survive fork: a parallel region in the child would wait forever for the
        # parent's worker threads (seen: the exporter hung after the parent had run a 2-thread forward). One thread
        # keeps every region on this thread.
        torch.set_num_threads(1)
        import faulthandler

        faulthandler.disable()  # a crash here is reported by the parent in one line, not as a stack dump
        quiet = os.open(os.devnull, os.O_WRONLY)  # the exporter prints whole graphs with its errors
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        code = 0
        try:
            fn()
        except BaseException as err:
            os.write(write, first_line(err).encode("utf-8", "replace"))
            code = 1
        os.close(write)
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode("utf-8", "replace")
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"the exporter crashed with signal {os.WTERMSIG(status)}"
    if os.WEXITSTATUS(status) != 0:
        return message or f"the exporter exited with status {os.WEXITSTATUS(status)}"
    return None


@checked
@torch.no_grad()
def check_onnx(model: nn.Module, directory: str | Path, seed: int = 1) -> float:
    """max |ORT − PyTorch| over the graphs in `directory` on a fresh probe input (other shapes than the export's);
    raises `ValueError` above `TOLERANCE`."""
    directory = Path(directory)
    worst = 0.0
    inputs = probe_inputs(model, batch=3, length=9, seed=seed)
    for name, (module, _, in_names, out_names, _) in graphs(model).items():
        if name == "decoder_with_past_model.onnx":
            ids, mask = inputs["input_ids"], inputs["attention_mask"]
            if getattr(model.config, "is_encoder_decoder", False):
                hidden = model.get_encoder()(input_ids=ids, attention_mask=mask)[0]
                dec = inputs["decoder_input_ids"]
                cases = ((dec[:, 3:], hidden, mask, *_prefill_past(model, dec[:, :3], None, hidden, mask)),
                         (dec, hidden, mask, *empty_past(model, ids.shape[0])))
            else:
                cases = ((ids[:, 5:], mask, *_prefill_past(model, ids[:, :5], mask[:, :5])),  # 4 new tokens
                         (ids, mask, *empty_past(model, ids.shape[0])))  # the prompt
            for args in cases:
                want = module(*args)
                got = session(directory / name).run(out_names, {n: a.numpy() for n, a in zip(in_names, args)})
                for g, w in zip(got, want):
                    diff = float((torch.from_numpy(g) - w.float()).abs().max()) if w.numel() else 0.0
                    worst = max(worst, diff)
                    if tuple(g.shape) != tuple(w.shape) or not diff <= TOLERANCE:
                        raise ValueError(f"format: ONNX Runtime's output of {name} differs from PyTorch's (max |Δ| "
                                         f"{diff:.3g}, shapes {tuple(g.shape)} / {tuple(w.shape)}); the export is "
                                         f"not written.")
            continue
        if name == "decoder_model.onnx":
            hidden = model.get_encoder()(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])[0]
            args = (inputs["decoder_input_ids"], hidden, inputs["attention_mask"])
        else:
            args = (inputs["input_ids"], inputs["attention_mask"])
        want = module(*args)
        feeds = {n: a.numpy() for n, a in zip(in_names, args)}
        got = session(directory / name).run(out_names, feeds)[0]
        diff = float((torch.from_numpy(got) - want.float()).abs().max())
        worst = max(worst, diff)
        if not diff <= TOLERANCE:
            raise ValueError(f"format: ONNX Runtime's output of {name} differs from PyTorch's by {diff:.3g} "
                             f"(> {TOLERANCE:g}); the export is not written.")
    return worst
