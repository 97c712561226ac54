"""GGUF export for llama.cpp: a model of the Llama family with a different number of heads and a different FFN
width in every layer.

llama.cpp's `deci` architecture (written for Nemotron-51B) reads the query and key/value head counts and the FFN
width per layer (`deci.attention.head_count`, `head_count_kv` and `deci.feed_forward_length` as arrays:
`n_head(il)`, `n_head_kv(il)`, `n_ff(il)`) and runs a layer with no heads as an identity on the attention path
(`cur = inpL`), so it computes, per layer l,

    h = x + Σ_{h ∈ heads(l)} softmax(RoPE(q_h) RoPE(k_g(h))ᵀ / √d) v_g(h) W_o^h,
    y = h + Σ_{j ∈ neurons(l)} (SiLU(RMSNorm(h)·g_j) · RMSNorm(h)·u_j) d_j  (+ the down projection's bias)

which is what a shrunk `LlamaForCausalLM` / `MistralForCausalLM` / `Qwen2ForCausalLM` computes. A layer whose FFN
width is 0 is skipped whole by llama.cpp (`if (n_ff == 0) continue;` comes before the residual add of the attention
output; in the last layer it also discards the selection of the output rows, and llama.cpp aborts), so an FFN is
written with width 0 (no `ffn_norm`, no FFN tensors) only where that skip is what the model computes: a layer other
than the last with no heads, no neurons and no down-projection bias. Every other emptied FFN is written with one zero
neuron (zero gate and up rows, zero down column: it adds exactly 0; `padding_report` counts them). Tensors are
written as llama.cpp's converter writes them: rows of W_q and W_k (and their biases) permuted per head from
Hugging Face's rotate-half layout (pairs i, i + d/2) to the interleaved pairs (2i, 2i + 1) of llama.cpp's rotary
embedding (`LLAMA_ROPE_TYPE_NORM`); q·k is unchanged because both are permuted alike.

Refused with one sentence, nothing written: other families; rotary scaling other than the default; activations other
than SiLU; a first layer with no heads (llama.cpp takes the head size from layer 0's head count); a head-less layer
whose output projection has a bias (llama.cpp skips the whole attention path there). A sliding window (Mistral,
Qwen2 with `use_sliding_window`) is written as the context length, below which the window never acts.

Qwen3, Gemma 2/3, Phi-3, OLMo 2 and Granite are written through their own llama.cpp architectures, which size
every layer alike: each layer's heads and FFN neurons are padded with zero heads and zero neurons to the same counts
(`prunetrain.export.gguf_families`; `padding_report` gives the cost).

Every export is run in llama.cpp before it is written (`check_gguf`): its logits on a probe must equal the model's
within `TOLERANCE[type]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from prunetrain.engine.heads import find_heads, unwrap_model
from prunetrain.export.gguf_families import (FAMILY_ARCH, FamilyPlan, check_gguf_type, family_plan, family_tensors,
                                             rope_interleave, write_family_metadata,
                                             write_shape_metadata)
from prunetrain.export.gguf_families import padding_report as family_padding_report
from prunetrain.utils.door import checked

FAMILIES = ("llama", "mistral", "qwen2")
GGUF_TYPES = ("f32", "f16", "q8_0")
FILE_NAME = "model.gguf"
ARCH = "deci"
# max |llama.cpp − model| over the probe's logits, relative to max |logit|. f32: both compute in f32 and differ only
# in summation order (measured 1e-7 to 2e-6). f16: weights are rounded to f16 and ggml rounds the activations
# multiplied with them to f16 (measured 4e-4 to 1.6e-3). q8_0: weights in blocks of 32 8-bit values with an f16
# scale, activations quantised alike for the dot products (measured 1.1e-2 to 4.0e-2; greedy tokens may differ).
TOLERANCE = {"f32": 1e-5, "f16": 1e-2, "q8_0": 1e-1}
FILE_TYPE = {"f32": 0, "f16": 1, "q8_0": 7}  # gguf.LlamaFileType.ALL_F32, MOSTLY_F16 (1-D tensors stay f32)


@dataclass(frozen=True)
class GgufPlan:
    """What llama.cpp's `deci` graph needs to know about a model (from its weights, not only its config)."""

    heads: tuple[int, ...]       # query heads per layer
    kv_heads: tuple[int, ...]    # key/value heads per layer
    ffn_kept: tuple[int, ...]    # FFN neurons the model holds per layer
    ffn: tuple[int, ...]         # FFN width written per layer: ffn_kept, or 1 zero neuron where llama.cpp needs one
    head_dim: int
    context_length: int
    rope_theta: float
    rms_norm_eps: float
    tied: bool                   # lm_head shares the token embedding


