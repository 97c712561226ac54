"""Masks attached at save time (issue 24, follow-up): while a HeadMask (or Hard-Concrete gates) that removes or
scales heads is attached, every save of the model — `save_pretrained` (what the Trainer's checkpoints and
`save_model` call), `save_pruned` — writes a directory that loads as the masked model, bit for bit: `load_pruned`
attaches the masks again (or shrinks with them), the modeling file attaches them with the same arithmetic, and
plain transformers refuses the directory with a message saying how to load it. Detached, the model saves plain.
The Trainer-level seams (checkpoints, resume, kill -9, a process without prunetrain) are in
tests/test_seams_masks_trainer.py."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import prunetrain as pt
from prunetrain.engine.mask import SavedMask, release_saved_masks
from prunetrain.engine.remote_code import GUARD_MESSAGE_MASKED, auto_classes
from prunetrain.methods.gates import gates_for
from prunetrain.zoo import random_mask, tiny_inputs, tiny_model

FAMILIES = ("marian", "llama", "bert", "t5", "gpt2")  # separate q/k/v, GQA, a sibling output projection, a
                                                     # shared position bias, a fused Conv1D projection


def _logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


def _remote(path, like):
    autos = auto_classes(like)
    auto = next((a for a, cls in autos.items() if cls == type(like).__name__), "AutoModel")
    return getattr(transformers, auto).from_pretrained(path, trust_remote_code=True).eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_model_saved_with_a_mask_attached_loads_as_the_masked_model(family, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    model = tiny_model(family)
    inputs = tiny_inputs(family)
    plain = _logits(model, inputs)
    mask = random_mask(model, seed=3, soft=True, empty_site=None).attach(model)
    masked = _logits(model, inputs)
    assert (masked - plain).abs().max() > 1e-4
    model.save_pretrained(tmp_path / "m")

    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["model_type"] == f"{model.config.model_type}-pruned-by-prunetrain"
    [record] = config["prunetrain_export"]["masks"]
    assert record["owner"] is None and {n: s["keep"] for n, s in record["sites"].items()} == {
        n: v.tolist() for n, v in mask.items() if bool((v != 1).any())}
    assert (tmp_path / "m" / "modeling_prunetrain.py").is_file()

    loaded = pt.load_pruned(tmp_path / "m")  # the masks attached again: the model as it was saved
    assert torch.equal(_logits(loaded, inputs), masked)
    [again] = pt.attached_masks(loaded)
    assert again == mask and isinstance(again._owner, SavedMask)
    state = loaded.state_dict()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())  # whole weights
    shrunk = pt.load_pruned(tmp_path / "m", masks="shrink")  # the zeros removed, soft values folded
    assert pt.find_heads(shrunk).total_heads == mask.num_kept and not pt.attached_masks(shrunk)
    assert (_logits(shrunk, inputs) - masked).abs().max() <= 1e-5

    remote = _remote(tmp_path / "m", model)  # the modeling file attaches them with the same arithmetic
    assert torch.equal(_logits(remote, inputs), masked)
    assert pt.attached_masks(remote) == [mask]  # prunetrain sees them as masks of its own
    remote.save_pretrained(tmp_path / "again")
    assert torch.equal(_logits(pt.load_pruned(tmp_path / "again"), inputs), masked)

    with pytest.raises(Exception, match=GUARD_MESSAGE_MASKED.replace("(", r"\(").replace(")", r"\)")):
        type(model).from_pretrained(tmp_path / "m", ignore_mismatched_sizes=True)

    mask.detach()  # detached, the model saves as the plain model it now is
    model.save_pretrained(tmp_path / "plain")
    config = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert config["model_type"] == model.config.model_type and "prunetrain_export" not in config
    assert type(model.config) is type(tiny_model(family).config)


def test_a_shrunk_model_with_a_mask_attached_records_both(tmp_path):
    model = tiny_model("marian")
    inputs = tiny_inputs("marian")
    pt.shrink(model, random_mask(model, seed=1, empty_site=None))
    second = random_mask(model, seed=2, soft=True, empty_site=None)
    first = random_mask(model, seed=5, empty_site=None, remove=0.3)
    first.attach(model)
    second.attach(model)  # two masks: recorded in the order their hooks run
    masked = _logits(model, inputs)
    path = pt.save_pruned(model, tmp_path / "m")  # save_pruned records attached masks as every save does
    loaded = pt.load_pruned(path)
    assert pt.find_heads(loaded) == pt.find_heads(model)
    assert pt.attached_masks(loaded) == [first, second]
    assert torch.equal(_logits(loaded, inputs), masked)
    assert torch.equal(_logits(_remote(path, model), inputs), masked)
    config = json.loads((path / "config.json").read_text())
    assert "pruned by prunetrain" in config["d_model"]  # the shrunk model's guard


def test_gates_are_saved_as_the_model_evaluates(tmp_path):
    model = tiny_model("llama")  # grouped-query attention: one gate per key/value group
    inputs = tiny_inputs("llama")
    gates = gates_for(model, init_log_alpha=2.0, seed=1)
    with torch.no_grad():
        gates.site_log_alpha(gates.site_names[0])[0] = -1.5  # one key/value group shut in eval mode
    gates.owner = "hard-concrete"
    gates.attach(model)
    assert gates.open_per_kind() == {"self": pt.find_heads(model).total_heads - pt.find_heads(model)[
        gates.site_names[0]].group_size}
    evaluated = _logits(model.eval(), inputs)
    model.train()
    model.save_pretrained(tmp_path / "m")
    [record] = json.loads((tmp_path / "m" / "config.json").read_text())["prunetrain_export"]["masks"]
    assert record["owner"] == "hard-concrete"
    assert {n: s["keep"] for n, s in record["sites"].items()} == {
        n: v.tolist() for n, v in gates.saved_keep().items() if bool((v != 1).any())}
    loaded = pt.load_pruned(tmp_path / "m")
    assert torch.equal(_logits(loaded, inputs), evaluated)
    assert release_saved_masks(loaded, "head-pruning") == 0  # another owner's record stays
    assert release_saved_masks(loaded, "hard-concrete") == 1 and not pt.attached_masks(loaded)
    gates.detach()
    model.save_pretrained(tmp_path / "plain")
    assert "prunetrain_export" not in json.loads((tmp_path / "plain" / "config.json").read_text())


def test_restore_layout_attaches_the_saved_masks(tmp_path):
    model = tiny_model("gpt2")
    inputs = tiny_inputs("gpt2")
    pt.shrink(model, random_mask(model, seed=4, empty_site=None))
    random_mask(model, seed=6, soft=True, empty_site=None).attach(model, owner="head-pruning")
    masked = _logits(model, inputs)
    model.save_pretrained(tmp_path / "checkpoint-1")
    fresh = tiny_model("gpt2", seed=9)
    pt.restore_layout(fresh, tmp_path / "checkpoint-1")
    fresh.load_state_dict(model.state_dict())  # what the Trainer's resume does next
    assert torch.equal(_logits(fresh, inputs), masked)
    assert [m._owner.name for m in pt.attached_masks(fresh)] == ["head-pruning"]


def test_load_pruned_refuses_a_mask_record_that_does_not_fit(tmp_path):
    model = tiny_model("bert")
    random_mask(model, seed=1, empty_site=None).attach(model)
    model.save_pretrained(tmp_path / "m")
    config_path = tmp_path / "m" / "config.json"
    good = json.loads(config_path.read_text())
    cases = {
        "unknown": (lambda r: r[0]["sites"].update({"bert.nowhere": {"keep": [1.0]}}),
                    r"site: unknown site 'bert\.nowhere'"),
        "count": (lambda r: next(iter(r[0]["sites"].values()))["keep"].append(1.0),
                  r"mask\['bert\.encoder\.layer\.\d\.attention'\]: got 5 keep values, but this site has 4 heads\)"),
        "range": (lambda r: next(iter(r[0]["sites"].values()))["keep"].__setitem__(0, 2.5),
                  r"mask\[.*\]: keep value 2\.5 is outside \[0, 1\]\)"),
        "shape": (lambda r: r.append("all"),
                  r"an entry is not \{'owner': \.\.\., 'sites'"),
    }
    for name, (damage, message) in cases.items():
        data = json.loads(json.dumps(good))
        damage(data["prunetrain_export"]["masks"])
        config_path.write_text(json.dumps(data))
        with pytest.raises(ValueError, match=r"path: '.*m': the masks recorded in its config\.json do not fit the "
                                             r"model \(" + message):
            pt.load_pruned(tmp_path / "m")
    config_path.write_text(json.dumps(good))
    with pytest.raises(ValueError, match=r"masks: 'fold' is not one of 'attach', 'shrink'"):
        pt.load_pruned(tmp_path / "m", masks="fold")
