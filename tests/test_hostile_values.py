"""Hostile values that used to give a silently wrong result (issue 37): a string read as a bool, a bool or float read
as a count, a string read as a list, a duplicate key read as its last value, a name that collides with another or
breaks a table, a head list with repeats or non-integers, an endless or binary input. Each is now one clear line
naming the argument and the value, or the right result."""

from __future__ import annotations

import io
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import prunetrain as pt
import prunetrain.bench as bench
from hostile import assert_one_line, run_main, save_tiny_translation_model
from prunetrain.training.options import CurveSweep, GateTraining, Heads, Importance, Output, Schedule
from prunetrain.zoo import tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, multi30k_dir) -> Path:
    return save_tiny_translation_model(tmp_path_factory.mktemp("hostile-values") / "model", multi30k_dir)


# ---------------------------------------------------------------------------------------------------------------------
# option records: a bool field takes a bool, a count an int, a list a list
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("build, message", [
    (lambda: CurveSweep(relative="no"), r"^relative: 'no' is not allowed; expected True or False\.$"),
    (lambda: Schedule(record_end="no"), r"^record_end: 'no' is not allowed; expected True or False\.$"),
    (lambda: Output(tensorboard="no"), r"^tensorboard: 'no' is not allowed; expected True or False\.$"),
    (lambda: Output(tensorboard=0), r"^tensorboard: 0 is not allowed; expected True or False\.$"),
    (lambda: Importance(iterative=1), r"^iterative: 1 is not allowed; expected True or False\.$"),
    (lambda: Importance(iterative="False"), r"^iterative: 'False' is not allowed"),
    (lambda: Importance(batches="abc"), r"^batches: 'abc' is not a list or DataLoader of batches"),
    (lambda: Importance(batches=4), r"^batches: 4 is not a list or DataLoader of batches"),
    (lambda: Importance(batches={"input_ids": 1}), r"^batches: .* is not a list or DataLoader of batches"),
    (lambda: Importance(batches=[]), r"^batches: it holds no batch"),
    (lambda: Importance(scorer_options=[("seed", 1)]), r"^scorer_options: .* is not a dict"),
    (lambda: Importance(num_batches=True), r"^num_batches: True is not allowed"),
    (lambda: Schedule(at_steps="12"), r"^at_steps: '12' is not a list of global optimizer steps"),
    (lambda: Schedule(at_steps=12), r"^at_steps: 12 is not a list of global optimizer steps"),
    (lambda: Schedule(prune_steps={7: 0.5}, shrink_steps="7"), r"^shrink_steps: '7' is not a list"),
    (lambda: Heads(kinds=["cross", "cross"]), r"^kinds: \['cross', 'cross'\] names a kind twice"),
    (lambda: Output(output_dir=""), r"^output_dir: '' is an empty path"),
    (lambda: CurveSweep(random_seeds="12"), r"^random_seeds: '12' is not a list of integers >= 0\.$"),
    (lambda: CurveSweep(random_seeds=[True]), r"^random_seeds: True is not allowed; expected integers >= 0\.$"),
    (lambda: CurveSweep(random_seeds=[0.5]), r"^random_seeds: 0.5 is not allowed"),
    (lambda: CurveSweep(random_seeds=[-1]), r"^random_seeds: -1 is not allowed"),
    (lambda: CurveSweep(random_seeds=[]), r"^random_seeds: \(\) is empty"),
    (lambda: CurveSweep(random_seeds=[3, 3]), r"^random_seeds: \[3, 3\] repeats a seed"),
    (lambda: GateTraining(init_log_alpha=float("nan")), r"^init_log_alpha: nan is not allowed; expected a finite"),
    (lambda: GateTraining(init_log_alpha="3"), r"^init_log_alpha: '3' is not allowed"),
    (lambda: GateTraining(init_log_alpha=True), r"^init_log_alpha: True is not allowed"),
    (lambda: GateTraining(seed=True), r"^seed: True is not allowed; expected an integer >= 0\.$"),
    (lambda: GateTraining(seed=1.0), r"^seed: 1.0 is not allowed"),
    (lambda: GateTraining(seed=-1), r"^seed: -1 is not allowed"),
])
def test_option_records_refuse_values_of_the_wrong_kind(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize("build, message", [
    (lambda: bench.BenchCalls(forward="no"), r"^forward: 'no' is not allowed; expected True or False\.$"),
    (lambda: bench.BenchReport(flops="no"), r"^flops: 'no' is not allowed; expected True or False\.$"),
    (lambda: bench.BenchReport(memory=1), r"^memory: 1 is not allowed"),
    (lambda: bench.BenchReport(label_a=""), r"^label_a: '' is not allowed; expected a non-empty label"),
    (lambda: bench.BenchReport(label_b=3), r"^label_b: 3 is not allowed"),
    (lambda: bench.BenchWorkload(seed=True), r"^seed: True is not allowed; expected an integer >= 0\.$"),
    (lambda: bench.BenchWorkload(seed=-1), r"^seed: -1 is not allowed"),
])
def test_bench_records_refuse_values_of_the_wrong_kind(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize("scorer, options, message", [
    ("gradient", {"sync": "no"}, r"^sync: 'no' is not allowed; expected True or False\.$"),
    ("ablation", {"sync": 1}, r"^sync: 1 is not allowed"),
    ("confidence", {"max_batches": 0}, r"^max_batches: 0 is not allowed; expected an integer >= 1\.$"),
    ("gradient", {"max_batches": True}, r"^max_batches: True is not allowed"),
    ("gradient", {"autocast": "bf16"}, r"^autocast: 'bf16' is not a torch dtype"),
    ("ablation", {"loss_fn": 3}, r"^loss_fn: 3 is not a callable"),
    ("random", {"seed": True}, r"^seed: True is not allowed; expected an integer\.$"),
    ("random", {"seed": "1"}, r"^seed: '1' is not allowed"),
])
def test_scorer_options_are_checked_when_the_record_is_built(scorer, options, message):
    with pytest.raises(ValueError, match=message):
        Importance(scorer=scorer, scorer_options=options)


def test_option_records_keep_real_bools_and_numpy_bools_as_bools():
    assert Output(tensorboard=np.bool_(False)).tensorboard is False
    assert CurveSweep(relative=np.True_).relative is True
    assert Schedule(record_end=False).record_end is False
    assert Importance(iterative=True, batches=iter([{"x": 1}])).iterative is True  # a one-shot iterable is fine
    assert CurveSweep(random_seeds=range(3)).random_seeds == (0, 1, 2)
    assert GateTraining(init_log_alpha=-2, seed=4).init_log_alpha == -2


# ---------------------------------------------------------------------------------------------------------------------
# ONNX beam settings: what generate() takes, checked the way it checks (and stricter where it is silent)
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    ({"num_beams": 0}, r"^num_beams: 0 is not allowed; expected an integer >= 1\.$"),
    ({"num_beams": -2}, r"^num_beams: -2 is not allowed"),
    ({"num_beams": True}, r"^num_beams: True is not allowed"),
    ({"num_beams": 2.0}, r"^num_beams: 2.0 is not allowed"),
    ({"early_stopping": "sometimes"}, r"^early_stopping: 'sometimes' is not allowed; expected True, False or 'never'"),
    ({"early_stopping": 1}, r"^early_stopping: 1 is not allowed"),
    ({"forced_eos_token_id": -5}, r"^forced_eos_token_id: -5 is not a token id; expected an integer >= 0"),
    ({"forced_bos_token_id": True}, r"^forced_bos_token_id: True is not a token id"),
    ({"pad_token_id": "1"}, r"^pad_token_id: '1' is not a token id"),
    ({"decoder_start_token_id": -1}, r"^decoder_start_token_id: -1 is not a token id"),
    ({"eos_token_id": -3}, r"^eos_token_id: -3 in \[-3\] is not a token id"),
    ({"eos_token_id": [2, 1.5]}, r"^eos_token_id: 1.5 in \[2, 1.5\] is not a token id"),
    ({"suppress_tokens": "12"}, r"^suppress_tokens: '12' is not a list of token ids"),
    ({"suppress_tokens": [3, -1]}, r"^suppress_tokens: -1 in \[3, -1\] is not a token id"),
    ({"suppress_tokens": 12}, r"^suppress_tokens: 12 is not a list of token ids"),
    ({"suppress_tokens": 0}, r"^suppress_tokens: 0 is not a list of token ids"),
    ({"suppress_tokens": ""}, r"^suppress_tokens: '' is not a list of token ids"),
    ({"bad_words_ids": "12"}, r"^bad_words_ids: '12' is not a list of token lists"),
    ({"bad_words_ids": ["1"]}, r"^bad_words_ids: '1' is not a list of token ids"),
    ({"bad_words_ids": [[True]]}, r"^bad_words_ids: True in \[True\] is not a token id"),
    ({"bad_words_ids": [[]]}, r"^bad_words_ids: \[\] bans nothing"),
    ({"min_new_tokens": -1}, r"^min_new_tokens: -1 is not allowed; expected an integer >= 0"),
    ({"min_new_tokens": True}, r"^min_new_tokens: True is not allowed"),
    ({"length_penalty": "x"}, r"^length_penalty: 'x' is not allowed; expected a finite number"),
    ({"length_penalty": float("nan")}, r"^length_penalty: nan is not allowed"),
    ({"do_sample": "no"}, r"^do_sample: 'no' is not supported"),
    ({"num_beam": 4}, r"^num_beam: not a generation setting"),
    ({"stop_strings": ["."]}, r"^stop_strings: \['.'\] is not supported by the ONNX Runtime beam search"),
    ({"max_time": 1.0}, r"^max_time: 1.0 is not supported"),
])
def test_beam_settings_refuse_what_generate_refuses(overrides, message):
    from prunetrain.export.onnx_beam import BeamSettings

    with pytest.raises(ValueError, match=message):
        BeamSettings.from_generation_config({"num_beams": 4}, **overrides)