def _refuse(why: str) -> ValueError:
    return ValueError(f"format: 'gguf' {why}")


def _decoder_layers(model: nn.Module):
    base = getattr(model, "model", None)
    return getattr(base, "layers", None), base


def _check_family(model: nn.Module) -> None:
    config = model.config
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES + tuple(FAMILY_ARCH) or not type(model).__name__.endswith("ForCausalLM"):
        raise _refuse(f"writes causal language models of the Llama family ({', '.join(FAMILIES)}) for llama.cpp's "
                      f"per-layer-heads graph, and of {', '.join(FAMILY_ARCH)} through their own llama.cpp "
                      f"architectures (heads padded); {type(model).__name__} ({model_type!r}) is not one.")
    layers, base = _decoder_layers(model)
    if layers is None or not all(hasattr(base, n) for n in ("embed_tokens", "norm")):
        raise _refuse(f"cannot find the decoder layers of {type(model).__name__} (model.layers, embed_tokens, norm).")
    if model_type in FAMILY_ARCH:
        return  # its own checks: gguf_families.family_plan
    act = getattr(config, "hidden_act", None)
    if act != "silu":
        raise _refuse(f"needs the SiLU-gated feed-forward llama.cpp runs; this model's hidden_act is {act!r}.")
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default" or rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise _refuse(f"writes the default rotary embedding over the whole head; this model's rope_parameters "
                      f"are {dict(rope)!r}.")


def gguf_plan(model: nn.Module) -> GgufPlan | FamilyPlan:
    """The per-layer head counts, FFN widths (kept and written, `ffn_width`) and hyper-parameters of `model` for
    llama.cpp; `ValueError` says why it cannot be written exactly. A family of `FAMILY_ARCH` gets a `FamilyPlan`
    (its own architecture, heads and neurons padded: `prunetrain.export.gguf_families`).

    Args:
        model: a (shrunk) Llama, Mistral or Qwen2 causal LM, or one of `FAMILY_ARCH`.
    """
    model = unwrap_model(model)
    _check_family(model)
    if model.config.model_type in FAMILY_ARCH:
        return family_plan(model)
    layers, base = _decoder_layers(model)
    sites = [s for s in find_heads(model) if s.kind == "self"]
    if len(sites) != len(layers):
        raise _refuse(f"expects one attention site per layer; found {len(sites)} sites in {len(layers)} layers.")
    head_dim = sites[0].head_dim
    if head_dim % 2:
        raise _refuse(f"needs an even head size for the rotary embedding; this model's is {head_dim}.")
    heads, kv_heads, ffn_kept, ffn = [], [], [], []
    for index, layer in enumerate(layers):
        attn = layer.self_attn
        h, kv = attn.q_proj.weight.shape[0] // head_dim, attn.k_proj.weight.shape[0] // head_dim
        if h == 0 and _adds_bias(attn.o_proj):
            raise _refuse(f"cannot write layer {index}: it has no heads but its output projection adds a bias, and "
                          f"llama.cpp skips the attention path of a head-less layer entirely.")
        heads.append(h)
        kv_heads.append(kv)
        ffn_kept.append(layer.mlp.down_proj.weight.shape[1])
        ffn.append(ffn_width(ffn_kept[-1], h, _adds_bias(layer.mlp.down_proj), last=index == len(layers) - 1))
    if heads[0] == 0:
        raise _refuse("cannot write a model whose first layer has no heads: llama.cpp derives the head size from "
                      "layer 0's head count (keep at least one key/value group there).")
    config = model.config
    context = int(getattr(config, "max_position_embeddings", 2048))
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or []
    uses_window = window and (getattr(config, "use_sliding_window", True) is not False
                              or "sliding_attention" in layer_types)
    if uses_window:
        context = min(context, int(window))  # within the window's length the window never masks anything
    lm_head = model.get_output_embeddings()
    tied = lm_head is not None and lm_head.weight.data_ptr() == base.embed_tokens.weight.data_ptr()
    rope = getattr(config, "rope_parameters", None) or {}
    return GgufPlan(tuple(heads), tuple(kv_heads), tuple(ffn_kept), tuple(ffn), head_dim, context,
                    float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
                    float(config.rms_norm_eps), tied)


