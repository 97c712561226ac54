"""Sequence-level distillation (`prunetrain.mt.text.sequence_distillation`, Kim & Rush 2016): the teacher translates
the training sources once; the translations are kept keyed by everything that decides them (a changed teacher,
tokenizer, setting or source list is never reused), an interrupted call continues where it stopped, the teacher is
left as it was given, and its cost is counted. Real parts: a tokenizer trained on Multi30k, a Marian teacher trained
briefly on it, transformers' `generate` and the CTranslate2 wheel, and a real compress recipe run."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import run_cli
from prunetrain.bench.flops import flop_counter
from prunetrain.mt.evaluation.translation import translate
from prunetrain.mt.text.sequence_distillation import (distilled_pairs, distilled_targets, length_ratio_outlier,
                                                      teacher_digest)
from test_ctranslate2 import _marian, train_briefly

SOURCES = 60


@pytest.fixture(scope="module")
def teacher(m30k_tokenizer, multi30k_train_slice):
    return train_briefly(_marian(m30k_tokenizer), m30k_tokenizer, multi30k_train_slice, steps=120)


@pytest.fixture(scope="module")
def sources(multi30k_train_slice):
    return [source for source, _ in multi30k_train_slice[1000:1000 + SOURCES]]


def _state(model):
    return {name: value.clone() for name, value in model.state_dict().items()}


def test_the_translations_are_the_teachers_and_are_read_back(teacher, m30k_tokenizer, sources, tmp_path):
    """The transformers engine gives exactly `translate`'s beam outputs; a second call reads every chunk back
    (nothing translated, the same translations and seconds); the teacher's weights, mode and flags are untouched."""
    teacher.train()  # a caller's mode and requires_grad are put back
    teacher.lm_head.weight.requires_grad_(True)
    before, rng = _state(teacher), torch.get_rng_state()
    made = distilled_targets(teacher, m30k_tokenizer, sources, tmp_path, num_beams=2, chunk_size=25,
                             max_new_tokens=30)
    assert torch.equal(torch.get_rng_state(), rng)  # in train mode too, nothing drew from the caller's stream
    assert made.translations == translate(teacher, m30k_tokenizer, sources, num_beams=2, max_new_tokens=30)
    record = made.record
    assert (record["sentences"], record["translated_now"], record["read_back"]) == (SOURCES, SOURCES, 0)
    assert isinstance(record["seconds"], float) and record["engine"] == "transformers" and record["num_beams"] == 2
    assert sorted(p.name for p in (tmp_path / record["key"]).iterdir()) == [
        "identity.json", "part-00000.json", "part-00001.json", "part-00002.json"]
    again = distilled_targets(teacher, m30k_tokenizer, sources, tmp_path, num_beams=2, chunk_size=25,
                              max_new_tokens=30)
    assert again.translations == made.translations
    assert (again.record["translated_now"], again.record["read_back"]) == (0, SOURCES)
    assert again.record["seconds"] == record["seconds"] and again.record["key"] == record["key"]
    assert teacher.training and teacher.lm_head.weight.requires_grad
    assert all(torch.equal(value, before[name]) for name, value in teacher.state_dict().items())
    teacher.eval()


def test_the_teachers_flops_are_k_beams_of_its_output_and_one_encoder(teacher, m30k_tokenizer, sources, tmp_path):
    """generation_flops_estimate = Σ F(k, S, T) − (k − 1)·E(S): F the teacher's forward FLOPs counted by torch's
    FlopCounterMode on k copies of the sentence and its translation, E its encoder's on the sentence (the estimate's
    definition, checked against counts)."""
    k = 3
    made = distilled_targets(teacher, m30k_tokenizer, sources[:4], tmp_path, num_beams=k, max_new_tokens=30)
    expected = 0
    for source, translation in zip(sources[:4], made.translations):
        batch = m30k_tokenizer([source] * k, text_target=[translation] * k, return_tensors="pt")
        counter = flop_counter()
        with counter, torch.no_grad():
            teacher(input_ids=batch["input_ids"], labels=batch["labels"])
        expected += int(counter.get_total_flops())
        counter = flop_counter()
        with counter, torch.no_grad():
            teacher.get_encoder()(input_ids=batch["input_ids"][:1])
        expected -= (k - 1) * int(counter.get_total_flops())
    assert made.record["generation_flops_estimate"] == expected > 0


