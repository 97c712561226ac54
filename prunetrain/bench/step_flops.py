"""Matmul FLOPs of one training step (forward + backward) of a model as it is, from the real shapes of each batch.

Counting every step under `FlopCounterMode` would slow training down; timing it would drift. Instead the count is an
exact polynomial in the batch's shape. For a transformer every matrix product of a training step has a cost
`2·M·N·K` in which exactly one of M, N, K is the batch size B, and the others are widths (fixed by the model) or the
padded sequence lengths — S for the encoder stream, T for the decoder stream. So the step's matmul FLOPs are

    F(B, S, T) = B · (p + a·S + b·T + c·S² + d·T² + e·S·T)      (encoder–decoder)
    F(B, S)    = B · (p + a·S + c·S²)                            (one stream: decoder-only or encoder-only)

(p: the products made once per sequence, e.g. a classifier's pooler and head on its first token; a, b: every linear
layer, including cross-attention's key/value projections which see S tokens; c, d, e: the attention products QKᵀ and
AV of self- and cross-attention; backward: the gradients of both operands of every product). `StepFlopModel.fit`
measures F with `prunetrain.bench.flops` (torch's `FlopCounterMode`, exact for matmuls) on a few tiny probe batches
cut from a real batch, solves for the integer coefficients exactly, and checks them on two more probes with other
batch sizes — a model whose FLOPs are not of this form (data-dependent routing,
say) is refused rather than counted wrongly. A shrunk model has other coefficients: refit after every change of size.

Masked heads are still computed (a mask zeroes their output), so they count; removed heads do not.

A probe measures the model alone: code that wraps a model's forward to do more in a training step (distillation
runs a teacher there) asks `measuring_step_flops()` and, while a probe runs, calls the model's own forward only.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping

import torch
from torch import nn

from prunetrain.bench.flops import flop_counter

__all__ = ["BatchShape", "StepFlopModel", "batch_shape", "measured_step_flops", "measuring_step_flops"]

_probing = threading.local()


def measuring_step_flops() -> bool:
    """True while `measured_step_flops` runs a model (in this thread): a wrapper around a model's forward then calls
    the model's own forward and nothing else, so that the count is the model's."""
    return getattr(_probing, "depth", 0) > 0


@contextlib.contextmanager
def _probe():
    _probing.depth = getattr(_probing, "depth", 0) + 1
    try:
        yield
    finally:
        _probing.depth -= 1

# (B, S, T) probes for the fit (as many independent monomials as coefficients) and for the check (other batch
# sizes), for two streams and for one
_FIT_PROBES = {True: ((1, 2, 2), (1, 2, 3), (1, 3, 2), (1, 3, 4), (1, 4, 3), (1, 2, 4)),
               False: ((1, 2, 0), (1, 3, 0), (1, 4, 0))}
_CHECK_PROBES = {True: ((2, 5, 3), (3, 3, 6)), False: ((2, 5, 0), (3, 6, 0))}
# the terms of `BatchShape.monomials`, in its order (two streams, one)
_MONOMIAL_NAMES = {True: ("B", "B·S", "B·T", "B·S²", "B·T²", "B·S·T"), False: ("B", "B·S", "B·S²")}


@dataclass(frozen=True)
class BatchShape:
    """The padded shape of one batch: rows, encoder-stream length S, decoder-stream length T (0: one stream)."""

    batch: int
    source: int
    target: int = 0

    def monomials(self, two_streams: bool) -> tuple[int, ...]:
        b, s, t = self.batch, self.source, self.target
        return (b, b * s, b * t, b * s * s, b * t * t, b * s * t) if two_streams else (b, b * s, b * s * s)


def _is_target_key(key: str, two_streams: bool) -> bool:
    """Batch entries of the decoder stream of an encoder–decoder model: `labels` and every `decoder_*` input."""
    return two_streams and (key == "labels" or key.startswith("decoder_"))


def _two_streams(model: nn.Module) -> bool:
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


def _token_tensors(inputs: Mapping) -> dict[str, torch.Tensor]:
    """The batch's tensors; each must be [B] or [B, L] (token models: ids, masks, labels). Scalars (the Trainer's
    `num_items_in_batch`) are not part of the shape."""
    out = {}
    for key, value in inputs.items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            continue
        if value.dim() not in (1, 2):
            raise ValueError(f"batch: entry {key!r} has shape {tuple(value.shape)}; training FLOPs are counted for "
                             f"token models whose inputs are [batch] or [batch, length] tensors.")
        out[key] = value
    if not out:
        raise ValueError("batch: no tensors in the batch; nothing to count.")
    return out


def batch_shape(model: nn.Module, inputs: Mapping) -> BatchShape:
    """The `BatchShape` of a batch as the model receives it (keyword inputs of its forward).

    Args:
        model: the (unwrapped) model; `config.is_encoder_decoder` says whether it has two streams.
        inputs: the batch, e.g. {"input_ids", "attention_mask", "decoder_input_ids", "labels"}.
    """
    two = _two_streams(model)
    tensors = _token_tensors(inputs)
    batch = next(iter(tensors.values())).shape[0]
    source = max((t.shape[1] for k, t in tensors.items() if t.dim() == 2 and not _is_target_key(k, two)), default=0)
    target = max((t.shape[1] for k, t in tensors.items() if t.dim() == 2 and _is_target_key(k, two)), default=0)
    return BatchShape(int(batch), int(source), int(target) if two else 0)


def _resize(tensor: torch.Tensor, rows: int, length: int | None) -> torch.Tensor:
    """`tensor` tiled and cut to `rows` rows (and `length` columns): real values, so token ids stay valid."""
    reps = [-(-rows // tensor.shape[0])] + ([] if length is None else [-(-length // tensor.shape[1])])
    tiled = tensor.repeat(*reps)
    return tiled[:rows] if length is None else tiled[:rows, :length].contiguous()


def _probe_batch(model: nn.Module, example: Mapping, shape: tuple[int, int, int]) -> dict:
    two = _two_streams(model)
    rows, source, target = shape
    out = {key: value for key, value in example.items() if isinstance(value, torch.Tensor) and value.dim() == 0}
    for key, tensor in _token_tensors(example).items():
        length = None if tensor.dim() == 1 else (target if _is_target_key(key, two) else source)
        out[key] = _resize(tensor, rows, length)
    return out


def measured_step_flops(model: nn.Module, inputs: Mapping) -> int:
    """Matmul FLOPs of one forward + backward of `model` on `inputs`, counted by `FlopCounterMode`.

    The backward computes the gradients of every trainable parameter with `torch.autograd.grad` (the products
    `loss.backward()` runs), so the parameters' `.grad` are left as they were; the model's train/eval mode is used
    as it is, and the RNG state is restored (dropout draws nothing from the training stream).

    Args:
        model: the model (unwrapped).
        inputs: the batch (keyword inputs of the forward).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        counter = flop_counter()
        with counter, _probe():
            output = model(**inputs)
            loss = getattr(output, "loss", None)
            if loss is None:
                first = output[0] if isinstance(output, (tuple, list)) else next(iter(output.values()))
                loss = first.float().sum()
            if params:
                torch.autograd.grad(loss, params, allow_unused=True)
        return int(counter.get_total_flops())
    finally:
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def _solve_exact(rows: list[tuple[int, ...]], values: list[int]) -> list[Fraction]:
    """Solve the square system rows · x = values exactly (Gauss–Jordan over the rationals)."""
    n = len(rows)
    matrix = [[Fraction(v) for v in row] + [Fraction(value)] for row, value in zip(rows, values)]
    for col in range(n):
        pivot = next((r for r in range(col, n) if matrix[r][col] != 0), None)
        if pivot is None:  # pragma: no cover - the probes are chosen independent
            raise AssertionError("step FLOPs: the probe shapes do not determine the coefficients.")
        matrix[col], matrix[pivot] = matrix[pivot], matrix[col]
        lead = matrix[col][col]
        matrix[col] = [v / lead for v in matrix[col]]
        for r in range(n):
            if r != col and matrix[r][col] != 0:
                factor = matrix[r][col]
                matrix[r] = [a - factor * b for a, b in zip(matrix[r], matrix[col])]
    return [matrix[r][n] for r in range(n)]


