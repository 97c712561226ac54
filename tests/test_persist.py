"""save_pruned / load_pruned: standard HF files plus the head layout; loading rebuilds the non-uniform model exactly."""

import json

import pytest
import torch

import prunetrain as pt
from prunetrain.zoo import TINY_FAMILIES, random_mask, tiny_inputs, tiny_model


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_save_load_round_trip_is_exact(family, tmp_path):
    model = tiny_model(family)
    pt.shrink(model, random_mask(model, seed=11, soft=True, empty_site=1))
    path = pt.save_pruned(model, tmp_path / "pruned")
    assert sorted(p.name for p in path.iterdir() if p.suffix not in (".json",)) == ["model.safetensors",
                                                                                   "modeling_prunetrain.py"]
    assert not any(p.suffix in (".bin", ".pt", ".pkl") for p in path.iterdir())  # no pickles
    loaded = pt.load_pruned(path, attn_implementation="eager")
    assert type(loaded) is type(model)
    assert pt.find_heads(loaded) == pt.find_heads(model)
    saved_state, loaded_state = model.state_dict(), loaded.state_dict()
    assert saved_state.keys() == loaded_state.keys()
    for key in saved_state:
        assert torch.equal(saved_state[key], loaded_state[key]), key
    inputs = tiny_inputs(family)
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, loaded(**inputs).logits)
    layout = json.loads((path / "prunetrain_layout.json").read_text())
    assert layout["sites"][1]["num_heads"] == 0


def test_unpruned_model_round_trips_too(tmp_path):
    model = tiny_model("marian")
    loaded = pt.load_pruned(pt.save_pruned(model, tmp_path / "full"), attn_implementation="eager")
    inputs = tiny_inputs("marian")
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, loaded(**inputs).logits)
    assert loaded.generation_config.decoder_start_token_id == model.generation_config.decoder_start_token_id


def test_loaded_model_generates_like_the_saved_one(tmp_path):
    model = tiny_model("t5")
    pt.shrink(model, random_mask(model, seed=2))
    loaded = pt.load_pruned(pt.save_pruned(model, tmp_path / "t5"), attn_implementation="eager")
    inputs = tiny_inputs("t5")
    kwargs = dict(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=6)
    with torch.no_grad():
        assert torch.equal(model.generate(**kwargs), loaded.generate(**kwargs))


def test_save_refuses_to_overwrite_and_leaves_nothing_half_written(tmp_path):
    model = tiny_model("bert")
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("user data")
    with pytest.raises(ValueError, match=r"path: '.*out' already exists and is not empty; pass overwrite=True"):
        pt.save_pruned(model, target)
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    with pytest.raises(ValueError, match=r"path: '.*out' is not empty and carries no prunetrain marker .*; "
                                         r"overwrite=True replaces only directories prunetrain marked as its own"):
        pt.save_pruned(model, target, overwrite=True)  # the user's file is never deleted (issue 37)
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    (target / "keep.txt").unlink()
    pt.save_pruned(model, target)
    (target / "config.json").write_text("{}")  # a saved model directory, changed: overwrite=True replaces it
    pt.save_pruned(model, target, overwrite=True)
    assert (target / "prunetrain_layout.json").is_file() and (target / "config.json").read_text() != "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging directory or lock file left behind


def test_loading_something_else_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"path: '.*empty' is not a pruned model directory \(expected config.json "
                                         r"and prunetrain_layout.json"):
        (tmp_path / "empty").mkdir()
        pt.load_pruned(tmp_path / "empty")
    plain = tmp_path / "plain"
    tiny_model("bert").save_pretrained(plain)  # an ordinary HF directory
    with pytest.raises(ValueError, match="is not a pruned model directory"):
        pt.load_pruned(plain)
    broken = pt.save_pruned(tiny_model("bert"), tmp_path / "broken")
    (broken / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="has no model.safetensors"):
        pt.load_pruned(broken)


def test_a_config_that_is_not_json_names_the_file(tmp_path):
    path = pt.save_pruned(tiny_model("bert"), tmp_path / "m")
    (path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"path: '.*config.json' is not valid JSON \(Expecting property name"):
        pt.load_pruned(path)


