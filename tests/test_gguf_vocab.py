"""The vocabulary a GGUF export writes is checked entry by entry before anything is written (issue 37): two tokens
sharing an id, a negative id, a malformed or unresolvable merge, added tokens that contradict the vocab, a
`tokenizer.json` that is a directory, ... are refused in one sentence naming the file and the entry. None of this
needs llama.cpp: the refusals come before its check (the write itself needs the `gguf` package only)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

import prunetrain as pt
from hostile import assert_one_line, run_main, tree
from prunetrain.export.formats import check_formats, export
from prunetrain.export.gguf_vocab import read_bpe_vocab
from prunetrain.zoo import tiny_model

SENTENCES = [f"{a} {b} the {c} near the {d}." for a in ("A dog", "Two cats", "The man", "A girl")
             for b in ("runs to", "looks at", "sits by") for c in ("red", "old", "small") for d in ("river", "house")]


EXTRA = 8


@pytest.fixture(scope="module")
def bpe():
    from tokenizers import ByteLevelBPETokenizer

    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(SENTENCES, vocab_size=300, min_frequency=2,
                                  special_tokens=["<s>", "<pad>", "</s>"], show_progress=False)
    return tokenizer


@pytest.fixture(scope="module")
def source(bpe, tmp_path_factory) -> Path:
    """A saved Llama whose directory carries the byte-level BPE tokenizer (the model's vocabulary 8 ids larger:
    ids the tokenizer never produces, written as unused placeholders)."""
    path = pt.save_pruned(tiny_model("llama", vocab_size=bpe.get_vocab_size() + EXTRA),
                          tmp_path_factory.mktemp("g") / "m")
    bpe.save(str(path / "tokenizer.json"))
    return path


@pytest.fixture
def copy_of(source, tmp_path):
    import shutil

    return Path(shutil.copytree(source, tmp_path / "src"))


def _edit(path: Path, change) -> None:
    data = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
    change(data)
    (path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")


def _vocab(data) -> dict:
    return data["model"]["vocab"]


def _share_id(data):
    _vocab(data)["Ġriver"] = _vocab(data)["Ġhouse"]


def _negative(data):
    _vocab(data)["Ġriver"] = -3


def _merges(data) -> list:
    return data["model"]["merges"]


def _set_merge(data, value):
    _merges(data)[5] = value


DAMAGE = {
    "two tokens share an id": (_share_id, r"gives the id \d+ to both 'Ġ\w+' and 'Ġ\w+' in model\.vocab; each id "
                                          r"names one token"),
    "a negative id": (_negative, r"gives the token 'Ġriver' the id -3 in model\.vocab; ids are whole numbers >= 0"),
    "a string id": (lambda d: _vocab(d).update({"Ġriver": "7"}), r"gives the token 'Ġriver' the id '7'"),
    "a boolean id": (lambda d: _vocab(d).update({"Ġriver": True}), r"gives the token 'Ġriver' the id True"),
    "a merge of three pieces": (lambda d: _set_merge(d, "Ġ t he"), r"has the merge 'Ġ t he' at model\.merges\[5\]; "
                                                                   r"a merge is two non-empty pieces without spaces"),
    "a merge of one piece": (lambda d: _set_merge(d, "Ġthe"), r"has the merge 'Ġthe' at model\.merges\[5\]"),
    "a merge with an empty piece": (lambda d: _set_merge(d, ["Ġ", ""]), r"has the merge \['Ġ', ''\] at model"),
    "a merge that is a number": (lambda d: _set_merge(d, 7), r"has the merge 7 at model\.merges\[5\]"),
    "a merge piece not in the vocab": (lambda d: _set_merge(d, "Ġzz q"), r"has the merge 'Ġzz q' at model\.merges"
                                                                         r"\[5\], but 'Ġzz' is not in model\.vocab"),
    "a merge whose result is not in the vocab": (lambda d: _set_merge(d, "r d"), r"has the merge 'r d' at model\."
                                                                                 r"merges\[5\], but 'rd' is not in"),
    "a repeated merge": (lambda d: _merges(d).append(_merges(d)[0]),
                         r"repeats the merge '.*' \(model\.merges\[0\] and \[\d+\]\); llama\.cpp and the tokenizers "
                         r"library would rank it differently"),
    "merges not a list": (lambda d: d["model"].update(merges="a b"), r"has model\.merges 'a b'; expected a list"),
    "vocab not an object": (lambda d: d["model"].update(vocab=["a"]), r"has model\.vocab \"\['a'\]\"; expected a "
                                                                      r"non-empty object"),
    "an empty vocab": (lambda d: d["model"].update(vocab={}, merges=[]), r"has model\.vocab '\{\}'; expected a "
                                                                         r"non-empty object"),
    "an added token taking a vocab token's id": (
        lambda d: d["added_tokens"].append({"id": _vocab(d)["Ġriver"], "content": "<extra>", "special": True}),
        r"gives the id \d+ to the added token '<extra>' \(added_tokens\[3\]\) and to 'Ġriver' in model\.vocab"),
    "an added token at another id than the vocab's": (
        lambda d: d["added_tokens"][0].update(id=_vocab(d)["Ġriver"]),
        r"gives the id \d+ to the added token '<s>' \(added_tokens\[0\]\) and to 'Ġriver'"),
    "an added token listed twice": (lambda d: d["added_tokens"].append(dict(d["added_tokens"][1])),
                                    r"lists the added token '<pad>' \(id 1\) twice in added_tokens"),
    "an added token with a negative id": (lambda d: d["added_tokens"][2].update(id=-1),
                                          r"has added_tokens\[2\] = .*; expected an object with a whole number id"),
    "added tokens not a list": (lambda d: d.update(added_tokens={"id": 0}), r"has added_tokens .*; expected a list"),
    "a model that is not an object": (lambda d: d.update(model="BPE"), r"cannot be written for llama\.cpp \(its "
                                                                       r"'model' is 'BPE', not a tokenizer model"),
    "a pre-tokenizer that is a list": (lambda d: d.update(pre_tokenizer=["ByteLevel"]),
                                       r"its pre-tokenizer is not GPT-2's byte-level split"),
    "a normalizer that is a string": (lambda d: d.update(normalizer="NFC"), r"it has a normalizer \('NFC'\)"),
    "a placeholder's name taken by a token": (
        lambda d: _vocab(d).update({f"[PAD{len(_vocab(d)) + 5}]": len(_vocab(d))}),
        r"holds the token '\[PAD(\d+)\]' at ids \d+ and \1"),
}


def _expect_refused(source: Path, tmp_path: Path, pattern: str) -> None:
    """check_formats names the problem for gguf; export refuses it and leaves nothing behind."""
    file = str(source / "tokenizer.json")
    reason = check_formats(source)["gguf"]
    assert reason is not None and reason.startswith(repr(file)), reason
    assert re.search(pattern, reason), reason
    before = tree(source)
    with pytest.raises(ValueError, match=r"^tokenizer: " + re.escape(repr(file)) + ".*" + pattern):
        export(source, tmp_path / "gguf", "gguf")
    assert not (tmp_path / "gguf").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".gguf")]
    assert tree(source) == before


def test_a_sound_byte_level_bpe_vocabulary_is_read_in_id_order(source, bpe):
    """The control: the tokenizer all damage below starts from passes, and its tokens are the tokenizer's."""
    size = bpe.get_vocab_size()
    vocab = read_bpe_vocab(source / "tokenizer.json", size + EXTRA)
    assert vocab["tokens"] == [bpe.id_to_token(i) for i in range(size)] + [f"[PAD{i}]" for i in range(size, size + 8)]
    assert vocab["token_types"] == [3, 3, 3] + [1] * (size - 3) + [5] * EXTRA
    assert len(vocab["merges"]) > 10 and all(len(m.split(" ")) == 2 for m in vocab["merges"])
    reason = check_formats(source)["gguf"]
    assert reason is None or "llama" in reason.lower(), reason  # only llama.cpp's absence may stand in the way


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_vocabulary_is_refused_naming_the_file_and_the_entry(copy_of, tmp_path, damage):
    change, pattern = DAMAGE[damage]
    _edit(copy_of, change)
    _expect_refused(copy_of, tmp_path, pattern)


