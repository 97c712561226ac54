"""Translation data pipeline: reading parallel text (and rejecting corrupt input), the joint byte-level BPE
tokenizer, datasets, collation, token-budget batching and the Marian configs. Real Multi30k data, real tokenizers."""

from __future__ import annotations

import time

import pytest
import torch

from prunetrain.mt.text.data import (EOS_ID, PAD_ID, UNK_ID, Seq2SeqDataset, TokenBudgetBatchSampler, available_splits,
                                     build_dataset, default_data_dir, load_tokenizer, make_collator, marian_config_base,
                                     marian_config_small, read_parallel, token_budget_dataloader, train_tokenizer, )




def _write(directory, name, data: bytes | str):
    path = directory / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


# reading --------------------------------------------------------------------------------------------------------
def test_read_multi30k_splits(multi30k_dir):
    train = read_parallel(multi30k_dir, "train")
    assert len(train) == 29_000
    assert train[0] == ("Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
                        "Two young, White males are outside near many bushes.")
    assert len(read_parallel(multi30k_dir, "valid")) == 1014
    assert len(read_parallel(multi30k_dir, "test")) == 1000
    assert read_parallel(multi30k_dir, "train", limit=3) == train[:3]
    # only line terminators are stripped: the upstream TAB inside German train line 7366 survives
    assert "\t" in train[7365][0]
    assert all(not s.endswith("\n") for pair in train for s in pair)
    assert {"train", "valid", "test", "test_2017_flickr", "test_2017_mscoco"} <= set(available_splits(multi30k_dir))
    en_de = read_parallel(multi30k_dir, "valid", src="en", tgt="de", limit=2)
    assert en_de == [(b, a) for a, b in read_parallel(multi30k_dir, "valid", limit=2)]


def test_default_data_dir_is_next_to_the_repo_and_overridable(monkeypatch, data_dir, tmp_path):
    monkeypatch.delenv("PRUNETRAIN_DATA", raising=False)
    assert default_data_dir().resolve().parent.name == "shared"
    monkeypatch.setenv("PRUNETRAIN_DATA", str(tmp_path))
    assert default_data_dir() == tmp_path


def test_keeps_inner_whitespace_and_crlf_terminators(tmp_path):
    _write(tmp_path, "train.de", "  ein  Hund \r\nzwei\u2028Katzen\n")  # U+2028 is not a line break here
    _write(tmp_path, "train.en", "  a  dog \r\ntwo cats")  # no final newline
    assert read_parallel(tmp_path, "train") == [("  ein  Hund ", "  a  dog "), ("zwei\u2028Katzen", "two cats")]


def test_different_line_counts_name_both_files_and_counts(tmp_path):
    _write(tmp_path, "train.de", "a\nb\nc\n")
    _write(tmp_path, "train.en", "a\nb\n")
    with pytest.raises(ValueError, match=r"train\.de has 3 lines but .*train\.en has 2 lines"):
        read_parallel(tmp_path, "train")


def test_empty_file_is_named(tmp_path):
    _write(tmp_path, "valid.de", "a\n")
    _write(tmp_path, "valid.en", b"")
    with pytest.raises(ValueError, match=r"valid\.en is empty"):
        read_parallel(tmp_path, "valid")


def test_invalid_utf8_gives_file_byte_offset_and_line(tmp_path):
    _write(tmp_path, "test.de", "gut\nauch gut\nschlecht: ".encode() + b"\xff\xfe" + b" hier\n")
    _write(tmp_path, "test.en", "good\nalso good\nbad here\n")
    with pytest.raises(ValueError, match=r"test\.de is not valid UTF-8: byte offset 23 \(line 3\)"):
        read_parallel(tmp_path, "test")


