"""Model directories read defensively (`prunetrain.engine.model_dir`, issue 25): every damaged or foreign thing a
careless or hostile user hands over as a model is one line naming the file (and field), through every command, and
never a hang, a traceback or a silently different model.

Cases: safetensors headers that are malformed in ways a length check misses (a list, entries that are not objects,
overlapping offsets, a dtype that lies, trailing zero padding, ...), a FIFO where a file should be, config fields of
the wrong type, a damaged layout file, a Trainer checkpoint given as a model, a missing tensor, NaN weights, a
tokenizer larger than the model's vocabulary, a model that is not a translation model, sequence lengths beyond the
model's positions, a deeply nested mask file. A fuzzer applies random header mutations and runs random commands.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import prunetrain as pt
from hostile import assert_one_line, run_main, save_tiny_translation_model, tree, write_small_data

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, multi30k_dir) -> Path:
    return save_tiny_translation_model(tmp_path_factory.mktemp("model-dir") / "model", multi30k_dir)


@pytest.fixture
def copy_of(model_dir, tmp_path):
    def make(name: str = "copy") -> Path:
        return Path(shutil.copytree(model_dir, tmp_path / name))
    return make


@pytest.fixture
def small_data(tmp_path, multi30k_dir) -> Path:
    return write_small_data(tmp_path / "data", multi30k_dir, pairs=4)


def read_st(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + size]), raw[8 + size:]


def write_st(path: Path, header, data: bytes, text: str | None = None) -> None:
    encoded = (text if text is not None else json.dumps(header)).encode()
    path.write_bytes(len(encoded).to_bytes(8, "little") + encoded + data)


def tensors(header: dict) -> list[str]:
    return sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])


def translate_args(model: Path, tmp_path: Path) -> list:
    (tmp_path / "in.txt").write_text("Ein Hund.\n")
    return ["translate", model, "--input", tmp_path / "in.txt", "--output", tmp_path / "out.txt", "--beams", "1"]


# ---------------------------------------------------------------------------------------------------------------------
# safetensors headers, checked completely before any tensor is read
# ---------------------------------------------------------------------------------------------------------------------
def _entry(header, index=1):
    return header[tensors(header)[index]]


def _dtype_lies(header, data):
    _entry(header)["dtype"] = "F16"  # half the bytes the data holds
    return header, data


def _overlap(header, data):
    first, second = tensors(header)[:2]
    size = header[second]["data_offsets"][1] - header[second]["data_offsets"][0]
    header[second]["data_offsets"] = [header[first]["data_offsets"][0], header[first]["data_offsets"][0] + size]
    return header, data


HEADER_DAMAGE = {
    "list": (lambda h, d: ([h], d), r"its header holds JSON list, not an object"),
    "entry not an object": (lambda h, d: ({**h, tensors(h)[0]: [1, 2]}, d),
                            r"the header entry of tensor '.*' is '\[1, 2\]', not an object with exactly dtype, shape"),
    "unknown dtype": (lambda h, d: (_entry(h).update(dtype="F7") or h, d), r"has dtype 'F7', which is not one of"),
    "dtype that lies": (_dtype_lies, r"claims dtype F16 and shape .* but spans \d+ bytes; the header lies about it"),
    "overlapping offsets": (_overlap, r"tensor '.*' at bytes 0\.\.\d+ overlaps the tensor before it"),
    "zero padding": (lambda h, d: (h, d + b"\0" * 64), r"has 64 bytes after its last tensor \(padding or a damaged"),
    "truncated": (lambda h, d: (h, d[:-10]), r"is truncated \(\d+ of \d+ bytes\)"),
    "extra field": (lambda h, d: (_entry(h).update(extra=1) or h, d), r"not an object with exactly dtype, shape"),
    "negative shape": (lambda h, d: (_entry(h).update(shape=[-4]) or h, d), r"has shape \[-4\]; expected a list"),
    "metadata": (lambda h, d: ({**h, "__metadata__": {"format": 3}}, d), r"its __metadata__ is not an object of"),
    "a hole": (lambda h, d: ({k: v for k, v in h.items() if k != tensors(h)[1]}, d), r"leaves a hole of \d+ bytes"),
}


@pytest.mark.parametrize("damage", sorted(HEADER_DAMAGE))
def test_a_malformed_safetensors_header_is_one_line_naming_the_file(monkeypatch, capsys, copy_of, tmp_path, damage):
    model = copy_of()
    mutate, pattern = HEADER_DAMAGE[damage]
    write_st(model / "model.safetensors", *mutate(*read_st(model / "model.safetensors")))
    assert_one_line(run_main(monkeypatch, capsys, *translate_args(model, tmp_path)),
                    r"model: '.*model.safetensors'.*" + pattern)
    assert not (tmp_path / "out.txt").exists()


def test_duplicate_tensor_names_and_nan_in_a_header_are_refused(monkeypatch, capsys, copy_of, tmp_path):
    model = copy_of()
    header, data = read_st(model / "model.safetensors")
    name = tensors(header)[0]
    text = json.dumps(header)
    write_st(model / "model.safetensors", None, data, text[:-1] + f', "{name}": {json.dumps(header[name])}}}')
    assert_one_line(run_main(monkeypatch, capsys, *translate_args(model, tmp_path)),
                    r"model: '.*model.safetensors' is not a safetensors file: its header names the key '.*' twice")
    write_st(model / "model.safetensors", None, data, text.replace('"shape": [', '"shape": [NaN, ', 1))
    assert_one_line(run_main(monkeypatch, capsys, *translate_args(model, tmp_path)),
                    r"its header holds NaN, which is not a JSON number")


def test_a_float_weight_stored_as_integers_is_refused(monkeypatch, capsys, copy_of, tmp_path):
    """F32 -> I32 keeps every size right: only the loaded model can tell that the dtype lies."""
    model = copy_of()
    header, data = read_st(model / "model.safetensors")
    name = next(k for k in tensors(header) if k.endswith("q_proj.weight"))
    header[name]["dtype"] = "I32"
    write_st(model / "model.safetensors", header, data)
    assert_one_line(run_main(monkeypatch, capsys, *translate_args(model, tmp_path)),
                    rf"model: '.*model.safetensors' stores the floating-point weight '{name}' as I32; its header "
                    rf"lies about the dtype")


def test_a_fifo_where_a_file_should_be_is_refused_without_hanging(copy_of, tmp_path):
    """Run as a real process with a time limit: a FIFO opened for reading would block forever."""
    for victim in ("model.safetensors", "config.json", "prunetrain_layout.json"):
        model = copy_of(f"fifo-{victim}")
        (model / victim).unlink()
        os.mkfifo(model / victim)
        (tmp_path / "in.txt").write_text("Ein Hund.\n")
        result = subprocess.run([sys.executable, "-m", "prunetrain.cli", "translate", str(model), "--input",
                                 str(tmp_path / "in.txt")], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert f"{victim}' is a FIFO (named pipe), not a regular file" in result.stderr, result.stderr


# ---------------------------------------------------------------------------------------------------------------------
# config, layout, checkpoints, weights, tokenizer
# ---------------------------------------------------------------------------------------------------------------------
def _edit_json(path: Path, **fields) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


@pytest.mark.parametrize("field, value, pattern", [
    ("d_model", "16", r"field 'd_model' is '16'; expected a whole number >= 0"),
    ("encoder_layers", 1.5, r"field 'encoder_layers' is 1.5; expected a whole number >= 0"),
    ("tie_word_embeddings", "yes", r"field 'tie_word_embeddings' is 'yes'; expected true or false"),
    ("dropout", "0.1", r"field 'dropout' is '0.1'; expected a finite number"),
    ("activation_function", 3, r"field 'activation_function' is 3; expected a string"),
    ("architectures", "MarianMTModel", r"field 'architectures' is 'MarianMTModel'; expected a list of class names"),
])
def test_a_config_field_of_the_wrong_type_is_named(monkeypatch, capsys, copy_of, tmp_path, field, value, pattern):
    model = copy_of()
    _edit_json(model / "config.json", **{field: value})
    assert_one_line(run_main(monkeypatch, capsys, *translate_args(model, tmp_path)),
                    r"model: '.*config.json' " + pattern)


@pytest.mark.parametrize("layout, pattern", [
    ({"family": "marian", "sites": 3}, r"field 'sites' is '3'; expected a list of sites"),
    ({"family": "marian", "sites": [[1]]}, r"field 'sites\[0\]' is '\[1\]'; expected an object"),
    ("heads", r"field 'sites\[0\].heads' is '\[0\]'; expected num_heads=2 head indices"),
    ("num_heads", r"field 'sites\[0\].num_heads' is 'two'; expected a whole number >= 0"),
])
def test_a_damaged_layout_file_names_the_file_and_the_field(monkeypatch, capsys, copy_of, tmp_path, layout, pattern):
    model = copy_of()
    path = model / "prunetrain_layout.json"
    if isinstance(layout, str):
        data = json.loads(path.read_text())
        data["sites"][0][layout] = [0] if layout == "heads" else "two"
        layout = data
    path.write_text(json.dumps(layout))
    assert_one_line(run_main(monkeypatch, capsys, *translate_args(model, tmp_path)),
                    r"model: '.*prunetrain_layout.json' " + pattern)


def test_a_trainer_checkpoint_is_recognised_and_named(monkeypatch, capsys, copy_of, tmp_path):
    checkpoint = copy_of("checkpoint-40")
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 40}))
    pattern = (r"'.*checkpoint-40' is a Trainer checkpoint \(trainer_state.json\), not a saved model: its weights do "
               r"not carry the masks .* give a saved model directory")
    assert_one_line(run_main(monkeypatch, capsys, *translate_args(checkpoint, tmp_path)), "model: " + pattern)
    assert_one_line(run_main(monkeypatch, capsys, "export", checkpoint, tmp_path / "exported", "--format", "padded"),
                    "source: " + pattern)
    assert not (tmp_path / "exported").exists()


def _drop_or_poison(path: Path, poison: bool) -> str:
    from safetensors.torch import load_file, save_file

    state = load_file(path)
    name = sorted(state)[3]
    if poison:
        state[name] = torch.full_like(state[name], float("nan"))
    else:
        del state[name]
    save_file(state, path, metadata={"format": "pt"})
    return name


@pytest.mark.parametrize("layout", [True, False], ids=["save_pruned", "save_pretrained"])
def test_a_missing_tensor_or_nan_weights_are_refused_not_translated(monkeypatch, capsys, model_dir, tmp_path,
                                                                    layout):
    for poison, pattern in ((False, r"(lacks tensor '{name}' \(1 missing\); transformers would initialise it at "
                                    r"random|does not fit its recorded layout \(missing keys: \['{name}'\]\))"),
                            (True, r"holds NaN or infinite values in tensor '{name}'; the weights are damaged")):
        model = Path(shutil.copytree(model_dir, tmp_path / f"m{poison}"))
        if not layout:
            (model / "prunetrain_layout.json").unlink()
        name = _drop_or_poison(model / "model.safetensors", poison)
        assert_one_line(run_main(monkeypatch, capsys, *translate_args(model, tmp_path)),
                        r"model: '.*'.*" + pattern.format(name=name.replace(".", r"\.")))
        assert not (tmp_path / "out.txt").exists()


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(monkeypatch, capsys, copy_of, tmp_path, multi30k_dir):
    from prunetrain.mt.text.data import read_parallel, train_tokenizer

    model = copy_of()
    train_tokenizer(read_parallel(multi30k_dir, "train", limit=300), vocab_size=400, path=tmp_path / "big")
    assert_one_line(run_main(monkeypatch, capsys, *translate_args(model, tmp_path), "--tokenizer", tmp_path / "big"),
                    r"--tokenizer: it has 4\d\d tokens but the model in '.*copy' has a vocabulary of 300 \(config.json "
                    r"vocab_size\); it is another model's tokenizer")


def test_translation_commands_refuse_a_model_that_is_not_a_translation_model(monkeypatch, capsys, tmp_path,
                                                                              small_data):
    from prunetrain.zoo import tiny_model

    bert = pt.save_pruned(tiny_model("bert"), tmp_path / "bert")
    before = tree(tmp_path / "bert")
    for args in (["prune", bert, "--data-dir", small_data, "--output", tmp_path / "p"],
                 ["importance", bert, "--data-dir", small_data],
                 ["evaluate", bert, "--data-dir", small_data]):
        assert_one_line(run_main(monkeypatch, capsys, *args),
                        r"model: '.*bert' holds a BertForMaskedLM, not a translation \(encoder-decoder\) model")
    assert tree(tmp_path / "bert") == before and not (tmp_path / "p").exists()


def test_bench_refuses_sequence_lengths_beyond_the_positions(monkeypatch, capsys, model_dir):
    assert_one_line(run_main(monkeypatch, capsys, "bench", model_dir, model_dir, "--seq-lens", "32,65",
                             "--batch-sizes", "1", "--repeats", "1"),
                    r"--seq-lens: 65 is beyond model_a's 64 positions \(max_position_embeddings in its config.json\)")


def test_a_deeply_nested_mask_file_is_one_line(monkeypatch, capsys, model_dir, tmp_path):
    (tmp_path / "mask.json").write_text("[" * 100_000 + "]" * 100_000)
    assert_one_line(run_main(monkeypatch, capsys, "shrink", model_dir, "--mask", tmp_path / "mask.json", "--output",
                             tmp_path / "out"), r"--mask: '.*mask.json' nests too deeply to be read")
    (tmp_path / "mask.json").write_text('{"sites": {}, "sites": {}}')
    assert_one_line(run_main(monkeypatch, capsys, "shrink", model_dir, "--mask", tmp_path / "mask.json", "--output",
                             tmp_path / "out"), r"--mask: '.*mask.json' names the key 'sites' twice")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------------------------------
# fuzz: random header mutations through random commands: refused naming the file, nothing written
# ---------------------------------------------------------------------------------------------------------------------
def _mutate(header: dict, data: bytes, rng: random.Random) -> tuple[object, bytes]:
    names = tensors(header)
    entry = header[rng.choice(names)]
    kind = rng.choice(["dtype", "shape", "shift", "swap_size", "pad", "cut", "drop", "entry", "offsets", "top"])
    if kind == "dtype":
        entry["dtype"] = rng.choice(["F16", "F64", "I8", "BOOL", "U64", "Q4", "", None, 3])
    elif kind == "shape":
        entry["shape"] = rng.choice([[], [0], entry["shape"] + [2], [x + 1 for x in entry["shape"]], ["4"], [1.5],
                                     None])
    elif kind == "shift":
        delta = rng.choice([-8, -4, 4, 8, 1])
        entry["data_offsets"] = [max(0, o + delta) for o in entry["data_offsets"]]
    elif kind == "swap_size":
        begin, end = entry["data_offsets"]
        entry["data_offsets"] = [end, begin] if end > begin else [begin, end + 4]
    elif kind == "pad":
        return header, data + bytes(rng.randint(1, 100))
    elif kind == "cut":
        return header, data[: rng.randrange(len(data))]
    elif kind == "drop":
        del header[rng.choice(names)]
    elif kind == "entry":
        header[rng.choice(names)] = rng.choice([[], "x", 7, None, {"dtype": "F32"}])
    elif kind == "offsets":
        entry["data_offsets"] = rng.choice([[0], [0, 1, 2], "0-4", [-4, 0], None, [0.0, 4.0]])
    else:
        return rng.choice([[header], "header", 3, None]), data
    return header, data


def test_fuzz_safetensors_header_mutations(monkeypatch, capsys, copy_of, small_data, tmp_path):
    rng = random.Random(2025)
    for case in range(30):
        model = copy_of(f"m{case}")
        header, data = read_st(model / "model.safetensors")
        write_st(model / "model.safetensors", *_mutate(header, data, rng))
        out = tmp_path / f"out{case}"
        command = rng.choice([
            ["shrink", model, "--mask", small_data / "missing.json", "--output", out],
            ["translate", model, "--input", small_data / "test.de", "--output", out, "--beams", "1"],
            ["evaluate", model, "--data-dir", small_data, "--limit", "2", "--beams", "1", "--output", out],
            ["export", model, out, "--format", "padded"],
        ])
        code, _, err = run_main(monkeypatch, capsys, *command)
        assert code == 2 and "Traceback" not in err, (case, command[0], code, err[-2000:])
        assert len(err.strip().splitlines()) == 1 and "model.safetensors" in err, (case, err)
        assert not out.exists()


# ---------------------------------------------------------------------------------------------------------------------
# a plain Hugging Face directory whose config.json states other head counts than its weights hold
# ---------------------------------------------------------------------------------------------------------------------
def _plain_save_with_unshrunk_config(model, path: Path) -> Path:
    """`model` (shrunk) saved as a plain HF directory whose config.json states the heads it had before the shrink:
    the prunetrain layout, guard and modeling file taken away, as a user who 'cleans' a pruned directory would."""
    from prunetrain.engine.remote_code import plain_config_dict

    model.save_pretrained(path)
    config = plain_config_dict(json.loads((path / "config.json").read_text()))
    config.pop("prunetrain_heads", None)
    (path / "config.json").write_text(json.dumps(config))
    for item in path.iterdir():
        if item.name.startswith(("prunetrain_", "modeling_")):
            item.unlink()
    return path


@pytest.mark.parametrize("family", ["llama", "bert", "gpt2", "marian"])
def test_a_plain_directory_whose_config_states_more_heads_than_its_weights_is_refused(tmp_path, family):
    from prunetrain.engine.model_dir import load_model_dir
    from prunetrain.zoo import tiny_model

    model = tiny_model(family)
    first = pt.find_heads(model).sites[0]
    pt.shrink(model, pt.HeadMask.from_heads(model, {s.name: list(range(s.group_size)) for s in pt.find_heads(model)}))
    held = pt.find_heads(model)[first.name].num_heads
    path = _plain_save_with_unshrunk_config(model, tmp_path / family)
    with pytest.raises(ValueError) as err:
        load_model_dir(path)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"model: {str(path)!r}: its config.json states "), message
    assert (f"states {first.num_heads} heads × {first.head_dim} at site {first.name!r}, but its weights hold "
            f"{held} (tensor ") in message, message


def test_a_plain_directory_with_its_true_config_still_loads_exactly(tmp_path):
    """The control of the refusals above: the same kind of directory, its config right, loads the same model."""
    from prunetrain.engine.model_dir import load_model_dir
    from prunetrain.zoo import tiny_inputs, tiny_model

    model = tiny_model("llama")
    model.save_pretrained(tmp_path / "plain")
    loaded = load_model_dir(tmp_path / "plain", attn_implementation="eager")
    inputs = tiny_inputs("llama")
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, model(**inputs).logits)


def test_key_value_heads_and_other_sizes_the_weights_do_not_hold_are_named(monkeypatch, capsys, tmp_path):
    from prunetrain.zoo import tiny_model

    model = tiny_model("llama")  # 4 query heads on 2 key/value heads of 8
    for name, fields, pattern in (
            ("kv", {"num_key_value_heads": 4},
             r"its config.json states 4 key/value heads × 8 at site 'model.layers.0.self_attn', but its weights "
             r"hold 2 \(tensor 'model.layers.0.self_attn.k_proj.weight' has shape \(16, 32\), the config needs "
             r"\(32, 32\)\)"),
            ("heads", {"num_attention_heads": 8, "num_key_value_heads": 4},
             r"its config.json states 8 heads × 8 at site 'model.layers.0.self_attn', but its weights hold 4"),
            ("ffn", {"intermediate_size": 40}, r"its config.json does not describe its weights \(tensor "
                                               r"'model.layers.0.mlp.gate_proj.weight' has shape \(\d+, 32\), the "
                                               r"config needs \(40, 32\)\)")):
        path = tmp_path / name
        model.save_pretrained(path)
        _edit_json(path / "config.json", **fields)
        before = tree(path)
        assert_one_line(run_main(monkeypatch, capsys, "export", path, tmp_path / f"out-{name}", "--format", "padded"),
                        rf"source: '.*{name}': " + pattern)
        assert not (tmp_path / f"out-{name}").exists() and tree(path) == before


def test_translate_refuses_a_cleaned_pruned_translation_model(monkeypatch, capsys, model_dir, tmp_path):
    from prunetrain.engine.model_dir import load_model_dir

    model = load_model_dir(model_dir)
    pt.shrink(model, pt.HeadMask.from_heads(model, {s.name: [0] for s in pt.find_heads(model)}))
    path = _plain_save_with_unshrunk_config(model, tmp_path / "cleaned")
    for item in model_dir.iterdir():
        if item.name.startswith(("tokenizer", "special_tokens")):
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, path / item.name)
    assert_one_line(run_main(monkeypatch, capsys, *translate_args(path, tmp_path)),
                    r"model: '.*cleaned': its config.json states 2 heads × 8 at site '.*', but its weights hold 1")
    assert not (tmp_path / "out.txt").exists()


@pytest.mark.parametrize("victim, damage, pattern", [
    ("generation_config.json", "directory", r"model: '.*generation_config.json' is a directory, not a file"),
    ("generation_config.json", "list", r"model: '.*generation_config.json' holds JSON list, not an object"),
    ("config.json", "loop", r"model: '.*config.json' cannot be read \(Too many levels of symbolic links\)"),
    ("tokenizer.json", "list", r"tokenizer: '.*tokenizer.json' holds JSON list, not an object"),
    ("tokenizer_config.json", "list", r"tokenizer: '.*tokenizer_config.json' holds JSON list, not an object"),
])
def test_side_files_that_are_directories_lists_or_link_loops_are_named(monkeypatch, capsys, copy_of, tmp_path,
                                                                        victim, damage, pattern):
    """A generation config transformers would skip (a directory) or fail on ('list' object is not a mapping), a
    config that is a link loop (not 'no config.json'), tokenizer files that hold a list (not a TypeError)."""
    model = copy_of()
    (model / victim).unlink()
    if damage == "directory":
        (model / victim).mkdir()
    elif damage == "list":
        (model / victim).write_text("[1]")
    else:
        (model / victim).symlink_to(model / victim)
    assert_one_line(run_main(monkeypatch, capsys, *translate_args(model, tmp_path)), pattern)
    assert not (tmp_path / "out.txt").exists()


def _zoo_families() -> list[str]:
    from prunetrain.zoo import ARCHITECTURES

    return sorted(ARCHITECTURES)


@pytest.mark.parametrize("family", _zoo_families())
def test_every_zoo_family_saved_plainly_loads_through_the_checks(tmp_path, family):
    """No false refusal: the head-count check (and the config field checks, e.g. DeBERTa's
    max_relative_positions = -1, its class's own default) pass every architecture saved as Hugging Face saves it."""
    from prunetrain.engine.model_dir import load_model_dir
    from prunetrain.zoo import tiny_model

    model = tiny_model(family)
    model.save_pretrained(tmp_path / family)
    for item in (tmp_path / family).iterdir():
        if item.name.startswith(("prunetrain_", "modeling_")):
            item.unlink()
    loaded = load_model_dir(tmp_path / family)
    assert type(loaded).__name__ == type(model).__name__
    assert {k: tuple(v.shape) for k, v in loaded.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in model.state_dict().items()}