def test_a_changed_teacher_setting_or_source_list_is_never_reused(teacher, m30k_tokenizer, sources, tmp_path):
    first = distilled_targets(teacher, m30k_tokenizer, sources[:10], tmp_path, num_beams=2, max_new_tokens=20)
    keys = {first.record["key"]}
    for changed in (dict(num_beams=3), dict(length_penalty=0.6), dict(max_new_tokens=21)):
        made = distilled_targets(teacher, m30k_tokenizer, sources[:10], tmp_path,
                                 **{"num_beams": 2, "max_new_tokens": 20, **changed})
        assert made.record["translated_now"] == 10, changed
        keys.add(made.record["key"])
    edited = sources[:9] + [sources[9] + " Hallo."]
    keys.add(distilled_targets(teacher, m30k_tokenizer, edited, tmp_path, num_beams=2,
                               max_new_tokens=20).record["key"])
    other = _marian(m30k_tokenizer)
    other.load_state_dict(teacher.state_dict())
    with torch.no_grad():
        other.lm_head.weight[0, 0] += 1e-6  # one weight, by a hair
    assert teacher_digest(other) != teacher_digest(teacher)
    made = distilled_targets(other, m30k_tokenizer, sources[:10], tmp_path, num_beams=2, max_new_tokens=20)
    assert made.record["translated_now"] == 10
    keys.add(made.record["key"])
    assert len(keys) == 6 and len(list(tmp_path.iterdir())) == 6
    # a directory whose identity is another's is refused, never read
    identity = tmp_path / first.record["key"] / "identity.json"
    held = json.loads(identity.read_text())
    identity.write_text(json.dumps({**held, "settings": {**held["settings"], "num_beams": 5}}))
    with pytest.raises(ValueError, match=r"^cache_dir: .* holds translations of another teacher, tokenizer, setting "
                                         r"or source list under the same key; remove it to translate again\.$"):
        distilled_targets(teacher, m30k_tokenizer, sources[:10], tmp_path, num_beams=2, max_new_tokens=20)


def test_an_interrupted_call_continues_at_the_first_missing_chunk(teacher, m30k_tokenizer, sources, tmp_path):
    whole = distilled_targets(teacher, m30k_tokenizer, sources, tmp_path / "whole", num_beams=2, chunk_size=20,
                              max_new_tokens=30)

    def stop_after_first(message):
        raise KeyboardInterrupt(message)

    with pytest.raises(KeyboardInterrupt, match="20 of 60"):
        distilled_targets(teacher, m30k_tokenizer, sources, tmp_path / "cut", num_beams=2, chunk_size=20,
                          max_new_tokens=30, progress=stop_after_first)
    directory = tmp_path / "cut" / whole.record["key"]
    assert sorted(p.name for p in directory.iterdir()) == ["identity.json", "part-00000.json"]  # no half file
    (directory / "part-00001.json.partial").write_text("")  # a stray file beside them is ignored
    lines = []
    resumed = distilled_targets(teacher, m30k_tokenizer, sources, tmp_path / "cut", num_beams=2, chunk_size=20,
                                max_new_tokens=30, progress=lines.append)
    assert resumed.translations == whole.translations
    assert (resumed.record["translated_now"], resumed.record["read_back"]) == (40, 20) and len(lines) == 2


def test_the_ctranslate2_engine_translates_with_the_teachers_export(teacher, m30k_tokenizer, sources, tmp_path):
    """engine="ctranslate2": the teacher exported (float32, checked exact) and translated by CTranslate2; its beam
    search is its own, so a few outputs may differ from `generate`'s, most do not."""
    made = distilled_targets(teacher, m30k_tokenizer, sources, tmp_path, num_beams=2, max_new_tokens=30,
                             engine="ctranslate2")
    torch_made = translate(teacher, m30k_tokenizer, sources, num_beams=2, max_new_tokens=30)
    same = sum(a == b for a, b in zip(made.translations, torch_made))
    assert same >= 0.9 * SOURCES, (same, SOURCES)
    assert made.record["engine"] == "ctranslate2" and made.record["generation_flops_estimate"] > 0
    assert not any(p.name.startswith("prunetrain-teacher-") for p in tmp_path.iterdir())


