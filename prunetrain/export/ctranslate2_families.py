"""How each encoder–decoder family maps onto CTranslate2's Transformer spec, and the padded loader that writes it.

CTranslate2's own transformers converter has one loader per family (`MarianMTLoader`, `BartLoader`, `MBartLoader`,
`M2M100Loader`, `PegasusLoader`), all built on `BartLoader`'s weight mapping; they differ in a few switches, which
`FAMILIES` states per `config.model_type`:

- `pre_norm`: the layer norm before each sub-layer and a final layer norm per stack (mBART, M2M-100/NLLB, Pegasus)
  or after each sub-layer (Marian, BART), as the family's modeling code runs it (its config's `normalize_before` is
  not read by transformers);
- `layernorm_embedding`: a layer norm on the embeddings (BART, mBART);
- `positions_after_pad`: M2M-100's sinusoidal positions are numbered from `pad_token_id + 1` (fairseq's rule), so
  CTranslate2's table starts at that row (written with the model's own table function for `max_position_embeddings`
  positions: transformers grows the table on demand); BART's and mBART's learned positions start at row 2 (their
  `offset`), Marian's and Pegasus' at row 0.

The embedding scale is read from the model itself. `PaddedLoader` (a subclass of CTranslate2's `BartLoader`) adds
what a pruned model needs: every attention of a stack padded with zero heads to the stack's count
(`_Padded`), each layer's FFN written from its own `fc1`/`fc2` weights (CTranslate2's `FeedForwardSpec` has no size
field: the engine builds every layer's FFN from its own `linear_0`/`linear_1` shapes, so layers keep their pruned
widths) with one zero neuron in an FFN that has none left (the engine refuses a width of 0 at load), the whole
vocabulary in tokenizer order, the decoder started from the real embedding of the model's decoder start token, and
an output bias of -inf on the pad token, which prunetrain's `translate` never generates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Family:
    """The switches of one family's mapping onto CTranslate2's `TransformerSpec` (see the module docstring)."""

    pre_norm: bool
    layernorm_embedding: bool
    positions_after_pad: bool = False


FAMILIES = {
    "marian": Family(pre_norm=False, layernorm_embedding=False),
    "bart": Family(pre_norm=False, layernorm_embedding=True),
    "mbart": Family(pre_norm=True, layernorm_embedding=True),
    "m2m_100": Family(pre_norm=True, layernorm_embedding=False, positions_after_pad=True),
    "pegasus": Family(pre_norm=True, layernorm_embedding=False),
}
"""`config.model_type` → its mapping; NLLB-200 checkpoints are `m2m_100`."""


def decoder_start_id(model: nn.Module) -> int | None:
    """The token `generate` starts decoding from: the generation config's, the model config's, else BOS (as
    transformers falls back for mBART, whose config may leave it unset)."""
    generation = getattr(model, "generation_config", None)
    for source in (generation, model.config):
        start = getattr(source, "decoder_start_token_id", None)
        if isinstance(start, int):
            return start
    bos = getattr(generation, "bos_token_id", None)
    return bos if isinstance(bos, int) else None


def forced_bos_id(model: nn.Module) -> int | None:
    """The token `generate` forces as the first output (mBART-50's and NLLB's target language), or None."""
    forced = getattr(getattr(model, "generation_config", None), "forced_bos_token_id", None)
    return forced if isinstance(forced, int) else None


def vocabulary(model: nn.Module, tokenizer) -> list[str]:
    """The tokenizer's tokens in id order, which must be exactly the model's `vocab_size` ids (CTranslate2 reads the
    vocabulary by position)."""
    vocab = tokenizer.get_vocab()
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    if [vocab[t] for t in tokens] != list(range(len(tokens))) or len(tokens) != model.config.vocab_size:
        raise ValueError(f"source: the tokenizer's ids are not 0..{model.config.vocab_size - 1} (it holds "
                         f"{len(tokens)} tokens for a model with vocab_size {model.config.vocab_size}); "
                         f"CTranslate2 reads the vocabulary by position.")
    return tokens


class _Padded(nn.Module):
    """A linear layer's weights padded to `width` output features (zero rows with zero bias: q/k/v, FFN `fc1`) or,
    with `columns`, to `width` input features (zero columns: the attention's output projection, FFN `fc2`)."""

    def __init__(self, linear: nn.Linear, width: int, columns: bool):
        super().__init__()
        weight = linear.weight.detach().float()
        if columns:
            self.weight = torch.cat([weight, weight.new_zeros(weight.shape[0], width - weight.shape[1])], dim=1)
            self.bias = None if linear.bias is None else linear.bias.detach().float()
        else:
            self.weight = torch.cat([weight, weight.new_zeros(width - weight.shape[0], weight.shape[1])], dim=0)
            if linear.bias is not None:
                bias = linear.bias.detach().float()
                self.bias = torch.cat([bias, bias.new_zeros(width - bias.shape[0])])
            else:
                self.bias = None


def _output_bias(model: nn.Module, projection, pad_token_id: int) -> torch.Tensor:
    """The output projection's bias as CTranslate2 adds it: the model's `final_logits_bias` (if any) plus the
    projection's own, and −inf on pad (never generated, as prunetrain's translate suppresses it)."""
    bias = getattr(model, "final_logits_bias", None)
    bias = torch.zeros(model.config.vocab_size) if bias is None else bias.detach().float().reshape(-1).clone()
    if projection.has_bias():
        bias = bias + projection.bias.detach().float()
    bias[pad_token_id] = -math.inf
    return bias


def ffn_width(layer: nn.Module) -> int:
    """The FFN width CTranslate2 runs for an encoder or decoder layer: its own (`fc1`'s output features), at least
    one (a zero neuron: a zero row with zero bias in `linear_0` and a zero column in `linear_1` adds exactly 0)."""
    return max(1, int(layer.fc1.weight.shape[0]))


def _set_special_tokens(config, model: nn.Module, tokenizer) -> None:
    """The engine's special tokens: the tokenizer's BOS (else CTranslate2's default, which it never reads here), EOS
    and UNK, and the token the decoder starts from."""
    if tokenizer.bos_token is not None:
        config.bos_token = tokenizer.bos_token
    config.eos_token = tokenizer.eos_token
    config.unk_token = tokenizer.unk_token
    config.decoder_start_token = tokenizer.convert_ids_to_tokens(decoder_start_id(model))


def padded_loader(heads: dict[str, int], head_dims: dict[str, int], model: nn.Module):
    """CTranslate2's `BartLoader` for `model`'s family, writing `heads` query heads of `head_dims` values per stack
    ("encoder", "decoder"; see the module)."""
    from ctranslate2.converters.transformers import BartLoader

    class PaddedLoader(BartLoader):
        """CTranslate2's BART-style loader for a model whose layers keep different numbers of heads."""

        def __init__(self):
            self.family = FAMILIES[model.config.model_type]
            self.heads, self.head_dims, self.pad_token_id = heads, head_dims, model.config.pad_token_id
            self.positions = model.config.max_position_embeddings
            self._stack = "encoder"

        def get_model_spec(self, model):
            from ctranslate2.converters.transformers import _SUPPORTED_ACTIVATIONS
            from ctranslate2.specs import transformer_spec

            config = model.config
            options = dict(pre_norm=self.family.pre_norm, layernorm_embedding=self.family.layernorm_embedding,
                           activation=_SUPPORTED_ACTIVATIONS[config.activation_function])
            spec = transformer_spec.TransformerSpec(
                transformer_spec.TransformerEncoderSpec(config.encoder_layers, self.heads["encoder"],
                                                        head_dim=self.head_dims["encoder"], **options),
                transformer_spec.TransformerDecoderSpec(config.decoder_layers, self.heads["decoder"],
                                                        head_dim=self.head_dims["decoder"], **options))
            self._stack = "encoder"
            self.set_encoder(spec.encoder, model.model.encoder)
            self._stack = "decoder"
            self.set_decoder(spec.decoder, model.model.decoder)
            self.set_linear(spec.decoder.projection, model.lm_head)
            spec.decoder.projection.bias = _output_bias(model, spec.decoder.projection, self.pad_token_id)
            return spec

        def set_common_layers(self, spec, module):
            super().set_common_layers(spec, module)
            scale = getattr(module.embed_tokens, "embed_scale", None)  # transformers 5 keeps it in the embedding
            if scale is not None and not hasattr(module, "embed_scale"):
                spec.scale_embeddings = float(scale)

        def set_position_encodings(self, spec, module):
            if self.family.positions_after_pad:  # the model's own table function, as long as its positions allow
                first = self.pad_token_id + 1
                table = module.get_embedding(first + self.positions, module.embedding_dim, module.padding_idx)
                spec.encodings = table[first:]
            else:
                super().set_position_encodings(spec, module)

        def set_encoder(self, spec, encoder):
            super().set_encoder(spec, encoder)
            self.set_ffns(spec, encoder)

        def set_decoder(self, spec, decoder):
            super().set_decoder(spec, decoder)
            self.set_ffns(spec, decoder)
            spec.start_from_zero_embedding = False  # the decoder start token's trained embedding starts decoding

        def set_ffns(self, spec, stack):
            """Each layer's FFN from its own weights, `ffn_width(layer)` neurons (see the module docstring)."""
            for layer_spec, layer in zip(spec.layer, stack.layers):
                width = ffn_width(layer)
                self.set_linear(layer_spec.ffn.linear_0, _Padded(layer.fc1, width, columns=False))
                self.set_linear(layer_spec.ffn.linear_1, _Padded(layer.fc2, width, columns=True))

        def set_attention(self, spec, attention, self_attention=False):
            width = self.heads[self._stack] * self.head_dims[self._stack]
            padded = nn.Module()
            for name in ("q_proj", "k_proj", "v_proj"):
                setattr(padded, name, _Padded(getattr(attention, name), width, columns=False))
            padded.out_proj = _Padded(attention.out_proj, width, columns=True)
            super().set_attention(spec, padded, self_attention=self_attention)

        def set_config(self, config, model, tokenizer):
            _set_special_tokens(config, model, tokenizer)

        def get_vocabulary(self, model, tokenizer):
            return vocabulary(model, tokenizer)

    return PaddedLoader()


__all__ = ["FAMILIES", "Family", "decoder_start_id", "ffn_width", "forced_bos_id", "padded_loader", "vocabulary"]
