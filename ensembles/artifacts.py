"""From a Hugging Face checkpoint to what the model repository points at: a TensorRT-LLM-layout checkpoint
(the engine dir) and the tokenizer files. Conversions are cached beside their source."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelArtifacts:
    engine_dir: Path  # config.json + rank0.safetensors (TensorRT-LLM checkpoint layout)
    tokenizer_dir: Path


def from_hf(hf_dir: Path, dtype: str = "float32", out_dir: Path | None = None) -> ModelArtifacts:
    """Convert a HF checkpoint of a supported family (docs/families.md), once: the result lives beside it (<hf dir>.trtllm-<dtype>) unless out_dir says
    otherwise, and is made again when the HF weights are newer."""
    from build_engines.convert import convert_hf_to_trtllm

    hf_dir = Path(hf_dir).resolve()
    engine_dir = Path(out_dir) if out_dir else hf_dir.parent / f"{hf_dir.name}.trtllm-{dtype}"
    if _stale(hf_dir, engine_dir):
        convert_hf_to_trtllm(hf_dir, engine_dir, dtype=dtype)
    return ModelArtifacts(engine_dir=engine_dir, tokenizer_dir=hf_dir)


def _stale(hf_dir: Path, engine_dir: Path) -> bool:
    converted = engine_dir / "rank0.safetensors"
    if not (engine_dir / "config.json").is_file() or not converted.is_file():
        return True
    newest_source = max(p.stat().st_mtime for p in hf_dir.glob("*.safetensors"))
    return newest_source > converted.stat().st_mtime


def demo(cache_root: Path | None = None) -> ModelArtifacts:
    """The demo model: trained on first use (a few minutes on 2 cores), cached by recipe afterwards."""
    from build_engines.demo_model import build_demo_model

    return from_hf(build_demo_model(cache_root))
