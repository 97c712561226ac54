"""The recipe under torchrun (2 ranks, gloo, CPU): `torchrun --nproc_per_node 2 -m prunetrain recipe ... --smoke`.

Rank 0 alone writes the run directory and trains the tokenizer (the other rank waits, then loads it), the Trainer
trains data-parallel on the recipe's global batch (split over the ranks), rank 0 evaluates and reports, and the JSON
summary is printed once. With dropout off (each rank draws its own dropout masks) and fp32, the run ends with the
heads, the test translations and the BLEU of the single-process run. `prunetrain.mt.run.ranks` holds the rank logic.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from prunetrain.mt.run import ranks
from test_distributed import _env, _free_port

SMOKE = ("recipe", "wmt-small-deen", "--smoke", "--set", "model.dropout=0", "--set", "train.precision=fp32",
         "--set", "eval.bench=false")


def _torchrun_cli(*args) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(_free_port()), "-m", "prunetrain", *map(str, args)]
    return subprocess.run(command, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)


def _losses(out: Path) -> list[tuple[int, float]]:
    last = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return [(h["step"], h["loss"]) for h in json.loads((last / "trainer_state.json").read_text())["log_history"]
            if "loss" in h]


@pytest.mark.slow
@pytest.mark.distributed
def test_recipe_under_torchrun_ends_as_one_process(tmp_path, multi30k_dir):
    single, sharded = tmp_path / "single", tmp_path / "torchrun"
    one = run_cli(*SMOKE, "--data-dir", multi30k_dir, "--output", single)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _torchrun_cli(*SMOKE, "--data-dir", multi30k_dir, "--output", sharded)
    assert two.returncode == 0, two.stderr[-4000:]
    assert json.loads(two.stdout)["output"] == str(sharded)  # one JSON summary (from rank 0), nothing else
    assert (sharded / "run_complete.json").is_file() and (sharded / "tokenizer" / "tokenizer.json").is_file()
    a, b = (json.loads((out / "results.json").read_text()) for out in (single, sharded))
    assert [(e["step"], e["mode"], e["heads_after"]) for e in b["pruning_events"]] == [
        (e["step"], e["mode"], e["heads_after"]) for e in a["pruning_events"]]
    assert b["kept_per_kind"] == a["kept_per_kind"] and b["heads_kept"] == a["heads_kept"] == 12
    assert json.loads((sharded / "final_mask.json").read_text()) == json.loads((single / "final_mask.json").read_text())
    # test BLEU over training and at the end, with its n-gram counts and lengths, and chrF: the same translations
    assert [(r["step"], r["bleu"], r["bleu_detail"], r["chrf"]) for r in b["bleu_over_training"][:-1]] == [
        (r["step"], r["bleu"], r["bleu_detail"], r["chrf"]) for r in a["bleu_over_training"][:-1]]
    assert [b["test_pruned"][k] for k in ("bleu", "bleu_detail", "chrf")] == [
        a["test_pruned"][k] for k in ("bleu", "bleu_detail", "chrf")]
    for (step_a, loss_a), (step_b, loss_b) in zip(_losses(single), _losses(sharded), strict=True):
        assert step_a == step_b and abs(loss_a - loss_b) <= 1e-4 * abs(loss_a), (step_a, loss_a, loss_b)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_refusal_on_rank_0_ends_every_rank_with_it(tmp_path, multi30k_dir):
    foreign = tmp_path / "not-a-run"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    done = _torchrun_cli(*SMOKE, "--data-dir", multi30k_dir, "--output", foreign)
    assert done.returncode != 0
    # rank 0 refused the output directory; rank 1 received the same one-line error instead of waiting forever
    assert done.stderr.count("is not empty and holds no prunetrain run") == 2, done.stderr[-3000:]
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]  # nothing written


def test_the_global_batch_must_split_over_the_ranks(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun sets for a 2-process run
    with pytest.raises(ValueError, match=r"train\.batch_size: 49 sentences per step do not split evenly over the 2 "
                                         r"processes torchrun started; give a multiple of 2\."):
        ranks.check_global_batch(49)
    ranks.check_global_batch(50)  # 25 per rank


def test_one_process_trains_as_before(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert ranks.trainer_settings(0.1) == ({}, None)  # no split batches, the Trainer's own loss
    assert ranks.on_main(lambda: 7) == 7 and ranks.is_main() and ranks.end_training()


@pytest.mark.slow
@pytest.mark.distributed
def test_compressing_with_distillation_under_torchrun_ends_as_one_process(tmp_path, multi30k_dir, full_smoke_run):
    """The compress recipe under DDP: every rank starts from the trained model and distils from its own replica of
    the frozen copy (the teacher is replicated, not sharded); the run ends with the single process's losses (the
    distillation's combined loss), heads, translations and teacher FLOPs (summed over the ranks)."""
    source, made = full_smoke_run
    assert made.returncode == 0, made.stderr[-3000:]
    compress = ("recipe", "wmt-small-deen-compress", "--smoke", "--set", f"model.init_from={source}", "--set",
                "model.dropout=0", "--set", "train.precision=fp32", "--set", "eval.bench=false",
                "--data-dir", multi30k_dir)
    single, sharded = tmp_path / "single", tmp_path / "torchrun"
    one = run_cli(*compress, "--output", single)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _torchrun_cli(*compress, "--output", sharded)
    assert two.returncode == 0, two.stderr[-4000:]
    a, b = (json.loads((out / "results.json").read_text()) for out in (single, sharded))
    assert b["kept_per_kind"] == a["kept_per_kind"] and b["heads_kept"] == a["heads_kept"] == 12
    assert [b["test_pruned"][k] for k in ("bleu", "bleu_detail", "chrf")] == [
        a["test_pruned"][k] for k in ("bleu", "bleu_detail", "chrf")]
    # every rank's teacher saw its half of each global batch, padded to the half's longest sentence: summed over the
    # ranks, at most the single process's count (padded to the whole batch's longest)
    teacher_a, teacher_b = a["distillation"]["teacher_forward_flops"], b["distillation"]["teacher_forward_flops"]
    assert 0 < teacher_b <= teacher_a
    for (step_a, loss_a), (step_b, loss_b) in zip(_losses(single), _losses(sharded), strict=True):
        assert step_a == step_b and abs(loss_a - loss_b) <= 1e-4 * abs(loss_a), (step_a, loss_a, loss_b)
