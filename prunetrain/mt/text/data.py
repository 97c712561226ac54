"""Translation data: parallel text, a joint subword vocabulary, datasets and batching for `Seq2SeqTrainer`.

Pipeline for the German→English recipe::

    pairs = read_parallel(data_dir / "multi30k", "train")            # [(de, en), ...]
    tokenizer = train_tokenizer(pairs, vocab_size=8000, path=run_dir)  # joint byte-level BPE
    train_set = build_dataset(pairs, tokenizer, max_length=128)        # {"input_ids", "labels"} per pair
    collator = make_collator(tokenizer, model)                         # pads; builds decoder inputs
    config = marian_config_small(tokenizer)                            # 6+6 layers, 8 heads, d256, tied embeddings

Token ids are fixed for every tokenizer trained here (see `SPECIAL_TOKENS`): `<pad>` = 0, which is also the decoder
start token (as in Marian), `</s>` = 1 (appended to source and target, as in Marian), `<unk>` = 2; no BOS.
(Converted OPUS-MT checkpoints use eos=0, unk=1, pad=last id; our models are trained from scratch, so the ids only
have to agree between tokenizer and `marian_config_small`, which reads them from the tokenizer.)
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from torch.utils.data import DataLoader, Dataset, Sampler

PAD_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
DECODER_START_ID = PAD_ID  # Marian starts decoding from the pad token
DATA_ENV = "PRUNETRAIN_DATA"
MAX_POSITIONS = 512  # marian_config's positions: the longest sentence (in tokens) the recipes' model can encode


# ---------------------------------------------------------------------------------------------------------------
# reading parallel text
# ---------------------------------------------------------------------------------------------------------------
def default_data_dir() -> Path:
    """The shared corpora: `$PRUNETRAIN_DATA` if set, else `<repo>/../shared/data` (next to the repository)."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[3].parent / "shared" / "data"  # prunetrain/mt/text/data.py -> <repo>/..


def available_splits(directory: str | os.PathLike, src: str = "de", tgt: str = "en") -> list[str]:
    """Splits `X` for which both `X.{src}` and `X.{tgt}` exist in `directory`, sorted."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p.name[: -len(src) - 1] for p in directory.glob(f"*.{src}")
                  if p.is_file() and (directory / f"{p.name[: -len(src) - 1]}.{tgt}").is_file())


def split_lines(text: str) -> list[str]:
    """The lines of `text`, split at `\\n` only, each without its terminator (`\\n` or `\\r\\n`).

    Not `str.splitlines`, which also breaks at U+2028, U+0085, form feeds, ... and would silently misalign a parallel
    corpus or a translation's output with its input: those characters stay inside their line. A final newline ends
    the last line (it does not start an empty one); a leading byte-order mark is dropped; "" gives no lines.
    """
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the file's final newline ends the last line; it does not start a new one
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def decode_utf8(data: bytes, name: str) -> str:
    """`data` decoded as UTF-8, or a `ValueError` naming `name`, the byte offset and the line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ValueError(f"{name} is not valid UTF-8: byte offset {err.start} (line {line}) holds "
                         f"{data[err.start:err.start + 1]!r} ({err.reason}).") from None


