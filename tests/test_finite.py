"""Diverged is not done: `FiniteGuard` stops a run at its first non-finite gradient, before any weight takes it, with
one line naming the step; the recipe's run then fails (exit 1, one line) and is neither complete nor saved."""

from __future__ import annotations

import pytest
import torch
from transformers import TrainerCallback

import prunetrain as pt
from prunetrain.training.finite import FiniteGuard, TrainingDiverged, all_finite

from conftest import run_cli
from test_callbacks import _marian, _seq2seq_trainer, tiny_mt  # noqa: F401  (the fixture)


class _PoisonFrom(TrainerCallback):
    """From step `step` on, the model's logits are multiplied by NaN (the loss, then every gradient, is NaN); the
    weights are never touched. Keeps the weights as they were at the end of each step."""

    def __init__(self, model, step):
        self.step, self.after = step, {}
        self.poisoned = False
        model.lm_head.register_forward_hook(lambda m, a, out: out * float("nan") if self.poisoned else out)

    def on_step_begin(self, args, state, control, **kwargs):
        self.poisoned = state.global_step + 1 >= self.step

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.after[state.global_step] = {k: v.detach().clone() for k, v in model.named_parameters()}


def test_a_nan_loss_stops_training_before_the_weights_take_it(tmp_path, tiny_mt):
    model = _marian(tiny_mt[2])
    poison = _PoisonFrom(model, step=3)
    trainer = _seq2seq_trainer(tmp_path, tiny_mt, [FiniteGuard(), poison], epochs=1, model=model)
    with pytest.raises(TrainingDiverged, match=r"^training diverged at step 3: its gradients hold NaN or inf \(the "
                                               r"weights are kept as they were after step 2\)\. The run is not "
                                               r"complete and nothing more was saved; check the settings likely at "
                                               r"fault \(learning_rate=0.002\)\.$"):
        trainer.train()
    assert sorted(poison.after) == [1, 2]  # step 3 never ended
    assert all_finite(list(model.parameters()))
    for name, weight in model.named_parameters():
        assert torch.equal(weight, poison.after[2][name]), name


def test_without_the_guard_the_same_run_ends_with_nan_weights(tmp_path, tiny_mt):
    """What the guard prevents (so the test above can fail): the Trainer trains on and every weight turns NaN."""
    model = _marian(tiny_mt[2])
    poison = _PoisonFrom(model, step=3)
    _seq2seq_trainer(tmp_path, tiny_mt, [poison], epochs=1, model=model).train()
    assert not all_finite(list(model.parameters()))


def test_all_finite_sees_nan_and_inf_anywhere():
    tensors = [torch.zeros(3), torch.ones(2, 2)]
    assert all_finite(tensors) and all_finite([]) and all_finite([torch.zeros(0)])
    for bad in (float("nan"), float("inf"), -float("inf")):
        broken = [t.clone() for t in tensors]
        broken[1][1, 0] = bad
        assert not all_finite(broken)
    assert not all_finite([torch.tensor([1e38, float("nan")], dtype=torch.bfloat16)])
    with pytest.raises(ValueError, match=r"^hint: 3 is not a string\.$"):
        FiniteGuard(hint=3)
    assert pt.FiniteGuard is FiniteGuard and pt.TrainingDiverged is TrainingDiverged


@pytest.mark.slow
def test_a_recipe_that_diverges_fails_in_one_line_and_is_not_complete(tmp_path, multi30k_dir):
    out = tmp_path / "run"
    done = run_cli("recipe", "wmt-small-deen", "--smoke", "--set", "train.learning_rate=1e30", "--set",
                   "eval.bench=false", "--data-dir", multi30k_dir, "--output", out)
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("prunetrain: error: training diverged at step ") and "Traceback" not in done.stderr
    assert "check the settings likely at fault (train.learning_rate=1e+30, train.max_grad_norm=" in lines[-1]
    assert not (out / "run_complete.json").exists() and not (out / "results.json").exists()
    assert not (out / "pruned").exists()
    for state in out.glob("checkpoint-*/model.safetensors"):  # any checkpoint written holds finite weights
        from safetensors.torch import load_file

        assert all_finite(list(load_file(state).values())), state