def test_beam_settings_accept_every_documented_form():
    from prunetrain.export.onnx_beam import BeamSettings

    s = BeamSettings.from_generation_config({"eos_token_id": 2, "early_stopping": "never"}, num_beams=3,
                                            suppress_tokens=(1, 5), bad_words_ids=[[4], (7,)], min_new_tokens=None,
                                            forced_eos_token_id=0, length_penalty=-1)
    assert (s.num_beams, s.eos_token_ids, s.early_stopping, s.length_penalty) == (3, (2,), "never", -1.0)
    assert (s.rules.suppress_tokens, s.rules.bad_tokens, s.rules.min_new_tokens) == ((1, 5), (4, 7), 0)
    s.check_vocabulary(8)
    with pytest.raises(ValueError, match=r"^bad_words_ids: 7 is not a token of this model; token ids lie in "
                                         r"\[0, 7\)\.$"):
        s.check_vocabulary(7)


def test_onnx_translation_refuses_bad_counts_and_out_of_vocabulary_ids(tmp_path, m30k_tokenizer):
    from transformers import MarianMTModel

    from prunetrain.export.formats import export
    from prunetrain.export.onnx_beam import beam_generate
    from prunetrain.mt.text.data import marian_config_small
    from prunetrain.mt.evaluation.translation import translate_onnx

    torch.manual_seed(0)
    model = MarianMTModel(marian_config_small(m30k_tokenizer, d_model=16, ffn_dim=32, layers=1, heads=2))
    export(model, tmp_path / "onnx", "onnx")
    ids = torch.tensor([[5, 6, 7, 0]])
    vocab = model.config.vocab_size
    with pytest.raises(ValueError, match=rf"^forced_eos_token_id: {vocab} is not a token of this model; token ids "
                                         rf"lie in \[0, {vocab}\)\.$"):
        beam_generate(tmp_path / "onnx", ids, torch.ones_like(ids), 4, num_beams=2, forced_eos_token_id=vocab,
                      decoder_start_token_id=model.config.decoder_start_token_id)
    with pytest.raises(ValueError, match=r"^threads: 0 is not allowed; expected an integer >= 1\.$"):
        beam_generate(tmp_path / "onnx", ids, torch.ones_like(ids), 4, num_beams=2, threads=0)
    common = dict(decoder_start_token_id=model.config.decoder_start_token_id, eos_token_id=model.config.eos_token_id)
    sources = ["Ein Hund läuft.", "Zwei Katzen."]
    for kwargs, message in [({"batch_size": -1}, r"^batch_size: -1 is not allowed; expected an integer >= 1\.$"),
                            ({"batch_size": True}, r"^batch_size: True is not allowed"),
                            ({"num_beams": 0}, r"^num_beams: 0 is not allowed"),
                            ({"num_beams": -2}, r"^num_beams: -2 is not allowed"),
                            ({"num_beams": True}, r"^num_beams: True is not allowed"),
                            ({"threads": 0}, r"^threads: 0 is not allowed"),
                            ({"suppress_pad": "no"}, r"^suppress_pad: 'no' is not allowed")]:
        with pytest.raises(ValueError, match=message):
            translate_onnx(tmp_path / "onnx", m30k_tokenizer, sources, **common, **kwargs)
    with pytest.raises(ValueError, match=r"^sources: 'Ein Hund läuft.' is not a list of sentences"):
        translate_onnx(tmp_path / "onnx", m30k_tokenizer, sources[0], **common)
    got = translate_onnx(tmp_path / "onnx", m30k_tokenizer, sources, batch_size=1, num_beams=2, **common)
    assert len(got) == 2 and all(isinstance(text, str) for text in got)  # a translation per sentence, not None


