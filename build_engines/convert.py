"""Convert a HF checkpoint directory of a supported family into a TensorRT-LLM 1.2.x checkpoint (single rank).

Supported: Llama 2 / 3.x, Mistral, Qwen2 / 2.5, Qwen3, Gemma 2, Phi-3 (build_engines/hf_families/). Every field of
the HF config is read, known to be inert, or refused with its name and value (hf_families/fields.py); the config
written is checked again by the runtime's own rules (backend/formats/families.py, backend/model/features.py), so
what converts is what loads. The tokenizer, chat template and generation config are copied beside the weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from packaging.version import Version
from safetensors.torch import load_file, save_file
from tqdm import tqdm
from transformers import AutoConfig

from backend.formats.checkpoint import CONFIG_FILE, DTYPES, TrtllmCheckpointConfig, rank_file
from backend.model.features import DecoderFeatures
from build_engines.cache import atomic_dir
from build_engines.hf_families.configs import checkpoint_config
from build_engines.hf_families.fields import check_fields, family_of
from build_engines.hf_families.weights import convert_weights as _convert_weights
from build_engines.side_files import copy_side_files

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


# The oldest transformers whose config objects the converter reads (hf_families/): rope_parameters and layer_types
# are transformers 5's layout; 4.x keeps rope_theta / rope_scaling apart and, before 4.53, no layer_types, where a
# sliding window would be lost without a word; 5.0-5.3 write a stray `ignore_keys_at_rope_validation` into Phi-3
# configs. The unit suite passes on 5.4.0 but for HF's own longrope generate (docs/operations.md, "Dependency bounds").
# pip enforces pyproject's bound; this names it where it was bypassed (a container's own transformers, --no-deps).
MIN_TRANSFORMERS = "5.4"


def require_transformers(version: str | None = None) -> None:
    """ValueError naming the installed and the needed transformers where the installed one is too old."""
    version = version or transformers.__version__
    if Version(version) < Version(MIN_TRANSFORMERS):
        raise ValueError(f"converting a HF checkpoint needs transformers>={MIN_TRANSFORMERS} (its config layout: "
                         f"rope_parameters, layer_types); this environment has transformers {version}")


def convert_hf_to_trtllm(hf_dir: Path, out_dir: Path, dtype: str = "float32") -> Path:
    """Write out_dir/config.json, out_dir/rank0.safetensors and the side files (replacing out_dir atomically)."""
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    config = checkpoint_config_from_hf(hf_dir, dtype)
    weights = convert_weights(load_hf_weights(hf_dir), config)
    with atomic_dir(out_dir) as tmp:
        config.to_json(tmp / CONFIG_FILE)
        save_file(weights, str(tmp / rank_file(0)), metadata={"format": "pt"})
        copy_side_files(hf_dir, tmp)
    return out_dir


def checkpoint_config_from_hf(hf_dir: Path, dtype: str = "float32") -> TrtllmCheckpointConfig:
    """The TRT-LLM config for the HF checkpoint in `hf_dir`, with weights stored as `dtype`. Raises ValueError
    naming the field and value of anything that would not be honoured."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    hf_dir = Path(hf_dir)
    path = hf_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{hf_dir}: no config.json (not a HF checkpoint directory)")
    require_transformers()
    raw = json.loads(path.read_text())
    family = family_of(raw, str(hf_dir))
    check_fields(family, raw, str(hf_dir))
    try:
        config = checkpoint_config(family, AutoConfig.from_pretrained(hf_dir), raw, dtype)
        DecoderFeatures.of(config)  # the runtime's rotary checks, at conversion too
    except ValueError as exc:
        raise ValueError(f"{hf_dir}: {exc}") from None
    return config


def load_hf_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of the HF checkpoint (one file, or the shards its index names)."""
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = [p.name for p in sorted(hf_dir.glob("*.safetensors"))]
    if not files:
        raise FileNotFoundError(f"{hf_dir}: no *.safetensors weights found")
    weights: dict[str, torch.Tensor] = {}
    for name in files:
        weights.update(load_file(str(hf_dir / name)))
    return weights


def convert_weights(hf: dict[str, torch.Tensor], config: TrtllmCheckpointConfig) -> dict[str, torch.Tensor]:
    """Rename (and fuse) HF tensors into TRT-LLM names, cast to config.dtype (hf_families/weights.py)."""
    return _convert_weights(hf, config, TORCH_DTYPES[config.dtype],
                            progress=lambda it: tqdm(it, desc="convert", unit="layer"))
