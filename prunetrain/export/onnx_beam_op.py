"""Beam search inside ONNX Runtime: one `beam_search_model.onnx` whose single node is ORT's `BeamSearch` operator
(domain `com.microsoft`, `model_type=1`, the encoder-decoder form) over two subgraphs of the (shrunk) model.

- `encoder` subgraph: (encoder_input_ids, encoder_attention_mask, decoder_input_ids: int32) → logits of the first
  decoder step, encoder_hidden_states, present_key_self_{j} / present_value_self_{j} (length 1) and
  present_key_cross_{j} / present_value_cross_{j} for every decoder layer;
- `decoder` subgraph: (input_ids [B, 1], encoder_attention_mask, past_key_self_{j}, past_value_self_{j}, ...,
  past_key_cross_{j}, past_value_cross_{j}) → logits, present_key_self_{j}, present_value_self_{j}. The cross
  attention keys/values are computed once, in the encoder subgraph, and reused at every step (the Python loop of
  `prunetrain.export.onnx_beam` recomputes them).

Each layer's cache keeps its own number of heads: the operator reorders every present tensor by its own shape
(`PickT5PastState`), and reads the number of heads only from the first self-attention cache, which must be static and
positive. So the caches are listed in an order whose first layer has heads (`j` is a position in that order, not the
layer index); a model whose decoder self-attention has no head left anywhere is refused.

The search is ORT's `BeamSearchScorer` (transformers' beam search before its vectorised rewrite): at each step the
2k best (beam, token) candidates by s_b + log softmax(logits)_t after the logits processors; a candidate ending in EOS
among the first k becomes a finished hypothesis scored s / L^length_penalty (L: the generated tokens with the EOS, as
transformers), the others fill the k running beams. With `early_stopping=True` (a sentence is done once it has k
finished hypotheses) that is `generate(num_beams=k, early_stopping=True)`, but for a hypothesis cut at the length
limit (no EOS), which the operator scores with L one larger than transformers does (the decoder start token
counted); `OrtBeamSearch.generate_or_none` returns None for a batch whose best hypothesis is such a one, and its
caller decodes that batch with the loop. `early_stopping=False` is refused: ORT's stop check for it reads another
sentence's candidate scores (docs/export.md, measured). Settings the operator takes: `num_beams`, `length_penalty`,
one `eos_token_id`, `suppress_tokens` and single-token `bad_words_ids` (its `vocab_mask`; the pad token among them),
`min_new_tokens` (its `min_length`); any other setting that changes the scores is refused with the Python loop named
as the route that takes it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

FILE = "beam_search_model.onnx"


def cache_order(model: nn.Module) -> list[int]:
    """Decoder layer indices, first a layer whose self-attention has heads (the operator reads the head count
    from the first cache), the rest in order; ValueError when no decoder self-attention head is left."""
    from prunetrain.engine.heads import find_heads

    heads = [s.num_heads for s in find_heads(model) if s.kind == "decoder_self"]
    with_heads = [i for i, n in enumerate(heads) if n > 0]
    if not with_heads:
        raise ValueError("format: ONNX Runtime's BeamSearch operator needs a decoder self-attention layer with at "
                         "least one head; this model has none left (use prunetrain.export.onnx_beam's loop).")
    first = with_heads[0]
    return [first] + [i for i in range(len(heads)) if i != first]


def _self_and_cross(cache, order: list[int]) -> tuple[list, list]:
    selfs, crosses = [], []
    for i in order:
        layer = cache.self_attention_cache.layers[i]
        selfs += [layer.keys, layer.values]
        layer = cache.cross_attention_cache.layers[i]
        crosses += [layer.keys, layer.values]
    return selfs, crosses


class _BeamEncoder(nn.Module):
    """Encoder and the first decoder step (the decoder start token), as the operator's `encoder` subgraph."""

    def __init__(self, model: nn.Module, order: list[int]):
        super().__init__()
        self.model, self.order = model, order

    def forward(self, encoder_input_ids, encoder_attention_mask, decoder_input_ids):
        from transformers import DynamicCache, EncoderDecoderCache

        mask = encoder_attention_mask.long()
        hidden = self.model.get_encoder()(input_ids=encoder_input_ids.long(), attention_mask=mask)[0]
        out = self.model(decoder_input_ids=decoder_input_ids.long(), encoder_outputs=(hidden,), attention_mask=mask,
                         use_cache=True, past_key_values=EncoderDecoderCache(DynamicCache(), DynamicCache()))
        selfs, crosses = _self_and_cross(out.past_key_values, self.order)
        return (out.logits, hidden, *selfs, *crosses)


