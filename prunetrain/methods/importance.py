"""Head importance: Michel et al. (2019) gradient importance, ablation, Voita et al. (2019) confidence, random.

Every scorer returns a `HeadScores` (one float per head per site of the model's `HeadLayout`); a low score means
"least important, prune first". The scorers work on any supported model without a Trainer, on any device, and under
an initialised `torch.distributed` process group they all-reduce their sums and counts, so every rank gets the scores
a single process would compute over the union of all ranks' batches.

Gradient importance (Michel et al. 2019, eq. 2), with ξ_h the keep value of head h (`HeadMask`):

    I_h = E_x | ∂L(x) / ∂ξ_h |     evaluated at ξ = 1.

What `head_importance` computes exactly, for units u that are batches (`per="batch"`) or examples
(`per="example"`), S_u the summed token loss of unit u and n_u its number of loss tokens:

    I_h = Σ_u |∂S_u/∂ξ_h| / Σ_u n_u   =   Σ_u n_u |∂L_u/∂ξ_h| / Σ_u n_u,     L_u = S_u / n_u,

i.e. the token-weighted mean over units of |∂L_u/∂ξ_h|, L_u the unit's mean token loss.
`per="example"` is the paper's expectation over examples. `per="batch"` is what the authors' released code does:
it accumulates |∂L_b/∂ξ| of the batch-mean loss L_b and divides by the total token count, which for equal-sized
batches is our value divided by the (constant) tokens per batch, a factor that the per-layer normalisation removes.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, runtime_checkable

import torch
from torch import nn

from prunetrain.engine.heads import HeadLayout, attention_sites, find_heads, unwrap_model
from prunetrain.engine.mask import HeadMask
from prunetrain.utils.device import device_of
from prunetrain.utils.progress import bar
from prunetrain.utils.validate import check_choice

PER = ("batch", "example")
NORMALIZE = ("layer", None)
REDUCTION = ("mean", "sum")
NORMALIZE_EPS = 1e-20
"""Added to each layer's L2 norm before dividing, as in the authors' code (a layer of all-zero scores stays zero)."""

LossFn = Callable[[nn.Module, dict], Any]
"""`loss_fn(model, batch) -> loss` or `-> (loss, n)`: a scalar loss that is a mean over `n` items (tokens); `n`
weights the batch in the token-weighted mean (default 1)."""


# ---------------------------------------------------------------------------------------------------------------------
# HeadScores
# ---------------------------------------------------------------------------------------------------------------------
@dataclass(eq=False)
class HeadScores:
    """One score per head for every site of a `HeadLayout` (float64, CPU). Low score = less important.

    `values[site_name]` is a tensor `[num_heads]` indexed by the head's current position in the site (the
    position `HeadMask.set` takes). `method` names the scorer, `meta` holds JSON-serialisable details of how the
    scores were computed (options, token and batch counts, world size).
    """

    layout: HeadLayout
    values: dict[str, torch.Tensor]
    method: str = "custom"
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.layout, HeadLayout):
            raise ValueError(f"layout: expected a prunetrain.HeadLayout, got {type(self.layout).__name__}.")
        unknown = [name for name in self.values if name not in self.layout]
        if unknown:
            raise ValueError(f"values: unknown site {unknown[0]!r}; valid sites: "
                             f"{', '.join(self.layout.names[:4])}, ...")
        clean = {}
        for site in self.layout:
            if site.name not in self.values:
                raise ValueError(f"values: site {site.name!r} is missing; every site of the layout needs scores.")
            value = self.values[site.name]
            value = value.detach() if torch.is_tensor(value) else value
            tensor = torch.as_tensor(value, dtype=torch.float64, device="cpu").reshape(-1).clone()
            if tensor.numel() != site.num_heads:
                raise ValueError(f"values[{site.name!r}]: got {tensor.numel()} scores, but this site has "
                                 f"{site.num_heads} heads.")
            clean[site.name] = tensor
        self.values = clean

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.values:
            raise KeyError(f"unknown site {name!r}; valid sites: {', '.join(self.layout.names[:4])}, ...")
        return self.values[name]

    def items(self):
        return self.values.items()

    @property
    def num_heads(self) -> int:
        return self.layout.total_heads

    def flat(self) -> torch.Tensor:
        """All scores in layout order (site by site, heads in position order)."""
        return torch.cat([self.values[s.name] for s in self.layout]) if len(self.layout) else torch.zeros(0)

    def ranked(self, descending: bool = False) -> list[tuple[str, int, float]]:
        """`(site, head, score)` for every head, lowest score first (ties: site order, then head index)."""
        rows = [(i, h, float(v)) for i, s in enumerate(self.layout) for h, v in enumerate(self.values[s.name].tolist())]
        rows.sort(key=lambda r: ((-r[2] if descending else r[2]), r[0], r[1]))
        names = self.layout.names
        return [(names[i], h, v) for i, h, v in rows]

    def as_matrix(self) -> torch.Tensor:
        """`[num_sites, max_heads]` float64, NaN where a site has fewer heads (rows in layout order): for heatmaps."""
        width = max((s.num_heads for s in self.layout), default=0)
        out = torch.full((len(self.layout), width), float("nan"), dtype=torch.float64)
        for i, s in enumerate(self.layout):
            out[i, : s.num_heads] = self.values[s.name]
        return out

    def normalized(self, how: str = "layer") -> "HeadScores":
        """A copy with normalised scores.

        `"layer"`: each site's scores divided by their L2 norm (+1e-20), as Michel et al.'s code does by default;
        `"minmax"`: all scores mapped linearly onto [0, 1] (min → 0, max → 1; all-equal scores → 0).
        """
        if how == "layer":
            values = {n: v / (v.norm(p=2) + NORMALIZE_EPS) for n, v in self.values.items()}
        elif how == "minmax":
            flat = self.flat()
            lo, hi = (float(flat.min()), float(flat.max())) if flat.numel() else (0.0, 0.0)
            span = hi - lo
            values = {n: (v - lo) / span if span > 0 else torch.zeros_like(v) for n, v in self.values.items()}
        else:
            raise ValueError(f"how: {how!r} is not one of 'layer', 'minmax'.")
        return HeadScores(self.layout, values, self.method, {**self.meta, "normalize": how})

    def allclose(self, other: "HeadScores", rtol: float = 1e-5, atol: float = 1e-8) -> bool:
        return self.layout.names == other.layout.names and all(
            v.shape == other.values[n].shape and torch.allclose(v, other.values[n], rtol=rtol, atol=atol)
            for n, v in self.values.items()
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HeadScores):
            return NotImplemented
        return (self.layout == other.layout and self.method == other.method and self.meta == other.meta
                and all(torch.equal(v, other.values[n]) for n, v in self.values.items()))

    def __repr__(self) -> str:
        return f"HeadScores(method={self.method!r}, {len(self.layout)} sites, {self.num_heads} heads)"

    # serialisation ---------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": "prunetrain.HeadScores/1",
            "method": self.method,
            "meta": self.meta,
            "layout": self.layout.to_dict(),
            "scores": {name: [float(x) for x in v.tolist()] for name, v in self.values.items()},
        }

    def to_json(self, path: str | Path | None = None) -> str:
        """JSON text (float64 values written with Python's shortest exact repr: `from_json` gives equal scores)."""
        text = json.dumps(self.to_dict(), indent=1)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_dict(cls, data: Mapping) -> "HeadScores":
        if not isinstance(data, Mapping) or data.get("format") != "prunetrain.HeadScores/1":
            raise ValueError("data: expected the output of HeadScores.to_dict() (format 'prunetrain.HeadScores/1').")
        layout = HeadLayout.from_dict(data["layout"])
        values = {n: torch.tensor(v, dtype=torch.float64) for n, v in data["scores"].items()}
        return cls(layout, values, data.get("method", "custom"), dict(data.get("meta", {})))

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> "HeadScores":
        text = str(text_or_path)
        if not text.lstrip().startswith("{"):
            text = Path(text_or_path).read_text()
        return cls.from_dict(json.loads(text))


# ---------------------------------------------------------------------------------------------------------------------
# shared machinery: batches, loss, frozen parameters, distributed sums
# ---------------------------------------------------------------------------------------------------------------------
def batch_to(batch: Mapping, device: torch.device) -> dict:
    """A batch (mapping) with its tensors moved to `device`."""
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


def _batches(batches: Iterable, device: torch.device, max_batches: int | None) -> Iterator[dict]:
    """Validate the arguments now; yield each batch (a mapping) with its tensors moved to `device`."""
    if isinstance(batches, Mapping):
        raise ValueError("batches: got a single batch (a mapping); pass an iterable of batches, e.g. [batch] or a "
                        "DataLoader.")
    if max_batches is not None and (not isinstance(max_batches, int) or isinstance(max_batches, bool)
                                    or max_batches < 1):
        raise ValueError(f"max_batches: {max_batches!r} is not allowed; give a positive int or None (all batches).")

    def moved() -> Iterator[dict]:
        total = len(batches) if hasattr(batches, "__len__") else None
        if max_batches is not None and total is not None:
            total = min(total, max_batches)
        for i, batch in enumerate(bar(batches, total=total, desc="importance", unit="batch")):
            if max_batches is not None and i >= max_batches:
                return
            if not isinstance(batch, Mapping):
                raise ValueError(f"batches: each batch must be a mapping of model inputs (a dict, as a DataLoader "
                                f"with a HF collator yields), got {type(batch).__name__}.")
            yield batch_to(batch, device)

    return moved()


def is_causal_lm(model: nn.Module) -> bool:
    """Decoder-only LMs shift labels by one inside their loss (HF `ForCausalLMLoss`)."""
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return False
    name = type(model).__name__
    return name.endswith("ForCausalLM") or name.endswith("LMHeadModel")


def loss_token_count(model: nn.Module, batch: Mapping) -> int:
    """Number of items the model's own (mean) loss averages over: labels != -100 (shifted by one for causal LMs);
    every element for float labels (regression, multi-label)."""
    labels = batch["labels"]
    if labels.is_floating_point():
        return labels.numel()
    if is_causal_lm(unwrap_model(model)):
        labels = labels[..., 1:]
    return int((labels != -100).sum())


def _batch_loss(model: nn.Module, batch: dict, loss_fn: LossFn | None) -> tuple[torch.Tensor, float]:
    """`(mean loss, n)`: the model's own loss over its `n` label tokens, or the custom `loss_fn`'s."""
    if loss_fn is not None:
        result = loss_fn(model, batch)
        loss, n = result if isinstance(result, tuple) else (result, 1.0)
        if not torch.is_tensor(loss) or loss.numel() != 1:
            raise ValueError(f"loss_fn: must return a scalar tensor (or (scalar, n)), got {type(loss).__name__}"
                            f"{'' if not torch.is_tensor(loss) else f' of shape {tuple(loss.shape)}'}.")
        return loss.reshape(()), float(n)
    if "labels" not in batch:
        raise ValueError(f"batches: a batch has no 'labels' (keys: {', '.join(batch)}), so the model computes no "
                         f"loss; add labels or pass loss_fn(model, batch) -> scalar.")
    outputs = model(**batch)
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else getattr(outputs, "loss", None)
    if loss is None:
        raise ValueError(f"model: {type(model).__name__} returned no loss for a batch with labels (a base model "
                         f"without a head?); pass loss_fn(model, batch) -> scalar.")
    return loss, float(loss_token_count(model, batch))


def _autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"autocast: expected a torch.dtype (e.g. torch.bfloat16) or None, got {dtype!r}.")
    return torch.autocast(device_type=device.type, dtype=dtype)