def test_missing_split_lists_the_splits_that_exist(tmp_path):
    for split in ("train", "valid"):
        _write(tmp_path, f"{split}.de", "a\n")
        _write(tmp_path, f"{split}.en", "a\n")
    _write(tmp_path, "orphan.de", "a\n")  # no orphan.en: not a split
    with pytest.raises(ValueError, match=r"test\.de does not exist; splits .* in .*: train, valid\.$"):
        read_parallel(tmp_path, "test")
    with pytest.raises(ValueError, match=r"orphan\.en does not exist"):
        read_parallel(tmp_path, "orphan")
    with pytest.raises(ValueError, match=r"directory .*nowhere does not exist"):
        read_parallel(tmp_path / "nowhere", "train")


# tokenizer ------------------------------------------------------------------------------------------------------
def test_tokenizer_trains_fast_and_has_fixed_special_ids(multi30k_train_slice, tmp_path):
    start = time.perf_counter()
    tokenizer = train_tokenizer(multi30k_train_slice, vocab_size=2000, path=tmp_path)
    assert time.perf_counter() - start < 20  # about 0.2 s on an idle 2-core CPU
    assert len(tokenizer) == 2000
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (PAD_ID, EOS_ID, UNK_ID)
    assert (PAD_ID, EOS_ID, UNK_ID) == (0, 1, 2)
    assert tokenizer.convert_ids_to_tokens([0, 1, 2]) == ["<pad>", "</s>", "<unk>"]
    assert tokenizer.bos_token_id is None
    ids = tokenizer("Ein Hund läuft.")["input_ids"]
    assert ids[-1] == EOS_ID and EOS_ID not in ids[:-1] and PAD_ID not in ids
    assert (tmp_path / "tokenizer.json").is_file() and (tmp_path / "tokenizer_config.json").is_file()


def test_tokenizer_is_deterministic(multi30k_train_slice):
    a = train_tokenizer(multi30k_train_slice[:500], vocab_size=1000)
    b = train_tokenizer(multi30k_train_slice[:500], vocab_size=1000)
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()


def test_round_trip_is_lossless_on_multi30k(m30k_tokenizer, multi30k_dir):
    """decode(encode(s)) == s, also for held-out sentences and characters never seen in training (byte-level)."""
    sentences = [s for pair in read_parallel(multi30k_dir, "test_2017_mscoco") for s in pair]
    sentences += [s for pair in read_parallel(multi30k_dir, "valid", limit=300) for s in pair]
    sentences += ["Ein Kätzchen – «très» ½ naïve 東京 🐕 …", "tab\tinside",
                  "double  space, trailing space "]
    encoded = m30k_tokenizer(sentences)["input_ids"]
    assert all(UNK_ID not in ids for ids in encoded)
    decoded = m30k_tokenizer.batch_decode(encoded, skip_special_tokens=True)
    # documented normalisation: leading whitespace is dropped (test_2017_mscoco.de line 104 starts with a space)
    assert [d for d, s in zip(decoded, sentences) if d != s.lstrip()] == []
    assert sum(d != s for d, s in zip(decoded, sentences)) == 1
    # and Unicode NFC
    assert m30k_tokenizer.decode(m30k_tokenizer("Ma\u0308dchen")["input_ids"], skip_special_tokens=True) == "Mädchen"
    assert m30k_tokenizer.decode(m30k_tokenizer("  leading")["input_ids"], skip_special_tokens=True) == "leading"


