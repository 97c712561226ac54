"""Mid-training shrink under FSDP2 (`fully_shard`), with real torchrun processes (2 ranks, gloo, CPU).

The worker (`tests/dist/fsdp_shrink.py`) trains a tiny Marian on Multi30k for 24 steps; the callbacks are driven
through transformers' `CallbackHandler` (on CPU the HF Trainer does not shard, see docs/distributed.md):

- `HeadPruningCallback(shrink_steps=[8, 14])`: two shrinks of the sharded model (each affected parameter and its
  sharded AdamW state gathered, sliced, sharded again), and the same global batches give the same losses and the
  same final weights as one unsharded process; each rank holds less after each shrink;
- a run whose rank 0 is killed with SIGKILL after both shrinks resumes from its checkpoint to the same end;
- `HardConcreteCallback(finalize="shrink")` leaves both ranks with the same shrunk, sharded model;
- `DistillationCallback(teacher=None)` through both shrinks: each rank distils from a whole replica of the model
  taken when training began (gathered, not deep-copied), as one process does, and a killed run resumes with it;
- what the sharded shrink cannot do (CPU offload, tensor-parallel weights) is refused before any weight changes
  (in this process, on a one-rank gloo group).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

import prunetrain as pt
from prunetrain.zoo import random_mask, tiny_model

from test_distributed import DIST, _env, _run, _torchrun

WORKER = DIST / "fsdp_shrink.py"


def _result(out, rank=0) -> dict:
    return json.loads((out / f"rank{rank}_result.json").read_text())


def _assert_weights_close(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].shape == b[key].shape, key
        if a[key].numel():
            assert torch.allclose(a[key], b[key], atol=atol, rtol=0), (key, float((a[key] - b[key]).abs().max()))


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory, multi30k_dir):
    """The same 24-step run with two mid-training shrinks in one process and sharded over two ranks."""
    base = tmp_path_factory.mktemp("fsdp_shrink")
    single, sharded = base / "single", base / "fsdp"
    _run([sys.executable, str(WORKER), "--out", str(single), "--data", str(multi30k_dir)], base)
    _run(_torchrun(WORKER, "--out", str(sharded), "--data", str(multi30k_dir)), base)
    return base, single, sharded


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_mid_training_shrinks_equal_one_process(fsdp_runs):
    _, single, sharded = fsdp_runs
    one, r0, r1 = _result(single), _result(sharded, 0), _result(sharded, 1)
    assert r0["world"] == 2 and r0["steps"] == r1["steps"] == one["steps"] == 24
    assert len(one["losses"]) == 24 and r0["losses"] == r1["losses"]
    for step, loss in one["losses"].items():  # every step, before, between and after the shrinks
        assert abs(r0["losses"][step] - loss) <= 1e-5, (step, r0["losses"][step], loss)
    assert r0["mask"] == r1["mask"] == one["mask"]  # the same heads chosen on every rank, as one process chose
    assert r0["layout"] == r1["layout"] == one["layout"]
    assert sum(len(site["heads"]) for site in r0["layout"]["sites"]) == 12  # 24 heads → 15 → 12, physically
    _assert_weights_close(load_file(str(sharded / "rank0_weights.safetensors")),
                          load_file(str(single / "rank0_weights.safetensors")), atol=1e-5)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_decision_one_rank_takes_is_taken_by_every_rank(fsdp_runs):
    _, single, sharded = fsdp_runs  # `any_rank`: how the time cap stops every rank at the same step
    assert _result(sharded, 0)["agreed"] == _result(sharded, 1)["agreed"] == [True, False]
    assert _result(single)["agreed"] == [True, False]  # one process: the flag itself


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_shrink_frees_memory_on_every_rank(fsdp_runs):
    _, single, sharded = fsdp_runs
    one = _result(single)["memory"]
    for rank in (0, 1):
        held = _result(sharded, rank)["memory"]  # bytes of parameter shards + optimizer state after each step
        assert held["8"] < held["7"] and held["14"] < held["13"]  # each shrink frees memory on this rank
        assert held["24"] == held["14"]  # and training goes on at the smaller size
        assert held["7"] < 0.6 * one["7"] and held["24"] < 0.6 * one["24"]  # each rank holds about half


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_run_killed_after_a_shrink_resumes_to_the_same_end(fsdp_runs, multi30k_dir):
    base, _, sharded = fsdp_runs
    killed = base / "killed"
    # rank 0 sends itself SIGKILL at step 20 (after both shrinks and the step-16 checkpoint); torchrun stops rank 1
    crashed = subprocess.run(_torchrun(WORKER, "--out", str(killed), "--data", str(multi30k_dir), "--kill-at-step",
                                       "20"), cwd=base, env=_env(), capture_output=True, text=True, timeout=600)
    assert crashed.returncode != 0 and "Signal 9 (SIGKILL)" in crashed.stderr, crashed.stderr[-3000:]
    assert not (killed / "rank0_result.json").exists() and not (killed / "checkpoint-24").exists()
    _run(_torchrun(WORKER, "--out", str(killed), "--data", str(multi30k_dir), "--resume"), base)
    resumed, full = _result(killed), _result(sharded)
    assert resumed["resumed_from"].endswith("checkpoint-16") and sorted(map(int, resumed["losses"])) == list(
        range(17, 25))
    assert all(resumed["losses"][step] == full["losses"][step] for step in resumed["losses"])
    assert resumed["mask"] == full["mask"] and resumed["layout"] == full["layout"]
    _assert_weights_close(load_file(str(killed / "rank0_weights.safetensors")),
                          load_file(str(sharded / "rank0_weights.safetensors")), atol=0)


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_shrinks_of_heads_and_ffn_neurons_equal_one_process_and_resume_after_a_kill(tmp_path, multi30k_dir):
    """FLOP targets met by heads and FFN neurons, shrunk twice in the sharded model: the same losses, units and
    weights as one process; a run killed after both shrinks resumes to the same end, bit for bit."""
    single, sharded, killed = tmp_path / "single", tmp_path / "fsdp", tmp_path / "killed"
    ffn = ("--callback", "prune-ffn-shrink")
    _run([sys.executable, str(WORKER), "--out", str(single), "--data", str(multi30k_dir), *ffn], tmp_path)
    _run(_torchrun(WORKER, "--out", str(sharded), "--data", str(multi30k_dir), *ffn), tmp_path)
    one, r0, r1 = _result(single), _result(sharded, 0), _result(sharded, 1)
    for step, loss in one["losses"].items():
        assert abs(r0["losses"][step] - loss) <= 1e-5, (step, r0["losses"][step], loss)
    assert r0["mask"] == r1["mask"] == one["mask"] and r0["layout"] == r1["layout"] == one["layout"]
    assert r0["layout"]["units"] == ["heads", "neurons"]
    assert sum(len(site["heads"]) for site in r0["layout"]["sites"] if site["kind"].endswith("ffn")) < 4 * 64
    _assert_weights_close(load_file(str(sharded / "rank0_weights.safetensors")),
                          load_file(str(single / "rank0_weights.safetensors")), atol=1e-5)
    crashed = subprocess.run(_torchrun(WORKER, "--out", str(killed), "--data", str(multi30k_dir), *ffn,
                                       "--kill-at-step", "20"), cwd=tmp_path, env=_env(), capture_output=True,
                             text=True, timeout=600)
    assert crashed.returncode != 0 and "Signal 9 (SIGKILL)" in crashed.stderr, crashed.stderr[-3000:]
    _run(_torchrun(WORKER, "--out", str(killed), "--data", str(multi30k_dir), *ffn, "--resume"), tmp_path)
    resumed = _result(killed)
    assert resumed["resumed_from"].endswith("checkpoint-16")
    assert all(resumed["losses"][step] == r0["losses"][step] for step in resumed["losses"])
    assert resumed["mask"] == r0["mask"] and resumed["layout"] == r0["layout"]
    _assert_weights_close(load_file(str(killed / "rank0_weights.safetensors")),
                          load_file(str(sharded / "rank0_weights.safetensors")), atol=0)


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_hard_concrete_finalize_shrink(tmp_path, multi30k_dir):
    out = tmp_path / "gates"
    _run(_torchrun(WORKER, "--out", str(out), "--data", str(multi30k_dir), "--callback", "gates-shrink"), tmp_path)
    r0, r1 = _result(out, 0), _result(out, 1)
    assert r0["log_alpha"] == r1["log_alpha"]  # gate gradients averaged over ranks: the same gates everywhere
    assert r0["mask"] == r1["mask"] and r0["layout"] == r1["layout"]
    kept = sum(sum(1 for v in keep if v) for keep in r0["mask"]["sites"].values())
    assert kept == 12 and sum(len(site["heads"]) for site in r0["layout"]["sites"]) == 12  # the budget, shrunk
    for result in (r0, r1):
        assert result["memory_end"] < result["memory"]["24"]  # the shrink at the end freed memory on every rank


@pytest.fixture(scope="module")
def distill_runs(tmp_path_factory, multi30k_dir):
    """The prune-shrink run distilling from a snapshot of the model taken when training begins, in one process and
    sharded over two ranks."""
    base = tmp_path_factory.mktemp("fsdp_distill")
    single, sharded = base / "single", base / "fsdp"
    args = ["--data", str(multi30k_dir), "--callback", "prune-shrink-distill"]
    _run([sys.executable, str(WORKER), "--out", str(single), *args], base)
    _run(_torchrun(WORKER, "--out", str(sharded), *args), base)
    return base, single, sharded, args


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_distils_from_a_whole_replica_of_the_model_as_one_process_does(distill_runs):
    _, single, sharded, _ = distill_runs
    one, r0, r1 = _result(single), _result(sharded, 0), _result(sharded, 1)
    # the snapshot teacher is a whole, unsharded, frozen replica of the unpruned model on each rank (a deep copy of
    # the sharded model is what FSDP refuses), and its forward FLOPs summed over the ranks are one process's
    assert one["teacher"]["parameters"] == r0["teacher"]["parameters"] == r1["teacher"]["parameters"]
    for result in (one, r0, r1):
        assert result["teacher"]["class"] == "MarianMTModel" and not result["teacher"]["sharded"]
        assert result["teacher"]["frozen"] and sum(len(s["heads"]) for s in result["teacher"]["layout"]["sites"]) == 24
    assert r0["teacher"]["flops"] == r1["teacher"]["flops"] == one["teacher"]["flops"] > 0
    # the combined loss (1 − α)·CE + α·T²·KL of every step, through both shrinks, is one process's
    assert len(one["losses"]) == 24 and r0["losses"] == r1["losses"]
    assert one["losses"]["1"] > 0
    for step, loss in one["losses"].items():
        assert abs(r0["losses"][step] - loss) <= 1e-5, (step, r0["losses"][step], loss)
    assert r0["mask"] == one["mask"] and r0["layout"] == one["layout"]
    _assert_weights_close(load_file(str(sharded / "rank0_weights.safetensors")),
                          load_file(str(single / "rank0_weights.safetensors")), atol=1e-5)


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_distillation_killed_after_a_shrink_resumes_with_the_saved_teacher(distill_runs):
    base, _, sharded, args = distill_runs
    killed = base / "killed"
    crashed = subprocess.run(_torchrun(WORKER, "--out", str(killed), *args, "--kill-at-step", "20"), cwd=base,
                             env=_env(), capture_output=True, text=True, timeout=600)
    assert crashed.returncode != 0 and "Signal 9 (SIGKILL)" in crashed.stderr, crashed.stderr[-3000:]
    # every rank rebuilds the teacher saved with checkpoint-16 as the student's own class (not FSDP's subclass)
    _run(_torchrun(WORKER, "--out", str(killed), *args, "--resume"), base)
    resumed, full = _result(killed), _result(sharded)
    assert resumed["resumed_from"].endswith("checkpoint-16") and sorted(map(int, resumed["losses"])) == list(
        range(17, 25))
    assert all(resumed["losses"][step] == full["losses"][step] for step in resumed["losses"])
    assert resumed["teacher"] == full["teacher"] and _result(killed, 1)["teacher"] == full["teacher"]
    _assert_weights_close(load_file(str(killed / "rank0_weights.safetensors")),
                          load_file(str(sharded / "rank0_weights.safetensors")), atol=0)


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _weights_of(model) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor().clone() if hasattr(v, "full_tensor") else v.clone()
            for k, v in model.state_dict().items()}


def test_fsdp2_with_cpu_offload_is_refused_before_anything_changes(one_rank_group):
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    model = tiny_model("llama")
    for layer in model.model.layers:
        fully_shard(layer, offload_policy=CPUOffloadPolicy(pin_memory=False))
    fully_shard(model, offload_policy=CPUOffloadPolicy(pin_memory=False))
    mask, before = random_mask(model, seed=1, empty_site=None), _weights_of(model)
    with pytest.raises(ValueError, match=r"^model: FSDP2 with CPU offload \(offload_policy=CPUOffloadPolicy\(\)\): a "
                                         r"shrink of the sharded model is not supported"):
        pt.shrink(model, mask)
    after = _weights_of(model)
    assert all(torch.equal(before[k], after[k]) for k in before) and pt.find_heads(model).total_heads == 8


def test_tensor_parallel_weights_are_refused_before_anything_changes(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model = tiny_model("llama")
    mask = random_mask(model, seed=1, empty_site=None)
    mesh = init_device_mesh("cpu", (1,))
    parallelize_module(model.model.layers[1].self_attn, mesh,
                       {"q_proj": ColwiseParallel(), "o_proj": RowwiseParallel()})
    before = _weights_of(model)
    with pytest.raises(ValueError, match=r"^model: it holds DTensor parameters that FSDP2 does not manage \(tensor "
                                         r"parallel\?\)"):
        pt.shrink(model, mask)
    after = _weights_of(model)
    assert all(torch.equal(before[k], after[k]) for k in before)  # layer 0 comes first and was not sliced either