def test_a_lone_surrogate_token_and_duplicate_json_keys_are_refused(copy_of, tmp_path):
    text = (copy_of / "tokenizer.json").read_text(encoding="utf-8")
    opening = re.search(r'"vocab":\s*\{', text).end()
    size = len(json.loads(text)["model"]["vocab"])
    for entry, pattern in ((f'"\\ud800": {size}, ', rf"holds the token '\\ud800' \(id {size}\), which is not valid "
                                                    rf"Unicode text"),
                           (f'"Ġhouse": {size}, ', r"names the key 'Ġhouse' twice")):
        (copy_of / "tokenizer.json").write_text(text[:opening] + entry + text[opening:], encoding="utf-8")
        _expect_refused(copy_of, tmp_path, pattern)


@pytest.mark.parametrize("kind", ["directory", "empty file", "json list", "dangling link", "link loop", "fifo"])
def test_a_tokenizer_json_that_is_not_a_json_object_file_is_refused(copy_of, tmp_path, kind):
    target = copy_of / "tokenizer.json"
    target.unlink()
    pattern = {"directory": r"is a directory, not a file", "empty file": r"is not valid JSON",
               "json list": r"holds JSON list, not an object", "dangling link": r"does not exist",
               "link loop": r"cannot be read \(Too many levels of symbolic links\)",
               "fifo": r"is a FIFO \(named pipe\), not a regular file"}[kind]
    if kind == "directory":
        target.mkdir()
        (target / "vocab.json").write_text("{}")
    elif kind == "empty file":
        target.write_text("")
    elif kind == "json list":
        target.write_text("[]")
    elif kind == "dangling link":
        target.symlink_to(copy_of / "nowhere.json")
    elif kind == "link loop":
        target.symlink_to(copy_of / "loop.json")
        (copy_of / "loop.json").symlink_to(target)
    else:
        os.mkfifo(target)
    reason = check_formats(copy_of)["gguf"]
    assert reason is not None and reason.startswith(repr(str(target))) and re.search(pattern, reason)
    with pytest.raises(ValueError, match=r"^tokenizer: .*tokenizer\.json.* " + pattern):
        export(copy_of, tmp_path / "gguf", "gguf")
    assert not (tmp_path / "gguf").exists()