def test_saved_tokenizer_reloads_offline_with_identical_ids(multi30k_train_slice, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = train_tokenizer(multi30k_train_slice, vocab_size=2000, path=tmp_path)
    sentences = [s for pair in multi30k_train_slice[:200] for s in pair]
    expected = tokenizer(sentences)["input_ids"]
    for reloaded in (load_tokenizer(tmp_path), AutoTokenizer.from_pretrained(tmp_path)):
        assert reloaded(sentences)["input_ids"] == expected
        assert (reloaded.pad_token_id, reloaded.eos_token_id, reloaded.unk_token_id) == (PAD_ID, EOS_ID, UNK_ID)
        assert reloaded.batch_decode(expected, skip_special_tokens=True) == sentences


def test_bad_tokenizer_arguments():
    with pytest.raises(ValueError, match="vocab_size 100 is too small"):
        train_tokenizer([("a", "b")], vocab_size=100)
    with pytest.raises(ValueError, match="no sentence pairs"):
        train_tokenizer([], vocab_size=1000)
    with pytest.raises(ValueError, match="has no tokenizer.json"):
        load_tokenizer("/nonexistent/tokenizer")


# datasets and batching ------------------------------------------------------------------------------------------
def test_dataset_truncates_keeping_eos(m30k_tokenizer, multi30k_train_slice):
    pairs = multi30k_train_slice[:300]
    full = build_dataset(pairs, m30k_tokenizer, max_length=256)
    short = build_dataset(pairs, m30k_tokenizer, max_length=8, max_target_length=6)
    assert len(full) == len(short) == 300
    assert set(full[0]) == {"input_ids", "labels"}
    assert full[0]["input_ids"] == m30k_tokenizer(pairs[0][0])["input_ids"]
    assert max(full.source_lengths) > 8 and max(short.source_lengths) == 8 and max(short.target_lengths) == 6
    assert all(x["input_ids"][-1] == EOS_ID and x["labels"][-1] == EOS_ID for x in short)
    assert all(short[i]["input_ids"][:-1] == full[i]["input_ids"][:7] for i in range(300)
               if len(full[i]["input_ids"]) > 8)


def test_collator_pads_and_builds_decoder_inputs(m30k_tokenizer, multi30k_train_slice):
    from transformers import MarianMTModel

    dataset = build_dataset(multi30k_train_slice[:4], m30k_tokenizer)
    config = marian_config_small(m30k_tokenizer, d_model=32, ffn_dim=64, layers=1, heads=4)
    model = MarianMTModel(config)
    batch = make_collator(m30k_tokenizer, model)([dataset[i] for i in range(4)])
    lengths = dataset.source_lengths
    assert batch["input_ids"].shape == (4, max(lengths))
    assert batch["attention_mask"].sum(1).tolist() == lengths
    shortest = min(range(4), key=lengths.__getitem__)
    assert (batch["input_ids"][shortest, lengths[shortest]:] == PAD_ID).all()
    labels = batch["labels"]
    assert (labels == -100).sum() == labels.numel() - sum(dataset.target_lengths)
    # decoder inputs: decoder start (= pad) then the labels shifted right
    assert (batch["decoder_input_ids"][:, 0] == PAD_ID).all()
    first = dataset[0]["labels"]
    assert batch["decoder_input_ids"][0, 1:len(first)].tolist() == first[:-1]
    loss = model(**batch).loss
    assert torch.isfinite(loss)


def test_token_budget_batches_cover_every_example_once_within_budget(m30k_tokenizer, multi30k_train_slice):
    dataset = build_dataset(multi30k_train_slice, m30k_tokenizer)
    sampler = TokenBudgetBatchSampler(dataset.lengths, max_tokens=600, seed=1)
    epochs = [list(sampler), list(sampler)]
    for batches in epochs:
        assert len(batches) == len(sampler)
        assert sorted(i for b in batches for i in b) == list(range(len(dataset)))
        assert all(len(b) * max(dataset.lengths[i] for i in b) <= 600 for b in batches)
    assert epochs[0] != epochs[1]  # reshuffled each epoch
    sampler.set_epoch(0)
    assert list(sampler) == epochs[0]  # reproducible
    padded = sum(len(b) * max(dataset.lengths[i] for i in b) for b in epochs[0])
    assert padded < 1.1 * sum(dataset.lengths)  # length-sorted batches hold little padding
    unshuffled = TokenBudgetBatchSampler([5, 1, 700, 3], max_tokens=10, shuffle=False)
    assert list(unshuffled) == [[1, 3], [0], [2]]  # an over-long example gets its own batch


def test_token_budget_dataloader_yields_model_batches(m30k_tokenizer, multi30k_train_slice):
    dataset = build_dataset(multi30k_train_slice[:200], m30k_tokenizer)
    loader = token_budget_dataloader(dataset, make_collator(m30k_tokenizer), max_tokens=512)
    batches = list(loader)
    assert sum(b["input_ids"].shape[0] for b in batches) == 200
    assert all(b["input_ids"].numel() <= 512 and b["labels"].shape[0] == b["input_ids"].shape[0] for b in batches)


@pytest.mark.parametrize("batching", ["group_by_length", "token_budget"])
def test_seq2seq_trainer_trains_on_the_dataset(m30k_tokenizer, multi30k_train_slice, tmp_path, batching):
    from transformers import MarianMTModel, Seq2SeqTrainer, Seq2SeqTrainingArguments

    class TokenBudgetTrainer(Seq2SeqTrainer):
        def get_train_dataloader(self):
            loader = token_budget_dataloader(self.train_dataset, self.data_collator, max_tokens=400)
            return self.accelerator.prepare(loader)

    dataset = build_dataset(multi30k_train_slice[:200], m30k_tokenizer)
    torch.manual_seed(0)
    model = MarianMTModel(marian_config_small(m30k_tokenizer, d_model=32, ffn_dim=64, layers=1, heads=4))
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=16, max_steps=3, use_cpu=True, report_to=[],
        save_strategy="no", disable_tqdm=True, learning_rate=1e-3,
        train_sampling_strategy="group_by_length" if batching == "group_by_length" else "random")
    cls = TokenBudgetTrainer if batching == "token_budget" else Seq2SeqTrainer
    trainer = cls(model=model, args=args, train_dataset=dataset, data_collator=make_collator(m30k_tokenizer, model),
                  processing_class=m30k_tokenizer)
    result = trainer.train()
    assert result.global_step == 3 and torch.isfinite(torch.tensor(result.training_loss))


