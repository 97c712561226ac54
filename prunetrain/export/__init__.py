"""Exports of pruned models for runtimes without prunetrain (docs/export.md).

- `remote-code`: the directory `save_pruned` writes: a small modeling file registered through `auto_map`
  (`prunetrain.engine.remote_code` and `prunetrain/engine/modeling_prunetrain.py`);
- `uniform`: a standard config with fewer heads (and narrower FFNs), when every site keeps the same number (and
  every FFN sized by one config key the same width) (`uniform`);
- `padded`: the original shapes with removed heads and FFN neurons as zero weights: exact, no speed-up (`padded`);
- `onnx`: ONNX graphs checked with ONNX Runtime, KV-cache graphs for generation (`onnx`);
- `gguf`: llama.cpp's GGUF with per-layer head counts for the Llama family, checked in llama.cpp (`gguf`);
- `ctranslate2`: CTranslate2 for encoder-decoder translation models (Marian, BART, mBART, M2M-100/NLLB, Pegasus),
  heads padded per stack, each FFN at its own width, checked in CTranslate2 (`ctranslate2`).

`formats.export(source, destination, format)` writes any of them (checked against the model first, staged and
renamed into place); `formats.check_formats(source)` says which formats can hold a model and why not the others.
"""

from prunetrain.utils.door import checked

FORMATS = ("remote-code", "uniform", "padded", "onnx", "gguf", "ctranslate2")


@checked
def export(source, destination, format: str, overwrite: bool = False, gguf_type: str | None = None,
           quantization: str | None = None) -> dict:
    """See `prunetrain.export.formats.export`."""
    from prunetrain.export.formats import export as _export

    return _export(source, destination, format, overwrite=overwrite, gguf_type=gguf_type, quantization=quantization)


@checked
def check_formats(source) -> dict:
    """See `prunetrain.export.formats.check_formats`."""
    from prunetrain.export.formats import check_formats as _check

    return _check(source)


__all__ = ["FORMATS", "check_formats", "export"]
