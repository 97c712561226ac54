"""The padded export: the original architecture and config, removed heads as zero weights.

A removed head h contributes Att_h(x) W_o^h to the attention output (Michel et al. 2019, eq. 1: MHAtt = Σ_h
ξ_h Att_h W_o^h); with its output-projection columns W_o^h = 0 (and its q/k/v rows zero) it contributes nothing,
so the padded model computes what the shrunk model computes, up to float summation order, in any runtime that
loads the original architecture. It is as large and as slow as the unpruned model: no speed-up.

FFN neurons are padded the same way, back to the config's width (`intermediate_size`, `encoder_ffn_dim` /
`decoder_ffn_dim`, `d_ff`, ...: a standard config states one width per stack): a removed neuron j gets a zero row
with zero bias in every up projection (the gate too, in gated FFNs; each block of a fused gate/up projection, whose
layout is kept) and a zero input column in the down projection, so its contribution act(x·0 + 0)·0 is exactly 0
(in a gated FFN act(gate)·up is 0 as its up row is zero). `padding_report` states what is kept and what runs.

Where each kept weight goes is found without family knowledge: a fresh model of the original shape is filled with
its own flat indices and shrunk to the recorded layout by the engine's adapters; the indices that survive are the
positions of the kept weights.
"""

from __future__ import annotations

import torch
from torch import nn

from prunetrain.engine.heads import LAYOUT_CONFIG_KEY, find_sites, supported_units, unwrap_model
from prunetrain.engine.remote_code import fresh_model


@torch.no_grad()
def padded_model(model: nn.Module) -> nn.Module:
    """The original architecture holding `model`'s weights, removed heads and FFN neurons as zeros (a new model,
    eval mode).

    Args:
        model: a shrunk model (a model with its original shapes is copied as it is).
    """
    from prunetrain.engine.persist import shrink_to_layout

    model = unwrap_model(model)
    recorded = dict(getattr(model.config, LAYOUT_CONFIG_KEY, None) or {})
    tracer = fresh_model(model, device="cpu").double()
    shrunk_state = model.state_dict()
    for name, param in tracer.named_parameters():
        if name in shrunk_state and shrunk_state[name].shape != param.shape:
            param.copy_(torch.arange(param.numel(), dtype=torch.float64).view(param.shape))
    shrink_to_layout(tracer, recorded)
    positions = tracer.state_dict()
    out = fresh_model(model, device="cpu").to(next(model.parameters()).dtype)
    state = out.state_dict()
    for name, value in shrunk_state.items():
        target = state[name]
        if target.shape == value.shape:
            target.copy_(value)
        else:
            target.zero_()
            target.view(-1)[positions[name].long().view(-1)] = value.reshape(-1).to(target.dtype)
    return out.eval()


def padding_report(model: nn.Module) -> dict[str, int]:
    """Units `model` keeps and units its padded export runs (the original counts: removed ones are zeros): heads,
    and FFN neurons for a family whose FFN prunetrain prunes.

    Args:
        model: a (shrunk) model.
    """
    model = unwrap_model(model)
    layout = find_sites(model, supported_units(model))
    report = {}
    for unit in layout.units:
        sites = [s for s in layout if s.unit == unit]
        report[f"{unit}_kept"] = sum(s.num_heads for s in sites)
        report[f"{unit}_executed"] = sum(s.original_num_heads for s in sites)
    return report
