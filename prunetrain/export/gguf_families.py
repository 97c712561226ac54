"""GGUF export of the newer decoder families (Qwen3, Gemma 2, Gemma 3, Phi-3, OLMo 2, Granite) through each family's
own llama.cpp architecture (`qwen3`, `gemma2`, `gemma3`, `phi3`, `olmo2`, `granite`).

These architectures read the head counts and the FFN width per layer from the file but size every layer's tensors
and graph with layer 0's (`hparams.n_head()`, `n_ff()`), so every layer is written with the same counts: H query
heads on K key/value heads and F FFN neurons, the largest any layer keeps (Phi-3 and OLMo 2: the config's heads,
because llama.cpp sizes their attention by the model width). A layer's kept key/value group g goes to slot g, and
its j-th query head of that group to slot g·R + j (R = H/K), so each query head still reads its own group. The
slots no head fills are zero heads: zero query, key and value rows, zero output-projection columns. A zero head's
scores are all 0 and its output, whatever the softmax gives, meets zero W_o columns: it adds exactly 0 (Michel et
al. 2019, eq. 1). An FFN is padded with zero neurons (zero gate and up rows and biases, zero down columns:
act(0)·0 = 0). `padding_report` gives what is kept and what llama.cpp runs.

Family specifics, as llama.cpp's converter writes them: Gemma's RMSNorm weights w are stored as 1 + w; Gemma's
query scale `query_pre_attn_scalar`^-1/2 is folded into W_q (Gemma 2) or the query norm (Gemma 3) where llama.cpp's
own scale differs; Gemma's sliding-window layers and soft-capping are written as such; Granite's rotary pairs are
interleaved per head (`rope_interleave`) and its multipliers written as scales; OLMo 2 keeps its q/k projections and
their norms whole (the norms span all heads; prunetrain selects the kept heads after the norm), so its removed heads
become zero value rows and output columns in their original slots.

Gemma is refused in f32 (`check_gguf_type`): llama.cpp's CPU GELU rounds its input to f16 for a lookup table, so
its logits differ from the model's by about 5e-4 of the largest; f16 and q8_0, whose tolerance covers that, are
written. Refused too: biases llama.cpp's architecture does not read (output projection, FFN; Granite reads them),
an untied Gemma 2 output layer or unset soft-capping, and rotary embeddings other than the default over the whole
head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

FAMILY_ARCH = {"qwen3": "qwen3", "gemma2": "gemma2", "gemma3_text": "gemma3", "phi3": "phi3", "olmo2": "olmo2",
               "granite": "granite"}
GEMMA = ("gemma2", "gemma3_text")
FULL_WIDTH = ("phi3", "olmo2")  # llama.cpp sizes q (and W_o) by the model width: the config's heads
LOADS_OUTPUT_BIAS = ("granite",)  # architectures that read `attn_output.bias` and FFN biases
GELU_TANH = ("gelu_pytorch_tanh",)
# the layer counts for which llama.cpp takes Gemma's query scale from the width (`LLM_TYPE_27B`)
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3_text": 62}


@dataclass(frozen=True)
class PaddedLayers:
    """Every layer padded to `heads` query heads on `kv_heads` key/value heads and `ffn` neurons; the kept heads and
    neurons per layer, and the slots `q_slots` / `kv_slots` place the kept heads in."""

    heads_kept: tuple[int, ...]
    kv_kept: tuple[int, ...]
    ffn_kept: tuple[int, ...]
    heads: int
    kv_heads: int
    ffn: int
    q_slots: tuple[tuple[int, ...], ...]   # per layer: the slot of each kept query head
    kv_slots: tuple[tuple[int, ...], ...]  # per layer: the slot of each kept key/value head


@dataclass(frozen=True)
class FamilyHyperparameters:
    """The model-wide values the GGUF header states."""

    head_dim: int
    context_length: int
    rope_theta: float
    rms_norm_eps: float
    tied: bool


@dataclass(frozen=True)
class FamilyPlan:
    """What one of llama.cpp's fixed-count architectures needs: the padded layers and the header's values (their
    fields read as the plan's own: `plan.heads`, `plan.head_dim`, ...)."""

    model_type: str
    arch: str
    layers: PaddedLayers
    hyper: FamilyHyperparameters

    def __getattr__(self, name: str):
        for part in ("layers", "hyper"):
            record = self.__dict__.get(part)
            if record is not None and name in type(record).__dataclass_fields__:
                return getattr(record, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def rope_interleave(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of W_q or W_k (or a bias) from rotate-half order (i, i + d/2 pair up) to llama.cpp's interleaved order
    (2i, 2i + 1 pair up), per head: row h·d + 2i ← h·d + i and h·d + 2i + 1 ← h·d + d/2 + i."""
    if heads == 0:
        return weight
    shape = weight.shape
    return weight.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _refuse(why: str) -> ValueError:
    return ValueError(f"format: 'gguf' {why}")


def _rope_checked(config, model_type: str) -> dict:
    """{layer type: rope parameters} (one entry "all" where the config has one set); refuses all but the default
    rotary embedding over the whole head."""
    rope = dict(getattr(config, "rope_parameters", None) or {})
    sets = rope if rope and all(isinstance(v, dict) for v in rope.values()) else {"all": rope}
    for params in sets.values():
        if params.get("rope_type", "default") != "default" or params.get("partial_rotary_factor", 1.0) != 1.0:
            raise _refuse(f"writes the default rotary embedding over the whole head; this model's rope_parameters "
                          f"are {rope!r}.")
    if getattr(config, "partial_rotary_factor", 1.0) not in (None, 1.0):
        raise _refuse(f"writes the rotary embedding over the whole head; this model's partial_rotary_factor is "
                      f"{config.partial_rotary_factor!r}.")
    return sets


def _check(model: nn.Module, model_type: str) -> None:
    config = model.config
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
    want = GELU_TANH if model_type in GEMMA else ("silu",)
    if act not in want:
        raise _refuse(f"needs the {want[0]}-gated feed-forward llama.cpp's {FAMILY_ARCH[model_type]} runs; this "
                      f"model's activation is {act!r}.")
    _rope_checked(config, model_type)
    if model_type == "gemma2" and (config.attn_logit_softcapping is None or config.final_logit_softcapping is None):
        raise _refuse("writes Gemma 2 with attention and final logit soft-capping, which llama.cpp's gemma2 always "
                      "applies; this model leaves one of them unset.")
    if model_type == "gemma3_text" and getattr(config, "attn_logit_softcapping", None) is not None:
        raise _refuse("cannot write Gemma 3 with attention logit soft-capping: llama.cpp's gemma3 does not apply it.")
    if model_type == "gemma2" and not _tied(model):
        raise _refuse("cannot write a Gemma 2 model whose output projection is not the token embedding: llama.cpp's "
                      "gemma2 reads its logits from the embedding.")


def _tied(model: nn.Module) -> bool:
    lm_head = model.get_output_embeddings()
    return lm_head is not None and lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def _adds_bias(linear: nn.Module | None) -> bool:
    """Whether `linear` has a bias with a non-zero entry."""
    bias = getattr(linear, "bias", None)
    return bias is not None and bool(bias.detach().ne(0).any())


def _counts(model_type: str, attn: nn.Module, d: int) -> tuple[int, int]:
    """(query heads, key/value heads) a layer's attention holds."""
    heads = attn.o_proj.weight.shape[1] // d
    if model_type == "phi3":
        return heads, (attn.qkv_proj.weight.shape[0] // d - heads) // 2
    return heads, attn.v_proj.weight.shape[0] // d


def family_plan(model: nn.Module) -> FamilyPlan:
    """The padded counts and slots of `model` (a shrunk model of a family in `FAMILY_ARCH`); `ValueError` says why it
    cannot be written exactly."""
    model_type = model.config.model_type
    _check(model, model_type)
    config = model.config
    layers = model.model.layers
    d = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    heads, kv, ffn_kept = [], [], []
    for index, layer in enumerate(layers):
        attn, mlp = layer.self_attn, layer.mlp
        h, g = _counts(model_type, attn, d)
        if (g == 0) != (h == 0) or (g and h % g):
            raise _refuse(f"cannot write layer {index}: its {h} query heads do not split evenly over its {g} "
                          f"key/value heads.")
        if model_type not in LOADS_OUTPUT_BIAS:
            biased = [name for name in ("o_proj", "gate_proj", "up_proj", "gate_up_proj", "down_proj")
                      if _adds_bias(getattr(attn if name == "o_proj" else mlp, name, None))]
            if biased:
                raise _refuse(f"cannot write layer {index}: its {biased[0]} has a non-zero bias, which llama.cpp's "
                              f"{FAMILY_ARCH[model_type]} does not read.")
        heads.append(h)
        kv.append(g)
        ffn_kept.append(mlp.down_proj.weight.shape[1])
    if model_type in FULL_WIDTH:
        n_heads, n_kv = int(config.num_attention_heads), int(config.num_key_value_heads)
        if n_heads * d != config.hidden_size:
            raise _refuse(f"cannot write {model_type} with {n_heads} heads of size {d} in a width of "
                          f"{config.hidden_size}: llama.cpp sizes its attention by the width.")
        if model_type == "olmo2" and any(layer.self_attn.q_proj.out_features != n_heads * d
                                         or layer.self_attn.k_proj.out_features != n_kv * d for layer in layers):
            raise _refuse("cannot write OLMo 2 whose q/k projections were sliced: their norms span all heads, so "
                          "llama.cpp needs them whole (prunetrain's shrink keeps them whole).")
    else:
        n_kv = max(kv)
        n_heads = n_kv * max((h // g for h, g in zip(heads, kv) if g), default=0)
    if n_heads == 0:
        raise _refuse("cannot write a model with no attention head in any layer.")
    ratio = n_heads // n_kv
    q_slots, kv_slots = [], []
    for index, (layer, h, g) in enumerate(zip(layers, heads, kv)):
        if model_type == "olmo2":
            qs, ks = _olmo2_slots(layer.self_attn, h, g, d)
        else:
            r = h // g if g else 0
            qs, ks = tuple((j // r) * ratio + j % r for j in range(h)), tuple(range(g))
        if any(qs[j] // ratio != ks[j // (h // g)] for j in range(h)) or max(qs, default=-1) >= n_heads \
                or max(ks, default=-1) >= n_kv:
            raise _refuse(f"cannot write layer {index}: its query heads do not read the key/value heads llama.cpp "
                          f"would pair them with ({n_heads} heads on {n_kv}).")
        q_slots.append(qs)
        kv_slots.append(ks)
    context = int(getattr(config, "max_position_embeddings", 2048))
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or []
    if model_type not in GEMMA and window and (getattr(config, "use_sliding_window", True) is not False
                                              or "sliding_attention" in layer_types):
        context = min(context, int(window))  # within the window's length the window never masks anything
    rope = _rope_checked(config, model_type)
    full = rope.get("full_attention", rope.get("all", {}))
    layers = PaddedLayers(tuple(heads), tuple(kv), tuple(ffn_kept), n_heads, n_kv, max(max(ffn_kept), 1),
                          tuple(q_slots), tuple(kv_slots))
    hyper = FamilyHyperparameters(d, context, float(full.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
                                  float(config.rms_norm_eps), _tied(model))
    return FamilyPlan(model_type, FAMILY_ARCH[model_type], layers, hyper)


def _olmo2_slots(attn: nn.Module, h: int, g: int, d: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """OLMo 2: each kept head stays in its original slot (prunetrain keeps q/k whole and selects after the norm)."""
    q_rows = getattr(attn, "_pt_q_rows", None)
    k_rows = getattr(attn, "_pt_k_rows", None)
    qs = tuple(range(h)) if q_rows is None else tuple(q_rows[j * d] // d for j in range(h))
    ks = tuple(range(g)) if k_rows is None else tuple(k_rows[j * d] // d for j in range(g))
    return qs, ks


def check_gguf_type(plan: FamilyPlan, gguf_type: str) -> None:
    """Refuses what cannot be exact in `gguf_type`: Gemma in f32 (llama.cpp's CPU GELU looks its value up in an f16
    table, its input rounded to f16: measured 3e-4 to 5e-4 of the largest logit on tiny Gemma models, far above f32's
    1e-5; within f16's and q8_0's tolerance)."""
    if gguf_type == "f32" and plan.model_type in GEMMA:
        raise _refuse("cannot write Gemma exactly in f32: llama.cpp's CPU GELU rounds its input to f16 for a lookup "
                      "table, which moves the logits by about 5e-4 of the largest; use gguf_type 'f16' or 'q8_0' "
                      "(--gguf-type), checked within their stated tolerance.")


def padding_report(plan: FamilyPlan) -> dict:
    """Heads and FFN neurons the model keeps, and those llama.cpp runs (zero heads and zero neurons included)."""
    layers = len(plan.heads_kept)
    return {"heads_kept": sum(plan.heads_kept), "heads_executed": layers * plan.heads,
            "neurons_kept": sum(plan.ffn_kept), "neurons_executed": layers * plan.ffn}


def _rows(slots, d: int) -> torch.Tensor:
    return (torch.tensor(slots, dtype=torch.long)[:, None] * d + torch.arange(d)).reshape(-1)


def _place(tensor: torch.Tensor, slots, total: int, d: int, dim: int = 0) -> torch.Tensor:
    """`tensor`'s head blocks (of `d` rows, or columns for dim=1) moved to `slots` of a zero tensor of `total`
    heads."""
    shape = list(tensor.shape)
    shape[dim] = total * d
    out = tensor.new_zeros(shape)
    if slots:
        out.index_copy_(dim, _rows(slots, d), tensor)
    return out


def _pad_rows(tensor: torch.Tensor, width: int, dim: int = 0) -> torch.Tensor:
    """`tensor` with zero rows (dim 0) or columns (dim 1) appended up to `width`."""
    shape = list(tensor.shape)
    shape[dim] = width - tensor.shape[dim]
    return torch.cat([tensor, tensor.new_zeros(shape)], dim=dim)


def _norm(weight: torch.Tensor, model_type: str) -> torch.Tensor:
    """A norm weight as llama.cpp multiplies with it (Gemma's RMSNorm multiplies with 1 + w)."""
    return weight.float() + 1.0 if model_type in GEMMA else weight


def _gemma_query_scale(model: nn.Module, plan: FamilyPlan) -> float:
    """The factor that turns llama.cpp's query scale for Gemma into `query_pre_attn_scalar`^-1/2."""
    config = model.config
    n_layers = len(plan.heads_kept)
    if n_layers == GEMMA_27B_LAYERS[plan.model_type]:
        theirs = (config.hidden_size // plan.heads) ** -0.5
    else:
        theirs = plan.head_dim ** -0.5
    return float(config.query_pre_attn_scalar) ** -0.5 / theirs


def _split_qkv(model_type: str, attn: nn.Module, h: int, g: int, d: int) -> dict[str, tuple]:
    """{"q"|"k"|"v": (weight, bias or None)} of a layer."""
    if model_type == "phi3":
        w = attn.qkv_proj.weight
        b = attn.qkv_proj.bias
        cuts = (0, h * d, (h + g) * d, (h + 2 * g) * d)
        return {s: (w[cuts[i]:cuts[i + 1]], None if b is None else b[cuts[i]:cuts[i + 1]])
                for i, s in enumerate("qkv")}
    return {s: (getattr(attn, f"{s}_proj").weight, getattr(attn, f"{s}_proj").bias) for s in "qkv"}


def _ffn(model_type: str, mlp: nn.Module) -> dict[str, tuple]:
    """{"gate"|"up"|"down": (weight, bias or None)} of a layer's FFN."""
    if model_type == "phi3":
        w, k = mlp.gate_up_proj.weight, mlp.down_proj.weight.shape[1]
        b = mlp.gate_up_proj.bias
        return {"gate": (w[:k], None if b is None else b[:k]), "up": (w[k:], None if b is None else b[k:]),
                "down": (mlp.down_proj.weight, mlp.down_proj.bias)}
    return {s: (getattr(mlp, f"{s}_proj").weight, getattr(mlp, f"{s}_proj").bias) for s in ("gate", "up", "down")}


def family_tensors(model: nn.Module, plan: FamilyPlan) -> dict[str, torch.Tensor]:
    """{GGUF tensor name: tensor} for `plan`'s architecture, every layer padded to the plan's counts."""

    mt, d = plan.model_type, plan.head_dim
    base = model.model
    out = {"token_embd.weight": base.embed_tokens.weight, "output_norm.weight": _norm(base.norm.weight, mt)}
    if not plan.tied:
        out["output.weight"] = model.get_output_embeddings().weight
    q_scale = _gemma_query_scale(model, plan) if mt in GEMMA else 1.0
    for i, layer in enumerate(base.layers):
        attn, mlp, p = layer.self_attn, layer.mlp, f"blk.{i}."
        h, g = plan.heads_kept[i], plan.kv_kept[i]
        qkv = _split_qkv(mt, attn, h, g, d)
        for s, (weight, bias) in qkv.items():
            if mt == "olmo2" and s != "v":  # whole, normalised over all heads
                placed_w, placed_b = weight, bias
            else:
                slots, total = (plan.q_slots[i], plan.heads) if s == "q" else (plan.kv_slots[i], plan.kv_heads)
                placed_w = _place(weight, slots, total, d)
                placed_b = None if bias is None else _place(bias, slots, total, d)
            if s == "q" and mt == "gemma2" and q_scale != 1.0:
                placed_w = placed_w * q_scale
                placed_b = None if placed_b is None else placed_b * q_scale
            if mt == "granite" and s != "v":
                n = plan.heads if s == "q" else plan.kv_heads
                placed_w = rope_interleave(placed_w, n)
                placed_b = None if placed_b is None else rope_interleave(placed_b, n)
            out[f"{p}attn_{s}.weight"] = placed_w
            if placed_b is not None:
                out[f"{p}attn_{s}.bias"] = placed_b
        out[f"{p}attn_output.weight"] = _place(attn.o_proj.weight, plan.q_slots[i], plan.heads, d, dim=1)
        biases = mt in LOADS_OUTPUT_BIAS  # elsewhere refused unless all zero (`family_plan`), so left out
        if biases and attn.o_proj.bias is not None:
            out[f"{p}attn_output.bias"] = attn.o_proj.bias
        if mt in ("qwen3", "gemma3_text", "olmo2"):
            q_norm, k_norm = _norm(attn.q_norm.weight, mt), _norm(attn.k_norm.weight, mt)
            if mt == "gemma3_text" and q_scale != 1.0:
                q_norm = q_norm * q_scale
            out[f"{p}attn_q_norm.weight"], out[f"{p}attn_k_norm.weight"] = q_norm, k_norm
        for s, (weight, bias) in _ffn(mt, mlp).items():
            dim = 1 if s == "down" else 0
            out[f"{p}ffn_{s}.weight"] = _pad_rows(weight, plan.ffn, dim)
            if biases and bias is not None:
                out[f"{p}ffn_{s}.bias"] = bias if s == "down" else _pad_rows(bias, plan.ffn)
        if mt == "phi3":  # llama.cpp's phi3 reads gate and up fused: [gate | up]
            out[f"{p}ffn_up.weight"] = torch.cat([out.pop(f"{p}ffn_gate.weight"), out[f"{p}ffn_up.weight"]])
        out.update(_layer_norms(layer, mt, p))
    return out


def _layer_norms(layer: nn.Module, mt: str, p: str) -> dict[str, torch.Tensor]:
    if mt in GEMMA:
        names = {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
                 "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
    elif mt == "olmo2":
        names = {"post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
    else:
        names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    return {f"{p}{ours}.weight": _norm(getattr(layer, theirs).weight, mt) for ours, theirs in names.items()}


def write_shape_metadata(writer, config, plan, blocks: int, ffn, heads, kv_heads) -> None:
    """The hyper-parameters every GGUF architecture here states: context, width, layers, FFN width and head counts
    (one value, or one per layer), head size, rotary base and the RMS norm's epsilon."""
    writer.add_context_length(plan.context_length)
    writer.add_embedding_length(int(config.hidden_size))
    writer.add_block_count(blocks)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(plan.head_dim)
    writer.add_value_length(plan.head_dim)
    writer.add_rope_dimension_count(plan.head_dim)
    writer.add_rope_freq_base(plan.rope_theta)
    writer.add_layer_norm_rms_eps(plan.rms_norm_eps)


def write_family_metadata(writer, model: nn.Module, plan: FamilyPlan) -> None:
    """The hyper-parameters of `plan`'s architecture (beside the tokenizer and file type)."""
    config = model.config
    write_shape_metadata(writer, config, plan, len(plan.heads_kept), plan.ffn, plan.heads, plan.kv_heads)
    mt = plan.model_type
    if mt in GEMMA:
        layer_types = list(getattr(config, "layer_types", None) or [])
        sliding = [t == "sliding_attention" for t in layer_types]
        if any(sliding) or mt == "gemma2":  # gemma2 always runs the pattern it is given (default: every other)
            writer.add_sliding_window(int(config.sliding_window or plan.context_length))
            writer.add_sliding_window_pattern(sliding)
            rope = _rope_checked(config, mt)
            if "sliding_attention" in rope:
                writer.add_rope_freq_base_swa(float(rope["sliding_attention"].get("rope_theta", plan.rope_theta)))
        if mt == "gemma2":
            writer.add_attn_logit_softcapping(float(config.attn_logit_softcapping))
        if getattr(config, "final_logit_softcapping", None) is not None:
            writer.add_final_logit_softcapping(float(config.final_logit_softcapping))
    if mt == "granite":
        writer.add_logit_scale(float(config.logits_scaling))
        writer.add_residual_scale(float(config.residual_multiplier))
        writer.add_embedding_scale(float(config.embedding_multiplier))
        writer.add_attention_scale(float(config.attention_multiplier))
