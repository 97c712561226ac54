"""Two models built from one config object (issue 37, seam 3): Hugging Face models keep the config they are given, so
`cls(config)` twice shares it. `shrink` (and attaching a mask) must never change the object the other model holds:
the shrunk model gets its own copy, every submodule of it that held the config (attention modules' `self.config`,
sub-configs of two-tower models) sees the copy, and the other model's config, `save_pretrained` and plain
`from_pretrained` stay exactly what they were.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
import transformers
from transformers import PreTrainedConfig

import prunetrain as pt
from prunetrain.zoo import architecture, tiny_config, tiny_inputs

FAMILIES = ["marian", "llama", "t5", "clip"]


def _pair(family: str):
    """Two models of `family` built from the same config object (different weights)."""
    config = tiny_config(family)
    cls = getattr(transformers, architecture(family).model_class)
    torch.manual_seed(0)
    first = cls(config).eval()
    torch.manual_seed(1)
    second = cls(config).eval()
    assert first.config is second.config
    return first, second


def _half_mask(model) -> pt.HeadMask:
    mask = pt.HeadMask.ones(model)
    for site in pt.find_heads(model):
        for head in range(site.group_size):  # the first key/value group (or head) of every site goes
            mask.set(site.name, head, 0.0)
    return mask


def _configs_in(model) -> list[PreTrainedConfig]:
    return [value for module in model.modules() for value in vars(module).values()
            if isinstance(value, PreTrainedConfig)]


def _holders_of(model, config) -> list[tuple[str, str]]:
    """(module name, attribute) of every submodule attribute that is `config`."""
    return [(name, key) for name, module in model.named_modules() for key, value in vars(module).items()
            if value is config]


def _logits(model, family):
    with torch.no_grad():
        out = model(**tiny_inputs(family))
    return out.logits_per_image if family == "clip" else out.logits


def _assert_plain_round_trip(model, family, path) -> None:
    model.save_pretrained(path)
    saved = json.loads((path / "config.json").read_text())
    assert not any(key.startswith("prunetrain") for key in saved), sorted(saved)
    assert "auto_map" not in saved and saved["model_type"] == architecture(family).model_type
    loaded = getattr(transformers, architecture(family).model_class).from_pretrained(
        path, attn_implementation=model.config._attn_implementation).eval()
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    assert torch.equal(_logits(loaded, family), _logits(model, family))


@pytest.mark.parametrize("family", FAMILIES)
def test_shrinking_one_model_leaves_the_other_models_config_alone(tmp_path, family):
    shrunk, other = _pair(family)
    before = copy.deepcopy(other.config.to_dict())
    config_class = type(other.config)
    shared = shrunk.config
    holders = _holders_of(shrunk, shared)
    mask = _half_mask(shrunk)
    with mask.applied(shrunk):
        masked = _logits(shrunk, family)
    pt.shrink(shrunk, mask)

    assert other.config.to_dict() == before and type(other.config) is config_class
    assert not any(getattr(c, "prunetrain_heads", None) for c in _configs_in(other))
    _assert_plain_round_trip(other, family, tmp_path / "other")

    # the shrunk model has its own copy, read by every submodule that read the shared one; no config object (nor a
    # sub-config of two-tower models) is shared with the other model any more
    assert shrunk.config is not other.config and getattr(shrunk.config, "prunetrain_heads", None)
    assert _holders_of(shrunk, shrunk.config) == holders  # (attention modules keep `self.config` in most families)
    assert not {id(c) for c in _configs_in(shrunk)} & {id(c) for c in _configs_in(other)}
    torch.testing.assert_close(_logits(shrunk, family), masked, atol=1e-5, rtol=0)
    pt.save_pruned(shrunk, tmp_path / "shrunk")
    assert torch.equal(_logits(pt.load_pruned(tmp_path / "shrunk").eval(), family), _logits(shrunk, family))


def test_attaching_a_mask_leaves_the_other_models_config_and_saves_alone(tmp_path):
    masked, other = _pair("marian")
    before = copy.deepcopy(other.config.to_dict())
    mask = _half_mask(masked)
    mask.attach(masked)
    assert type(other.config) is transformers.MarianConfig and other.config.to_dict() == before
    _assert_plain_round_trip(other, "marian", tmp_path / "other")
    mask.detach()


def test_a_second_shrink_keeps_the_models_own_copy(tmp_path):
    shrunk, other = _pair("llama")
    pt.shrink(shrunk, _half_mask(shrunk))
    own = shrunk.config
    pt.shrink(shrunk, pt.HeadMask.ones(shrunk))
    assert shrunk.config is own and other.config is not own
