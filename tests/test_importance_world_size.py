"""The default importance sample is defined by global examples (issue 37, seam 4): with `HeadPruningCallback`'s
default batches (the Trainer's own training set), one process, two processes (torchrun and accelerate's launcher,
gloo on CPU) and any gradient accumulation at the same global batch score the same examples in the same batches and
pick the same heads. The scores agree up to float summation order and the slightly different training of the
configurations (the Trainer scales an accumulated or distributed loss differently), well within the tolerance below;
the sample itself (examples and batches scored) is identical. The worker is `tests/dist/importance_world_size.py`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_distributed import _free_port, _run as run_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

WORKER = Path(__file__).parent / "dist" / "importance_world_size.py"


def _launch(kind: str) -> list[str]:
    if kind == "python":
        return [sys.executable]
    if kind == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                "--master_port", str(_free_port())]
    # accelerate's launcher: `--cpu` always starts one process, so two processes on CPU are its multi-process
    # launcher; the worker's TrainingArguments(use_cpu=True) makes it DDP over gloo
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
            str(_free_port())]


def _run(tmp_path: Path, kind: str, per_device: int, accum: int) -> dict:
    out = tmp_path / f"{kind}-{per_device}x{accum}"
    command = [*_launch(kind), str(WORKER), "--out", str(out), "--per-device", str(per_device), "--accum", str(accum)]
    run_ranks(command, tmp_path)
    return json.loads((out / "result.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("importance-world-size")
    return {(kind, per_device, accum): _run(tmp, kind, per_device, accum)
            for kind, per_device, accum in [("python", 8, 1), ("python", 4, 2), ("torchrun", 4, 1),
                                            ("torchrun", 2, 2), ("accelerate", 4, 1)]}


@pytest.mark.parametrize("config", [("python", 4, 2), ("torchrun", 4, 1), ("torchrun", 2, 2), ("accelerate", 4, 1)],
                         ids=["accumulation", "torchrun", "torchrun+accumulation", "accelerate"])
def test_same_heads_as_one_process_at_the_same_global_batch(runs, config):
    one, other = runs[("python", 8, 1)], runs[config]
    assert other["world"] == (1 if config[0] == "python" else 2)
    for key in ("tokens", "batches"):  # the same sample: 3 global batches of 8 examples (one label each)
        assert other["scores"]["meta"][key] == one["scores"]["meta"][key] == {"tokens": 24.0, "batches": 3}[key]
    assert other["losses"] == pytest.approx(one["losses"], abs=1e-6)  # the same training, up to float order
    assert other["mask"] == one["mask"]
    for site, values in one["scores"]["scores"].items():
        assert other["scores"]["scores"][site] == pytest.approx(values, abs=1e-5), site


def test_a_training_set_that_cannot_be_indexed_is_announced_in_one_line(tmp_path, caplog):
    """An IterableDataset has no global sample: each rank scores its own first batches, and a notice says so."""
    import torch
    import transformers
    from torch.utils.data import IterableDataset

    from prunetrain.training import HeadPruningCallback, Importance, Schedule

    class Stream(IterableDataset):
        def __iter__(self):
            generator = torch.Generator().manual_seed(0)
            for i in range(64):
                yield {"input_ids": torch.randint(1, 60, (10,), generator=generator), "labels": torch.tensor(i % 2)}

    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=60, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32, num_labels=2))
    callback = HeadPruningCallback(Schedule(at_epochs=[], at_steps=[1], prune_steps={1: 0.5}),
                                   importance=Importance(num_batches=2))
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4,
                                          report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
    with caplog.at_level("WARNING", logger="prunetrain"):
        transformers.Trainer(model, args, train_dataset=Stream(), callbacks=[callback]).train()
    notices = [r.getMessage() for r in caplog.records if "cannot be indexed" in r.getMessage()]
    assert len(notices) == 1 and "\n" not in notices[0] and "depend on the world size" in notices[0], notices
    assert callback.history[1]["scores"]["meta"]["batches"] == 2