class _BeamDecoder(nn.Module):
    """One decoder step over the self-attention cache and the cross-attention keys/values of the encoder subgraph,
    as the operator's `decoder` subgraph."""

    def __init__(self, model: nn.Module, order: list[int]):
        super().__init__()
        from prunetrain.engine.heads import find_heads

        self.model, self.order = model, order
        self.d_model = model.get_input_embeddings().embedding_dim  # the encoder's output width
        heads = [s.num_heads for s in find_heads(model) if s.kind == "decoder_self"]
        self.headless = [i for i, n in enumerate(heads) if n == 0]

    def forward(self, input_ids, encoder_attention_mask, *past):
        from transformers import DynamicCache, EncoderDecoderCache

        from prunetrain.engine.kv_cache import headless_layer_class

        n = len(self.order)
        self_cache, cross_cache = DynamicCache(), DynamicCache()
        by_layer = {layer: position for position, layer in enumerate(self.order)}
        for layer in range(n):
            j = by_layer[layer]
            self_cache.update(past[2 * j], past[2 * j + 1], layer)
            cross_cache.update(past[2 * n + 2 * j], past[2 * n + 2 * j + 1], layer)
        for layer in self.headless:
            self_cache.layers[layer].__class__ = headless_layer_class()
        cache = EncoderDecoderCache(self_cache, cross_cache)
        cache.is_updated = {layer: True for layer in range(n)}  # cross keys/values come from the encoder subgraph
        mask = encoder_attention_mask.long()
        # the cross attention reads its keys/values from the cache; the decoder still needs hidden states of the
        # source's shape to run its cross-attention blocks (their values are not used)
        hidden = torch.zeros(mask.shape[0], mask.shape[1], self.d_model)
        out = self.model(decoder_input_ids=input_ids.long(), encoder_outputs=(hidden,), attention_mask=mask,
                         use_cache=True, past_key_values=cache)
        selfs, _ = _self_and_cross(out.past_key_values, self.order)
        return (out.logits, *selfs)


def _subgraphs(model: nn.Module) -> dict[str, tuple[nn.Module, tuple, list[str], list[str], dict]]:
    """{"encoder" | "decoder": (module, example args, input names, output names, dynamic axes)}."""
    from prunetrain.export.probe import probe_inputs

    order = cache_order(model)
    n = len(order)
    inputs = probe_inputs(model)
    ids, mask = inputs["input_ids"].int(), inputs["attention_mask"].int()
    start = torch.full((ids.shape[0], 1), int(model.config.decoder_start_token_id), dtype=torch.int32)
    self_out = [f"present_{kv}_self_{j}" for j in range(n) for kv in ("key", "value")]
    cross_out = [f"present_{kv}_cross_{j}" for j in range(n) for kv in ("key", "value")]
    batch, source = {0: "batch"}, {0: "batch", 1: "source"}
    encoder = _BeamEncoder(model, order).eval()
    with torch.no_grad():
        first = encoder(ids, mask, start)
    enc_axes = {"encoder_input_ids": source, "encoder_attention_mask": source, "decoder_input_ids": batch,
                "logits": batch, "encoder_hidden_states": source, **{name: batch for name in self_out},
                **{name: {0: "batch", 2: "source"} for name in cross_out}}
    past_in = [name.replace("present", "past") for name in self_out + cross_out]
    dec_axes = {"input_ids": batch, "encoder_attention_mask": source, "logits": batch,
                **{name: {0: "batch", 2: "past"} for name in past_in[:2 * n]},
                **{name: {0: "batch", 2: "source"} for name in past_in[2 * n:]},
                **{name: {0: "batch", 2: "total"} for name in self_out}}
    next_ids = first[0][:, -1].argmax(-1, keepdim=True).int()
    return {
        "encoder": (encoder, (ids, mask, start),
                    ["encoder_input_ids", "encoder_attention_mask", "decoder_input_ids"],
                    ["logits", "encoder_hidden_states", *self_out, *cross_out], enc_axes),
        "decoder": (_BeamDecoder(model, order).eval(), (next_ids, mask, *first[2:]),
                    ["input_ids", "encoder_attention_mask", *past_in], ["logits", *self_out], dec_axes),
    }