def _adds_bias(linear: nn.Linear) -> bool:
    """Whether `linear` has a bias with a non-zero entry."""
    return linear.bias is not None and bool(linear.bias.detach().ne(0).any())


def ffn_width(kept: int, heads: int, down_bias: bool, last: bool) -> int:
    """The FFN width written for a layer that keeps `kept` neurons and `heads` query heads.

    `kept` when it is not 0. An emptied FFN is written with width 0 only where llama.cpp's skip of a width-0 layer
    computes what the model does: no heads (else the attention output, added after the skip, would be lost), no
    bias on the down projection (else the FFN adds it), and not the last layer (the skip there discards the
    selection of the output rows, and llama.cpp aborts); otherwise with one zero neuron, which adds exactly 0.
    """
    if kept > 0 or heads > 0 or down_bias or last:
        return max(kept, 1)
    return 0


def padding_report(plan: GgufPlan | FamilyPlan) -> dict:
    """Heads and FFN neurons the model keeps and those llama.cpp executes for the export of `plan` (`deci`: heads are
    never padded, an emptied FFN may run one zero neuron, see `ffn_width`; a `FamilyPlan` pads every layer to the
    same counts)."""
    if isinstance(plan, FamilyPlan):
        return family_padding_report(plan)
    return {"heads_kept": sum(plan.heads), "heads_executed": sum(plan.heads),
            "neurons_kept": sum(plan.ffn_kept), "neurons_executed": sum(plan.ffn)}


def gguf_tensors(model: nn.Module, plan: GgufPlan) -> dict[str, torch.Tensor]:
    """{GGUF tensor name: tensor} in llama.cpp's names (`blk.{i}.attn_q.weight`, ...), q/k rows interleaved."""
    layers, base = _decoder_layers(unwrap_model(model))
    out = {"token_embd.weight": base.embed_tokens.weight, "output_norm.weight": base.norm.weight}
    if not plan.tied:
        out["output.weight"] = model.get_output_embeddings().weight
    for i, layer in enumerate(layers):
        attn, mlp = layer.self_attn, layer.mlp
        if plan.heads[i] > 0:
            out[f"blk.{i}.attn_norm.weight"] = layer.input_layernorm.weight
            for short, proj, heads in (("q", attn.q_proj, plan.heads[i]), ("k", attn.k_proj, plan.kv_heads[i]),
                                       ("v", attn.v_proj, 0)):
                out[f"blk.{i}.attn_{short}.weight"] = rope_interleave(proj.weight, heads)
                if proj.bias is not None:
                    out[f"blk.{i}.attn_{short}.bias"] = rope_interleave(proj.bias, heads)
            out[f"blk.{i}.attn_output.weight"] = attn.o_proj.weight
            if attn.o_proj.bias is not None:
                out[f"blk.{i}.attn_output.bias"] = attn.o_proj.bias
        if plan.ffn[i] > 0:
            out[f"blk.{i}.ffn_norm.weight"] = layer.post_attention_layernorm.weight
            out.update(ffn_tensors(i, mlp, plan.ffn[i]))
    return out