@contextlib.contextmanager
def scoring_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) and frozen parameters for the duration; every module's `training` flag and every
    parameter's `requires_grad` flag are restored exactly afterwards, also on error."""
    training = [(m, m.training) for m in model.modules()]
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        model.eval()
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        for m, flag in training:
            m.training = flag


def _distributed_world(sync: bool | None) -> int:
    """World size to reduce over (1 = no reduction)."""
    if sync is not None and not isinstance(sync, bool):
        raise ValueError(f"sync: expected True, False or None (auto), got {sync!r}.")
    available = torch.distributed.is_available() and torch.distributed.is_initialized()
    if sync and not available:
        raise ValueError("sync: True needs an initialised torch.distributed process group; none is initialised.")
    if sync is False or not available:
        return 1
    return torch.distributed.get_world_size()


class _Sums:
    """Per-site sums `[num_heads]` and counts (float64, CPU), all-reduced across ranks when distributed."""

    def __init__(self, layout: HeadLayout):
        self.layout = layout
        self.sums = {s.name: torch.zeros(s.num_heads, dtype=torch.float64) for s in layout}
        self.counts = {s.name: 0.0 for s in layout}
        self.batches = 0

    def add(self, name: str, values: torch.Tensor, count: float) -> None:
        self.sums[name] += values.detach().to("cpu", torch.float64)
        self.counts[name] += float(count)

    def all_reduce(self, model: nn.Module) -> int:
        """Sum across ranks (a collective: every rank must call it). Returns the world size."""
        import torch.distributed as dist

        names = self.layout.names
        flat = torch.cat([self.sums[n] for n in names]
                         + [torch.tensor([self.counts[n] for n in names] + [float(self.batches)], dtype=torch.float64)])
        backend = str(dist.get_backend())
        device = device_of(model) if "nccl" in backend and device_of(model).type == "cuda" else torch.device("cpu")
        flat = flat.to(device)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat = flat.cpu()
        offset = 0
        for n in names:
            k = self.sums[n].numel()
            self.sums[n] = flat[offset: offset + k].clone()
            offset += k
        for n in names:
            self.counts[n] = float(flat[offset])
            offset += 1
        self.batches = int(flat[offset])
        return dist.get_world_size()

    def result(self, reduction: str) -> dict[str, torch.Tensor]:
        if reduction == "sum":
            return {n: v.clone() for n, v in self.sums.items()}
        return {n: v / self.counts[n] if self.counts[n] > 0 else torch.zeros_like(v) for n, v in self.sums.items()}