# ---------------------------------------------------------------------------------------------------------------------
# translate: a list of sentences, counts as ints; the command reads its input bounded and lazily
# ---------------------------------------------------------------------------------------------------------------------
def test_translate_refuses_a_bare_string_and_bool_counts(model_dir):
    from prunetrain.mt.text.data import read_parallel
    from prunetrain.mt.evaluation.translation import (evaluate_bleu, load_model_tokenizer, load_translation_model,
                                                      translate)

    model, tokenizer = load_translation_model(model_dir), load_model_tokenizer(model_dir)
    for sources, kwargs, message in [
        ("Ein Hund läuft.", {}, r"^sources: 'Ein Hund läuft.' is not a list of sentences; pass a list of str"),
        (b"Ein Hund", {}, r"^sources: b'Ein Hund' is not a list of sentences"),
        (["Ein Hund.", None], {}, r"^sources: item 2 is None, not a str sentence\.$"),
        (["Ein Hund."], {"batch_size": True}, r"^batch_size: True is not allowed; expected an integer >= 1\.$"),
        (["Ein Hund."], {"batch_size": 2.0}, r"^batch_size: 2.0 is not allowed"),
        (["Ein Hund."], {"num_beams": 0}, r"^num_beams: 0 is not allowed"),
        (["Ein Hund."], {"num_beams": True}, r"^num_beams: True is not allowed"),
        (["Ein Hund."], {"max_new_tokens": 0}, r"^max_new_tokens: 0 is not allowed"),
        (["Ein Hund."], {"max_source_length": True}, r"^max_source_length: True is not allowed"),
        (["Ein Hund."], {"device": "nonsense"}, r"^device: 'nonsense' is not a device; expected e.g. 'cpu'"),
        (["Ein Hund."], {"suppress_pad": 1}, r"^suppress_pad: 1 is not allowed; expected True or False\.$"),
    ]:
        with pytest.raises(ValueError, match=message):
            translate(model, tokenizer, sources, **kwargs)
    for pairs, kwargs, message in [
        ("ab", {}, r"^pairs: 'ab' is not a list of \(source, reference\) pairs\.$"),
        ([("Ein Hund.", "A dog.", "extra")], {}, r"^pairs: item 1 is .* not a \(source, reference\) pair of str\.$"),
        (["ab"], {}, r"^pairs: item 1 is 'ab', not a \(source, reference\) pair"),
        ([("Ein Hund.", "A dog.")], {"return_hypotheses": "no"}, r"^return_hypotheses: 'no' is not allowed"),
        ([("Ein Hund.", "A dog.")], {"sentence_stats": 1}, r"^sentence_stats: 1 is not allowed"),
    ]:
        with pytest.raises(ValueError, match=message):
            evaluate_bleu(model, tokenizer, pairs, **kwargs)
    with pytest.raises(ValueError, match=r"limit must be a non-negative integer or None, not True"):
        read_parallel(Path(model_dir).parent, "test", limit=True)  # not one pair
    one = translate(model, tokenizer, ["Ein Hund läuft."], num_beams=1)
    assert len(one) == 1 and one == translate(model, tokenizer, ("Ein Hund läuft.",), num_beams=1)


