"""Running a GGUF export in llama.cpp itself (through `llama-cpp-python`): logits, greedy decoding, timing.

Used by the GGUF export's check (every export is compared with the model in the engine before it is written), by
the tests and by `benchmarks/bench_gguf.py`. The context keeps keys and values in f32 (llama.cpp's default KV cache
is f16, which would round them) and runs without flash attention, so an f32 export computes in f32 end to end.
Install: `bash scripts/install.sh --with-llama` (builds llama.cpp for the CPU; docs/export.md).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import numpy as np

def llama_cpp_missing() -> str | None:
    """None when `gguf` and `llama-cpp-python` import, else one sentence saying what to install."""
    from prunetrain.utils.extras import packages_missing

    return packages_missing("gguf", "llama_cpp")


@contextlib.contextmanager
def quiet_stderr():
    """stderr silenced for the block, both file descriptor 2 (llama.cpp's C code) and Python's `sys.stderr`
    (llama-cpp-python's log callback prints there): llama.cpp logs warnings (context larger than the training
    context, V cache padding, ...) even with `verbose=False`, and the CLI's stderr is for one-line errors."""
    import io
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def open_model(path: str | Path, n_ctx: int = 512, threads: int = 1, logits_all: bool = True, n_batch: int = 512):
    """A `llama_cpp.Llama` for the GGUF file `path` (CPU, f32 KV cache, no flash attention, quiet).

    Args:
        path: the `.gguf` file.
        n_ctx: context length (tokens).
        threads: threads for generation and for prompt processing.
        logits_all: keep the logits of every position (`scores`), not only the last.
        n_batch: tokens per decode call during prompt processing.
    """
    import llama_cpp

    with quiet_stderr():
        return llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=threads,
                               n_threads_batch=threads, logits_all=logits_all, flash_attn=False,
                               type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, seed=0,
                               verbose=False)


def prompt_logits(llm, tokens) -> np.ndarray:
    """`[len(tokens), vocab]` logits of llama.cpp for one sequence (the model opened with `logits_all=True`)."""
    llm.reset()
    llm.eval([int(t) for t in tokens])
    return np.array(llm.scores[: len(tokens)], dtype=np.float32)


def greedy(llm, prompt, max_new_tokens: int) -> list[int]:
    """`max_new_tokens` tokens chosen by llama.cpp's own greedy sampler (temperature 0, no penalties), decoded one
    at a time with its KV cache; EOS is a token like any other (it neither stops nor is suppressed), as `generate`
    with `eos_token_id=None`."""
    out: list[int] = []
    for token in llm.generate([int(t) for t in prompt], temp=0.0, top_k=1, top_p=1.0, min_p=0.0,
                              repeat_penalty=1.0, reset=True):
        out.append(int(token))
        if len(out) == max_new_tokens:
            break
    return out


def tokenize(llm, text: str) -> list[int]:
    """llama.cpp's tokenization of `text` (no BOS, special tokens not parsed)."""
    return llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)


def time_prompt(llm, tokens) -> float:
    """Seconds llama.cpp takes to process `tokens` as one prompt from an empty cache (as llama-bench's `pp`)."""
    llm.reset()
    start = time.perf_counter()
    llm.eval([int(t) for t in tokens])
    return time.perf_counter() - start


def time_generation(llm, prompt, tokens) -> float:
    """Seconds llama.cpp takes to decode `tokens` one at a time, each with the KV cache of all before it, after
    `prompt` (not timed): as llama-bench's `tg`, the tokens are given, so the work does not depend on a sampler."""
    llm.reset()
    llm.eval([int(t) for t in prompt])
    start = time.perf_counter()
    for token in tokens:
        llm.eval([int(token)])
    return time.perf_counter() - start