def _finish(acc: _Sums, model: nn.Module, world: int, reduction: str) -> tuple[dict, int]:
    """All-reduce (if distributed; a rank with no batches still takes part) and turn sums into scores."""
    if world > 1:
        acc.all_reduce(model)
    if acc.batches == 0:
        raise ValueError("batches: no batch was scored (empty iterable, or every batch had 0 loss tokens).")
    return acc.result(reduction), world


# ---------------------------------------------------------------------------------------------------------------------
# gradient importance (Michel et al. 2019)
# ---------------------------------------------------------------------------------------------------------------------
def _batch_size(batch: Mapping) -> int | None:
    ids = batch.get("input_ids")
    return int(ids.shape[0]) if torch.is_tensor(ids) and ids.dim() >= 1 else None


class _ExampleGate:
    """Forward pre-hook on an output projection: multiply head h of example b by its own leaf ξ[b, h] = 1.

    Example b's loss depends only on ξ[b, :], so one backward of the batch loss gives every example's ∂L/∂ξ_h.
    """

    def __init__(self, num_heads: int, head_dim: int):
        self.num_heads, self.head_dim = num_heads, head_dim
        self.gate: torch.Tensor | None = None
        self.batch_size: int | None = None  # from the batch's input_ids, to catch time-first activations

    def __call__(self, module: nn.Module, args: tuple):
        (x, *rest) = args  # x: [B, T, H * d]
        if self.batch_size is not None and (x.dim() != 3 or x.shape[0] != self.batch_size):
            raise RuntimeError(f"per='example': this model's heads come out as {tuple(x.shape)}, not batch-first "
                               f"[{self.batch_size}, time, heads*dim] (e.g. FSMT/fairseq are time-first); use "
                               f"per='batch'.")
        if self.gate is None:
            self.gate = torch.ones(x.shape[0], self.num_heads, device=x.device, dtype=torch.float32,
                                   requires_grad=True)
        if x.dim() != 3 or x.shape[0] != self.gate.shape[0]:
            raise RuntimeError(f"per='example': expected the heads' output as [batch, time, heads*dim] with batch "
                               f"{self.gate.shape[0]}, got shape {tuple(x.shape)}.")
        gate = self.gate.to(x.dtype)[:, None, :, None]  # [B, 1, H, 1]
        return ((x.unflatten(-1, (self.num_heads, self.head_dim)) * gate).flatten(-2), *rest)