@pytest.mark.llama  # run again where CI installs the llama extra, so this skip cannot hide
def test_the_writer_refuses_before_opening_the_file(copy_of, tmp_path):
    """write_gguf (the gguf package only, no llama.cpp) reads the vocabulary before it creates the file."""
    if os.environ.get("PRUNETRAIN_REQUIRE_LLAMA", "").lower() in ("1", "true", "yes"):
        import gguf  # noqa: F401  (an ImportError fails the test loudly)
    pytest.importorskip("gguf", reason="the gguf package is not installed (pip install 'prunetrain[llama]')")
    from prunetrain.engine.model_dir import load_model_dir
    from prunetrain.export.gguf import write_gguf

    model = load_model_dir(copy_of)
    sound = (copy_of / "tokenizer.json").read_bytes()
    _edit(copy_of, _negative)
    with pytest.raises(ValueError, match=r"gives the token 'Ġriver' the id -3"):
        write_gguf(model, tmp_path / "model.gguf", tokenizer_dir=copy_of)
    assert not (tmp_path / "model.gguf").exists()
    (copy_of / "tokenizer.json").write_bytes(sound)
    result = write_gguf(model, tmp_path / "model.gguf", tokenizer_dir=copy_of)  # the sound one is written
    import gguf

    reader = gguf.GGUFReader(str(tmp_path / "model.gguf"))
    tokens = reader.fields["tokenizer.ggml.tokens"]
    assert result["tokenizer"] == str(copy_of / "tokenizer.json") and len(tokens.data) == model.config.vocab_size


def test_cli_check_names_the_damaged_entry(monkeypatch, capsys, copy_of):
    _edit(copy_of, _share_id)
    code, out, err = run_main(monkeypatch, capsys, "export", copy_of, "--check")
    assert code == 0 and "Traceback" not in err, err
    gguf = json.loads(out)["formats"]["gguf"]
    assert gguf["possible"] is False and "in model.vocab; each id names one token" in gguf["why_not"], gguf
    from prunetrain.export.llama_cpp import llama_cpp_missing

    # the command checks for llama.cpp first (before loading the model); with it, the vocabulary is what it refuses
    pattern = (r"tokenizer: '.*tokenizer\.json' gives the id \d+ to both .* each id names one token"
               if llama_cpp_missing() is None else r"--format: gguf is checked in llama\.cpp")
    assert_one_line(run_main(monkeypatch, capsys, "export", copy_of, copy_of.parent / "g", "--format", "gguf"),
                    pattern)
    assert not (copy_of.parent / "g").exists()
