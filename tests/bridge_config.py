"""Megatron-Bridge's config layer on a CPU machine, to load our bridge-yaml exactly as Bridge applies a YAML.

Bridge's documented YAML path (docs/recipe-usage.md, "YAML"): a recipe's ConfigContainer ->
`create_omegaconf_dict_config` -> `OmegaConf.merge` with `OmegaConf.load(yaml)` -> `apply_overrides`; then
`runtime_config_update` (what `pretrain()` runs first: mixed-precision recipe resolved and applied, data
parallel size, `ConfigContainer.validate()`, which finalizes every Megatron-Core config).

What is not real here, and why (nothing else is stubbed):
- Bridge's package `__init__` modules are registries that import every Hugging Face model bridge and, through
  PEFT, Transformer Engine, which cannot be installed without CUDA. Those registries are not run: each
  package below is entered as a bare package (its modules load from the installed files, unchanged), and
  the two names the config modules take from `megatron.bridge.models` are its real provider classes.
- The questions the validation asks of the machine get an H100 node's answers (`on_h100_node`): Transformer
  Engine's version (`TE_VERSION`, the release a GPU node installs) and CUDA's device properties (`DEVICE`).

megatron-bridge is installed with `--no-deps` (its runtime requirements include GPU-only packages), plus the
light packages its config modules import: omegaconf, hydra-core, transformers, datasets, megatron-energon.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import logging
import os
import sys
import types
import warnings
from typing import Any, Iterator

BRIDGE_VERSION = "0.6.2"
TE_VERSION = "2.20.2"  # Transformer Engine's release on the package index (Bridge's `te` extra takes the newest)
DEVICE = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0)  # what CUDA reports on an H100
_BARE_PACKAGES = ("megatron.bridge", "megatron.bridge.models", "megatron.bridge.models.conversion",
                  "megatron.bridge.recipes", "megatron.bridge.recipes.gpt", "megatron.bridge.recipes.gpt.h100")


def installed() -> bool:
    return importlib.util.find_spec("megatron.bridge") is not None  # runs no Bridge code


def _bare_package(name: str) -> None:
    if name in sys.modules:
        return
    parent, _, child = name.rpartition(".")
    path = [os.path.join(p, child) for p in sys.modules[parent].__path__ if os.path.isdir(os.path.join(p, child))]
    module = types.ModuleType(name)
    module.__path__ = path
    module.__spec__ = importlib.util.spec_from_file_location(name, os.path.join(path[0], "__init__.py"),
                                                             submodule_search_locations=path)
    sys.modules[name] = module
    setattr(sys.modules[parent], child, module)


@dataclasses.dataclass(frozen=True)
class Bridge:
    """The Bridge classes and functions the tests use (imported once)."""
    version: str
    recipe: Any  # a recipe function: () -> ConfigContainer
    gpt_provider: type
    mla_provider: type
    create_omegaconf_dict_config: Any
    apply_overrides: Any
    runtime_config_update: Any
    get_mixed_precision_config: Any


def load() -> Bridge:
    from importlib.metadata import version

    import megatron  # noqa: F401  (the namespace the bare packages hang from)

    for name in _BARE_PACKAGES:
        _bare_package(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.bridge.models.gpt_provider import GPTModelProvider
        from megatron.bridge.models.mla_provider import MLAModelProvider
        from megatron.bridge.models.t5_provider import T5ModelProvider

        models = sys.modules["megatron.bridge.models"]
        models.GPTModelProvider, models.T5ModelProvider = GPTModelProvider, T5ModelProvider
        from megatron.bridge.recipes.gpt.h100.vanilla_gpt import vanilla_gpt_pretrain_1gpu_h100_bf16_config
        from megatron.bridge.training.config import runtime_config_update
        from megatron.bridge.training.mixed_precision import get_mixed_precision_config
        from megatron.bridge.training.utils.omegaconf_utils import apply_overrides, create_omegaconf_dict_config
    return Bridge(version("megatron-bridge"), vanilla_gpt_pretrain_1gpu_h100_bf16_config, GPTModelProvider,
                  MLAModelProvider, create_omegaconf_dict_config, apply_overrides, runtime_config_update,
                  get_mixed_precision_config)


class _Refusals(logging.Handler):
    """Bridge's apply_overrides logs, and skips, a key the config has no field for, or a value it cannot set."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "not found in config object" in text or "Could not set attribute" in text:
            self.messages.append(text)


@contextlib.contextmanager
def on_h100_node() -> Iterator[None]:
    """The answers a GPU node gives to the questions the validation asks of the machine: Transformer Engine's
    version (Megatron-Core: fp8 recompute, fused kernels) and CUDA's device properties and capability
    (Megatron-LM's and Bridge's checks of GroupedGEMM and the flex-dispatcher backends), as on an H100."""
    import megatron.core.utils as mcore_utils
    import torch
    from packaging.version import Version

    saved = mcore_utils._te_version, torch.cuda.get_device_properties, torch.cuda.get_device_capability
    mcore_utils._te_version = Version(TE_VERSION)
    torch.cuda.get_device_properties = lambda device=None: DEVICE
    torch.cuda.get_device_capability = lambda device=None: (DEVICE.major, DEVICE.minor)
    try:
        yield
    finally:
        mcore_utils._te_version, torch.cuda.get_device_properties, torch.cuda.get_device_capability = saved


@contextlib.contextmanager
def _bridge_run(world_size: int) -> Iterator[_Refusals]:
    """The process state a Bridge run sees (WORLD_SIZE, the recipe's environment defaults), restored after."""
    saved_env = dict(os.environ)
    refusals = _Refusals()
    logger = logging.getLogger("megatron.bridge.training.utils.omegaconf_utils")
    logger.addHandler(refusals)
    os.environ["WORLD_SIZE"] = str(world_size)
    try:
        with on_h100_node(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield refusals
    finally:
        logger.removeHandler(refusals)
        os.environ.clear()
        os.environ.update(saved_env)


def apply_yaml(bridge: Bridge, model_fields: dict[str, Any], mla: bool, yaml_path: str, world_size: int,
               comm_overlap: Any = None):
    """The recipe's ConfigContainer with the model's architecture (and `comm_overlap`, as recipes that set one),
    the YAML applied as Bridge applies one, then `runtime_config_update`. Returns (ConfigContainer, refused keys)."""
    from omegaconf import OmegaConf

    with _bridge_run(world_size) as refusals:
        cfg = bridge.recipe()
        cfg.comm_overlap = comm_overlap
        provider = bridge.mla_provider if mla else bridge.gpt_provider
        names = {f.name for f in dataclasses.fields(provider)}
        cfg.model = provider(**{k: v for k, v in model_fields.items() if k in names})
        merged, excluded = bridge.create_omegaconf_dict_config(cfg)
        merged = OmegaConf.merge(merged, OmegaConf.load(yaml_path))
        bridge.apply_overrides(cfg, OmegaConf.to_container(merged, resolve=True), excluded)
        bridge.runtime_config_update(cfg)
    return cfg, refusals.messages