class _BatchGates:
    """per="batch": one keep value ξ_h per head (a `HeadMask` with gradients), shared by the batch's examples."""

    def __init__(self, net: nn.Module, layout: HeadLayout):
        self.layout = layout
        self.mask = HeadMask(layout).requires_grad_()
        self.mask.attach(net)

    def start(self, batch: Mapping) -> None:
        self.mask.zero_grad()

    def abs_grad(self, name: str) -> torch.Tensor:
        grad = self.mask[name].grad
        return grad.abs() if grad is not None else torch.zeros(self.layout[name].num_heads)

    def close(self) -> None:
        self.mask.detach()
        self.mask.requires_grad_(False)


class _ExampleGates:
    """per="example": one ξ[b, h] per example and head (`_ExampleGate` hooks), so one backward gives every example's
    gradient; `abs_grad` sums |∂L/∂ξ[b, h]| over the examples b."""

    def __init__(self, net: nn.Module, layout: HeadLayout):
        sites = attention_sites(net)
        if sites and sites[0].adapter.time_first:
            raise ValueError(f"per: 'example' needs batch-first attention outputs; {sites[0].adapter.name} "
                             f"models are time-first, so use per='batch'.")
        self.layout = layout
        self.gates = {s.info.name: _ExampleGate(s.info.num_heads, s.info.head_dim) for s in sites}
        self.handles = [s.out_proj.register_forward_pre_hook(self.gates[s.info.name]) for s in sites]

    def start(self, batch: Mapping) -> None:
        size = _batch_size(batch)
        for gate in self.gates.values():
            gate.gate, gate.batch_size = None, size

    def abs_grad(self, name: str) -> torch.Tensor:
        gate = self.gates[name].gate
        grad = gate.grad if gate is not None else None
        return grad.abs().sum(0) if grad is not None else torch.zeros(self.layout[name].num_heads)

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        for gate in self.gates.values():
            gate.gate = None