def ffn_tensors(index: int, mlp: nn.Module, width: int) -> dict[str, torch.Tensor]:
    """The gate, up and down tensors (and biases) of layer `index`'s FFN written with `width` neurons: its own, or,
    for an emptied FFN written with one neuron, a zero neuron (zero gate and up rows and biases, zero down column;
    the down projection's bias is kept)."""
    zero_neuron = mlp.down_proj.weight.shape[1] != width
    out = {}
    for short, proj in (("gate", mlp.gate_proj), ("up", mlp.up_proj), ("down", mlp.down_proj)):
        weight, bias = proj.weight, proj.bias
        if zero_neuron:
            weight = weight.new_zeros((weight.shape[0], width) if short == "down" else (width, weight.shape[1]))
            if bias is not None and short != "down":
                bias = bias.new_zeros(width)
        out[f"blk.{index}.ffn_{short}.weight"] = weight
        if bias is not None:
            out[f"blk.{index}.ffn_{short}.bias"] = bias
    return out


@torch.no_grad()  # outside the door: the door resolves the hints in this module
@checked
def write_gguf(model: nn.Module, path: str | Path, gguf_type: str = "f32", tokenizer_dir: str | Path | None = None
               ) -> dict:
    """Write `model` as a GGUF file of llama.cpp's `deci` architecture (or its family's, `gguf_families`); returns
    {"plan", "tokenizer", "vocab_size"} and the `padding_report` ("heads_kept", "heads_executed", "neurons_kept",
    "neurons_executed").

    Args:
        model: a (shrunk) Llama, Mistral or Qwen2 causal LM, or one of `FAMILY_ARCH`.
        path: the `.gguf` file to write.
        gguf_type: "f32", "f16" (matrices in f16; norms and biases stay f32) or "q8_0" (matrices whose rows are
            made of 32-value blocks in llama.cpp's Q8_0, the others f16; norms and biases f32).
        tokenizer_dir: a model directory whose byte-level BPE `tokenizer.json` is written (None: no tokenizer).
    """
    import gguf

    from prunetrain.export.gguf_vocab import read_vocab, write_vocab

    model = unwrap_model(model)
    plan = gguf_plan(model)
    config = model.config
    vocab_size = base_vocab = model.get_input_embeddings().weight.shape[0]
    vocab = read_vocab(tokenizer_dir, base_vocab)  # checked entry by entry before the file is opened
    writer = gguf.GGUFWriter(str(path), arch=plan.arch if isinstance(plan, FamilyPlan) else ARCH)
    writer.add_name(str(getattr(config, "_name_or_path", "") or "prunetrain export"))
    if isinstance(plan, FamilyPlan):
        write_family_metadata(writer, model, plan)
        tensors = family_tensors(model, plan)
    else:
        _write_deci_metadata(writer, config, plan)
        tensors = gguf_tensors(model, plan)
    writer.add_file_type(FILE_TYPE[gguf_type])
    tokenizer = write_vocab(writer, vocab, config, base_vocab)
    for name, tensor in tensors.items():
        array = np.ascontiguousarray(tensor.detach().float().cpu().numpy())
        if gguf_type == "q8_0" and array.ndim == 2 and array.shape[1] % 32 == 0:
            writer.add_tensor(name, gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            continue
        if gguf_type != "f32" and array.ndim == 2:  # f16 (q8_0: rows not made of 32-value blocks)
            array = array.astype(np.float16)
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"plan": plan, "tokenizer": tokenizer, "vocab_size": vocab_size, **padding_report(plan)}


def _write_deci_metadata(writer, config, plan: GgufPlan) -> None:
    """The `deci` hyper-parameters: per-layer head counts and FFN widths."""
    write_shape_metadata(writer, config, plan, len(plan.heads), list(plan.ffn), list(plan.heads), list(plan.kv_heads))


def probe_tokens(model: nn.Module, length: int = 24, seed: int = 0) -> list[int]:
    """A reproducible token sequence for the check (ids from 3 up, below the vocabulary size)."""
    vocab = model.get_input_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, max(vocab, 4), (length,), generator=gen).tolist()


@torch.no_grad()
def model_logits(model: nn.Module, tokens: list[int]) -> np.ndarray:
    """The model's `[len(tokens), vocab]` logits in f32 (one sequence, no padding), in eval mode; the model's
    modes are put back afterwards (`prunetrain.engine.read_only`)."""
    from prunetrain.engine.read_only import modes_kept

    model = unwrap_model(model)
    with modes_kept(model):
        ids = torch.tensor([tokens], device=next(model.parameters()).device)
        return model.eval()(input_ids=ids, use_cache=False).logits[0].float().cpu().numpy()