@dataclass(frozen=True)
class StepFlopModel:
    """The exact training-step FLOPs of one model size as a polynomial in the batch shape (module docstring).

    Attributes:
        coefficients: the integer coefficients of the monomials of `BatchShape.monomials`.
        two_streams: whether the model has an encoder and a decoder stream.
        parameters: the model's parameter count when it was fitted (a different count means: refit).
    """

    coefficients: tuple[int, ...]
    two_streams: bool
    parameters: int

    def __call__(self, shape: BatchShape) -> int:
        return sum(c * m for c, m in zip(self.coefficients, shape.monomials(self.two_streams)))

    @classmethod
    def fit(cls, model: nn.Module, example: Mapping) -> "StepFlopModel":
        """Fit the coefficients on probes cut from `example` (a real batch) and check them on two more probes.

        Raises:
            ValueError: the model's step FLOPs are not the polynomial of the module docstring.
        """
        two = _two_streams(model)
        rows, values = [], []
        for shape in _FIT_PROBES[two]:
            rows.append(BatchShape(*shape).monomials(two))
            values.append(measured_step_flops(model, _probe_batch(model, example, shape)))
        solution = _solve_exact(rows, values)
        if any(x.denominator != 1 for x in solution):
            raise ValueError(f"step FLOPs: {type(model).__name__}'s matmul FLOPs are not an integer polynomial in "
                             f"the batch shape (coefficients {[str(x) for x in solution]}); they cannot be counted "
                             f"from shapes.")
        fitted = cls(tuple(int(x) for x in solution), two, sum(p.numel() for p in model.parameters()))
        for shape in _CHECK_PROBES[two]:
            measured = measured_step_flops(model, _probe_batch(model, example, shape))
            if fitted(BatchShape(*shape)) != measured:
                raise ValueError(f"step FLOPs: {type(model).__name__}'s matmul FLOPs at batch shape {shape} are "
                                 f"{measured}, not the {fitted(BatchShape(*shape))} the fitted polynomial predicts "
                                 f"(data-dependent computation?); they cannot be counted from shapes.")
        return fitted

    def to_dict(self) -> dict:
        return {"coefficients": list(self.coefficients), "monomials": list(_MONOMIAL_NAMES[self.two_streams]),
                "two_streams": self.two_streams,
                "parameters": self.parameters}
