"""Bad input never costs a run, damages a directory or gives a silently wrong answer (issue 19, the application side).

Every case goes through the real command line (`prunetrain.cli.main`, in process for speed: the same argument
parsing, checks and error printing as the installed `prunetrain` command) on a real tiny Marian model with a real
tokenizer, and asserts exit code 2, one line on stderr naming the flag, key or file, no traceback, and nothing
written. A fuzz test feeds random recipe overrides and random corrupt files through the same paths.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

import prunetrain as pt
from hostile import assert_one_line, run_main, save_tiny_translation_model, tree, write_small_data


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, multi30k_dir) -> Path:
    """A tiny saved Marian translation model with its tokenizer (the layout `save_translation_model` writes)."""
    return save_tiny_translation_model(tmp_path_factory.mktemp("bad-input") / "model", multi30k_dir)


@pytest.fixture
def copy_of(model_dir, tmp_path):
    def make(name: str = "copy") -> Path:
        return Path(shutil.copytree(model_dir, tmp_path / name))
    return make


@pytest.fixture
def small_data(tmp_path, multi30k_dir) -> Path:
    """A parallel-text directory with 8 pairs per split (fast to translate)."""
    return write_small_data(tmp_path / "data", multi30k_dir)


# ---------------------------------------------------------------------------------------------------------------------
# recipes: validated when loaded (so --show reports it), before the output directory is touched
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("override, pattern", [
    ("train.batch_size=0", r"train.batch_size: 0 is not allowed; expected an integer >= 1"),
    ("train.learning_rate=-1", r"train.learning_rate: -1.0 is not allowed; expected a finite number in \(0, inf\)"),
    ("train.learning_rate=.nan", r"train.learning_rate: nan is not allowed"),
    ("pruning.final_fraction=1.5", r"pruning.final_fraction: 1.5 is not a fraction in \[0, 1\]"),
    ("pruning.final_fraction=0.9", r"pruning.final_fraction: 0.9 is out of reach: with pruning.min_heads_per_layer=1 "
                                   r"and model.heads=8 at most 0.875"),
    ("pruning.curve_fractions=[0.5, 2]", r"pruning.curve_fractions: 2.0 is not a fraction in \[0, 1\]"),
    ("pruning.min_heads_per_layer=9", r"pruning.min_heads_per_layer: 9 is more than model.heads=8"),
    ("pruning.schedule_steps={200: 0.25, 300: 0.5, 400: 0.625, 500: 0.75, 9000: 0.8}",
     r"pruning.schedule_steps: step 9000 is never reached: the run ends at step 5448 \(29000 training pairs, 454 "
     r"steps per epoch × train.epochs=12\)"),
    ("pruning.schedule={2: 0.4, 4: 0.2}", r"pruning.schedule: .* must not decrease"),
    ("pruning.scope=everywhere", r"pruning.scope: 'everywhere' is not one of 'global', 'layer', 'kind'"),
    ("model.heads=3", r"model.d_model: 256 is not divisible by model.heads=3"),
    ("model.dropout=1", r"model.dropout: 1.0 is not allowed; expected a finite number in \[0, 1\)"),
    ("train.scheduler=sometimes", r"train.scheduler: 'sometimes' is not one of 'linear'"),
    ("train.precision=fp8", r"train.precision: 'fp8' is not one of 'auto', 'bf16', 'fp32'"),
    ("data.vocab_size=100", r"data.vocab_size: 100 is not allowed; expected an integer >= 300"),
    ("data.tgt=de", r"data.tgt: 'de' is also data.src"),
    ("eval.num_beams=0", r"eval.num_beams: 0 is not allowed; expected an integer >= 1"),
    ("name=../../elsewhere", r"name: '../../elsewhere' is not allowed"),
])
def test_a_bad_recipe_value_is_one_line_naming_the_key_before_anything_is_written(monkeypatch, capsys, tmp_path,
                                                                                 override, pattern):
    assert_one_line(run_main(monkeypatch, capsys, "recipe", "wmt-small-deen", "--set", override, "--show"), pattern)
    out = tmp_path / "run"
    assert_one_line(run_main(monkeypatch, capsys, "recipe", "wmt-small-deen", "--set", override, "--output", out),
                    pattern)
    assert not out.exists()


def test_show_prints_a_valid_recipe(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "recipe", "wmt-small-deen", "--smoke", "--set",
                              "pruning.final_fraction=0.75", "--show")
    assert code == 0, err
    assert "final_fraction: 0.75" in out and "heads: 4" in out


# ---------------------------------------------------------------------------------------------------------------------
# run directories: a failed run never blocks the next; --resume never rewrites the record
# ---------------------------------------------------------------------------------------------------------------------
def test_run_directories(tmp_path):
    from prunetrain.mt.config.recipe import load_recipe, recipe_to_yaml
    from prunetrain.mt.run.run_dir import COMPLETE_MARKER, mark_complete, prepare_output_dir

    from hostile import tree as _tree
    from prunetrain.utils.output_paths import MARKER_FILE

    def tree(path):  # the run's files; its marker is checked in tests/test_output_markers.py
        return {name: data for name, data in _tree(path).items() if name != MARKER_FILE}

    recipe = load_recipe("wmt-small-deen", ["train.epochs=3"])
    out = tmp_path / "run"
    prepare_output_dir(out, recipe, resume=False, overwrite=False)
    assert tree(out) == {"recipe.yaml": recipe_to_yaml(recipe).encode()}
    (out / "tokenizer").mkdir()
    (out / "tokenizer" / "tokenizer.json").write_text("{}")  # a run that failed before its first checkpoint
    lines = []
    prepare_output_dir(out, recipe, resume=False, overwrite=False, progress=lines.append)
    assert tree(out) == {"recipe.yaml": recipe_to_yaml(recipe).encode()}  # replaced, not blocking
    assert lines and "replacing it" in lines[0]

    (out / "checkpoint-7").mkdir()  # an interrupted run with something to resume is kept
    with pytest.raises(ValueError, match=r"holds an unfinished run with checkpoint-7; pass --resume"):
        prepare_output_dir(out, recipe, resume=False, overwrite=False)
    changed = load_recipe("wmt-small-deen", ["train.epochs=4", "model.layers=2"])
    before = tree(out)
    with pytest.raises(ValueError, match=r"--resume: the recipe differs .* in model.layers, train.epochs; "):
        prepare_output_dir(out, changed, resume=True, overwrite=False)
    prepare_output_dir(out, recipe, resume=True, overwrite=False)
    assert tree(out) == before  # recipe.yaml is never rewritten

    mark_complete(out)
    with pytest.raises(ValueError, match=r"already holds a finished run; pass --overwrite"):
        prepare_output_dir(out, recipe, resume=False, overwrite=False)
    prepare_output_dir(out, changed, resume=False, overwrite=True)
    assert tree(out) == {"recipe.yaml": recipe_to_yaml(changed).encode()}
    assert not (out / COMPLETE_MARKER).exists()
    mark_complete(out)  # the new run finished: the run it replaced, kept whole beside it until now, is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    (out / "recipe.yaml").write_text(": not yaml : [")
    with pytest.raises(ValueError, match=r"--resume: '.*recipe.yaml' is not valid YAML"):
        prepare_output_dir(out, changed, resume=True, overwrite=False)


# ---------------------------------------------------------------------------------------------------------------------
# saved models: damaged files are one line naming the file
# ---------------------------------------------------------------------------------------------------------------------
def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize("damage, pattern", [
    (lambda d: _truncate(d / "model.safetensors"), r"model: '.*model.safetensors' is truncated \(\d+ of \d+ bytes\)"),
    (lambda d: _truncate(d / "model.safetensors", 0.0001), r"model: '.*model.safetensors' is truncated"),
    (lambda d: (d / "config.json").write_text("{not json"), r"model: '.*config.json' is not valid JSON"),
    (lambda d: (d / "config.json").write_text("[1, 2]"), r"model: '.*config.json' holds JSON list, not an object"),
    (lambda d: (d / "prunetrain_layout.json").write_bytes(b"\xff\xfe"),
     r"model: '.*prunetrain_layout.json' is not valid UTF-8 \(byte offset 0\)"),
    (lambda d: ((d / "model.safetensors").unlink(), (d / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")),
     r"model: '.*' has no .safetensors weights \(it holds pytorch_model.bin, pickle weights prunetrain does not "
     r"unpickle\)"),
    (lambda d: (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()),
                                                          "model_type": "marianne"})),
     r"model: '.*config.json' names model_type 'marianne', which transformers .* does not know"),
    (lambda d: (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()),
                                                          "architectures": ["MarianXModel"]})),
     r"model: '.*config.json' names the architecture 'MarianXModel', which transformers .* does not have"),
])
@pytest.mark.parametrize("command", ["evaluate", "shrink", "translate", "bench"])
def test_a_damaged_model_directory_is_one_line_naming_the_file(monkeypatch, capsys, copy_of, small_data, tmp_path,
                                                              damage, pattern, command):
    broken = copy_of()
    damage(broken)
    (tmp_path / "mask.json").write_text("{}")
    (tmp_path / "in.txt").write_text("Ein Hund.\n")
    args = {"evaluate": ["--data-dir", small_data],
            "shrink": ["--mask", tmp_path / "mask.json", "--output", tmp_path / "out"],
            "translate": ["--input", tmp_path / "in.txt", "--output", tmp_path / "out.txt"],
            "bench": []}[command]
    if command == "bench":
        result = run_main(monkeypatch, capsys, "bench", broken, broken, "--batch-sizes", "1", "--repeats", "1")
        pattern = pattern.replace("model:", "model_a:", 1)
    else:
        result = run_main(monkeypatch, capsys, command, broken, *args)
    assert_one_line(result, pattern)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.txt").exists()


def test_debug_keeps_the_original_exception(monkeypatch, capsys, copy_of, small_data):
    broken = copy_of()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config.json' is not valid JSON"):
        run_main(monkeypatch, capsys, "evaluate", broken, "--data-dir", small_data, env={"PRUNETRAIN_DEBUG": "1"})


# ---------------------------------------------------------------------------------------------------------------------
# commands: flags checked before any work, named as the user typed them
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, pattern", [
    (["curve", "{model}", "--data-dir", "{data}", "--beams", "0"], r"--beams: 0 is not allowed"),
    (["curve", "{model}", "--data-dir", "{data}", "--sentences", "-5"], r"--sentences: -5 is not allowed"),
    (["curve", "{model}", "--data-dir", "{data}", "--fractions", "0,1.5"], r"--fractions: 1.5 is not a fraction"),
    (["curve", "{model}", "--data-dir", "{data}", "--order", "best"], r"--order: 'best' is not one of"),
    (["prune", "{model}", "--data-dir", "{data}", "--batch-size", "-5", "--output", "{tmp}/p"],
     r"--batch-size: -5 is not allowed"),
    (["prune", "{model}", "--data-dir", "{data}", "--amount", "2.5", "--count", "--output", "{tmp}/p"],
     r"--amount: 2.5 is not a whole number of heads"),
    (["prune", "{model}", "--data-dir", "{data}", "--scope", "all", "--output", "{tmp}/p"],
     r"--scope: 'all' is not one of"),
    (["prune", "{model}", "--data-dir", "{tmp}/nowhere", "--output", "{tmp}/p"], r"--data-dir: '.*nowhere' is not a"),
    (["importance", "{model}", "--data-dir", "{data}", "--scorer", "magic"], r"--scorer: 'magic' is not one of"),
    (["evaluate", "{model}", "--data-dir", "{data}", "--limit", "0"], r"--limit: 0 is not allowed"),
    (["evaluate", "{model}", "--data-dir", "{data}", "--output", "{tmp}/missing/dir/e.json"],
     r"--output: the directory '.*missing/dir' does not exist"),
    (["evaluate", "{model}", "--data-dir", "{data}", "--tokenizer", "{tmp}"], r"--tokenizer: '.*' holds no tokenizer"),
    (["translate", "{model}", "--input", "{tmp}/in.txt", "--output", "{tmp}/missing/out.txt"],
     r"--output: the directory '.*missing' does not exist; create it first"),
    (["translate", "{model}", "--input", "{tmp}/nothing.txt"], r"--input: '.*nothing.txt' is not a file"),
    (["translate", "{model}", "--input", "{tmp}/in.txt", "--batch-size", "0"], r"--batch-size: 0 is not allowed"),
    (["bench", "{model}", "{model}", "--batch-sizes", "1,x"], r"--batch-sizes: '1,x' is not a comma-separated"),
    (["bench", "{model}", "{model}", "--dtype", "fp16"], r"--dtype: 'fp16' is not one of 'fp32', 'bf16'"),
    (["bench", "{model}", "{model}", "--generate", "sample"], r"--generate: 'sample' is not one of"),
    (["bench", "{model}", "{model}", "--repeats", "0"], r"--repeats: 0 is not allowed"),
    (["study", "curves", "{model}", "--data-dir", "{data}", "--seeds", "0"], r"--seeds: 0 is not allowed"),
])
def test_bad_flags_are_one_line_naming_the_flag_before_any_work(monkeypatch, capsys, model_dir, small_data, tmp_path,
                                                                args, pattern):
    (tmp_path / "in.txt").write_text("Ein Hund.\n")
    filled = [a.format(model=model_dir, data=small_data, tmp=tmp_path) for a in args]
    before = tree(tmp_path)
    assert_one_line(run_main(monkeypatch, capsys, *filled), pattern)
    assert tree(tmp_path) == before  # nothing written


def test_a_huge_line_is_a_clear_limit_error(monkeypatch, capsys, model_dir, small_data):
    line = " ".join(["Ein Hund läuft."] * 80_000)  # about 1.2 MB
    (small_data / "huge.de").write_text("Ein Hund.\n" + line + "\n")
    (small_data / "huge.en").write_text("A dog.\nA dog runs.\n")
    assert len(line) > 1_200_000
    assert_one_line(run_main(monkeypatch, capsys, "evaluate", model_dir, "--data-dir", small_data, "--split", "huge"),
                    r"sources: sentence 2 has \d+ tokens, more than the model's 64 positions; shorten it or pass "
                    r"max_source_length=64 to truncate")


def test_shrink_and_prune_into_their_own_directory_keep_the_tokenizer(monkeypatch, capsys, copy_of, small_data):
    model = copy_of()
    net = pt.load_pruned(model)
    mask = pt.HeadMask.ones(net)
    mask.set(pt.find_heads(net).sites[0].name, 0, 0.0)
    mask.to_json(model.parent / "mask.json")
    refused = run_main(monkeypatch, capsys, "shrink", model, "--mask", model.parent / "mask.json", "--output", model)
    assert_one_line(refused, r"--output: '.*copy' already exists and is not empty; pass --overwrite to replace it")
    code, _, err = run_main(monkeypatch, capsys, "shrink", model, "--mask", model.parent / "mask.json", "--output",
                            model, "--overwrite")
    assert code == 0, err
    assert (model / "tokenizer.json").is_file() and pt.find_heads(pt.load_pruned(model)).total_heads == 5
    # prune counts heads of the original model (the one removed above counts): 2 of 6 leaves 4
    code, _, err = run_main(monkeypatch, capsys, "prune", model, "--data-dir", small_data, "--split", "valid",
                            "--amount", "2", "--count", "--num-batches", "1", "--batch-size", "4", "--output", model,
                            "--overwrite")
    assert code == 0, err
    assert (model / "tokenizer.json").is_file() and pt.find_heads(pt.load_pruned(model)).total_heads == 4


def test_a_neighbours_tokenizer_is_never_used_silently(monkeypatch, capsys, model_dir, small_data, tmp_path):
    run = tmp_path / "run"
    (run / "tokenizer").mkdir(parents=True)
    alone = Path(shutil.copytree(model_dir, run / "pruned"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.move(alone / name, run / "tokenizer" / name)
    args = ["evaluate", alone, "--data-dir", small_data, "--split", "valid", "--beams", "1", "--limit", "2"]
    assert_one_line(run_main(monkeypatch, capsys, *args),
                    r"tokenizer: no tokenizer.json in '.*pruned' or its tokenizer/ folder; .* --tokenizer")
    code, out, err = run_main(monkeypatch, capsys, *args, "--tokenizer", run / "tokenizer")
    assert code == 0, err
    assert json.loads(out)["num_sentences"] == 2


# ---------------------------------------------------------------------------------------------------------------------
# translate: line-exact, one output line per input line
# ---------------------------------------------------------------------------------------------------------------------
def test_translate_is_line_exact(monkeypatch, capsys, model_dir, tmp_path):
    from prunetrain.mt.text.data import read_lines
    from prunetrain.mt.evaluation.translation import load_model_tokenizer, load_translation_model, translate

    sources = ["Ein Hund\u2028läuft.", "Zwei\x0cKatzen.", "Ein Mann\x85fährt.", "", "Ein Auto\u2029."]
    (tmp_path / "in.txt").write_bytes("".join(s + "\n" for s in sources).encode())
    code, _, err = run_main(monkeypatch, capsys, "translate", model_dir, "--input", tmp_path / "in.txt", "--output",
                            tmp_path / "out.txt", "--beams", "1")
    assert code == 0, err
    written = read_lines(tmp_path / "out.txt")
    assert len(written) == len(sources)
    expected = translate(load_translation_model(model_dir), load_model_tokenizer(model_dir), sources, num_beams=1)
    assert written == [h.replace("\r", " ").replace("\n", " ") for h in expected]
    # stdin gives the same lines on stdout
    code, out, err = run_main(monkeypatch, capsys, "translate", model_dir, "--input", "-", "--beams", "1",
                              stdin=(tmp_path / "in.txt").read_bytes())
    assert code == 0, err
    assert out.split("\n")[:-1] == written and out.endswith("\n")


def test_translate_of_empty_input_writes_nothing(monkeypatch, capsys, model_dir, tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    code, out, err = run_main(monkeypatch, capsys, "translate", model_dir, "--input", tmp_path / "empty.txt")
    assert (code, out) == (0, ""), err
    code, _, err = run_main(monkeypatch, capsys, "translate", model_dir, "--input", "-", "--output",
                            tmp_path / "out.txt", stdin=b"")
    assert code == 0 and (tmp_path / "out.txt").read_bytes() == b""


def test_translate_rejects_invalid_utf8(monkeypatch, capsys, model_dir, tmp_path):
    assert_one_line(run_main(monkeypatch, capsys, "translate", model_dir, "--input", "-", stdin=b"Ein \xff Hund\n"),
                    r"--input: stdin is not valid UTF-8: byte offset 4 \(line 1\)")
    (tmp_path / "bad.txt").write_bytes(b"gut\nEin \xc3 Hund\n")
    assert_one_line(run_main(monkeypatch, capsys, "translate", model_dir, "--input", tmp_path / "bad.txt"),
                    r"--input: .*bad.txt is not valid UTF-8: byte offset 8 \(line 2\)")


# ---------------------------------------------------------------------------------------------------------------------
# fuzz: random overrides and random corrupt files never give a traceback, and a refusal writes nothing
# ---------------------------------------------------------------------------------------------------------------------
KEYS = ["data.src", "data.vocab_size", "data.max_length", "data.train_limit", "model.layers", "model.heads",
        "model.d_model", "model.dropout", "model.attn_implementation", "train.epochs", "train.batch_size",
        "train.learning_rate", "train.warmup_steps", "train.scheduler", "train.precision", "train.max_minutes",
        "pruning.final_fraction", "pruning.curve_fractions", "pruning.schedule", "pruning.scope", "pruning.mode",
        "pruning.min_heads_per_layer", "pruning.importance_epochs", "eval.num_beams", "eval.test_limit", "name",
        "train.nope", "nope.key", "train", "kind", "train.seed", "pruning.schedule_steps", "eval.test_steps",
        "data.max_length", "data.dir", "train.max_steps"]
VALUES = ["0", "-1", "1", "2", "3", "0.5", "1.5", "-0.0", ".nan", ".inf", "true", "null", "''", "abc", "[0.2, 0.9]",
          "[]", "{1: 0.5}", "{3: 2}", "[1, x]", "{", "\"\"", "eager", "global", "inverse_sqrt", "1e-9", "99999",
          "1e-3", "{2: 0.5, 2: 0.6}", "4294967296", "[[[[[[]]]]]]", "&a [1]", "*a", "9" * 400, "flash_attention_2",
          "1000000000", "{10: 0.5, 9000: 0.6}", "[9000]", "a #b: c"]


def test_fuzz_recipe_overrides(monkeypatch, capsys, tmp_path):
    rng = random.Random(19)
    outcomes = {0: 0, 2: 0}
    for case in range(150):
        sets = []
        for _ in range(rng.randint(1, 3)):
            sets += ["--set", f"{rng.choice(KEYS)}={rng.choice(VALUES)}"]
        recipe = rng.choice(["wmt-small-deen", "wmt-small-deen-l0"])
        code, out, err = run_main(monkeypatch, capsys, "recipe", recipe, *sets, "--show")
        assert code in (0, 2) and "Traceback" not in err, (sets, code, err[-2000:])
        if code == 2:
            assert len(err.strip().splitlines()) == 1 and not out, (sets, err)
        else:
            assert "name:" in out
        outcomes[code] += 1
    assert outcomes[0] >= 3 and outcomes[2] >= 50, outcomes  # both paths exercised


def _corrupt(data: bytes, rng: random.Random) -> bytes:
    kind = rng.choice(["truncate", "flip", "garbage", "empty", "json"])
    if kind == "truncate":
        return data[: rng.randrange(len(data))]
    if kind == "flip":
        pos = rng.randrange(len(data))
        return data[:pos] + bytes([data[pos] ^ 0xFF]) + data[pos + 1:]
    if kind == "garbage":
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    if kind == "empty":
        return b""
    return json.dumps(rng.choice([[], 1, "x", None, {"sites": 3}])).encode()


def test_fuzz_corrupt_files(monkeypatch, capsys, copy_of, small_data, tmp_path):
    rng = random.Random(1919)
    refused = 0
    for case in range(16):
        model = copy_of(f"m{case}")
        victim = rng.choice(["config.json", "model.safetensors", "prunetrain_layout.json", "tokenizer.json"])
        (model / victim).write_bytes(_corrupt((model / victim).read_bytes(), rng))
        (tmp_path / "in.txt").write_bytes(_corrupt("Ein Hund.\nZwei Katzen.\n".encode(), rng))
        out = tmp_path / f"out{case}"
        command = rng.choice([
            ["shrink", model, "--mask", tmp_path / "in.txt", "--output", out],
            ["translate", model, "--input", tmp_path / "in.txt", "--output", out, "--beams", "1"],
            ["evaluate", model, "--data-dir", small_data, "--limit", "2", "--beams", "1", "--output", out],
        ])
        code, _, err = run_main(monkeypatch, capsys, *command)
        assert code in (0, 2) and "Traceback" not in err, (victim, command[0], err[-2000:])
        if code == 2:
            assert len(err.strip().splitlines()) == 1, err
            assert not out.exists(), (victim, command[0])
            named = (victim, "in.txt", "--mask", "--input", "mask data")  # what was damaged is named
            assert any(name in err for name in named), (victim, err)
            refused += 1
    assert refused >= 4  # the damage was seen, not ignored


# ---------------------------------------------------------------------------------------------------------------------
# issue 37: the mask a callback writes next to the model it shrank
# ---------------------------------------------------------------------------------------------------------------------
def test_shrink_takes_a_mask_in_the_original_head_numbering_of_an_already_shrunk_model(monkeypatch, capsys,
                                                                                      tmp_path):
    """A callback that shrinks at the end writes final_mask.json over the model as it was (every original head);
    `prunetrain shrink SHRUNK --mask final_mask.json` maps it onto the heads left: exactly the same model, and a
    mask that removes more gives exactly the original shrunk by both."""
    import torch

    from prunetrain.zoo import random_mask, tiny_inputs, tiny_model

    original = tiny_model("bert")
    final = random_mask(original, seed=3, empty_site=None)
    (tmp_path / "final_mask.json").write_text(json.dumps(final.to_dict()))
    model = tiny_model("bert")
    pt.shrink(model, final)
    pt.save_pruned(model, tmp_path / "model")
    code, out, err = run_main(monkeypatch, capsys, "shrink", tmp_path / "model", "--mask", tmp_path / "final_mask.json",
                              "--output", tmp_path / "again")
    assert code == 0, err
    again = pt.load_pruned(tmp_path / "again")
    assert pt.find_heads(again) == pt.find_heads(model)
    inputs = tiny_inputs("bert")
    with torch.no_grad():
        assert torch.equal(again(**inputs).logits, pt.load_pruned(tmp_path / "model")(**inputs).logits)
    site = next(s for s in pt.find_heads(model) if 0 < s.num_heads < s.original_num_heads)
    more = final.to_dict()
    more["sites"][site.name][site.heads[0]] = 0.0  # one more head, in the original numbering
    (tmp_path / "more.json").write_text(json.dumps(more))
    assert run_main(monkeypatch, capsys, "shrink", tmp_path / "model", "--mask", tmp_path / "more.json", "--output",
                    tmp_path / "fewer")[0] == 0
    expected = tiny_model("bert")
    pt.shrink(expected, pt.HeadMask.from_dict(more, expected))
    fewer = pt.load_pruned(tmp_path / "fewer")
    assert pt.find_heads(fewer) == pt.find_heads(expected)
    with torch.no_grad():
        assert torch.equal(fewer(**inputs).logits, expected.eval()(**inputs).logits)
    gone = next(h for h in range(site.original_num_heads) if h not in site.heads)
    back = final.to_dict()
    back["sites"][site.name][gone] = 1.0
    (tmp_path / "back.json").write_text(json.dumps(back))
    assert_one_line(run_main(monkeypatch, capsys, "shrink", tmp_path / "model", "--mask", tmp_path / "back.json",
                             "--output", tmp_path / "x"),
                    rf"--mask: '.*back.json' keeps head {gone} of site '{site.name}' \(in the original numbering: "
                    rf"{site.original_num_heads} keep values\), which '.*model' no longer holds")
    assert not (tmp_path / "x").exists()


def test_a_checkpoint_cut_short_while_a_callback_saved_is_called_incomplete(tmp_path):
    import torch

    from prunetrain.training.state import load_callback_state, save_callback_state

    checkpoint = tmp_path / "checkpoint-40"
    save_callback_state(checkpoint, "hard-concrete", {"step": 40}, {"log_alpha": torch.zeros(3)})
    (checkpoint / "prunetrain-hard-concrete.json").unlink()  # killed between the tensors and the JSON
    with pytest.raises(ValueError, match=r"resume: '.*checkpoint-40' is incomplete: it holds "
                                         r"prunetrain-hard-concrete.safetensors but not prunetrain-hard-concrete.json, "
                                         r"which HardConcreteCallback writes last"):
        load_callback_state(checkpoint, "hard-concrete", "HardConcreteCallback")
    (checkpoint / "prunetrain-hard-concrete.safetensors").unlink()
    save_callback_state(checkpoint, "head-pruning", {"step": 40}, {})
    with pytest.raises(ValueError, match=r"has no prunetrain-hard-concrete.json: either the run that wrote it had no "
                                         r"HardConcreteCallback, or the checkpoint is incomplete"):
        load_callback_state(checkpoint, "hard-concrete", "HardConcreteCallback")


def test_a_single_process_shrink_during_training_warns_nothing():
    """The training-time shrink looks for a DDP wrapper; it never touches `torch.distributed.reduce_op` (whose every
    attribute access is a FutureWarning)."""
    import warnings

    import torch.distributed

    from prunetrain.training.head_pruning import HeadPruningCallback
    from prunetrain.zoo import random_mask, tiny_model

    assert torch.distributed.reduce_op is not None  # alive, as in every process that imported torch.distributed
    model = tiny_model("bert")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        HeadPruningCallback._shrink(model, random_mask(model, seed=1, empty_site=None), None)
    assert [str(w.message) for w in caught] == []


@pytest.mark.parametrize("command", ["importance", "prune", "curve"])
def test_the_parallel_text_commands_say_so_in_their_help(monkeypatch, capsys, command):
    code, out, _ = run_main(monkeypatch, capsys, command, "--help", env={"COLUMNS": "200"})
    assert code == 0
    text = " ".join(out.split())
    assert "Parallel text only (translation models)" in text and "Python API" in text


def test_resume_fills_keys_added_since_and_lets_the_time_guard_change(tmp_path):
    """A run started before a recipe key existed resumes (the key counts with its default, which is what the run was
    trained with); a non-default value of that key is still a different recipe; the wall-time guard may change."""
    import yaml

    from prunetrain.mt.config.recipe import load_recipe
    from prunetrain.mt.run.run_dir import prepare_output_dir

    recipe = load_recipe("wmt-small-deen", ["train.epochs=3"])
    out = tmp_path / "run"
    prepare_output_dir(out, recipe, resume=False, overwrite=False)
    stored = yaml.safe_load((out / "recipe.yaml").read_text())
    del stored["distill"], stored["model"]["init_from"]  # as written before these keys existed
    (out / "recipe.yaml").write_text(yaml.safe_dump(stored, sort_keys=False))
    (out / "checkpoint-7").mkdir()
    before = tree(out)
    prepare_output_dir(out, recipe, resume=True, overwrite=False)
    prepare_output_dir(out, load_recipe("wmt-small-deen", ["train.epochs=3", "train.max_minutes=150"]), resume=True,
                       overwrite=False)
    with pytest.raises(ValueError, match=r"--resume: the recipe differs .* in distill.temperature; "):
        prepare_output_dir(out, load_recipe("wmt-small-deen", ["train.epochs=3", "distill.temperature=3"]),
                           resume=True, overwrite=False)
    assert tree(out) == before