def test_seq2seq_dataset_rejects_misaligned_lists():
    with pytest.raises(ValueError, match="2 sources but 1 targets"):
        Seq2SeqDataset([[1], [1]], [[1]])


# configs --------------------------------------------------------------------------------------------------------
def test_marian_configs(m30k_tokenizer):
    small = marian_config_small(8000)
    assert (small.encoder_layers, small.decoder_layers) == (6, 6)
    assert (small.encoder_attention_heads, small.decoder_attention_heads) == (8, 8)
    assert (small.d_model, small.encoder_ffn_dim, small.decoder_ffn_dim) == (256, 1024, 1024)
    assert (small.pad_token_id, small.eos_token_id, small.decoder_start_token_id) == (PAD_ID, EOS_ID, PAD_ID)
    assert small.tie_word_embeddings and small.share_encoder_decoder_embeddings
    base = marian_config_base(8000)
    assert (base.d_model, base.encoder_ffn_dim, base.encoder_layers, base.encoder_attention_heads) == (512, 2048, 6, 8)
    from_tok = marian_config_small(m30k_tokenizer, attn_implementation="eager", layers=2)
    assert from_tok.vocab_size == len(m30k_tokenizer) == 2000 and from_tok.encoder_layers == 2
    assert from_tok._attn_implementation == "eager"


def test_small_marian_has_tied_embeddings_and_144_heads():
    import prunetrain as pt
    from transformers import MarianMTModel

    model = MarianMTModel(marian_config_small(8000))
    shared = model.model.shared.weight
    assert model.lm_head.weight is shared or model.lm_head.weight.data_ptr() == shared.data_ptr()
    assert model.model.encoder.embed_tokens.weight.data_ptr() == shared.data_ptr()
    assert model.model.decoder.embed_tokens.weight.data_ptr() == shared.data_ptr()
    assert 13.0e6 < sum(p.numel() for p in model.parameters()) < 13.6e6
    assert pt.find_heads(model).total_heads == 144