def test_translate_refuses_binary_endless_and_overlong_input_at_once(monkeypatch, capsys, model_dir, tmp_path):
    from prunetrain.cli import translation as command

    assert_one_line(run_main(monkeypatch, capsys, "translate", model_dir, "--input", "-", stdin=b"Ein Hund\n\0\0\0"),
                    r"--input: stdin: line 2 holds a NUL byte; the input is binary")
    assert_one_line(run_main(monkeypatch, capsys, "translate", model_dir, "--input", "/dev/zero"),
                    r"--input: '/dev/zero' is a device, not a regular file\.$")
    with open("/dev/zero", "rb") as zeros:  # an endless stream of NUL bytes: refused at its first line
        with pytest.raises(ValueError, match=r"^--input: stdin: line 1 holds a NUL byte"):
            command.read_input_lines(zeros, "--input: stdin")

    class Endless(io.RawIOBase):  # an endless stream of ordinary lines (`yes | prunetrain translate ...`)
        def readable(self):
            return True

        def readinto(self, buffer):
            data = b"Ein Hund.\n" * (len(buffer) // 10)
            buffer[:len(data)] = data
            return len(data)

    data = tmp_path / "data"  # a corpus file holding a NUL byte is binary: evaluate refuses it, naming the line
    data.mkdir()
    (data / "test.de").write_bytes(b"Ein Hund.\nZwei\0Katzen.\n")
    (data / "test.en").write_bytes(b"A dog.\nTwo cats.\n")
    assert_one_line(run_main(monkeypatch, capsys, "evaluate", model_dir, "--data-dir", data),
                    r"read_parallel: .*test.de holds a NUL byte \(line 2\); it is binary")
    monkeypatch.setattr(command, "MAX_INPUT_BYTES", 10_000)
    with pytest.raises(ValueError, match=r"^--input: stdin: more than 0 MiB of input \(at line 1001\); translate it "
                                         r"in parts\.$"):
        command.read_input_lines(io.BufferedReader(Endless()), "--input: stdin")
    monkeypatch.setattr(command, "MAX_LINE_BYTES", 100)
    (tmp_path / "long.txt").write_bytes(b"Ein Hund.\n" + b"x" * 101 + b"\n")
    assert_one_line(run_main(monkeypatch, capsys, "translate", model_dir, "--input", tmp_path / "long.txt"),
                    r"--input: .*long.txt: line 2 is longer than 100 bytes; give one sentence per line\.$")
    (tmp_path / "fits.txt").write_bytes(b"x" * 99 + b"\n" + b"y" * 100)  # at the limit, with and without "\n"
    assert command.read_input_lines(open(tmp_path / "fits.txt", "rb"), "f") == ["x" * 99, "y" * 100]


# ---------------------------------------------------------------------------------------------------------------------
# head layouts: original head indices, ints, each once, increasing, within the site
# ---------------------------------------------------------------------------------------------------------------------
SITE = "model.encoder.layers.0.self_attn"


@pytest.mark.parametrize("kept, message", [
    (["0"], r"keeps head '0', which is not an index in 0..3"),
    ([0.9], r"keeps head 0.9, which is not an index in 0..3"),
    ([True], r"keeps head True, which is not an index"),
    ([4], r"keeps head 4, which is not an index in 0..3"),
    ([-1], r"keeps head -1, which is not an index"),
    ([0, 0], r"keeps heads \[0, 0\]; give each index once, in increasing order"),
    ([2, 1], r"keeps heads \[2, 1\]; give each index once, in increasing order"),
    ("01", r"keeps '01', which is not a list of head indices"),
    (1, r"keeps 1, which is not a list of head indices"),
])
def test_shrink_to_layout_refuses_a_head_list_that_is_not_one(kept, message):
    from prunetrain.engine.persist import shrink_to_layout

    model = tiny_model("marian")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=rf"^layout: site '{SITE}' {message}"):
        shrink_to_layout(model, {SITE: kept})
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # nothing was cut


