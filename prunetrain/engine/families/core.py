"""Family adapters: the one place that knows Hugging Face module names.

An adapter answers two questions for one model family:

1. `sites(model)`: which modules are multi-head attention sites, their kind and layer, and which module's input is
   the concatenation of the heads (the output projection).
2. `remove_heads(site, keep, select)`: how to slice the weights so that only the heads in `keep` remain.

Adding a family is one small subclass registered with `@register` (see `LinearAttentionAdapter` for the common
q/k/v/out layout: most families only name their modules and head-count attributes).
"""

from __future__ import annotations

import re
from typing import Callable

import torch
from torch import nn

from prunetrain.engine.heads import LAYOUT_CONFIG_KEY, AttentionSite, HeadSite

Select = Callable[[nn.Parameter, int, torch.Tensor], None]
"""`select(param, dim, index)`: keep `index` along `dim` of `param`, in place (and in the optimizer state)."""

CROSS_ATTENTION_NAMES = {"encoder_attn", "EncDecAttention", "crossattention"}

_ADAPTERS: list["FamilyAdapter"] = []


def register(cls: type["FamilyAdapter"]) -> type["FamilyAdapter"]:
    """Class decorator: make a family adapter available to `find_heads`, `HeadMask` and `shrink`."""
    _ADAPTERS.append(cls())
    return cls


def supported_families() -> list[str]:
    return [a.name for a in _ADAPTERS]


def adapter_for(model: nn.Module) -> "FamilyAdapter":
    """The adapter for `model`, chosen by `model.config.model_type`; a clear error for anything else."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    for adapter in _ADAPTERS:
        if model_type in adapter.model_types:
            return adapter
    supported = ", ".join(f"{a.name} ({'/'.join(a.model_types)})" for a in _ADAPTERS)
    raise ValueError(
        f"model: {type(model).__name__} (model_type={model_type!r}) is not supported; "
        f"supported families: {supported}. Adding one is a small adapter in prunetrain/families.py."
    )


def head_rows(heads: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Row indices of the given heads in a head-major `[num_heads * head_dim]` axis."""
    return (heads[:, None] * head_dim + torch.arange(head_dim, device=heads.device)).reshape(-1)


def _get(module: nn.Module, path: str):
    for part in path.split("."):
        module = getattr(module, part)
    return module


def _set(module: nn.Module, path: str, value) -> None:
    *parents, last = path.split(".")
    for part in parents:
        module = getattr(module, part)
    setattr(module, last, value)


def _layer_index(path: str) -> int:
    numbers = re.findall(r"\.(\d+)(?:\.|$)", path)
    return int(numbers[0]) if numbers else 0  # the block index: first number in the path


def select_linear_out(linear: nn.Linear, rows: torch.Tensor, select: Select) -> None:
    """Keep output features `rows` of an `nn.Linear` (weight rows and bias)."""
    select(linear.weight, 0, rows)
    if linear.bias is not None:
        select(linear.bias, 0, rows)
    linear.out_features = len(rows)


def select_linear_in(linear: nn.Linear, cols: torch.Tensor, select: Select) -> None:
    """Keep input features `cols` of an `nn.Linear` (weight columns; the bias is untouched)."""
    select(linear.weight, 1, cols)
    linear.in_features = len(cols)


class FamilyAdapter:
    """Base class. Subclasses set `name` and `model_types` and implement `sites` and `remove_heads`."""

    name: str = ""
    model_types: tuple[str, ...] = ()

    def sites(self, model: nn.Module) -> list[AttentionSite]:  # pragma: no cover - abstract
        raise NotImplementedError

    def remove_heads(self, site: AttentionSite, keep: torch.Tensor, select: Select) -> None:  # pragma: no cover
        """Slice `site`'s weights so that only query heads `keep` (current positions, sorted) remain."""
        raise NotImplementedError

    # helpers shared by the adapters
    @staticmethod
    def kind_of(model: nn.Module, path: str) -> str:
        leaf = path.rsplit(".", 1)[-1]
        if leaf in CROSS_ATTENTION_NAMES:
            return "cross"
        if getattr(model.config, "is_encoder_decoder", False):
            parts = path.split(".")
            return "encoder_self" if "encoder" in parts else "decoder_self"
        return "self"

    @staticmethod
    def original_heads(model: nn.Module, path: str, num_heads: int) -> tuple[int, ...]:
        recorded = (getattr(model.config, LAYOUT_CONFIG_KEY, None) or {}).get(path)
        return tuple(recorded) if recorded is not None else tuple(range(num_heads))


class LinearAttentionAdapter(FamilyAdapter):
    """Families whose attention is four `nn.Linear` projections q, k, v and out (head-major, `view(..., -1, d)`).

    Subclasses give the attention module classes, the attribute paths of the projections relative to the attention
    module, where head_dim lives, and which head-count attributes to update after a shrink.
    """

    module_classes: tuple[str, ...] = ()
    q: str = "q_proj"
    k: str = "k_proj"
    v: str = "v_proj"
    out: str = "out_proj"
    head_dim_attr: str = "head_dim"
    count_attrs: tuple[str, ...] = ()  # set to the new number of query heads
    width_attrs: tuple[str, ...] = ()  # set to the new num_heads * head_dim
    leaf_names: tuple[str, ...] | None = None  # only modules whose attribute name is one of these (None: any)

    def original_num_heads(self, model: nn.Module, kind: str) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def group_size(self, module: nn.Module) -> int:
        return 1

    def sites(self, model: nn.Module) -> list[AttentionSite]:
        found = []
        for path, module in model.named_modules():
            if type(module).__name__ not in self.module_classes:
                continue
            if self.leaf_names is not None and path.rsplit(".", 1)[-1] not in self.leaf_names:
                continue
            head_dim = int(_get(module, self.head_dim_attr))
            out_proj = _get(module, self.out)
            num_heads = out_proj.weight.shape[1] // head_dim
            num_kv = _get(module, self.k).weight.shape[0] // head_dim
            kind = self.kind_of(model, path)
            info = HeadSite(
                name=path,
                kind=kind,
                layer=_layer_index(path),
                num_heads=num_heads,
                head_dim=head_dim,
                num_kv_heads=num_kv,
                heads=self.original_heads(model, path, num_heads),
                original_num_heads=self.original_num_heads(model, kind),
                group_size=self.group_size(module),
            )
            found.append(AttentionSite(info=info, module=module, out_proj=out_proj, adapter=self, root=model))
        return found

    def remove_heads(self, site: AttentionSite, keep: torch.Tensor, select: Select) -> None:
        d, g = site.info.head_dim, site.info.group_size
        q_rows = head_rows(keep, d)
        kv_rows = head_rows(keep.view(-1, g)[:, 0] // g, d) if g > 1 else q_rows
        module = site.module
        select_linear_out(_get(module, self.q), q_rows, select)
        select_linear_out(_get(module, self.k), kv_rows, select)
        select_linear_out(_get(module, self.v), kv_rows, select)
        select_linear_in(_get(module, self.out), q_rows, select)
        for attr in self.count_attrs:
            _set(module, attr, len(keep))
        for attr in self.width_attrs:
            _set(module, attr, len(keep) * d)