@contextlib.contextmanager
def _unit_gates(per: str, net: nn.Module, layout: HeadLayout) -> Iterator["_BatchGates | _ExampleGates"]:
    """The ξ whose gradients `head_importance` reads, attached for the duration (removed also on error)."""
    gates = _BatchGates(net, layout) if per == "batch" else _ExampleGates(net, layout)
    try:
        yield gates
    finally:
        gates.close()


def _scoring_setup(model: nn.Module, sync: bool | None, autocast) -> tuple[int, nn.Module, torch.device, HeadLayout,
                                                                     "_Sums"]:
    """What every scorer starts with: the distributed world size, the inner model (forward it, not a DDP wrapper,
    which would expect parameter gradients), its device, its layout and empty per-head sums. The autocast argument
    is validated here, before any work."""
    world = _distributed_world(sync)
    net = unwrap_model(model)
    device = device_of(net)
    _autocast(device, autocast)
    layout = find_heads(net)
    return world, net, device, layout, _Sums(layout)


def head_importance(
    model: nn.Module,
    batches: Iterable[Mapping[str, Any]],
    *,
    loss_fn: LossFn | None = None,
    per: str = "batch",
    normalize: str | None = "layer",
    reduction: str = "mean",
    autocast: torch.dtype | None = None,
    max_batches: int | None = None,
    sync: bool | None = None,
) -> HeadScores:
    """Michel et al. (2019) head importance I_h = E_x |∂L(x)/∂ξ_h| at ξ = 1 (eq. 2; see the module docstring
    for the exact token-weighted expectation).

    One forward and one backward per batch; model parameters get no gradients (they are frozen for the duration,
    and `requires_grad` flags and train/eval mode are restored exactly afterwards, also on error). Runs in eval mode
    (no dropout). Masks already attached to the model stay in effect (a removed head scores 0).

    Args:
        model: the model (a DDP-style `.module` wrapper is unwrapped; an FSDP2 model is scored as it is).
        batches: an iterable of batches (mappings of model inputs), e.g. a list or a DataLoader.
        loss_fn: None → the model's own loss (batches need `labels`; seq2seq and MLM average token cross-entropy
            over labels != -100, so padding must be -100 as HF collators produce; causal LMs shift labels by one).
            Otherwise `loss_fn(model, batch) -> loss | (loss, n)` with `loss` a mean over `n` items (default 1).
        per: "batch" (default; the authors' code: |∂L_b/∂ξ| of each batch's loss) or "example" (the paper: one
            |∂L_x/∂ξ| per example, obtained exactly from the same single backward by giving each example its own
            ξ[b, h]; cost ≈ per="batch").
        normalize: "layer" (default, as the authors' code): divide each site's importance by its L2 norm;
            None: raw values.
        reduction: "mean" (default): divide by the total token count Σ n_u; "sum": Σ_u |∂S_u/∂ξ_h| undivided.
        autocast: a dtype (e.g. torch.bfloat16) to run forward under `torch.autocast`, or None.
        max_batches: score at most this many batches (None: all).
        sync: None (default): all-reduce sums and counts when torch.distributed is initialised with >1 rank (every
            rank must call this function); False: local only; True: require a process group.

    Returns:
        `HeadScores` (method "gradient"); `meta` records the options, tokens, batches and world size.
    """
    check_choice("per", per, PER)
    check_choice("normalize", normalize, NORMALIZE)
    check_choice("reduction", reduction, REDUCTION)
    world, net, device, layout, acc = _scoring_setup(model, sync, autocast)
    with scoring_mode(net), _unit_gates(per, net, layout) as gates:
        for batch in _batches(batches, device, max_batches):
            gates.start(batch)
            with _autocast(device, autocast):
                loss, n = _batch_loss(net, batch, loss_fn)
            if n <= 0:
                continue
            loss.backward()
            for site in layout:  # Σ_u |∂S_u/∂ξ_h| = n · Σ_u |∂L/∂ξ_u,h| (L the batch's mean loss)
                acc.add(site.name, n * gates.abs_grad(site.name), n)
            acc.batches += 1
    values, world = _finish(acc, net, world, reduction)
    meta = {"per": per, "normalize": None, "reduction": reduction, "tokens": acc.counts[layout.names[0]]
            if layout.names else 0.0, "batches": acc.batches, "world_size": world,
            "loss": "model" if loss_fn is None else "custom", "autocast": str(autocast) if autocast else None}
    scores = HeadScores(layout, values, "gradient", meta)
    return scores.normalized("layer") if normalize == "layer" else scores


