"""A shrunk model's config stays cheap to deep-copy (prunetrain.engine.config_records).

transformers deep-copies a model's config on every forward of an encoder–decoder model (`DynamicCache(config=...)`
→ `get_text_config(decoder=True)`: a deep copy, then `to_dict()`), so the layout record of a shrunk model — one
original index per kept head and FFN neuron, recorded twice — must not cost one Python `deepcopy` call per index:
on a lent H200 that made the shrunk FFN models' training forward 2.4× slower than the full model's. The copies must
still be exact: equal, independent, and the same on disk.
"""

from __future__ import annotations

import copy
import json
import pickle

import pytest
import torch

import prunetrain as pt
from prunetrain.engine.config_records import ATOMS, AtomDict, AtomList, AtomTuple, cheap_to_copy
from prunetrain.zoo import tiny_inputs, tiny_model


def _shrunk_marian(ffn_dim: int, soft: bool = False):
    """A tiny Marian with FFN width `ffn_dim`, shrunk to the first half of every FFN and of every attention's heads
    (`soft`: the kept units at keep value 0.5, so the folded soft values are recorded too)."""
    model = tiny_model("marian", encoder_ffn_dim=ffn_dim, decoder_ffn_dim=ffn_dim)
    mask = pt.HeadMask.ones(model, units=("heads", "neurons"))
    for site in mask.layout:
        half = site.num_heads // 2
        mask[site.name] = [0.5 if soft else 1.0] * half + [0.0] * (site.num_heads - half)
    pt.shrink(model, mask)
    return model


def _atom_copies(action) -> int:
    """How many atoms (ints, strs, ...) `copy.deepcopy` visits one by one while `action()` runs."""
    count = 0
    dispatch = copy._deepcopy_dispatch  # CPython's per-type table: every atom deepcopy visits goes through it
    originals = {kind: dispatch[kind] for kind in ATOMS}

    def counting(kind):
        def visit(value, memo):
            nonlocal count
            count += 1
            return originals[kind](value, memo)
        return visit

    try:
        dispatch.update({kind: counting(kind) for kind in originals})
        action()
    finally:
        dispatch.update(originals)
    return count


def test_the_forward_of_a_shrunk_model_deep_copies_as_many_atoms_whatever_its_ffn_width():
    narrow, wide = _shrunk_marian(64), _shrunk_marian(1024)  # 32 against 512 kept neurons per FFN
    assert len(wide.config.prunetrain_heads["model.encoder.layers.0.fc2"]) == 512
    inputs = tiny_inputs("marian")
    inputs["decoder_input_ids"] = inputs.pop("labels")  # no labels, as the recipes' Trainer calls the model
    copies = {}
    for name, model in (("narrow", narrow), ("wide", wide)):
        model.train()  # a training forward without labels: transformers builds the decoder's cache, copying the config
        copies[name] = _atom_copies(lambda m=model: m(**inputs))
        assert copies[name] > 0  # the hot path this guards is there: transformers deep-copies the config
    assert copies["wide"] == copies["narrow"], copies  # not one visit per kept neuron (4 × 480 more in each record)


def test_the_records_deep_copy_exactly_and_independently():
    model = _shrunk_marian(256, soft=True)
    config = model.config
    records = {key: value for key, value in vars(config).items() if key.startswith("prunetrain_")}
    assert {"prunetrain_heads", "prunetrain_export", "prunetrain_folded"} <= set(records)
    layout = config.prunetrain_heads["model.encoder.layers.0.fc2"]
    assert isinstance(layout, AtomList) and isinstance(config.prunetrain_folded["model.encoder.layers.0.fc2"], AtomDict)
    duplicate = copy.deepcopy(config)
    assert type(duplicate) is type(config) and duplicate.to_dict() == config.to_dict()
    assert json.dumps(duplicate.to_dict(), sort_keys=True) == json.dumps(config.to_dict(), sort_keys=True)
    copied = duplicate.prunetrain_heads["model.encoder.layers.0.fc2"]
    assert copied == layout and copied is not layout
    copied.append(10_000)  # a copy is independent of its original
    duplicate.prunetrain_folded["model.encoder.layers.0.fc2"]["0"] = 0.25
    assert 10_000 not in layout and config.prunetrain_folded["model.encoder.layers.0.fc2"]["0"] == 0.5
    assert pickle.loads(pickle.dumps(config)).to_dict() == config.to_dict()


def test_a_loaded_pruned_model_keeps_its_records_cheap_to_copy_and_computes_the_same(tmp_path):
    model = _shrunk_marian(256).eval()
    pt.save_pruned(model, tmp_path / "pruned")
    loaded = pt.load_pruned(tmp_path / "pruned")
    assert isinstance(loaded.config.prunetrain_heads["model.decoder.layers.1.fc2"], AtomList)
    assert loaded.config.prunetrain_heads == model.config.prunetrain_heads
    inputs = tiny_inputs("marian")
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, model(**inputs).logits)


@pytest.mark.parametrize("record, kinds", [
    ({"a": [1, 2, 3], "b": {"0": 0.5}}, {"a": AtomList, "b": AtomDict}),
    ({"a": [[1], [2]], "b": {"x": [1]}}, {"a": list, "b": dict}),  # holders of containers stay plain
    ({"a": [1, "two", None, 2.5, True]}, {"a": AtomList}),
    ({"a": (1, 2), "b": ("x", [1])}, {"a": AtomTuple, "b": tuple}),
])
def test_cheap_to_copy_wraps_only_containers_of_atoms(record, kinds):
    cheap = cheap_to_copy(record)
    assert cheap == record
    assert {key: type(value) for key, value in cheap.items()} == kinds
    assert copy.deepcopy(cheap) == record
