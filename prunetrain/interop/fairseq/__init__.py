"""fairseq interoperability: prune fairseq-trained Transformer translation models (GitHub issue 8).

Two ways in:

1. **Import** a fairseq checkpoint into Hugging Face `FSMTForConditionalGeneration`, the class transformers ported
   from fairseq's WMT19 Transformer, so every prunetrain tool applies to it:

       model = import_fairseq("checkpoints/checkpoint_best.pt", "data-bin/iwslt14.de-en")   # in memory
       convert_fairseq("checkpoints/checkpoint_best.pt", "data-bin/iwslt14.de-en", "hf-model")  # to a directory

   FSMT computes exactly what fairseq's post-norm `TransformerModel` computes: sinusoidal positions offset by the
   padding index (fairseq's table and `make_positions`), `sqrt(d)` embedding scale (or none with
   `--no-scale-embedding`), post-norm layers without a final encoder/decoder layer norm, separate source/target
   vocabularies, an output projection (tied to every embedding with `--share-all-embeddings`), relu/gelu, q scaled by
   `head_dim**-0.5` after its bias. Marian does *not*: its sinusoids use another frequency base, its positions start
   at 0, and its position table is not saved. FSMT has no pre-norm variant, so `--encoder-normalize-before` /
   `--decoder-normalize-before` models are refused with a clear error (as are learned positions, layernorm_embedding,
   adaptive softmax and differing encoder/decoder widths).

2. **Use the head engine inside fairseq** (no import): `wrap_fairseq(model)` gives an `nn.Module` view that shares
   the fairseq model's modules and that `find_heads`, `HeadMask`, `head_importance` and `shrink` accept; masks act
   through forward pre-hooks on fairseq's own `MultiheadAttention.out_proj`, so fairseq's `SequenceGenerator` and
   training loop see them. `fairseq_importance(model, samples)` computes Michel et al.'s importance from fairseq
   samples. Site names are those of the imported FSMT model (`model.encoder.layers.0.self_attn`, ...), so scores
   and masks carry over between the two worlds unchanged.

Checkpoints are read with `torch.load(..., weights_only=True)` only. fairseq 0.12 stores `cfg` as plain containers
except `cfg["model"]`, an `argparse.Namespace`; older checkpoints store `args` as a Namespace, and some hold
omegaconf `DictConfig` objects or numpy scalars. Those (and only those, see `SAFE_CHECKPOINT_GLOBALS`) are allowed for the
duration of the load through `torch.serialization.safe_globals`, a scoped allow-list: nothing is added to the
process-wide list, and any other pickled global makes the load fail with a `ValueError` naming it.

Tokens: fairseq dictionaries are over the (BPE'd) tokens fairseq-preprocess saw. `convert_fairseq` writes a
whitespace word-level tokenizer per side (source at the top of the directory, target in `target_tokenizer/`): give
it text that went through the same tokenizer/BPE as your training data (e.g. `subword-nmt apply-bpe -c codes`),
and remove the BPE from the output (`translate(..., remove_bpe="@@ ")`, like fairseq's `--remove-bpe`).

The modules: `checkpoint` (reading checkpoints and dictionaries), `convert` (the FSMT model, tokenizers, a directory
on disk, translation) and `adapter` (the head engine inside fairseq: `wrap_fairseq`, `FairseqAdapter`,
`fairseq_importance`); every name is importable from `prunetrain.interop.fairseq`.
"""

from prunetrain.engine.families.core import lazy_subclass
from prunetrain.interop.fairseq.adapter import (EMPTY_FAIRSEQ, FAIRSEQ_MODEL_TYPE, FairseqAdapter, FairseqHeadConfig,
                                                FairseqTransformer, fairseq_importance, fairseq_loss, wrap_fairseq)
from prunetrain.interop.fairseq.checkpoint import (SAFE_CHECKPOINT_GLOBALS, SPECIAL_SYMBOLS, FairseqCheckpoint,
                                                   FairseqDictionary, load_fairseq_checkpoint)
from prunetrain.interop.fairseq.convert import (ACTIVATIONS, IMPORT_FILE, SUPPORTED_ARCHS, TARGET_TOKENIZER_DIR,
                                                convert_fairseq, dictionary_tokenizer, fsmt_config_from_fairseq,
                                                hf_batch_from_fairseq, import_fairseq, load_fairseq_tokenizers,
                                                translate)


def __getattr__(name: str):
    """The lazily built attention subclasses, by name (so that pickles of shrunk models find them). Without fairseq
    installed the name is absent (`hasattr` is False) and using it says which extra to install."""
    if name == EMPTY_FAIRSEQ:
        return lazy_subclass(__name__, name)
    if name in ("PrunableFSMTAttention", "FSMTAdapter"):  # moved to prunetrain.engine.families.fsmt
        from prunetrain.engine.families import fsmt

        return getattr(fsmt, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ACTIVATIONS",
    "FSMTAdapter",
    "FairseqAdapter",
    "FairseqCheckpoint",
    "FairseqDictionary",
    "FairseqTransformer",
    "SAFE_CHECKPOINT_GLOBALS",
    "SUPPORTED_ARCHS",
    "convert_fairseq",
    "dictionary_tokenizer",
    "fairseq_importance",
    "fairseq_loss",
    "fsmt_config_from_fairseq",
    "hf_batch_from_fairseq",
    "import_fairseq",
    "load_fairseq_checkpoint",
    "load_fairseq_tokenizers",
    "translate",
    "wrap_fairseq",
]