# ---------------------------------------------------------------------------------------------------------------------
# ablation: the real loss change of removing each head alone
# ---------------------------------------------------------------------------------------------------------------------
def ablation_scores(
    model: nn.Module,
    batches: Iterable[Mapping[str, Any]],
    *,
    loss_fn: LossFn | None = None,
    autocast: torch.dtype | None = None,
    max_batches: int | None = None,
    sync: bool | None = None,
) -> HeadScores:
    """Score_h = token-weighted mean over batches of L(model with head h alone removed) − L(model).

    Negative: removing the head lowers the loss. Costs 1 + H forward passes per batch (H = all heads), no backward.
    Masks already attached to the model stay in effect. Eval mode, no gradients.

    Args:
        model: the model.
        batches: an iterable of batches with labels (or use `loss_fn`).
        loss_fn: as in `head_importance`.
        autocast: a dtype to run forward under `torch.autocast`, or None.
        max_batches: score at most this many batches (None: all).
        sync: distributed reduction, as in `head_importance`.
    """
    world, net, device, layout, acc = _scoring_setup(model, sync, autocast)
    probe = HeadMask(layout)
    with scoring_mode(net), torch.no_grad():
        probe.attach(net)
        try:
            for batch in _batches(batches, device, max_batches):
                with _autocast(device, autocast):
                    base, n = _batch_loss(net, batch, loss_fn)
                if n <= 0:
                    continue
                for s in layout:
                    deltas = torch.zeros(s.num_heads, dtype=torch.float64)
                    for h in range(s.num_heads):
                        probe.set(s.name, h, 0.0)
                        try:
                            with _autocast(device, autocast):
                                loss, _ = _batch_loss(net, batch, loss_fn)
                        finally:
                            probe.set(s.name, h, 1.0)
                        deltas[h] = float(loss) - float(base)
                    acc.add(s.name, n * deltas, n)
                acc.batches += 1
        finally:
            probe.detach()
    values, world = _finish(acc, net, world, "mean")
    meta = {"batches": acc.batches, "world_size": world, "loss": "model" if loss_fn is None else "custom",
            "autocast": str(autocast) if autocast else None}
    return HeadScores(layout, values, "ablation", meta)


# ---------------------------------------------------------------------------------------------------------------------
# confidence (Voita et al. 2019)
# ---------------------------------------------------------------------------------------------------------------------
def _query_masks(batch: Mapping) -> dict[str, torch.Tensor | None]:
    """Which query positions are real tokens: encoder/self-attention from `attention_mask`; decoder self and cross
    attention from `decoder_attention_mask`, else from `labels != -100` when the decoder inputs come from labels."""
    encoder = batch.get("attention_mask")
    decoder = batch.get("decoder_attention_mask")
    if decoder is None and "decoder_input_ids" not in batch and torch.is_tensor(batch.get("labels")):
        labels = batch["labels"]
        decoder = labels != -100 if labels.dim() == 2 and not labels.is_floating_point() else None
    return {"encoder_self": encoder, "self": encoder, "decoder_self": decoder, "cross": decoder}