def test_shrink_to_layout_refuses_a_record_that_is_not_a_mapping_and_keeps_good_ones():
    from prunetrain.engine.persist import shrink_to_layout

    model = tiny_model("marian")
    with pytest.raises(ValueError, match=r"^layout: \[\[0, 1\]\] is not a mapping"):
        shrink_to_layout(model, [[0, 1]])
    layout = shrink_to_layout(model, {SITE: [1, 3], "model.decoder.layers.0.self_attn": []})
    assert layout[SITE].heads == (1, 3) and layout["model.decoder.layers.0.self_attn"].num_heads == 0
    assert shrink_to_layout(model, {SITE: (1, 3)})[SITE].heads == (1, 3)  # the same record again: nothing to do


def test_restore_layout_refuses_a_checkpoint_whose_head_list_repeats(tmp_path):
    model = tiny_model("marian")
    model.config.prunetrain_heads = {SITE: [0, 0]}
    model.config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=rf"^checkpoint: .* does not fit this model \(layout: site '{SITE}' keeps "
                                         r"heads \[0, 0\]; give each index once"):
        pt.restore_layout(tiny_model("marian"), tmp_path)


# ---------------------------------------------------------------------------------------------------------------------
# JSON prunetrain reads: a key given twice is refused, not read as its last value
# ---------------------------------------------------------------------------------------------------------------------
def _duplicate_first_key(path: Path) -> None:
    """Rewrite the JSON object in `path` with its first key given twice (the second time with another value)."""
    text = path.read_text()
    data = json.loads(text)
    key = next(iter(data))
    path.write_text("{" + json.dumps(key) + ": " + json.dumps(data[key]) + ", " + text.lstrip()[1:])