@checked
def check_gguf(model: nn.Module, path: str | Path, gguf_type: str, threads: int = 1) -> float:
    """max |llama.cpp − model| / max |logit| on a probe sequence, run in llama.cpp; `ValueError` above
    `TOLERANCE[gguf_type]`."""
    from prunetrain.export.llama_cpp import open_model, prompt_logits, quiet_stderr

    tokens = probe_tokens(model)
    want = model_logits(model, tokens)
    llm = open_model(path, n_ctx=max(64, len(tokens)), threads=threads)
    try:
        with quiet_stderr():
            got = prompt_logits(llm, tokens)
    finally:
        llm.close()
    if got.shape != want.shape:
        raise _refuse(f"export gives logits of shape {got.shape} in llama.cpp, the model {want.shape}; it is not "
                      f"written.")
    diff = float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-12))
    if not diff <= TOLERANCE[gguf_type]:
        raise _refuse(f"export ({gguf_type}) differs from the model in llama.cpp (max |Δ| {diff:.3g} of the largest "
                      f"logit > {TOLERANCE[gguf_type]:g} on a probe); it is not written.")
    return diff


@checked
def export_gguf(model: nn.Module, out: Path, gguf_type: str = "f32", tokenizer_dir: str | Path | None = None
                ) -> float:
    """Write `out/model.gguf` and check it in llama.cpp; returns the relative max |Δ| of the logits."""
    from prunetrain.export.gguf_vocab import read_vocab
    from prunetrain.export.llama_cpp import llama_cpp_missing

    plan = gguf_plan(model)  # refuse before anything is written: the model, then its tokenizer, then the environment
    if isinstance(plan, FamilyPlan):
        check_gguf_type(plan, gguf_type)
    read_vocab(tokenizer_dir, unwrap_model(model).get_input_embeddings().weight.shape[0])
    missing = llama_cpp_missing()
    if missing is not None:
        raise _refuse(f"export is checked in llama.cpp: {missing}")
    out.mkdir(parents=True, exist_ok=True)
    write_gguf(model, out / FILE_NAME, gguf_type, tokenizer_dir)
    return check_gguf(model, out / FILE_NAME, gguf_type)


@checked
def gguf_reason(model: nn.Module, tokenizer_dir: str | Path | None = None) -> str | None:
    """None when `model` (with the tokenizer of `tokenizer_dir`) can be written as GGUF, else one sentence why not
    (for `check_formats`)."""
    from prunetrain.export.gguf_vocab import find_tokenizer, has_other_tokenizer, read_vocab
    from prunetrain.export.llama_cpp import llama_cpp_missing

    try:
        gguf_plan(model)
        if find_tokenizer(tokenizer_dir) is None and has_other_tokenizer(tokenizer_dir):
            return (f"its tokenizer ({has_other_tokenizer(tokenizer_dir)}) is not a byte-level BPE tokenizer.json, "
                    f"the kind GGUF export writes.")
        read_vocab(tokenizer_dir, unwrap_model(model).get_input_embeddings().weight.shape[0])
    except ValueError as err:
        return str(err).removeprefix("format: ").removeprefix("tokenizer: ")
    return llama_cpp_missing()


def gguf_padding(source) -> dict:
    """What the GGUF export of `source` (a model or a saved directory) runs, for `prunetrain export --check`:
    {"architecture": llama.cpp's, "gguf_types": those it can be written in, "heads_kept", "heads_executed",
    "neurons_kept", "neurons_executed"} (zero heads and zero neurons are executed too); `ValueError` where it cannot
    be written."""
    from prunetrain.export.source import load_source

    plan = gguf_plan(load_source(source))
    types = list(GGUF_TYPES)
    if isinstance(plan, FamilyPlan):
        types = [t for t in GGUF_TYPES if _writable(plan, t)]
    return {"architecture": plan.arch if isinstance(plan, FamilyPlan) else ARCH, "gguf_types": types,
            **padding_report(plan)}


def _writable(plan: FamilyPlan, gguf_type: str) -> bool:
    try:
        check_gguf_type(plan, gguf_type)
    except ValueError:
        return False
    return True
