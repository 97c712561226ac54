"""Inputs are read-only: what a save or an export may touch on the model it is given is put back afterwards.

Writing a model changes it as a side effect in places the caller never asked for: transformers' `save_pretrained`
sets `config.dtype` and `config.architectures`, prunetrain refreshes its record on the config (`mark_pruned`), and
every check of an export runs the model in eval mode. `config_kept` and `modes_kept` restore exactly what was there
(the config's attributes and class, each module's training flag), whatever happens inside. Tensors are never written
by prunetrain's exporters; a third-party converter that may write into what it is given (CTranslate2 quantizes in
place) gets a copy (`prunetrain.export.ctranslate2`).
"""

from __future__ import annotations

from contextlib import contextmanager

from torch import nn


@contextmanager
def config_kept(model: nn.Module):
    """Restore `model.config`'s attributes (the same objects: sub-configs shared with submodules stay shared) and its
    class on exit. A model without a config is left alone."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "__dict__"):
        yield
        return
    saved_class, saved = type(config), dict(vars(config))
    try:
        yield
    finally:
        vars(config).clear()
        vars(config).update(saved)
        if type(config) is not saved_class:
            config.__class__ = saved_class


@contextmanager
def modes_kept(model: nn.Module):
    """Restore each module's training flag on exit (an export checks the model in eval mode)."""
    modes = [(module, module.training) for module in model.modules()]
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


@contextmanager
def left_as_given(model: nn.Module):
    """`config_kept` and `modes_kept` together: what an export of `model` may touch, restored on exit."""
    with config_kept(model), modes_kept(model):
        yield


@contextmanager
def attention_kept(config):
    """Restore the attention implementation of `config` and of each of its sub-configs on exit (transformers' setter
    writes a config's value into all its sub-configs, which may have had their own)."""
    saved = []

    def remember(cfg) -> None:
        if cfg is None or not hasattr(cfg, "__dict__"):
            return
        key = "_attn_implementation_internal"
        saved.append((cfg, key in vars(cfg), vars(cfg).get(key)))
        for key in getattr(cfg, "sub_configs", None) or {}:
            remember(getattr(cfg, key, None))

    remember(config)
    try:
        yield
    finally:
        for cfg, present, value in saved:
            if present:
                vars(cfg)["_attn_implementation_internal"] = value
            else:
                vars(cfg).pop("_attn_implementation_internal", None)
