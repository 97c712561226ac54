"""Which engines prunetrain serves, decided when the Trainer is built (`on_init_end`), before any step is spent.

Supported: one process, DDP, FSDP2 (everything, mid-training shrink included: tests/test_fsdp_shrink.py) and
DeepSpeed ZeRO-1/2 (masks, importance, gates and curves, no shrink). Refused in one line naming the engine and why:
DeepSpeed ZeRO-3, FSDP1, tensor parallel, context/pipeline parallel and `device_map` over devices. DeepSpeed is not
installed here, so its runs are described by the Trainer's own arguments (`args.deepspeed`, as the Trainer holds
them); tensor parallelism is real (`parallelize_module` on a one-process gloo group).
"""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist
from transformers import TrainingArguments

from prunetrain.training import HardConcreteCallback, HeadPruningCallback, PruningCurveCallback
from prunetrain.training.options import Schedule
from prunetrain.training.distributed import training_engine
from prunetrain.zoo import tiny_model


def _args(tmp_path, **settings) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), report_to=[], num_train_epochs=1, **settings)


def _deepspeed_args(tmp_path, stage) -> TrainingArguments:
    args = _args(tmp_path, use_cpu=True)
    args.deepspeed = {"zero_optimization": {"stage": stage}}  # what TrainingArguments(deepspeed=...) holds
    return args


def _init_end(callback, args, model) -> None:
    callback.on_init_end(args, None, None, model=model)


@pytest.fixture
def llama():
    return tiny_model("llama")


def test_deepspeed_zero_1_2_serves_masks_and_refuses_a_shrink(tmp_path, llama):
    args = _deepspeed_args(tmp_path, 2)
    assert training_engine(llama, args) == "deepspeed"
    _init_end(HeadPruningCallback(), args, llama)  # importance and masks: accepted
    _init_end(HardConcreteCallback(lam=0.1), args, llama)
    _init_end(PruningCurveCallback(metric=lambda m: 0.0), args, llama)
    with pytest.raises(ValueError, match=r"^HeadPruningCallback\(mode='shrink'\): not supported under deepspeed; "
                                         r"under deepspeed, prunetrain supports masks, importance, Hard-Concrete gates "
                                         r"and pruning curves, but no shrink: ZeRO's optimizer keeps flat copies of "
                                         r"every parameter, sized when training starts\.$"):
        _init_end(HeadPruningCallback(mode="shrink"), args, llama)
    with pytest.raises(ValueError, match=r"^HardConcreteCallback\(finalize='shrink'\): not supported under deepspeed"):
        _init_end(HardConcreteCallback(lam=0.1, finalize="shrink"), args, llama)
    # masks first and a shrink at step 8: the refusal names what the user gave (shrink_steps), not mode='shrink'
    with pytest.raises(ValueError, match=r"^HeadPruningCallback\(Schedule\(shrink_steps=\[8\]\)\): not supported under "
                                         r"deepspeed; .*no shrink"):
        _init_end(HeadPruningCallback(Schedule(at_epochs=[], prune_steps={8: 0.5}, shrink_steps=[8])), args, llama)


def test_deepspeed_zero_3_is_refused(tmp_path, llama):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    args = _args(tmp_path, use_cpu=True)
    args.deepspeed = str(path)  # a config file, as `--deepspeed ds.json` gives it
    with pytest.raises(ValueError, match=r"^HeadPruningCallback: not supported under deepspeed_zero3; ZeRO-3 \(or a "
                                         r"DeepSpeed config whose ZeRO stage cannot be read\) partitions every "
                                         r"parameter outside PyTorch's view"):
        _init_end(HeadPruningCallback(), args, llama)


def test_fsdp_through_the_trainer_is_fsdp2_unless_version_1(tmp_path, llama):
    # transformers 5 builds FSDP2 when fsdp_config names no version (on GPUs; on CPUs it trains with DDP)
    args = _args(tmp_path, fsdp="full_shard", use_cpu=False)
    assert training_engine(llama, args) == "fsdp2"
    _init_end(HeadPruningCallback(mode="shrink"), args, llama)
    legacy = _args(tmp_path, fsdp="full_shard", fsdp_config={"version": 1}, use_cpu=False)
    with pytest.raises(ValueError, match=r"^HeadPruningCallback: not supported under fsdp1; FSDP1 flattens the "
                                         r"parameters into FlatParameters and renames the modules; use FSDP2"):
        _init_end(HeadPruningCallback(), legacy, llama)


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_tensor_parallel_is_refused(tmp_path, llama, one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (1,))
    for layer in llama.model.layers:
        parallelize_module(layer.self_attn, mesh, {"q_proj": ColwiseParallel(), "k_proj": ColwiseParallel(),
                                                   "v_proj": ColwiseParallel(), "o_proj": RowwiseParallel()})
    assert training_engine(llama) == "tensor_parallel"
    with pytest.raises(ValueError, match=r"^HardConcreteCallback: not supported under tensor_parallel; tensor "
                                         r"parallelism splits each attention site's heads over the ranks"):
        _init_end(HardConcreteCallback(lam=0.1), _args(tmp_path, use_cpu=True), llama)


def test_a_model_over_several_devices_is_refused(tmp_path, llama):
    llama.hf_device_map = {"model.layers.0": "cpu", "model.layers.1": "meta"}  # what from_pretrained(device_map=) sets
    with pytest.raises(ValueError, match=r"^HeadPruningCallback: not supported under model_parallel; layers on several "
                                         r"devices \(device_map\)"):
        _init_end(HeadPruningCallback(), _args(tmp_path, use_cpu=True), llama)

