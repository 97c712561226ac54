"""What a translation run checks before it touches its run directory, and the record that keeps a resume honest.

- `check_initial_architecture(recipe)`: `pruning.init_layout` (the file it names, and that its layout fits the
  recipe's model) and `pruning.init_heads`, checked by the very code the run uses (`apply_initial_architecture`) on a
  model with the recipe's layers and heads but one unit wide — at `recipe --show` and before a run directory is
  prepared, so a refused value never costs the run `--overwrite` would replace.
- `check_flop_budget(recipe, tokenizer, train_pairs)`: a FLOP budget (`train.max_flops`) too small for the schedule
  is refused: the budget must outlast one step, and every pruning, shrink and test step and the gates' start must
  come before it is spent. The FLOPs are a lower bound, never a guess: the exact per-step polynomial of the model the
  run starts with (`prunetrain.bench.step_flops`), at the shortest batches the training data can form (the k-th
  shortest source and target lengths for k rows), counted only up to the first step that can make the model smaller.
- `merged_flop_points(recipe, clock)`: `eval.test_flops` points that one training step crossed together (the clock
  scores such a step once), so the run reports each of them instead of merging them silently.
- `write_tokenizer_record` / `check_tokenizer_record`: a sha256 of every file of the run's tokenizer, written when the
  run starts (`tokenizer_record.json`); `--resume` refuses a tokenizer that changed since (another one of the same
  size would load and train without an error, on other token ids).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

TOKENIZER_RECORD = "tokenizer_record.json"


# ---------------------------------------------------------------------------------------------------------------------
# the initial architecture
# ---------------------------------------------------------------------------------------------------------------------
def check_initial_architecture(recipe) -> None:
    """Refuse what `apply_initial_architecture` would refuse, on a model of the recipe's layers, heads and FFN width
    whose heads are one unit wide (site names and head counts do not depend on the head width; a layout that names FFN
    neurons needs the FFN's); nothing without `init_layout`/`init_heads`.
    A starting model (`model.init_from`) and a given teacher (`distill.teacher`) must be trained model directories
    with one tokenizer (their configs are checked once the run has its tokenizer: `runner.check_trained_models`)."""
    if getattr(recipe, "kind", "") != "translation":
        return
    p, m = recipe.pruning, recipe.model
    if m.init_from or recipe.distill.teacher:  # the trained models a run starts or distils from, and their tokenizer
        from prunetrain.mt.run.starting import run_tokenizer_dir

        run_tokenizer_dir(recipe)
    if not (p.init_layout or p.init_heads):
        return
    import torch
    from transformers import MarianMTModel

    from prunetrain.mt.run.init_architecture import apply_initial_architecture
    from prunetrain.mt.text.data import marian_config

    rng = torch.get_rng_state()
    try:
        narrow = MarianMTModel(marian_config(300, d_model=m.heads, ffn_dim=m.ffn_dim, layers=m.layers, heads=m.heads,
                                             max_position_embeddings=8, attn_implementation="eager"))
        apply_initial_architecture(recipe, narrow)
    finally:
        torch.set_rng_state(rng)


# ---------------------------------------------------------------------------------------------------------------------
# the FLOP budget
# ---------------------------------------------------------------------------------------------------------------------
def _epoch_step(epoch: float, per_epoch: int) -> int:
    return max(1, int(math.floor(epoch * per_epoch + 0.5)))  # as prunetrain.training.points places epochs


def needed_points(recipe, per_epoch: int) -> list[tuple[str, int]]:
    """(recipe key and point, step) of everything the run must reach before its budget is spent."""
    p, ev = recipe.pruning, recipe.eval
    points = [(f"eval.test_steps step {s}", s) for s in ev.test_steps]
    if p.method == "l0":
        return points + [(f"pruning.l0_start_step {p.l0_start_step}", p.l0_start_step + 1)]  # gates train a step
    points += [(f"pruning.schedule epoch {e:g}", _epoch_step(e, per_epoch)) for e in p.schedule]
    points += [(f"pruning.schedule_steps step {s}", s) for s in p.schedule_steps]
    points += [(f"pruning.ffn_schedule_steps step {s}", s) for s in p.ffn_schedule_steps]
    return points + [(f"pruning.shrink_steps step {s}", s) for s in p.shrink_steps]


def first_smaller_step(recipe, per_epoch: int) -> int | None:
    """The first step after which the model can be smaller (its step FLOPs lower): a shrink, or in mode shrink a
    pruning step; None when the model keeps its size until training ends (masks cost as much as heads)."""
    p = recipe.pruning
    if p.method == "l0":
        return None
    if p.mode == "shrink":
        steps = [_epoch_step(e, per_epoch) for e in p.schedule] + list(p.schedule_steps) + list(p.ffn_schedule_steps)
    else:
        steps = list(p.shrink_steps)
    return min(steps) if steps else None


def _shortest(lengths: list[int], k: int) -> int:
    """The smallest padded length a batch of k rows can have: the k-th shortest sequence."""
    return sorted(lengths)[max(1, min(k, len(lengths))) - 1]


def step_flops_floor(recipe, model, tokenizer, train_pairs) -> tuple[int, int, int]:
    """(a full batch's, the short last batch's, a single row's) training-step FLOPs, each a lower bound for any step
    of `model`'s size: the step polynomial at the shortest padded lengths such a batch can have."""
    from prunetrain.bench.step_flops import BatchShape, StepFlopModel
    from prunetrain.mt.run.ranks import launched_world_size
    from prunetrain.mt.text.data import build_dataset, make_collator

    data = build_dataset(train_pairs, tokenizer, max_length=recipe.data.max_length)
    sources = [len(ids) for ids in data.input_ids]
    targets = [len(ids) for ids in data.labels]
    polynomial = StepFlopModel.fit(model, make_collator(tokenizer, model)([data[0], data[1 % len(data)]]))
    rows = min(recipe.train.batch_size, len(train_pairs))
    per_rank = max(1, rows // launched_world_size())
    full = polynomial(BatchShape(rows, _shortest(sources, per_rank), _shortest(targets, per_rank)))
    last_rows = len(train_pairs) % recipe.train.batch_size
    one = polynomial(BatchShape(1, _shortest(sources, 1), _shortest(targets, 1)))
    short = polynomial(BatchShape(last_rows, _shortest(sources, 1), _shortest(targets, 1))) if last_rows else full
    return full, short, one


def flops_floor(steps: int, per_epoch: int, full: int, short: int) -> int:
    """A lower bound on the FLOPs of the first `steps` steps: each epoch has one short last batch at most."""
    short_steps = min(steps, math.ceil(steps / per_epoch)) if short < full else 0
    return (steps - short_steps) * full + short_steps * short


def check_flop_budget(recipe, tokenizer, train_pairs) -> None:
    """Refuse a `train.max_flops` that one step spends, or that is spent before a point the schedule needs (see
    the module docstring); nothing without a budget."""
    budget = recipe.train.max_flops
    if not budget:
        return
    import torch

    from prunetrain.mt.run.init_architecture import apply_initial_architecture
    from prunetrain.mt.run.run_checks import steps_per_epoch

    rng = torch.get_rng_state()
    try:
        from prunetrain.mt.run.inputs import build_model

        model = build_model(recipe, tokenizer)
        apply_initial_architecture(recipe, model)
        full, short, _ = step_flops_floor(recipe, model, tokenizer, train_pairs)
    finally:
        torch.set_rng_state(rng)
    per_epoch = steps_per_epoch(recipe, len(train_pairs))
    one = min(full, short)
    if budget <= one:
        raise ValueError(f"train.max_flops: {budget:.4g} is spent by the first training step (at least {one:.4g} "
                         f"FLOPs with this model and data); the run would stop after one step — give a budget of "
                         f"many steps.")
    smaller = first_smaller_step(recipe, per_epoch)
    for key, step in sorted(needed_points(recipe, per_epoch), key=lambda item: item[1]):
        counted = min(step - 1, smaller) if smaller is not None else step - 1
        floor = flops_floor(counted, per_epoch, full, short)
        if budget <= floor:
            raise ValueError(f"train.max_flops: {budget:.4g} is spent before {key}: the first {counted} steps alone "
                             f"need at least {floor:.4g} training FLOPs with this model and data; raise "
                             f"train.max_flops or move the point earlier.")


def merged_flop_points(recipe, clock) -> list[dict]:
    """`eval.test_flops` points the run reached that have no test record of their own (one step crossed them with
    another point; the clock scored that step once): [{"share", "step"}] with the step that crossed each."""
    budget = recipe.train.max_flops
    recorded = {r.get("flops_target") for r in clock.records if r.get("kind") == "flops"}
    merged = []
    for share in recipe.eval.test_flops:
        target = share * budget
        if target in recorded or clock.flops < target:
            continue
        later = [r for r in clock.records if r.get("kind") == "flops" and (r.get("flops") or 0) >= target]
        merged.append({"share": share, "step": later[0]["step"] if later else None})
    return merged


# ---------------------------------------------------------------------------------------------------------------------
# the tokenizer record
# ---------------------------------------------------------------------------------------------------------------------
def tokenizer_fingerprint(tokenizer_dir: str | os.PathLike) -> dict[str, str]:
    """{file name: sha256} of every file of a saved tokenizer directory."""
    directory = Path(tokenizer_dir)
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.iterdir()) if path.is_file()}


def write_tokenizer_record(out_dir: str | os.PathLike) -> None:
    from prunetrain.utils.output_paths import write_file

    out_dir = Path(out_dir)
    write_file(out_dir / TOKENIZER_RECORD, json.dumps(tokenizer_fingerprint(out_dir / "tokenizer"), indent=1))


def check_tokenizer_record(out_dir: str | os.PathLike) -> str | None:
    """Refuse a resume whose `tokenizer/` differs from the fingerprint recorded when the run started (ValueError
    naming the file); returns a notice when the run has no record to check against (None when it matched)."""
    from prunetrain.utils.files import read_json

    out_dir = Path(out_dir)
    record_path = out_dir / TOKENIZER_RECORD
    if not record_path.is_file():
        return (f"--resume: {str(out_dir)!r} has no {TOKENIZER_RECORD} (a run started before it was written); its "
                f"tokenizer could not be checked")
    recorded = read_json(record_path, "--resume")
    current = tokenizer_fingerprint(out_dir / "tokenizer") if (out_dir / "tokenizer").is_dir() else {}
    for name in sorted(set(recorded) | set(current)):
        if recorded.get(name) != current.get(name):
            state = "is missing" if name not in current else ("is new" if name not in recorded else "differs")
            raise ValueError(f"--resume: the run's tokenizer changed since it started: {str(out_dir / 'tokenizer' / name)!r} "
                             f"{state} (sha256 recorded in {TOKENIZER_RECORD}); the checkpoints' token ids belong to "
                             f"the original tokenizer — put it back, or use --overwrite or another --output.")
    return None


__all__ = ["TOKENIZER_RECORD", "check_flop_budget", "check_initial_architecture", "check_tokenizer_record",
           "merged_flop_points", "tokenizer_fingerprint", "write_tokenizer_record"]
