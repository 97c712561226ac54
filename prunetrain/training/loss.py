"""Label-smoothed cross-entropy as a Trainer `compute_loss_func`, in one fused kernel.

transformers' `LabelSmoother` (what a Trainer uses for `label_smoothing_factor` > 0) computes

    L = (1 − ε) · Σ_t −log p_t(y_t) / N  +  ε · Σ_t Σ_v −log p_t(v) / (N · V)

over the N label tokens t (label −100 excluded) and the V vocabulary entries, as five separate passes over the
[tokens × V] log-probabilities (log-softmax, negation, gather, sum, masking) and their backward. `SmoothedCrossEntropy`
computes the same L with one `torch.nn.functional.cross_entropy(..., label_smoothing=ε)`, whose smoothing term is
the same ε · mean over the vocabulary of −log p: equal to `LabelSmoother` up to float rounding, value and gradient
(tests/test_loss.py). On the main recipe's step (Marian, 8000 words, bf16 autocast, 2-core AMD EPYC) it takes
8–11 % off every training step (benchmarks/README.md k5), in the full and the pruned model alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from prunetrain.utils.door import PositiveInt, check, checked
from prunetrain.utils.validate import check_fraction


@checked
class SmoothedCrossEntropy:
    """`compute_loss_func(outputs, labels, num_items_in_batch=None)` for a Trainer: label-smoothed cross-entropy
    (module docstring) over `outputs["logits"]` and `labels`, normalised by `num_items_in_batch` when the Trainer
    gives it (the label tokens of the whole step, all ranks and accumulated batches) and by this batch's label
    tokens otherwise, as `LabelSmoother` normalises.

    Args:
        epsilon: ε, the smoothing weight in [0, 1); 0 gives the plain token cross-entropy.
        ignore_index: the label that marks positions without a target (the Trainer's −100).
        shift_labels: predict token t + 1 from position t (a causal language model's labels), as
            `LabelSmoother(shift_labels=True)`.
    """

    def __init__(self, epsilon: float, ignore_index: int = -100, shift_labels: bool = False):
        if check_fraction("epsilon", epsilon) == 1.0:
            raise ValueError("epsilon: 1.0 is not allowed; expected a smoothing weight in [0, 1) (1 ignores the "
                             "labels).")
        self.epsilon, self.ignore_index = float(epsilon), int(ignore_index)
        self.shift_labels = bool(shift_labels)

    def __call__(self, outputs, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None = None
                 ) -> torch.Tensor:
        """The loss of one batch; `num_items_in_batch` (the Trainer's label-token count: a positive int, or a tensor
        that is not read back from the device on the training step's hot path) normalises the sum."""
        if not torch.is_tensor(num_items_in_batch):
            check("num_items_in_batch", num_items_in_batch, PositiveInt | None)
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        if self.shift_labels:
            logits, labels = logits[..., :-1, :], labels[..., 1:]
        total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).to(logits.device),
                                ignore_index=self.ignore_index, label_smoothing=self.epsilon, reduction="sum")
        if num_items_in_batch is None:
            count = labels.ne(self.ignore_index).sum()
        elif torch.is_tensor(num_items_in_batch):
            count = num_items_in_batch.to(total.device)
        else:
            count = num_items_in_batch
        return total / count

    def __repr__(self) -> str:
        return f"SmoothedCrossEntropy(epsilon={self.epsilon}, ignore_index={self.ignore_index})"


def trainer_loss(label_smoothing: float, loss=None):
    """The `compute_loss_func` a Trainer gets: `loss` where one is given (e.g. the torchrun recipe's), else
    `SmoothedCrossEntropy(label_smoothing)` for label smoothing > 0, else None (the model's own loss)."""
    if loss is None and label_smoothing > 0:
        return SmoothedCrossEntropy(label_smoothing)
    return loss


__all__ = ["SmoothedCrossEntropy", "trainer_loss"]