def export_beam_search(model: nn.Module, directory: str | Path) -> str:
    """Write `beam_search_model.onnx` (the `BeamSearch` operator over `model`'s encoder and decoder subgraphs)
    into `directory`; returns its file name. The model is an encoder-decoder with a decoder KV cache (Marian,
    BART, ...), in eval mode, exported with eager attention."""
    import tempfile
    import warnings

    import onnx
    from onnx import TensorProto, helper

    from prunetrain.export.onnx_runtime import OPSET

    config = model.config
    vocab = int(model.get_output_embeddings().weight.shape[0])
    parts = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, (module, args, in_names, out_names, axes) in _subgraphs(model).items():
            path = Path(scratch) / f"{name}.onnx"
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                torch.onnx.export(module, args, str(path), input_names=in_names, output_names=out_names,
                                  dynamic_axes=axes, opset_version=OPSET, dynamo=False, do_constant_folding=True)
            parts[name] = onnx.load(str(path)).graph
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", "source"]),
              helper.make_tensor_value_info("max_length", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("min_length", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("num_beams", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("num_return_sequences", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("length_penalty", TensorProto.FLOAT, [1]),
              helper.make_tensor_value_info("repetition_penalty", TensorProto.FLOAT, [1]),
              helper.make_tensor_value_info("vocab_mask", TensorProto.INT32, [vocab]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT32, ["batch", "source"])]
    node = helper.make_node(
        "BeamSearch", [i.name for i in inputs[:8]] + ["", "attention_mask"], ["sequences"], domain="com.microsoft",
        name="beam_search", model_type=1, eos_token_id=int(config.eos_token_id), pad_token_id=int(config.pad_token_id),
        decoder_start_token_id=int(config.decoder_start_token_id), no_repeat_ngram_size=0, early_stopping=1,
        vocab_size=vocab, encoder=parts["encoder"], decoder=parts["decoder"])
    output = helper.make_tensor_value_info("sequences", TensorProto.INT32, ["batch", "returned", "length"])
    graph = helper.make_graph([node], "beam_search", inputs, [output])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("com.microsoft", 1)])
    onnx.save(proto, str(Path(directory) / FILE))
    return FILE


def _operator_settings(settings) -> dict:
    """The operator's attributes and inputs for `BeamSettings` (`prunetrain.export.onnx_beam`); ValueError names a
    setting it does not take (the Python loop, `beam_generate`, takes it)."""
    rules = settings.rules
    refused = [("forced_bos_token_id", rules.forced_bos_token_id), ("forced_eos_token_id", rules.forced_eos_token_id)]
    for argument, value in refused:
        if value is not None:
            raise ValueError(f"{argument}: {value} is not taken by ONNX Runtime's BeamSearch operator; "
                             f"prunetrain.export.onnx_beam.beam_generate (the Python loop) reproduces it.")
    if settings.early_stopping is not True:
        raise ValueError(f"early_stopping: {settings.early_stopping!r} is not taken by ONNX Runtime's BeamSearch "
                         f"operator, only True: its stop check for the length heuristic reads another sentence's "
                         f"candidate scores once a batch has more than one sentence (docs/export.md), so its "
                         f"hypotheses differ from generate's; prunetrain.export.onnx_beam.beam_generate (the "
                         f"Python loop) reproduces it.")
    if len(settings.eos_token_ids) != 1:
        raise ValueError(f"eos_token_id: {list(settings.eos_token_ids)} is not one token; ONNX Runtime's BeamSearch "
                         f"operator takes exactly one (prunetrain.export.onnx_beam.beam_generate takes several).")
    for argument, value in (("pad_token_id", settings.pad_token_id),
                            ("decoder_start_token_id", settings.decoder_start_token_id)):
        if value is None:
            raise ValueError(f"{argument}: None; ONNX Runtime's BeamSearch operator needs it (the model config's).")
    banned = tuple(rules.bad_tokens) + tuple(rules.suppress_tokens)
    if settings.pad_token_id not in banned:
        raise ValueError(f"suppress_tokens: the pad token {settings.pad_token_id} is not suppressed; ONNX Runtime's "
                         f"BeamSearch operator fills its outputs with it, so it must never be generated "
                         f"(prunetrain.export.onnx_beam.beam_generate, the Python loop, decodes without that).")
    return {"attributes": {"eos_token_id": settings.eos_token_ids[0], "pad_token_id": settings.pad_token_id,
                           "decoder_start_token_id": settings.decoder_start_token_id,
                           "early_stopping": 1},
            "banned": banned,
            "min_length": rules.min_new_tokens + 1 if rules.min_new_tokens else 0,  # the start token counts
            "num_beams": settings.num_beams, "length_penalty": settings.length_penalty}


def _as_generate_returns(sequences: torch.Tensor, settings) -> torch.Tensor:
    """The operator's `[batch, max_length]` hypotheses as `generate` returns them. The operator keeps a hypothesis
    that ended in EOS without its EOS and fills every row with the pad token up to max_length; `generate` keeps the
    EOS and fills with `pad_token_id or eos_token_id` up to the longest row. A row shorter than max_length ended in
    EOS (only those end early); the pad token is never generated (`_operator_settings` requires it banned), so the
    first pad after the decoder start marks a row's end."""
    eos = settings.eos_token_ids[0]
    fill = settings.pad_token_id or eos
    batch, max_length = sequences.shape
    ends = [max_length] * batch
    for row, tokens in enumerate(sequences[:, 1:].tolist()):
        if settings.pad_token_id in tokens:
            ends[row] = 1 + tokens.index(settings.pad_token_id)
    lengths = [end + 1 if end < max_length else end for end in ends]  # with the EOS
    out = torch.full((batch, max(lengths)), fill, dtype=torch.long)
    for row, end in enumerate(ends):
        out[row, :end] = sequences[row, :end]
        if end < max_length:
            out[row, end] = eos
    return out


class OrtBeamSearch:
    """Sessions of an export's `beam_search_model.onnx`, one per set of operator attributes (EOS, pad, decoder
    start, early stopping are attributes of the node; the rest are inputs).

    Args:
        directory: an `--format onnx` export of an encoder-decoder model that holds `beam_search_model.onnx`.
        threads: ONNX Runtime intra-op threads.
    """

    def __init__(self, directory: str | Path, threads: int = 1):
        import onnx

        from prunetrain.export.onnx_runtime import read_generation_config

        path = Path(directory) / FILE
        if not path.is_file():
            raise ValueError(f"directory: {directory} has no {FILE} (an `--format onnx` export of an "
                             f"encoder-decoder model writes it).")
        self.directory = Path(directory)
        self.proto = onnx.load(str(path))
        self.threads = threads
        self.vocab = next(a.i for a in self.proto.graph.node[0].attribute if a.name == "vocab_size")
        self.sessions: dict[tuple, object] = {}
        self.generation_config = read_generation_config(self.directory)

    def _session(self, attributes: dict):
        import onnxruntime as ort
        from onnx import helper

        key = tuple(sorted(attributes.items()))
        if key not in self.sessions:
            proto = type(self.proto)()
            proto.CopyFrom(self.proto)
            node = proto.graph.node[0]
            kept = [a for a in node.attribute if a.name not in attributes]
            del node.attribute[:]
            node.attribute.extend(kept + [helper.make_attribute(k, v) for k, v in attributes.items()])
            options = ort.SessionOptions()
            options.intra_op_num_threads = self.threads
            options.inter_op_num_threads = 1
            self.sessions[key] = ort.InferenceSession(proto.SerializeToString(), options,
                                                      providers=["CPUExecutionProvider"])
        return self.sessions[key]

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                 settings) -> torch.Tensor:
        """`[batch, 1 + generated]` sequences (decoder start, new tokens, pad after EOS) as
        `generate(num_beams=k)` returns them, for `BeamSettings` the operator takes (`_operator_settings`)."""
        import numpy as np

        s = _operator_settings(settings)
        settings.check_vocabulary(self.vocab)
        vocab_mask = np.ones(self.vocab, dtype=np.int32)
        vocab_mask[list(s["banned"])] = 0
        feeds = {"input_ids": input_ids.numpy().astype(np.int32),
                 "max_length": np.array([max_new_tokens + 1], dtype=np.int32),
                 "min_length": np.array([s["min_length"]], dtype=np.int32),
                 "num_beams": np.array([s["num_beams"]], dtype=np.int32),
                 "num_return_sequences": np.array([1], dtype=np.int32),
                 "length_penalty": np.array([s["length_penalty"]], dtype=np.float32),
                 "repetition_penalty": np.array([1.0], dtype=np.float32),
                 "vocab_mask": vocab_mask, "attention_mask": attention_mask.numpy().astype(np.int32)}
        sequences = self._session(s["attributes"]).run(None, feeds)[0][:, 0]
        return _as_generate_returns(torch.from_numpy(sequences.astype(np.int64)), settings)

    def generate_or_none(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                         **generate_kwargs) -> torch.Tensor | None:
        """`generate(num_beams=..., **generate_kwargs)`'s sequences with the export's generation config, or None
        where a row's best hypothesis reached the length limit without EOS: the operator scores such a hypothesis
        by its length including the decoder start token, transformers by its generated length (one less), so
        the caller decodes that batch with the loop (`prunetrain.export.onnx_beam.beam_generate`)."""
        from prunetrain.export.onnx_beam import BeamSettings

        settings = BeamSettings.from_generation_config(self.generation_config, **generate_kwargs)
        sequences = self.generate(input_ids, attention_mask, max_new_tokens, settings)
        ended = (sequences[:, 1:] == settings.eos_token_ids[0]).any(dim=1)
        return sequences if bool(ended.all()) else None