def read_lines(path: str | os.PathLike, *, allow_empty: bool = True, argument: str = "path") -> list[str]:
    """The lines of a UTF-8 text file (`split_lines`: split at `\\n` only, terminators removed).

    Args:
        path: the file.
        allow_empty: an empty file gives `[]`; with False it is an error (a corpus file must hold sentences).
        argument: how error messages name the file (e.g. "--input").
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{argument}: {str(path)!r} is not a file.")
    data = path.read_bytes()
    if not allow_empty and not data.strip():
        raise ValueError(f"{argument}: {path} is empty" + (" (only whitespace)." if data else " (0 bytes)."))
    if b"\0" in data:  # valid UTF-8, but no text file of sentences holds one: a binary file given by mistake
        line = data[: data.index(b"\0")].count(b"\n") + 1
        raise ValueError(f"{argument}: {path} holds a NUL byte (line {line}); it is binary, not text with one sentence "
                         f"per line.")
    return split_lines(decode_utf8(data, f"{argument}: {path}"))


def format_lines(lines: Sequence[str]) -> str:
    """The text `read_lines` reads back as `lines`: each line followed by `\\n` ("" for no lines).

    Raises ValueError if a line holds a `\\n` (it would become two lines).
    """
    for index, line in enumerate(lines):
        if "\n" in line:
            raise ValueError(f"lines: line {index + 1} holds a newline; it would be written as two lines.")
    return "".join(f"{line}\n" for line in lines)


def write_lines(path: str | os.PathLike, lines: Sequence[str]) -> Path:
    """Write `lines` as UTF-8 (`format_lines`), via a temporary file renamed into place (never half-written)."""
    from prunetrain.utils.output_paths import write_file

    return write_file(path, format_lines(lines))  # a temporary file removed at any error or signal


def _read_lines(path: Path) -> list[str]:
    """A corpus file's lines: non-empty, valid UTF-8 (errors name the file), split at `\\n` only."""
    return read_lines(path, allow_empty=False, argument="read_parallel")


def read_parallel(directory: str | os.PathLike, split: str, src: str = "de", tgt: str = "en",
                  limit: int | None = None) -> list[tuple[str, str]]:
    """Aligned `(source, target)` pairs from `directory/{split}.{src}` and `directory/{split}.{tgt}`.

    Plain UTF-8, one sentence per line; only line terminators are stripped (other whitespace is kept). `limit`
    keeps the first `limit` pairs (the whole files are still checked). Corrupt input raises `ValueError` naming the
    file: missing file (with the splits that do exist), empty file, invalid UTF-8 (byte offset and line), and
    different line counts (both counts).
    """
    directory = Path(directory)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"read_parallel: limit must be a non-negative integer or None, not {limit!r}.")
    if src == tgt:
        raise ValueError(f"read_parallel: source and target language are both {src!r}.")
    if not directory.is_dir():
        raise ValueError(f"read_parallel: directory {directory} does not exist (set {DATA_ENV} or pass the folder "
                         f"that holds {split}.{src} and {split}.{tgt}).")
    paths = [directory / f"{split}.{lang}" for lang in (src, tgt)]
    for path in paths:
        if not path.is_file():
            splits = available_splits(directory, src, tgt)
            have = ", ".join(splits) if splits else f"none (no *.{src} file with a matching *.{tgt} file)"
            raise ValueError(f"read_parallel: {path} does not exist; splits with both .{src} and .{tgt} files in "
                             f"{directory}: {have}.")
    sources, targets = (_read_lines(p) for p in paths)
    if len(sources) != len(targets):
        raise ValueError(f"read_parallel: {paths[0]} has {len(sources)} lines but {paths[1]} has {len(targets)} "
                         f"lines; the files are not aligned.")
    pairs = list(zip(sources, targets))
    return pairs if limit is None else pairs[:limit]


def load_hf_parallel(name: str, config: str | None = None, split: str = "train", src: str = "de", tgt: str = "en",
                     limit: int | None = None, **load_kwargs) -> list[tuple[str, str]]:
    """`(source, target)` pairs from a Hugging Face dataset (needs network or a local HF cache; `pip install datasets`).

    Understands the two usual layouts: a `translation` column of `{src: ..., tgt: ...}` dicts (wmt14, iwslt2017,
    opus_books) and separate `src`/`tgt` columns (bentrevett/multi30k). Example:
    `load_hf_parallel("wmt14", "de-en", split="validation")`.
    """
    try:
        import datasets
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("load_hf_parallel needs the `datasets` package: pip install datasets") from err
    if limit is not None:
        split = f"{split}[:{int(limit)}]"
    ds = datasets.load_dataset(name, config, split=split, **load_kwargs)
    columns = set(ds.column_names)
    if "translation" in columns:
        rows = ds["translation"]
        return [(row[src], row[tgt]) for row in rows]
    if {src, tgt} <= columns:
        return list(zip(ds[src], ds[tgt]))
    raise ValueError(f"load_hf_parallel: dataset {name!r} has columns {sorted(columns)}; expected 'translation' "
                     f"or both {src!r} and {tgt!r}.")