class _ConfidenceHook:
    """Forward hook on an attention module: Σ over real query tokens of max_k attention weight, per head."""

    def __init__(self, name: str, kind: str, acc: _Sums):
        self.name, self.kind, self.acc = name, kind, acc
        self.query_masks: dict = {}

    def __call__(self, module: nn.Module, args, output):
        weights = output[-1] if isinstance(output, tuple) else None
        if not torch.is_tensor(weights) or weights.dim() != 4:
            raise RuntimeError(f"confidence: site {self.name!r} returned no attention weights [batch, heads, query, "
                               f"key]; this scorer needs the eager attention implementation.")
        top = weights.detach().float().amax(dim=-1)  # [B, H, Tq]
        mask = self.query_masks.get(self.kind)
        if mask is not None and tuple(mask.shape) == (top.shape[0], top.shape[2]):
            keep = mask.to(top.device, top.dtype)[:, None, :]  # [B, 1, Tq]
            total, count = (top * keep).sum(dim=(0, 2)), float(keep.sum())
        else:
            total, count = top.sum(dim=(0, 2)), float(top.shape[0] * top.shape[2])
        self.acc.add(self.name, total, count)


@contextlib.contextmanager
def _eager_attention(model: nn.Module) -> Iterator[None]:
    """Temporarily switch a transformers model to eager attention (the only one that returns attention weights)."""
    current = getattr(getattr(model, "config", None), "_attn_implementation", "eager")
    if current == "eager":
        yield
        return
    if not hasattr(model, "set_attn_implementation"):
        raise ValueError(f"model: uses {current!r} attention and cannot be switched to 'eager', which the "
                         f"confidence scorer needs for attention weights.")
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(current)


def confidence_scores(
    model: nn.Module,
    batches: Iterable[Mapping[str, Any]],
    *,
    autocast: torch.dtype | None = None,
    max_batches: int | None = None,
    sync: bool | None = None,
) -> HeadScores:
    """Voita et al. (2019) confidence: the mean over real (non-padding) query tokens of the head's maximum attention
    weight. In [1/T, 1] for T keys; a head that always attends to one token scores 1. Runs the model in eval mode with
    eager attention (switched temporarily), without labels and without gradients.

    Args:
        model: the model.
        batches: an iterable of batches (labels not needed).
        autocast: a dtype to run forward under `torch.autocast`, or None.
        max_batches: score at most this many batches (None: all).
        sync: distributed reduction, as in `head_importance`.
    """
    world, net, device, layout, acc = _scoring_setup(model, sync, autocast)
    sites = attention_sites(net)
    hooks = {s.info.name: _ConfidenceHook(s.info.name, s.info.kind, acc) for s in sites}
    with scoring_mode(net), torch.no_grad(), _eager_attention(net):
        handles = [s.module.register_forward_hook(hooks[s.info.name]) for s in sites]
        try:
            for batch in _batches(batches, device, max_batches):
                masks = _query_masks(batch)
                for hook in hooks.values():
                    hook.query_masks = masks
                inputs = {k: v for k, v in batch.items() if k != "labels"}
                if "labels" in batch and getattr(net.config, "is_encoder_decoder", False) \
                        and "decoder_input_ids" not in batch:
                    inputs["labels"] = batch["labels"]  # seq2seq models build decoder inputs from labels
                with _autocast(device, autocast):
                    net(**inputs)
                acc.batches += 1
        finally:
            for handle in handles:
                handle.remove()
    values, world = _finish(acc, net, world, "mean")
    return HeadScores(layout, values, "confidence", {"batches": acc.batches, "world_size": world})