def test_distilled_pairs_and_the_refusals(teacher, m30k_tokenizer, sources, tmp_path):
    pairs = [("a", "A"), ("b", "B")]
    assert distilled_pairs(pairs, ["x", "y"]) == [("a", "x"), ("b", "y")]
    assert distilled_pairs(pairs, ["x", "y"], "both") == [("a", "A"), ("b", "B"), ("a", "x"), ("b", "y")]
    assert distilled_pairs(pairs, ["x", "y"], "references") == pairs
    # the length-ratio filter: the teacher's pairs out of proportion to their sources go, the references stay
    sentences = [("ein Hund", "a dog"), ("zwei Männer laufen", "two men run"), ("ein Mann", "a man")]
    looped = ["a dog", "two men " * 6, ""]  # 12 words for 3 (ratio 4); an empty output is always out of proportion
    assert length_ratio_outlier("zwei Männer laufen", looped[1], 3.9) and not length_ratio_outlier(
        "zwei Männer laufen", looped[1], 4.0)
    assert distilled_pairs(sentences, looped, "teacher", max_length_ratio=3.0) == [("ein Hund", "a dog")]
    assert distilled_pairs(sentences, looped, "teacher", max_length_ratio=4.0) == [
        ("ein Hund", "a dog"), ("zwei Männer laufen", looped[1])]
    assert length_ratio_outlier("", "a", 1.0) is False and length_ratio_outlier("Hund", "", 100.0) is True
    assert distilled_pairs(sentences, looped, "both", max_length_ratio=3.0) == [*sentences, ("ein Hund", "a dog")]
    assert len(distilled_pairs(sentences, looped, "teacher")) == 3  # None: every translation
    cases = [
        (lambda: distilled_pairs(pairs, ["x"]), r"^translations: 1 translations for 2 pairs"),
        (lambda: distilled_pairs(pairs, ["x", "y"], "teachers"), r"^targets: 'teachers'"),
        (lambda: distilled_pairs(pairs, ["x", "y"], max_length_ratio=0.5), r"^max_length_ratio: 0.5 is not allowed"),
        (lambda: distilled_pairs(pairs, ["x", "y"], max_length_ratio=True), r"^max_length_ratio: True"),
        (lambda: distilled_targets(teacher, m30k_tokenizer, sources, tmp_path, num_beams=0), r"^num_beams: 0 "),
        (lambda: distilled_targets(teacher, m30k_tokenizer, sources, tmp_path, num_beams=True), r"^num_beams: True"),
        (lambda: distilled_targets(teacher, m30k_tokenizer, sources, tmp_path, engine="fairseq"), r"^engine: 'fairseq'"),
        (lambda: distilled_targets(teacher, m30k_tokenizer, "Ein Satz.", tmp_path), r"^sources: "),
        (lambda: distilled_targets(teacher, m30k_tokenizer, sources, tmp_path, engine="ctranslate2",
                                   autocast_bf16=True), r"^autocast_bf16: True is for engine='transformers'"),
        (lambda: distilled_targets(torch.nn.Linear(2, 2), m30k_tokenizer, sources, tmp_path),
         r"^teacher: Linear is not an encoder-decoder model"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message) as refused:
            call()
        assert "\n" not in str(refused.value)
    import prunetrain as pt

    mask = pt.HeadMask.ones(teacher)
    with mask.applied(teacher):
        with pytest.raises(ValueError, match=r"^teacher: it has attached head or neuron masks; shrink it first"):
            distilled_targets(teacher, m30k_tokenizer, sources, tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written by a refused call


def test_the_recipe_refuses_sequence_level_distillation_without_a_teacher():
    from prunetrain.mt.config.recipe import load_recipe

    with pytest.raises(ValueError, match=r"^distill.targets: 'teacher' trains on a teacher's translations, but there "
                                         r"is no teacher"):
        load_recipe("wmt-small-deen", ["distill.targets=teacher"])
    for key, value, message in (("targets", "teachers", r"^distill.targets: 'teachers'"),
                                ("beams", "0", r"^distill.beams: 0"), ("engine", "fairseq", r"^distill.engine: ")):
        with pytest.raises(ValueError, match=message):
            load_recipe("wmt-small-deen-compress", [f"distill.{key}={value}"])
    with pytest.raises(ValueError, match=r"^distill.max_length_ratio: 0.5 is not allowed; expected a finite number "
                                         r"in \[1, inf\)\.$"):
        load_recipe("wmt-small-deen-compress", ["distill.targets=teacher", "distill.max_length_ratio=0.5"])
    with pytest.raises(ValueError, match=r"^distill.max_length_ratio: 3.0 filters the teacher's translations, which "
                                         r"distill.targets='references' does not train on; set distill.targets"):
        load_recipe("wmt-small-deen-compress", ["distill.max_length_ratio=3.0"])
    load_recipe("wmt-small-deen-compress", ["distill.targets=teacher", "distill.alpha=0"])  # seq-KD alone
    load_recipe("wmt-small-deen", ["distill.targets=both", "distill.teacher=x"])  # a trained teacher, no KL


@pytest.mark.slow
def test_the_compress_recipe_trains_on_the_teachers_translations(full_smoke_run, multi30k_dir, tmp_path):
    """`distill.targets=both` with `distill.alpha=0`: the starting model translates the 1000 training sources in
    CTranslate2, kept in the run; the run trains on references and translations (2000 pairs), records the
    teacher's cost and reports it; the kept translations are the starting model's (read back by the library)."""
    from prunetrain.mt.evaluation.translation import load_translation_model
    from prunetrain.mt.text.data import load_tokenizer, read_parallel

    source, made = full_smoke_run
    assert made.returncode == 0, made.stderr[-3000:]
    out = tmp_path / "run"
    result = run_cli("recipe", "wmt-small-deen-compress", "--smoke", "--set", f"model.init_from={source}",
                     "--set", "distill.targets=both", "--set", "distill.alpha=0", "--set", "distill.beams=2",
                     "--set", "distill.max_length_ratio=1.5", "--set", "eval.bench=false", "--data-dir", multi30k_dir,
                     "--output", out)
    assert result.returncode == 0, result.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    seq = results["sequence_distillation"]
    assert (seq["targets"], seq["engine"], seq["num_beams"], seq["sentences"]) == ("both", "ctranslate2", 2, 1000)
    assert seq["translated_now"] == 1000 and isinstance(seq["seconds"], float) and seq["generation_flops_estimate"] > 0
    assert "distillation" not in results  # no word-level term (alpha 0)
    assert "the run trains on the references and its translations (" in result.stderr
    report = (out / "report.md").read_text()
    assert "## Sequence-level distillation" in report and "the references and the teacher's translations" in report
    teacher = load_translation_model(source / "full")
    tokenizer = load_tokenizer(out / "tokenizer")
    sources = [s for s, _ in read_parallel(multi30k_dir, "train", limit=1000)]
    again = distilled_targets(teacher, tokenizer, sources, out / "prunetrain" / "teacher_translations",
                              num_beams=2, engine="ctranslate2")
    assert again.record["key"] == seq["key"] and again.record["read_back"] == 1000
    # distill.max_length_ratio=1.5: the translations out of proportion to their sources were left out, the
    # references kept (the smoke model's translations are far from its sources' lengths: some go, some stay)
    outliers = sum(length_ratio_outlier(s, t, 1.5) for s, t in zip(sources, again.translations))
    assert 0 < outliers < 1000 and seq["left_out_by_length_ratio"] == outliers, (outliers, seq)
    assert seq["training_pairs"] == 2000 - outliers and seq["max_length_ratio"] == 1.5
    assert f"{outliers} of them were left out for a length out of proportion" in report