def test_a_layout_or_config_with_a_duplicate_key_is_refused(tmp_path):
    from prunetrain.mt.run.init_architecture import read_layout

    model = tiny_model("marian")
    pt.shrink(model, pt.HeadMask.from_heads(model, {SITE: [0]}))
    pt.save_pruned(model, tmp_path / "pruned")
    layout = tmp_path / "pruned" / "prunetrain_layout.json"
    assert read_layout(tmp_path / "pruned").to_dict() == pt.find_heads(model).to_dict()
    shutil.copytree(tmp_path / "pruned", tmp_path / "twice")
    _duplicate_first_key(tmp_path / "twice" / "prunetrain_layout.json")
    with pytest.raises(ValueError, match=r"^pruning.init_layout: '.*twice/prunetrain_layout.json' names the key "
                                         r"'.*' twice; each key may appear once\.$"):
        read_layout(tmp_path / "twice")
    with pytest.raises(ValueError, match=r"^path: '.*twice/prunetrain_layout.json' names the key '.*' twice"):
        pt.load_pruned(tmp_path / "twice")
    shutil.copytree(tmp_path / "pruned", tmp_path / "config-twice")
    _duplicate_first_key(tmp_path / "config-twice" / "config.json")
    with pytest.raises(ValueError, match=r"^path: '.*config-twice/config.json' names the key '.*' twice"):
        pt.load_pruned(tmp_path / "config-twice")
    with pytest.raises(ValueError, match=r"^checkpoint: '.*config-twice/config.json' names the key '.*' twice"):
        pt.restore_layout(tiny_model("marian"), tmp_path / "config-twice")
    assert layout.is_file() and pt.load_pruned(tmp_path / "pruned") is not None


def test_saved_scores_and_callback_state_with_a_duplicate_key_are_refused(tmp_path):
    from prunetrain.methods.importance import HeadScores, random_scores
    from prunetrain.training.state import load_callback_state, save_callback_state

    scores = random_scores(tiny_model("marian"), seed=0)
    scores.to_json(tmp_path / "scores.json")
    assert HeadScores.from_json(tmp_path / "scores.json").to_dict() == scores.to_dict()
    _duplicate_first_key(tmp_path / "scores.json")
    with pytest.raises(ValueError, match=r"^scores: '.*scores.json' names the key '.*' twice"):
        HeadScores.from_json(tmp_path / "scores.json")
    save_callback_state(tmp_path / "checkpoint-3", "pruning", {"step": 3, "loss": math.nan}, {})
    data, _ = load_callback_state(tmp_path / "checkpoint-3", "pruning", "HeadPruningCallback")
    assert data["step"] == 3 and math.isnan(data["loss"])  # json.dumps wrote NaN: still read
    _duplicate_first_key(tmp_path / "checkpoint-3" / "prunetrain-pruning.json")
    with pytest.raises(ValueError, match=r"^resume: '.*prunetrain-pruning.json' names the key 'step' twice"):
        load_callback_state(tmp_path / "checkpoint-3", "pruning", "HeadPruningCallback")


