"""Structural discovery of FFN neurons, beside the attention sites (`prunetrain.engine.families.discovery`).

1. **Propose** (`propose_ffn`): in the probe forward's order of `nn.Linear` calls, a *down* projection (`w` inputs,
   `d` outputs) directly preceded by one or two *up* projections (`d` inputs, `w` outputs each: a plain FFN, or a
   gated one's gate and up) is an FFN of width `w`; Linear layers inside an attention site never count. The FFN's
   host is the innermost module holding its up and down projections (the MLP module, or the layer for BERT's
   `intermediate.dense` → `output.dense`); one `FfnProposal` per host class, whose integer attributes equal to `w` on
   the way to the projections (`intermediate_size`, ...) are rewritten by a shrink.
2. **Prove** (`discovery_check.prove_ffn`): on the perturbed copy the attention proof uses, an all-ones neuron mask
   on the down projection's input leaves the output bit-identical, and masked == shrunk (≤ 1e-5) for a random
   neuron mask and with one FFN emptied — so whatever runs between the up and the down projections acts neuron by
   neuron (an activation, a gate's product), never across neurons (a norm over the FFN's hidden features fails).
3. The proven proposals become the discovered adapter's `ffn` (`FeedForward`s), recorded in its description, so a
   pruned directory rebuilds them; when no FFN is found or the proof fails, the adapter's `ffn_refusal` says which
   and why, and its heads stay prunable.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch import nn

from prunetrain.engine.families.core import FeedForward, _get
from prunetrain.engine.families.discovery_propose import _call_trace

MAX_UPS = 2
"""Up projections of one FFN: one (plain) or two (a gated FFN's gate and up)."""
GENERIC_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
"""Host classes that say nothing about what they hold: such an FFN host is also named by its attribute name."""


@dataclass(frozen=True)
class FfnProposal:
    """Where the FFNs of one host module class keep their neurons; paths relative to the host. Built by discovery
    (`propose_ffn`, `FfnProposal.from_dict`).

    Args:
        module_class: the host module's class name.
        up: the up (and gate) projections, in call order.
        down: the down projection.
        width: the FFN width when discovered (the original width of every such FFN).
        width_attrs: integer attributes set to the new width after a shrink.
        leaf_names: for a generic container host (`nn.Sequential`), the attribute names it has in the FFNs found
            (so another `Sequential` of the model is not taken for an FFN); empty: any.
    """

    module_class: str
    up: tuple[str, ...]
    down: str
    width: int
    width_attrs: tuple[str, ...] = ()
    leaf_names: tuple[str, ...] = ()

    def feed_forward(self) -> FeedForward:
        """The `FeedForward` the discovered adapter slices neurons with."""
        return FeedForward((self.module_class,), up=self.up, down=self.down, width=(),
                           default_width=lambda config, width=self.width: width, width_attrs=self.width_attrs,
                           leaf_names=self.leaf_names or None)

    def describe(self) -> str:
        return f"{self.module_class}: {'/'.join(self.up)} -> {self.down} (width {self.width})"

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> "FfnProposal":
        return cls(module_class=str(data["module_class"]), up=tuple(data["up"]), down=str(data["down"]),
                   width=int(data["width"]), width_attrs=tuple(data.get("width_attrs", ())),
                   leaf_names=tuple(data.get("leaf_names", ())))


def _host(paths: list[str]) -> str:
    """The innermost module path holding every path of `paths` (module paths, "." separated)."""
    parts = [p.split(".")[:-1] for p in paths]
    common = []
    for level in zip(*parts):
        if len(set(level)) > 1:
            break
        common.append(level[0])
    return ".".join(common)


def _width_attrs(host: nn.Module, paths: list[str], width: int) -> tuple[str, ...]:
    """Integer attributes equal to `width` of the host and of the modules between it and the projections."""
    found = []
    prefixes = {""} | {".".join(p.split(".")[:i]) for p in paths for i in range(1, len(p.split(".")))}
    for prefix in sorted(prefixes, key=len):
        module = _get(host, prefix) if prefix else host
        if isinstance(module, nn.Linear):
            continue
        for name, value in vars(module).items():
            if isinstance(value, int) and not isinstance(value, bool) and value == width and not name.startswith("_"):
                found.append(f"{prefix}.{name}" if prefix else name)
    return tuple(found)


def propose_ffn(model: nn.Module, inputs: dict, attention_modules: list[nn.Module]) -> list[FfnProposal]:
    """Candidate FFNs of `model` (module docstring, step 1), one `FfnProposal` per host class.

    Args:
        model: the model (in eval mode).
        inputs: probe inputs, `model(**inputs)` must run.
        attention_modules: the attention site modules (their Linear layers are never FFN projections).

    Raises:
        ValueError: FFNs of one host class laid out differently.
    """
    modules = dict(model.named_modules())
    inside_attention = {id(m) for site in attention_modules for m in site.modules()}
    order = list(dict.fromkeys(p for event, p in _call_trace(model, inputs) if event == "linear"))
    order = [p for p in order if id(modules[p]) not in inside_attention]
    by_class: dict[str, FfnProposal] = {}
    used: set[str] = set()
    for index, down in enumerate(order):
        layer = modules[down]
        width, d = layer.in_features, layer.out_features
        ups = []
        for previous in reversed(order[max(0, index - MAX_UPS):index]):
            candidate = modules[previous]
            if previous in used or candidate.in_features != d or candidate.out_features != width:
                break
            ups.insert(0, previous)
        if not ups:
            continue
        host_path = _host([*ups, down])
        host = modules[host_path]
        cut = len(host_path) + 1 if host_path else 0
        relative = [p[cut:] for p in (*ups, down)]
        generic = isinstance(host, GENERIC_CONTAINERS)
        proposal = FfnProposal(module_class=type(host).__name__, up=tuple(relative[:-1]), down=relative[-1],
                               width=width, width_attrs=_width_attrs(host, relative, width),
                               leaf_names=(host_path.rsplit(".", 1)[-1],) if generic else ())
        known = by_class.setdefault(proposal.module_class, proposal)
        if (known.up, known.down, known.width) != (proposal.up, proposal.down, proposal.width):
            raise ValueError(f"model: discovery found FFNs in modules of class {proposal.module_class} laid out "
                             f"differently ({proposal.describe()} at {host_path!r}, {known.describe()} before)")
        if generic and proposal.leaf_names[0] not in known.leaf_names:
            by_class[known.module_class] = dataclasses.replace(known, leaf_names=known.leaf_names +
                                                               proposal.leaf_names)
        used.update((*ups, down))
    return list(by_class.values())


__all__ = ["FfnProposal", "propose_ffn"]