# ---------------------------------------------------------------------------------------------------------------
# joint subword vocabulary
# ---------------------------------------------------------------------------------------------------------------
def _texts(pairs: Iterable[tuple[str, str]]) -> Iterator[str]:
    for source, target in pairs:
        yield source
        yield target


def build_tokenizer_model(pairs: Iterable[tuple[str, str]], vocab_size: int = 8000, min_frequency: int = 2):
    """Train the raw `tokenizers.Tokenizer` (see `train_tokenizer`)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())  # no unk_token: byte-level BPE can spell every string
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Strip(left=True, right=False)])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    # ByteLevel gives back the exact bytes; Strip removes the one space that add_prefix_space put in front
    tok.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(_texts(pairs), trainer=trainer)
    ids = [tok.token_to_id(t) for t in SPECIAL_TOKENS]
    if ids != [PAD_ID, EOS_ID, UNK_ID]:  # pragma: no cover - guarded by the trainer's special_tokens order
        raise RuntimeError(f"train_tokenizer: special tokens got ids {ids}, expected {[PAD_ID, EOS_ID, UNK_ID]}.")
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS_TOKEN}", pair=f"$A $B {EOS_TOKEN}", special_tokens=[(EOS_TOKEN, EOS_ID)])
    return tok


def train_tokenizer(pairs: Sequence[tuple[str, str]], vocab_size: int = 8000, path: str | os.PathLike | None = None,
                    *, min_frequency: int = 2, model_max_length: int = 512):
    """A joint source+target subword tokenizer trained on `pairs` (use the training split), as a
    `PreTrainedTokenizerFast`, saved to `path` (`tokenizer.json`, `tokenizer_config.json`, ...) if given.

    Choice: **byte-level BPE** (HF `tokenizers`), with NFC normalisation and a prefix space.
      - lossless: every string is spelled with the 256 byte symbols, so there is never an `<unk>` and
        `decode(encode(s)) == s` for any text up to the documented normalisation: Unicode NFC, and leading
        whitespace is dropped (then one space is prepended for encoding, so a sentence's first word is
        spelled as inside a sentence, and removed again by the decoder); inner and trailing whitespace is kept;
      - deterministic: the BPE trainer gives the same merges on every run and thread count (the HF Unigram trainer
        does not: its EM runs in parallel and its vocabulary changes between runs), and it is fast
        (Multi30k's 58k sentences: about 2 s on 2 cores, versus about 8 s for Unigram);
      - one vocabulary for both languages, so `MarianConfig(share_encoder_decoder_embeddings=True)` and tied
        output embeddings work, as in Marian.
    Special tokens have fixed ids: `<pad>`=0 (also decoder start), `</s>`=1 (appended to every encoded sequence),
    `<unk>`=2 (never produced by encoding, kept for Marian compatibility). There is no BOS token.

    Reload offline with `transformers.AutoTokenizer.from_pretrained(path)` or `load_tokenizer(path)`.
    """
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 300:
        raise ValueError(f"train_tokenizer: vocab_size {vocab_size} is too small; byte-level BPE needs 259 symbols "
                         f"(256 bytes + 3 special tokens) before any merge.")
    pairs = list(pairs)
    if not pairs:
        raise ValueError("train_tokenizer: no sentence pairs to train on.")
    tok = build_tokenizer_model(pairs, vocab_size, min_frequency)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD_TOKEN, eos_token=EOS_TOKEN, unk_token=UNK_TOKEN,
        model_max_length=model_max_length, padding_side="right", truncation_side="right",
        clean_up_tokenization_spaces=False,
    )
    if path is not None:
        Path(path).mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(path)
    return tokenizer


def load_tokenizer(path: str | os.PathLike):
    """Reload a tokenizer saved by `train_tokenizer` (offline; only local files are read)."""
    from transformers import PreTrainedTokenizerFast

    path = Path(path)
    if not (path / "tokenizer.json").is_file():
        raise ValueError(f"load_tokenizer: {path} has no tokenizer.json (saved by prunetrain.data.train_tokenizer).")
    from prunetrain.utils.files import read_json

    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"):
        if (path / name).exists() or (path / name).is_symlink():  # each a regular file holding a strict JSON object
            read_json(path / name, "tokenizer")
    try:
        return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    except Exception as err:  # a damaged file: json, tokenizers and transformers all raise their own types
        detail = " ".join(str(err).split())[:200]
        raise ValueError(f"tokenizer: {str(path / 'tokenizer.json')!r} (or its config) could not be read "
                         f"({type(err).__name__}: {detail}).") from err


# ---------------------------------------------------------------------------------------------------------------
# datasets, collation, batching
# ---------------------------------------------------------------------------------------------------------------
class Seq2SeqDataset(Dataset):
    """Tokenized pairs; item `i` is `{"input_ids": [...], "labels": [...]}` (lists of ints, both ending in `</s>`).

    Works with `Seq2SeqTrainer` + `make_collator` (also with transformers 5's
    `train_sampling_strategy="group_by_length"`, which measures `input_ids`). `lengths[i]` = max(source, target)
    tokens, for `TokenBudgetBatchSampler`.
    """

    def __init__(self, input_ids: list[list[int]], labels: list[list[int]]):
        if len(input_ids) != len(labels):
            raise ValueError(f"Seq2SeqDataset: {len(input_ids)} sources but {len(labels)} targets.")
        self.input_ids = input_ids
        self.labels = labels
        self.source_lengths = [len(x) for x in input_ids]
        self.target_lengths = [len(x) for x in labels]
        self.lengths = [max(a, b) for a, b in zip(self.source_lengths, self.target_lengths)]

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return {"input_ids": self.input_ids[index], "labels": self.labels[index]}

    def num_target_tokens(self) -> int:
        return sum(self.target_lengths)


def build_dataset(pairs: Sequence[tuple[str, str]], tokenizer, max_length: int = 128,
                  max_target_length: int | None = None) -> Seq2SeqDataset:
    """Tokenize `pairs` into a `Seq2SeqDataset`; sequences longer than `max_length` (source) /
    `max_target_length` (target, default `max_length`) tokens are truncated, keeping the final `</s>`."""
    if not pairs:
        raise ValueError("build_dataset: no sentence pairs.")
    sources = [s for s, _ in pairs]
    targets = [t for _, t in pairs]
    kw = dict(truncation=True, add_special_tokens=True, return_attention_mask=False)
    input_ids = tokenizer(sources, max_length=max_length, **kw)["input_ids"]
    labels = tokenizer(text_target=targets, max_length=max_target_length or max_length, **kw)["input_ids"]
    return Seq2SeqDataset(input_ids, labels)


def make_collator(tokenizer, model=None, pad_to_multiple_of: int | None = None) -> "Seq2SeqCollator":
    """A `Seq2SeqCollator`: pads `input_ids` with `<pad>` (plus `attention_mask`), `labels` with -100, and with
    `model` given also builds `decoder_input_ids` (labels shifted right after the pad/decoder-start token)."""
    return Seq2SeqCollator(tokenizer, model, pad_to_multiple_of)


class Seq2SeqCollator:
    """`DataCollatorForSeq2Seq` padding, with the decoder inputs built from a *copy* of the padded labels.

    transformers' collator hands the labels themselves to `model.prepare_decoder_input_ids_from_labels`, and some
    families shift in place (FSMT's `shift_tokens_right` rewrites -100 to `<pad>`), which would make the loss count
    padding. Here the labels keep their -100 whatever the family does.
    """

    def __init__(self, tokenizer, model=None, pad_to_multiple_of: int | None = None):
        from transformers import DataCollatorForSeq2Seq

        self.pad = DataCollatorForSeq2Seq(tokenizer, model=None, label_pad_token_id=-100,
                                          pad_to_multiple_of=pad_to_multiple_of, return_tensors="pt")
        self.model = model

    def __call__(self, features):
        batch = self.pad(features)
        prepare = getattr(self.model, "prepare_decoder_input_ids_from_labels", None)
        if prepare is not None and batch.get("labels") is not None:
            batch["decoder_input_ids"] = prepare(labels=batch["labels"].clone())
        return batch


def collate_batches(dataset, collator, batch_size: int, limit: int | None = None) -> list[dict]:
    """The first `limit` examples of `dataset` (all by default), in order, as collated batches of `batch_size`
    (the last one may be smaller): fixed batches for head importance and similar passes."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, not {batch_size}.")
    end = len(dataset) if limit is None else min(len(dataset), limit)
    return [collator([dataset[i] for i in range(start, min(start + batch_size, end))])
            for start in range(0, end, batch_size)]


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Batches of similar-length examples holding at most `max_tokens` tokens each, padding included
    (`len(batch) * max(lengths in batch) <= max_tokens`, as fairseq's `--max-tokens`).

    Each epoch: shuffle (seeded by `seed` + epoch), stable-sort by length, pack greedily, shuffle the batch order.
    The batch count is the same every epoch. An example longer than `max_tokens` gets a batch of its own.
    `set_epoch(e)` picks the epoch (Trainer/accelerate call it); otherwise each iteration advances it by one.
    With `lengths = dataset.lengths` (max of source and target) and max_tokens ~4100 a batch has somewhat under
    4100 target tokens (the recipes' throughput was measured at ~4100 target tokens per step).
    """

    def __init__(self, lengths: Sequence[int], max_tokens: int = 4096, max_sentences: int | None = None,
                 shuffle: bool = True, seed: int = 0):
        if max_tokens <= 0:
            raise ValueError(f"TokenBudgetBatchSampler: max_tokens must be positive, not {max_tokens}.")
        self.lengths = [int(x) for x in lengths]
        self.max_tokens = int(max_tokens)
        self.max_sentences = max_sentences
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self._num_batches = len(self._batches(0))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _batches(self, epoch: int) -> list[list[int]]:
        order = list(range(len(self.lengths)))
        rng = random.Random(self.seed * 1_000_003 + epoch)
        if self.shuffle:
            rng.shuffle(order)
        order.sort(key=self.lengths.__getitem__)  # stable: equal lengths stay in shuffled order
        batches: list[list[int]] = []
        batch: list[int] = []
        longest = 0
        for index in order:
            length = self.lengths[index]
            grown = max(longest, length)
            full = self.max_sentences is not None and len(batch) >= self.max_sentences
            if batch and (grown * (len(batch) + 1) > self.max_tokens or full):
                batches.append(batch)
                batch, grown = [], length
            batch.append(index)
            longest = grown
        if batch:
            batches.append(batch)
        if self.shuffle:
            rng.shuffle(batches)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._batches(self.epoch)
        self.epoch += 1
        return iter(batches)

    def __len__(self) -> int:
        return self._num_batches


def token_budget_dataloader(dataset: Seq2SeqDataset, collator, max_tokens: int = 4096, shuffle: bool = True,
                            seed: int = 0, max_sentences: int | None = None, num_workers: int = 0) -> DataLoader:
    """A `DataLoader` over `dataset` with `TokenBudgetBatchSampler` batches. With `Seq2SeqTrainer`, override
    `get_train_dataloader` to return `self.accelerator.prepare(token_budget_dataloader(self.train_dataset,
    self.data_collator, max_tokens))` (`per_device_train_batch_size` is then unused)."""
    sampler = TokenBudgetBatchSampler(dataset.lengths, max_tokens, max_sentences, shuffle, seed)
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=collator, num_workers=num_workers)


# ---------------------------------------------------------------------------------------------------------------
# model configs
# ---------------------------------------------------------------------------------------------------------------
def _special_ids(tokenizer) -> dict:
    if tokenizer is None:
        return dict(pad_token_id=PAD_ID, eos_token_id=EOS_ID, decoder_start_token_id=DECODER_START_ID)
    return dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                decoder_start_token_id=tokenizer.pad_token_id)


def marian_config(vocab_size_or_tokenizer=8000, *, d_model: int = 256, ffn_dim: int = 1024, layers: int = 6,
                  heads: int = 8, max_position_embeddings: int = MAX_POSITIONS, dropout: float = 0.1,
                  attention_dropout: float = 0.0, activation_dropout: float = 0.0, activation_function: str = "relu",
                  attn_implementation: str | None = None, **overrides):
    """A `MarianConfig` for a Transformer trained from scratch with a tokenizer from `train_tokenizer`.

    Post-norm Transformer layers (as in Vaswani et al. and Marian), ReLU, sinusoidal positions, scaled embeddings,
    one embedding matrix shared by encoder, decoder and output layer (`share_encoder_decoder_embeddings=True`,
    `tie_word_embeddings=True`), pad/eos/decoder start from the tokenizer (or the fixed ids `PAD_ID`, `EOS_ID`).
    Any MarianConfig field can be overridden.
    `attn_implementation="eager"` trained fastest under bf16 autocast on a CPU with avx512_bf16 (measured on a 2-core development CPU); the default
    is transformers' (sdpa). On CPUs without native bf16 (see `prunetrain.utils.device`) stay in fp32.
    """
    from transformers import MarianConfig

    tokenizer = None
    if isinstance(vocab_size_or_tokenizer, int):
        vocab_size = vocab_size_or_tokenizer
    else:
        tokenizer = vocab_size_or_tokenizer
        vocab_size = len(tokenizer)
    fields = dict(
        vocab_size=vocab_size, decoder_vocab_size=vocab_size, d_model=d_model,
        encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_ffn_dim=ffn_dim, decoder_ffn_dim=ffn_dim, max_position_embeddings=max_position_embeddings,
        dropout=dropout, attention_dropout=attention_dropout, activation_dropout=activation_dropout,
        activation_function=activation_function, scale_embedding=True, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, bos_token_id=None, forced_eos_token_id=None, **_special_ids(tokenizer),
    )
    fields.update(overrides)
    config = MarianConfig(**fields)
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    return config


def marian_config_small(vocab_size_or_tokenizer=8000, **overrides):
    """The CPU-sized setting: 6 encoder + 6 decoder layers, 8 heads per attention (144 heads in all: 48 encoder
    self, 48 decoder self, 48 cross), d_model 256, FFN 1024, tied embeddings; 13.4 M parameters with vocab 8000.
    About 2.2-3.6k target tokens/s in bf16 autocast on 2 CPU cores (measured on an AVX512-BF16 CPU)."""
    return marian_config(vocab_size_or_tokenizer, **{"d_model": 256, "ffn_dim": 1024, **overrides})


def marian_config_base(vocab_size_or_tokenizer=8000, **overrides):
    """The larger (GPU) setting: Transformer-base widths, 6+6 layers, 8 heads, d_model 512, FFN 2048
    (48.5 M parameters with vocab 8000; about 0.45k tokens/s fp32 on this CPU, so train it on a GPU)."""
    return marian_config(vocab_size_or_tokenizer, **{"d_model": 512, "ffn_dim": 2048, **overrides})


def steps_per_epoch(dataset: Seq2SeqDataset, max_tokens: int = 4096) -> int:
    """Batches per epoch with `TokenBudgetBatchSampler(dataset.lengths, max_tokens)`."""
    return len(TokenBudgetBatchSampler(dataset.lengths, max_tokens, shuffle=False))


__all__ = [
    "DECODER_START_ID", "EOS_ID", "PAD_ID", "SPECIAL_TOKENS", "UNK_ID", "Seq2SeqDataset", "TokenBudgetBatchSampler",
    "available_splits", "build_dataset", "decode_utf8", "format_lines", "read_lines", "split_lines", "write_lines", "collate_batches", "default_data_dir", "load_hf_parallel", "load_tokenizer", "make_collator",
    "marian_config", "marian_config_base", "marian_config_small", "read_parallel", "steps_per_epoch",
    "token_budget_dataloader",
    "train_tokenizer",
]
