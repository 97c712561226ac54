"""Optional dependencies: which extra brings each one, and how a lazily provided name fails when it is missing.

prunetrain's core needs torch and transformers only; fairseq, gguf / llama-cpp-python, onnx / onnxruntime,
ctranslate2 and peft are extras. Modules that offer names built from an optional package (the fairseq attention
subclass, resolved by name for pickles) build them on first access. When the package is absent, that access raises
`MissingExtraError`: an `AttributeError`, so `hasattr()` answers False and `dir()`-driven tools (inspect, doc
generators, test collectors) go on, with one line that says what to install. Nothing fails at import time.
"""

from __future__ import annotations

import contextlib

EXTRAS: dict[str, str] = {
    "fairseq": "bash scripts/install.sh --with-fairseq (fairseq-fixed built against the installed torch)",
    "gguf": "bash scripts/install.sh --with-llama, or pip install gguf llama-cpp-python",
    "llama_cpp": "bash scripts/install.sh --with-llama, or pip install gguf llama-cpp-python",
    "onnx": "pip install 'prunetrain[onnx]'",
    "onnxruntime": "pip install 'prunetrain[onnx]'",
    "peft": "pip install 'prunetrain[peft]'",
    "ctranslate2": "pip install 'prunetrain[ctranslate2]'",
}
"""Top-level package of each optional dependency → how to install it."""

DISTRIBUTIONS = {"llama_cpp": "llama-cpp-python"}
"""Import names whose distribution on the package index is named otherwise."""


class MissingExtraError(AttributeError):
    """A lazily provided name whose optional dependency is not installed (an AttributeError: `hasattr` is False)."""


def missing_package(err: ImportError) -> str | None:
    """The optional package whose absence raised `err`, or None when `err` is about anything else."""
    top = (err.name or "").split(".")[0]
    return top if isinstance(err, ModuleNotFoundError) and top in EXTRAS else None


def packages_missing(*packages: str) -> str | None:
    """None when every optional package in `packages` (import names) imports, else one sentence naming the first
    missing one and how to install it: "the onnx and onnxruntime packages are needed (onnx is missing: ...)."."""
    import importlib

    for package in packages:
        try:
            importlib.import_module(package)
        except ImportError:
            names = [DISTRIBUTIONS.get(p, p) for p in packages]
            listed = f"the {' and '.join(names)} package{'s are' if len(names) > 1 else ' is'} needed"
            return f"{listed} ({DISTRIBUTIONS.get(package, package)} is missing: {EXTRAS[package]})."
    return None


@contextlib.contextmanager
def lazy_name(module: str, name: str):
    """Around the code that builds `module.name` on first access: a missing optional package becomes a
    `MissingExtraError` naming the package and its install command; every other error passes unchanged."""
    try:
        yield
    except ModuleNotFoundError as err:
        package = missing_package(err)
        if package is None:
            raise
        raise MissingExtraError(f"{module}.{name} needs the optional package {package}, which is not installed: "
                                f"{EXTRAS[package]}.", name=name) from None
