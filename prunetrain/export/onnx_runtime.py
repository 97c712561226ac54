"""Running an `--format onnx` export in ONNX Runtime: a CPU session (`session`), the export's generation settings
(`read_generation_config`) and greedy decoding with its KV-cache graph (`OrtGenerator`, `greedy_generate`); the
exporter's opset and the tolerance every check of an export against PyTorch uses."""

from __future__ import annotations

from pathlib import Path

import torch

TOLERANCE = 1e-4
OPSET = 17


def session(path: str | Path, threads: int = 1):
    """An ONNX Runtime CPU inference session for `path`."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def read_generation_config(directory: str | Path):
    """The export's `generation_config.json` as a `transformers.GenerationConfig` (its defaults where the export has
    none); the decoders read it once, not per batch."""
    from transformers import GenerationConfig

    return (GenerationConfig.from_pretrained(directory) if (Path(directory) / "generation_config.json").is_file()
            else GenerationConfig())


class OrtGenerator:
    """Greedy decoding with ONNX Runtime and the KV-cache graph of an `--format onnx` export (what `generate` does
    with `do_sample=False, num_beams=1` and exactly `max_new_tokens` new tokens, no stopping at EOS). The sessions
    are made once, so repeated calls time only the decoding.

    Args:
        directory: the export (holds `decoder_with_past_model.onnx`, and `encoder_model.onnx` for an
            encoder-decoder).
        threads: ONNX Runtime intra-op threads.
    """

    def __init__(self, directory: str | Path, threads: int = 1):
        directory = Path(directory)
        self.decoder = session(directory / "decoder_with_past_model.onnx", threads)
        self.encoder = session(directory / "encoder_model.onnx", threads) \
            if (directory / "encoder_model.onnx").is_file() else None
        self.fixed = 2 if self.encoder is None else 3  # inputs before the past keys/values
        self.names = [i.name for i in self.decoder.get_inputs()]
        self.outputs = [o.name for o in self.decoder.get_outputs()]
        self.generation_config = read_generation_config(directory)

    def greedy(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
               decoder_start_token_id: int | None = None, suppress_tokens=()) -> torch.Tensor:
        """Prompt + new tokens (decoder-only) or decoder start + new tokens (encoder-decoder), as `generate`.

        Args:
            input_ids: `[batch, length]` token ids (the prompt of a decoder-only model, left-padded as `generate`
                expects; the source of an encoder-decoder).
            attention_mask: `[batch, length]`.
            max_new_tokens: tokens to generate.
            decoder_start_token_id: first decoder token of an encoder-decoder (its config's).
            suppress_tokens: token ids never chosen (as `generate(suppress_tokens=...)`).
        """
        import numpy as np

        batch = input_ids.shape[0]
        past = {inp.name: np.zeros((batch, inp.shape[1], 0, inp.shape[3]), dtype=np.float32)
                for inp in self.decoder.get_inputs()[self.fixed:]}
        mask = attention_mask.numpy()
        if self.encoder is not None:
            if decoder_start_token_id is None:
                raise ValueError("decoder_start_token_id: an encoder-decoder export needs it (the model config's).")
            hidden = self.encoder.run(None, {"input_ids": input_ids.numpy(), "attention_mask": mask})[0]
            ids = np.full((batch, 1), decoder_start_token_id, dtype=np.int64)
        else:
            ids = input_ids.numpy()
        tokens = [ids]
        for _ in range(max_new_tokens):
            feeds = ({"decoder_input_ids": ids, "encoder_hidden_states": hidden, "encoder_attention_mask": mask}
                     if self.encoder is not None else {"input_ids": ids, "attention_mask": mask})
            got = self.decoder.run(self.outputs, {**feeds, **past})
            logits = got[0][:, -1]
            if len(suppress_tokens):
                logits = logits.copy()
                logits[:, list(suppress_tokens)] = -np.inf
            ids = logits.argmax(-1)[:, None].astype(np.int64)
            tokens.append(ids)
            past = dict(zip(self.names[self.fixed:], got[1:]))
            if self.encoder is None:
                mask = np.concatenate([mask, np.ones_like(ids)], axis=1)
        return torch.from_numpy(np.concatenate(tokens, axis=1))


def greedy_generate(directory: str | Path, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    max_new_tokens: int, decoder_start_token_id: int | None = None, threads: int = 1) -> torch.Tensor:
    """`OrtGenerator(directory, threads).greedy(...)`: greedy decoding of an ONNX export with its KV cache."""
    return OrtGenerator(directory, threads).greedy(input_ids, attention_mask, max_new_tokens, decoder_start_token_id)
