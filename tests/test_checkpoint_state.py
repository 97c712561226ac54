"""The callbacks' checkpoint files: a checkpoint cut short by a kill is never taken for a complete one.

A kill can land between any two files a checkpoint save writes: between a callback's tensors and its JSON, or
between two callbacks' `on_save`. These tests lay out exactly those half-written directories on disk and check
that `last_complete_checkpoint` skips them and that loading a half-written state is refused, never read as a
different (silently reset) state.
"""

import json

import pytest
import torch

from prunetrain import HardConcreteCallback, HeadPruningCallback, last_complete_checkpoint
from prunetrain.training.state import load_callback_state, save_callback_state


def _trainer_files(checkpoint):
    checkpoint.mkdir(parents=True, exist_ok=True)
    (checkpoint / "trainer_state.json").write_text("{}")


def test_state_round_trips_and_leaves_no_partial_files(tmp_path):
    tensors = {"gates.log_alpha": torch.randn(3, 4), "opt.0.exp_avg": torch.randn(12)}
    save_callback_state(tmp_path, "hard-concrete", {"step": 7, "history": [1, 2]}, tensors)
    data, loaded = load_callback_state(tmp_path, "hard-concrete", "HardConcreteCallback")
    assert data == {"step": 7, "history": [1, 2]}
    assert loaded.keys() == tensors.keys()
    assert all(torch.equal(loaded[k], tensors[k]) for k in tensors)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prunetrain-hard-concrete.json",
                                                         "prunetrain-hard-concrete.safetensors"]
    # a state without tensors writes no tensor file and loads none
    save_callback_state(tmp_path / "b", "head-pruning", {"mask": None}, {})
    assert load_callback_state(tmp_path / "b", "head-pruning", "HeadPruningCallback") == ({"mask": None}, None)
    assert not (tmp_path / "b" / "prunetrain-head-pruning.safetensors").exists()


def test_a_json_whose_tensors_are_missing_is_refused(tmp_path):
    save_callback_state(tmp_path, "hard-concrete", {"step": 7}, {"gates.log_alpha": torch.zeros(2)})
    (tmp_path / "prunetrain-hard-concrete.safetensors").unlink()
    with pytest.raises(ValueError, match=r"has prunetrain-hard-concrete.json but not the "
                                         r"prunetrain-hard-concrete.safetensors it was saved with"):
        load_callback_state(tmp_path, "hard-concrete", "HardConcreteCallback")


def test_last_complete_checkpoint_skips_checkpoints_cut_short(tmp_path):
    pruning, gates = HeadPruningCallback(), HardConcreteCallback(lam=0.1)
    both = [pruning, gates, object()]  # callbacks without prunetrain state do not count
    # checkpoint-10: complete for both callbacks
    _trainer_files(tmp_path / "checkpoint-10")
    save_callback_state(tmp_path / "checkpoint-10", pruning.name, {}, {})
    save_callback_state(tmp_path / "checkpoint-10", gates.name, {}, {"g": torch.zeros(1)})
    # checkpoint-20: killed between the two callbacks' on_save
    _trainer_files(tmp_path / "checkpoint-20")
    save_callback_state(tmp_path / "checkpoint-20", pruning.name, {}, {})
    # checkpoint-30: killed while the second callback's tensors were being written (only the temporary file)
    _trainer_files(tmp_path / "checkpoint-30")
    save_callback_state(tmp_path / "checkpoint-30", pruning.name, {}, {})
    (tmp_path / "checkpoint-30" / f"prunetrain-{gates.name}.safetensors.partial").write_bytes(b"\0" * 8)
    # checkpoint-40: killed before the Trainer's own state was written
    save_callback_state(tmp_path / "checkpoint-40", pruning.name, {}, {})
    save_callback_state(tmp_path / "checkpoint-40", gates.name, {}, {})
    assert last_complete_checkpoint(tmp_path, both) == str(tmp_path / "checkpoint-10")
    # knowing only one callback, checkpoint-30 is complete for it
    assert last_complete_checkpoint(tmp_path, [pruning]) == str(tmp_path / "checkpoint-30")
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-30")
    assert last_complete_checkpoint(tmp_path / "nothing-here", both) is None
    # the JSON itself is written under a temporary name and renamed: a half-written one never counts
    _trainer_files(tmp_path / "checkpoint-50")
    (tmp_path / "checkpoint-50" / f"prunetrain-{pruning.name}.json.partial").write_text('{"mask": ')
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-30")
    assert json.loads((tmp_path / "checkpoint-10" / f"prunetrain-{gates.name}.json").read_text())