@pytest.mark.parametrize("family", ["t5", "marian"])
def test_a_model_loads_computing_bit_identically_with_the_attention_it_ran(family, tmp_path):
    """T5's logits differ by ~1e-6 between eager and sdpa kernels: the directory records the implementation the
    saved model ran, and load_pruned / from_pretrained(trust_remote_code=True) use it unless asked otherwise."""
    import transformers

    model = tiny_model(family)  # the zoo builds eager models; transformers' default on CPU is sdpa
    pt.shrink(model, random_mask(model, seed=2))
    path = pt.save_pruned(model, tmp_path / family)
    inputs = tiny_inputs(family)
    remote = transformers.AutoModelForSeq2SeqLM.from_pretrained(path, trust_remote_code=True)
    with torch.no_grad():
        expected = model(**inputs).logits
        assert torch.equal(pt.load_pruned(path)(**inputs).logits, expected)
        assert torch.equal(remote.eval()(**inputs).logits, expected)
    assert pt.load_pruned(path, attn_implementation="sdpa").config._attn_implementation == "sdpa"


def test_a_copy_or_pickle_of_a_shrunk_model_still_saves_a_pruned_directory(tmp_path):
    import copy
    import pickle

    model = tiny_model("qwen2")
    pt.shrink(model, random_mask(model, seed=1, empty_site=0))
    for name, twin in (("copy", copy.deepcopy(model)), ("pickle", pickle.loads(pickle.dumps(model)))):
        twin.save_pretrained(tmp_path / name)
        config = json.loads((tmp_path / name / "config.json").read_text())
        assert config["model_type"] == "qwen2-pruned-by-prunetrain", name
        assert (tmp_path / name / "modeling_prunetrain.py").is_file()
        loaded = pt.load_pruned(tmp_path / name)
        assert pt.find_heads(loaded) == pt.find_heads(model)
    assert type(model.config).__name__ == "Qwen2Config"  # transformers' auto mappings still know the class
    import transformers

    assert type(transformers.AutoModelForCausalLM.from_config(model.config)).__name__ == "Qwen2ForCausalLM"


def test_a_model_loaded_from_its_remote_code_saves_a_pruned_directory_again(tmp_path):
    """A user without prunetrain loads the directory with trust_remote_code=True and saves it: the new directory is
    guarded and complete again (modeling file, layout file), and prunetrain loads it exactly."""
    import transformers

    model = tiny_model("llama")
    pt.shrink(model, random_mask(model, seed=4, empty_site=1))
    path = pt.save_pruned(model, tmp_path / "first")
    remote = transformers.AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)
    remote.save_pretrained(tmp_path / "again")
    config = json.loads((tmp_path / "again" / "config.json").read_text())
    assert config["model_type"] == "llama-pruned-by-prunetrain" and config["hidden_size"].startswith("this model")
    with pytest.raises(Exception, match="pruned by prunetrain"):
        transformers.LlamaForCausalLM.from_pretrained(tmp_path / "again", ignore_mismatched_sizes=True)
    loaded = pt.load_pruned(tmp_path / "again")
    inputs = tiny_inputs("llama")
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, model(**inputs).logits)


def test_every_tensor_of_a_loaded_model_has_aligned_memory_of_its_own(tmp_path):
    """The loader's tensors may be views into the memory-mapped file at any 8-byte offset; CPU kernels take other
    paths on unaligned data (a reloaded shrunk Qwen2 computed 1.5e-8 away on an AMD EPYC), so load_pruned copies
    each one that is not aligned as PyTorch's allocator aligns (64 bytes). Checked on the pointers, on any machine."""
    from safetensors.torch import load_file

    from prunetrain.engine.persist import ALIGNMENT

    unaligned_in_the_file = 0
    for family in ("qwen2", "gemma", "mbart", "marian"):
        model = tiny_model(family)
        pt.shrink(model, random_mask(model, seed=5))
        path = pt.save_pruned(model, tmp_path / family)
        in_the_file = load_file(path / "model.safetensors").values()
        unaligned_in_the_file += sum(tensor.data_ptr() % ALIGNMENT != 0 for tensor in in_the_file)
        loaded = pt.load_pruned(path, attn_implementation="eager")
        misaligned = [name for name, tensor in [*loaded.named_parameters(), *loaded.named_buffers()]
                      if tensor.data_ptr() % ALIGNMENT]
        assert not misaligned, (family, misaligned)
    assert unaligned_in_the_file  # the file's own views are unaligned: the copy is what aligns them