# ---------------------------------------------------------------------------------------------------------------------
# random baseline
# ---------------------------------------------------------------------------------------------------------------------
def random_scores(model_or_layout: nn.Module | HeadLayout, *, seed: int = 0) -> HeadScores:
    """Uniform [0, 1) scores from a seeded generator: the same seed and layout always give the same scores.

    Args:
        model_or_layout: a model or its `HeadLayout`.
        seed: the generator's seed.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed: expected an int, got {seed!r}.")
    layout = model_or_layout if isinstance(model_or_layout, HeadLayout) else find_heads(model_or_layout)
    gen = torch.Generator().manual_seed(seed)
    values = {s.name: torch.rand(s.num_heads, generator=gen, dtype=torch.float64) for s in layout}
    return HeadScores(layout, values, "random", {"seed": seed})


# ---------------------------------------------------------------------------------------------------------------------
# the scorer protocol and registry
# ---------------------------------------------------------------------------------------------------------------------
@runtime_checkable
class Scorer(Protocol):
    """Anything that scores heads: `scorer(model, batches) -> HeadScores` (low score = prune first)."""

    def __call__(self, model: nn.Module, batches: Iterable[Mapping[str, Any]]) -> HeadScores: ...


@dataclass
class GradientScorer:
    """Michel et al. (2019) I_h = E_x |∂L(x)/∂ξ_h| (`head_importance`). Cost: 1 forward + 1 backward per batch."""

    loss_fn: LossFn | None = None
    per: str = "batch"
    normalize: str | None = "layer"
    reduction: str = "mean"
    autocast: torch.dtype | None = None
    max_batches: int | None = None
    sync: bool | None = None

    def __post_init__(self) -> None:
        check_choice("per", self.per, PER)
        check_choice("normalize", self.normalize, NORMALIZE)
        check_choice("reduction", self.reduction, REDUCTION)

    def __call__(self, model, batches) -> HeadScores:
        return head_importance(model, batches, loss_fn=self.loss_fn, per=self.per, normalize=self.normalize,
                               reduction=self.reduction, autocast=self.autocast, max_batches=self.max_batches,
                               sync=self.sync)


@dataclass
class AblationScorer:
    """Loss change when each head alone is removed (`ablation_scores`). Cost: 1 + H forward passes per batch."""

    loss_fn: LossFn | None = None
    autocast: torch.dtype | None = None
    max_batches: int | None = None
    sync: bool | None = None

    def __call__(self, model, batches) -> HeadScores:
        return ablation_scores(model, batches, loss_fn=self.loss_fn, autocast=self.autocast,
                               max_batches=self.max_batches, sync=self.sync)


@dataclass
class ConfidenceScorer:
    """Voita et al. (2019) mean maximum attention weight (`confidence_scores`). Cost: 1 forward per batch (eager)."""

    autocast: torch.dtype | None = None
    max_batches: int | None = None
    sync: bool | None = None

    def __call__(self, model, batches) -> HeadScores:
        return confidence_scores(model, batches, autocast=self.autocast, max_batches=self.max_batches, sync=self.sync)


@dataclass
class RandomScorer:
    """Seeded uniform scores (`random_scores`): the baseline. Ignores the batches; no forward pass."""

    seed: int = 0

    def __call__(self, model, batches=None) -> HeadScores:
        return random_scores(model, seed=self.seed)


SCORERS: dict[str, Callable[..., Scorer]] = {
    "gradient": GradientScorer,
    "ablation": AblationScorer,
    "confidence": ConfidenceScorer,
    "random": RandomScorer,
}
"""Scorer factories by name; `get_scorer(name, **options)` builds one. Add your own with `register_scorer`."""


def register_scorer(name: str, factory: Callable[..., Scorer]) -> None:
    """Make `get_scorer(name, **options)` return `factory(**options)`.

    Args:
        name: the registry name.
        factory: `factory(**options) -> Scorer` (a callable `scorer(model, batches) -> HeadScores`).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a non-empty string, got {name!r}.")
    SCORERS[name] = factory


def get_scorer(name: str | Scorer, **options) -> Scorer:
    """A scorer by registry name (`gradient`, `ablation`, `confidence`, `random`, or registered), built with
    `options`; a callable scorer is returned as is (options must then be empty).

    Args:
        name: a registry name or a callable `scorer(model, batches) -> HeadScores`.
        **options: keyword options of the scorer (e.g. `per="example"` for "gradient").
    """
    if callable(name) and not isinstance(name, str):
        if options:
            raise ValueError(f"options: {', '.join(options)} can only be given with a scorer name, not with a "
                             f"scorer object.")
        return name
    if name not in SCORERS:
        raise ValueError(f"scorer: {name!r} is not one of {', '.join(map(repr, SCORERS))} (or a callable "
                         f"scorer(model, batches) -> HeadScores).")
    try:
        return SCORERS[name](**options)
    except TypeError as err:
        raise ValueError(f"options for scorer {name!r}: {err}") from None


__all__ = [
    "AblationScorer", "ConfidenceScorer", "GradientScorer", "HeadScores", "RandomScorer", "SCORERS", "Scorer",
    "ablation_scores", "confidence_scores", "get_scorer", "head_importance", "loss_token_count", "random_scores",
    "register_scorer", "scoring_mode",
]