# ---------------------------------------------------------------------------------------------------------------------
# compare: one label per run, names that cannot break a table, damaged results named in one sentence
# ---------------------------------------------------------------------------------------------------------------------
def _results(seed: int, bleu: float) -> dict:
    """The fields of a finished recipe run's results.json that `prunetrain compare` reads."""
    return {"recipe": {"train": {"seed": seed}}, "heads_kept": 10, "steps": 20, "train_step_minutes": 1.0,
            "train_minutes": 1.2, "total_minutes": 2.0, "parameters_final": 1000, "kept_per_kind": {"cross": 10},
            "test_pruned": {"bleu": bleu, "chrf": 40.0, "num_beams": 1, "sentences_per_second": 10.0},
            "bleu_over_training": [{"step": 10, "step_seconds": 30.0, "bleu": bleu - 1, "heads": 10},
                                   {"step": 20, "step_seconds": 60.0, "bleu": bleu, "heads": 10}],
            "step_rate": [{"from_step": 0, "to_step": 20, "heads": 10, "steps_per_second": 0.3}],
            "pruning_events": []}


@pytest.fixture
def three_runs(tmp_path) -> list[Path]:
    runs = []
    for index, (seed, bleu) in enumerate([(1, 20.0), (1, 21.0), (2, 22.0)]):
        run = tmp_path / f"run{index}"
        run.mkdir()
        (run / "results.json").write_text(json.dumps(_results(seed, bleu)))
        runs.append(run)
    return runs


def test_compare_never_drops_a_run_whose_label_collides(monkeypatch, capsys, three_runs, tmp_path):
    for names, pattern in [("x (seed 1),x,x", r"names: runs 1 and 2 would both be shown as 'x \(seed 1\)'"),
                           ("", r"names: \[''\] must give one name per run \(3 runs\)"),
                           ("a,b", r"names: \['a', 'b'\] must give one name per run")]:
        assert_one_line(run_main(monkeypatch, capsys, "compare", *three_runs, "--names", names, "--output",
                                 tmp_path / "out"), pattern)
        assert not (tmp_path / "out").exists()
    from prunetrain.mt.comparison.compare import write_comparison

    for runs, kwargs, message in [(three_runs[:2], {"names": ["a\nb", "c"]}, r"^names: 'a\\nb' holds a line break"),
                                  (three_runs[:2], {"samples": True}, r"^samples: True is not allowed"),
                                  (str(three_runs[0]), {}, r"^runs: '.*run0' is one path; give a list")]:
        with pytest.raises(ValueError, match=message):
            write_comparison(runs, tmp_path / "out", **kwargs)
    for names, labels in [("x,y (seed 1),y", ["x", "y (seed 1)", "y"]), ("x,y,y", ["x", "y (seed 1)", "y (seed 2)"])]:
        shutil.rmtree(tmp_path / "out", ignore_errors=True)
        code, _, err = run_main(monkeypatch, capsys, "compare", *three_runs, "--names", names, "--output",
                                tmp_path / "out")
        assert code == 0, err
        data = json.loads((tmp_path / "out" / "compare.json").read_text())
        assert [r["run"] for r in data["runs"]] == labels  # every run, each under its own label


def test_compare_escapes_a_bar_in_a_name(monkeypatch, capsys, three_runs, tmp_path):
    code, _, err = run_main(monkeypatch, capsys, "compare", *three_runs, "--names", "a|b,c,_d $x",
                            "--output", tmp_path / "out")
    assert code == 0, err
    markdown = (tmp_path / "out" / "compare.md").read_text()
    rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    header_cells = {line.count(" | ") for line in rows if line.startswith("| run |") or line.startswith("| arm |")}
    assert rows and header_cells
    for line in rows:  # every row has as many cells as the header of its table: an escaped bar splits none
        assert line.replace("\\|", "").count("|") in {n + 2 for n in header_cells}, line
    assert "| a\\|b |" in markdown and (tmp_path / "out" / "compare.png").is_file()