def test_collator_keeps_padded_labels_for_families_that_shift_in_place(m30k_tokenizer, multi30k_train_slice):
    """FSMT builds decoder inputs with an in-place shift that rewrites -100 to <pad>; the loss would then count
    padding. make_collator shifts a copy: labels keep -100, decoder inputs are FSMT's own."""
    from transformers import DataCollatorForSeq2Seq, FSMTConfig, FSMTForConditionalGeneration
    from transformers.models.fsmt.modeling_fsmt import shift_tokens_right

    dataset = build_dataset(multi30k_train_slice[:4], m30k_tokenizer)
    vocab = len(m30k_tokenizer)
    model = FSMTForConditionalGeneration(FSMTConfig(
        langs=["de", "en"], src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=16, encoder_layers=1,
        decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, pad_token_id=PAD_ID))
    features = [dataset[i] for i in range(4)]
    padding = sum(max(dataset.target_lengths) - n for n in dataset.target_lengths)
    assert padding > 0
    batch = make_collator(m30k_tokenizer, model)(features)
    assert int((batch["labels"] == -100).sum()) == padding
    expected = shift_tokens_right(batch["labels"].clone(), PAD_ID)
    assert torch.equal(batch["decoder_input_ids"], expected)
    plain = DataCollatorForSeq2Seq(m30k_tokenizer, model=model, label_pad_token_id=-100, return_tensors="pt")
    assert int((plain(features)["labels"] == -100).sum()) == 0  # what transformers' own collator leaves


def test_collate_batches_keeps_order_sizes_and_limit(m30k_tokenizer, multi30k_train_slice):
    from prunetrain.mt.text.data import collate_batches

    dataset = build_dataset(multi30k_train_slice[:10], m30k_tokenizer)
    collator = make_collator(m30k_tokenizer)
    batches = collate_batches(dataset, collator, 4)
    assert [len(b["input_ids"]) for b in batches] == [4, 4, 2]
    assert batches[1]["input_ids"][0, :dataset.source_lengths[4]].tolist() == dataset[4]["input_ids"]
    assert [len(b["input_ids"]) for b in collate_batches(dataset, collator, 4, limit=6)] == [4, 2]
    with pytest.raises(ValueError, match="batch_size must be positive, not 0"):
        collate_batches(dataset, collator, 0)


@pytest.mark.parametrize("lines", [
    [], [""], ["a"], ["a", "", "b"], ["Ein\u2028Hund", "zwei\x0cKatzen", "drei\x85Mäuse", "vier\u2029", "\x1c\x1d\x1e"],
    [" leading and trailing spaces ", "\ttab"],
])
def test_line_io_round_trips_exactly(tmp_path, lines):
    from prunetrain.mt.text.data import format_lines, read_lines, split_lines, write_lines

    path = write_lines(tmp_path / "out.txt", lines)
    assert read_lines(path) == lines == split_lines(format_lines(lines))
    assert path.read_bytes() == "".join(f"{line}\n" for line in lines).encode()
    assert not list(tmp_path.glob(".*.tmp"))  # staged file renamed into place


def test_line_io_edge_cases(tmp_path):
    from prunetrain.mt.text.data import format_lines, read_lines, split_lines

    assert split_lines("a\r\nb\r\n") == ["a", "b"]  # Windows line ends
    assert split_lines("\ufeffa\nb") == ["a", "b"]  # a BOM is dropped; a missing final newline is fine
    assert split_lines("a\r\rb\n") == ["a\r\rb"]  # a lone CR is not a line end
    with pytest.raises(ValueError, match=r"lines: line 2 holds a newline"):
        format_lines(["a", "b\nc"])
    (tmp_path / "x.txt").write_bytes(b"ok\n\xe2\x82")
    with pytest.raises(ValueError, match=r"--input: .*x.txt is not valid UTF-8: byte offset 3 \(line 2\)"):
        read_lines(tmp_path / "x.txt", argument="--input")
    with pytest.raises(ValueError, match=r"--input: '.*nope.txt' is not a file"):
        read_lines(tmp_path / "nope.txt", argument="--input")


def test_default_data_dir_is_next_to_the_repository(monkeypatch):
    from pathlib import Path

    from prunetrain.mt.text.data import DATA_ENV, default_data_dir

    monkeypatch.delenv(DATA_ENV, raising=False)
    assert default_data_dir() == Path(__file__).resolve().parents[1].parent / "shared" / "data"
    monkeypatch.setenv(DATA_ENV, "/somewhere/else")
    assert default_data_dir() == Path("/somewhere/else")
