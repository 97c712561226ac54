"""The run's real limits, checked before anything is built or written: what `recipe --show` accepts, the run accepts.

Two groups:
- `check_static_limits(recipe)` needs no data and runs whenever a recipe is loaded (so `--show` reports it): a seed
  the random generators take (numpy's `seed` wants 0 <= seed < 2**32), an attention implementation that is installed
  and runs here (`flash_attention_2` needs the flash-attn package and CUDA), sentences no longer than the model's
  positions, and the memory the model's weights, gradients and Adam state need at the least (16 bytes per
  parameter) against this machine's memory — estimated from the sizes, before a model with a billion layers is
  built.
- `check_points_reachable(recipe, train_pairs)` needs the number of training pairs: every pruning, shrink and
  test point, and the gates' start, must fall on a step the run reaches (`train.max_steps`, or epochs × batches per
  epoch), so a schedule that can never fire is refused instead of ending with all heads and a line on stderr.
"""

from __future__ import annotations

import math
import os

import torch

MAX_SEED = 2**32 - 1  # numpy.random.seed (called by transformers.set_seed) takes 0 <= seed < 2**32
BYTES_PER_PARAMETER = 16  # fp32 weight + gradient + Adam's two moments: a lower bound on training memory


def check_seed(key: str, seed: int) -> None:
    if seed > MAX_SEED:
        raise ValueError(f"{key}: {seed} is not allowed; expected an integer in [0, {MAX_SEED}] (the random number "
                         f"generators take 32-bit seeds).")


def attention_unavailable(implementation: str) -> str | None:
    """Why `implementation` cannot run here (None: it can)."""
    from transformers.utils import is_flash_attn_2_available, is_torch_flex_attn_available

    if implementation == "flash_attention_2" and not is_flash_attn_2_available():
        return "needs the flash-attn package and a CUDA GPU, which this machine does not have"
    if implementation == "flex_attention" and not is_torch_flex_attn_available():
        return f"needs a torch with flex attention (this is torch {torch.__version__})"
    return None


def marian_parameters(layers: int, d_model: int, ffn_dim: int, vocab: int) -> int:
    """Parameters of the recipes' Marian model (shared embeddings, `layers` encoder + `layers` decoder layers):
    vocab·d + layers·(4d² + 2d·ffn) for the encoder + layers·(8d² + 2d·ffn) for the decoder (biases and norms
    left out: a lower bound)."""
    return vocab * d_model + layers * (12 * d_model * d_model + 4 * d_model * ffn_dim)


def memory_bytes() -> int | None:
    """The memory training would use: the first CUDA device's, else this machine's RAM (None if unknown)."""
    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_memory(key: str, parameters: int) -> None:
    available = memory_bytes()
    needed = parameters * BYTES_PER_PARAMETER
    if available is not None and needed > available:
        raise ValueError(f"{key}: the model would have about {parameters:.3g} parameters and need at least "
                         f"{needed / 2**30:.3g} GiB for weights, gradients and Adam state, more than the "
                         f"{available / 2**30:.3g} GiB here; make it smaller.")


def check_static_limits(recipe) -> None:
    """The checks that need no data (see the module docstring); called when a translation recipe is loaded."""
    from prunetrain.mt.text.data import MAX_POSITIONS

    m, d, t = recipe.model, recipe.data, recipe.train
    check_seed("train.seed", t.seed)
    why = attention_unavailable(m.attn_implementation)
    if why:
        raise ValueError(f"model.attn_implementation: {m.attn_implementation!r} {why}; use 'eager' or 'sdpa'.")
    if d.max_length > MAX_POSITIONS:
        raise ValueError(f"data.max_length: {d.max_length} is more than the model's {MAX_POSITIONS} positions; "
                         f"longer sentences could not be encoded.")
    check_memory("model.layers", marian_parameters(m.layers, m.d_model, m.ffn_dim, d.vocab_size))


def steps_per_epoch(recipe, train_pairs: int) -> int:
    """Optimizer steps per epoch as the Trainer counts them: ceil(pairs / (batch size × processes))."""
    world = max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))
    return max(1, math.ceil(train_pairs / (recipe.train.batch_size * world)))


def planned_steps(recipe, train_pairs: int) -> int:
    """The last optimizer step of the run: `train.max_steps`, or epochs × steps per epoch."""
    t = recipe.train
    return t.max_steps or t.epochs * steps_per_epoch(recipe, train_pairs)


def check_points_reachable(recipe, train_pairs: int) -> None:
    """Every pruning step (epochs placed on steps as the callbacks place them: round(epoch × steps per epoch)),
    shrink step, test step and the gates' start fall within the run's `planned_steps`; else one sentence naming
    the key, the point and the run's length."""
    p, ev = recipe.pruning, recipe.eval
    per_epoch, last = steps_per_epoch(recipe, train_pairs), planned_steps(recipe, train_pairs)
    where = (f"the run ends at step {last} ({train_pairs} training pairs, {per_epoch} steps per epoch"
             + (f", train.max_steps={recipe.train.max_steps})" if recipe.train.max_steps else
                f" × train.epochs={recipe.train.epochs})"))
    pruning = p.method != "l0"
    points = [("pruning.schedule", f"epoch {e:g} (step {max(1, math.floor(e * per_epoch + 0.5))})",
               max(1, math.floor(e * per_epoch + 0.5))) for e in (p.schedule if pruning else {})]
    points += [("pruning.schedule_steps", f"step {s}", s) for s in (p.schedule_steps if pruning else {})]
    points += [("pruning.ffn_schedule_steps", f"step {s}", s) for s in (p.ffn_schedule_steps if pruning else {})]
    points += [("pruning.shrink_steps", f"step {s}", s) for s in (p.shrink_steps if pruning else [])]
    points += [("eval.test_steps", f"step {s}", s) for s in ev.test_steps]
    for key, label, step in points:
        if step > last:
            raise ValueError(f"{key}: {label} is never reached: {where}.")
    if p.method == "l0" and p.l0_start_step >= last:
        raise ValueError(f"pruning.l0_start_step: {p.l0_start_step} is not before the last step: {where}; the gates "
                         f"would never train.")


def check_with_local_data(recipe) -> None:
    """`check_points_reachable` for a translation recipe whose training data is on this machine (counted, not
    read), so `recipe --show` refuses what the run would refuse; nothing when the data is remote or missing."""
    from prunetrain.mt.run.run_record import local_train_pairs

    if getattr(recipe, "kind", "") != "translation":
        return
    pairs = local_train_pairs(recipe)
    if pairs is not None:
        check_points_reachable(recipe, pairs)


__all__ = ["MAX_SEED", "attention_unavailable", "check_memory", "check_points_reachable", "check_seed",
           "check_static_limits", "check_with_local_data", "planned_steps", "steps_per_epoch"]