@pytest.mark.parametrize("change, pattern", [
    (lambda r: r.pop("test_pruned"), r"field 'test_pruned' is missing"),
    (lambda r: r.update(heads_kept="10"), r"field 'heads_kept' is '10', not an integer"),
    (lambda r: r["test_pruned"].update(bleu=None), r"field 'test_pruned.bleu' is missing"),
    (lambda r: r["bleu_over_training"][1].pop("step_seconds"), r"field 'bleu_over_training\[1\].step_seconds' is "
                                                               r"missing"),
    (lambda r: r.update(bleu_over_training=[]), r"field 'bleu_over_training' holds no record"),
    (lambda r: r.update(steps="many"), r"field 'steps' is 'many', not a number"),
    (lambda r: r["step_rate"][0].update(steps_per_second="fast"), r"field 'step_rate\[0\].steps_per_second' is "
                                                                  r"'fast', not a number"),
    (lambda r: r.update(pruning_events=[{"step": 3}]), r"field 'pruning_events\[0\].per_kind_before' is missing"),
    (lambda r: r.update(recipe=[1]), r"field 'recipe' is \[1\], not an object"),
])
def test_compare_names_a_missing_or_mistyped_field_in_one_sentence(monkeypatch, capsys, three_runs, tmp_path,
                                                                    change, pattern):
    results = _results(2, 22.0)
    change(results)
    (three_runs[2] / "results.json").write_text(json.dumps(results))
    assert_one_line(run_main(monkeypatch, capsys, "compare", three_runs[0], three_runs[2], "--output",
                             tmp_path / "out"), rf"run: '.*run2/results.json' {pattern}; the file is damaged or not "
                                                rf"the results.json of a finished recipe run\.$")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------------------------------
# importance / prune: a sentence longer than the model's positions is named before any work
# ---------------------------------------------------------------------------------------------------------------------
def test_importance_and_prune_refuse_a_sentence_longer_than_the_models_positions(monkeypatch, capsys, model_dir,
                                                                                  tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    sources, targets = ["Ein Hund läuft."] * 6, ["A dog runs."] * 6

    def write(split="valid"):
        (data / f"{split}.de").write_text("".join(line + "\n" for line in sources))
        (data / f"{split}.en").write_text("".join(line + "\n" for line in targets))

    write()
    code, _, err = run_main(monkeypatch, capsys, "importance", model_dir, "--data-dir", data)
    assert code == 0, err
    sources[2] = " ".join(["Ein Hund läuft."] * 8)  # over 64 tokens, under 128
    write()
    pattern = (r"--data-dir: line 3 of '.*valid.de' has \d+ tokens, more than the model's 64 positions "
               r"\(max_position_embeddings\); shorten or remove it\.$")
    assert_one_line(run_main(monkeypatch, capsys, "importance", model_dir, "--data-dir", data), pattern)
    assert_one_line(run_main(monkeypatch, capsys, "prune", model_dir, "--data-dir", data, "--amount", "0.5",
                             "--output", tmp_path / "pruned"), pattern)
    assert not (tmp_path / "pruned").exists()
    sources[2], targets[4] = "Ein Hund.", " ".join(["A dog runs."] * 400)  # cut at 128 tokens: still too long
    write()
    assert_one_line(run_main(monkeypatch, capsys, "importance", model_dir, "--data-dir", data),
                    r"line 5 of '.*valid.en' has 128 or more tokens, more than the model's 64 positions")


def test_a_curve_callback_refuses_a_metric_key_or_metric_of_the_wrong_kind():
    for kwargs, message in [({"metric": lambda model: 1.0, "metric_key": 3}, r"^metric_key: 3 is not allowed"),
                            ({"metric": lambda model: 1.0, "metric_key": ""}, r"^metric_key: '' is not allowed"),
                            ({"metric": "bleu"}, r"^metric: 'bleu' is not a callable model")]:
        with pytest.raises(ValueError, match=message):
            pt.PruningCurveCallback(Schedule(at_steps=[2]), **kwargs)


def test_a_comparison_that_fails_while_writing_leaves_nothing(tmp_path, monkeypatch):
    """compare writes into a staging directory renamed in whole: a failure part-way (here the Markdown table, after
    the figure and compare.json) leaves no output behind. Two real runs of the payoff study are compared."""
    import prunetrain.mt.comparison.compare as compare

    study = Path(__file__).resolve().parents[1] / "recipes/results/wmt-small-deen-study"
    runs = [study / "off-cooldown-s0", study / "small-steps-cooldown-s0"]

    def fail(comparison):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(compare, "comparison_markdown", fail)
    with pytest.raises(OSError):
        compare.write_comparison(runs, tmp_path / "out", samples=10)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    compare.write_comparison(runs, tmp_path / "out", samples=10)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".prunetrain-output.json", "compare.json",
                                                                  "compare.md", "compare.png"]