@torch.no_grad()
def check_beam_search(model: nn.Module, directory: str | Path, seed: int = 1) -> float:
    """max |ORT − PyTorch| of the operator's two subgraphs (each run alone in ONNX Runtime) on a fresh probe input:
    the encoder subgraph's logits, hidden states and caches, then the decoder subgraph's step from them; raises
    `ValueError` above the export's tolerance, so a file whose search would run another model is never left."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import helper

    from prunetrain.export.onnx_runtime import OPSET, TOLERANCE
    from prunetrain.export.probe import probe_inputs

    proto = onnx.load(str(Path(directory) / FILE))
    node = proto.graph.node[0]
    graphs = {a.name: a.g for a in node.attribute if a.name in ("encoder", "decoder")}
    parts = _subgraphs(model)
    inputs = probe_inputs(model, batch=3, length=9, seed=seed)
    ids, mask = inputs["input_ids"].int(), inputs["attention_mask"].int()
    start = torch.full((ids.shape[0], 1), int(model.config.decoder_start_token_id), dtype=torch.int32)
    worst = 0.0
    args = (ids, mask, start)
    for name in ("encoder", "decoder"):
        module, _, in_names, out_names, _ = parts[name]
        want = module(*args)
        standalone = helper.make_model(graphs[name], opset_imports=[helper.make_opsetid("", OPSET)])
        session = ort.InferenceSession(standalone.SerializeToString(), providers=["CPUExecutionProvider"])
        got = session.run(out_names, {n: a.numpy() for n, a in zip(in_names, args)})
        for g, w in zip(got, want):
            diff = float(np.abs(g - w.float().numpy()).max()) if w.numel() else 0.0
            worst = max(worst, diff)
            if tuple(g.shape) != tuple(w.shape) or not diff <= TOLERANCE:
                raise ValueError(f"format: ONNX Runtime's {name} subgraph of {FILE} differs from PyTorch's (max |Δ| "
                                 f"{diff:.3g}, shapes {tuple(g.shape)} / {tuple(w.shape)}); the export is not "
                                 f"written.")
        if name == "encoder":  # the decoder's step from the encoder's caches and the best first token
            args = (want[0][:, -1].argmax(-1, keepdim=True).int(), mask, *want[2:])
    return worst
