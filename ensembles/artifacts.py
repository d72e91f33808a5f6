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
    """Convert (once) a HF Llama checkpoint; the converted checkpoint lives beside it unless out_dir says otherwise."""
    from build_engines.convert import convert_hf_to_trtllm

    hf_dir = Path(hf_dir).resolve()
    engine_dir = Path(out_dir) if out_dir else hf_dir.parent / f"trtllm-{dtype}"
    if not (engine_dir / "config.json").is_file():
        convert_hf_to_trtllm(hf_dir, engine_dir, dtype=dtype)
    return ModelArtifacts(engine_dir=engine_dir, tokenizer_dir=hf_dir)


def demo(cache_root: Path | None = None) -> ModelArtifacts:
    """The demo model: trained on first use (a few minutes on 2 cores), cached by recipe afterwards."""
    from build_engines.demo_model import build_demo_model

    return from_hf(build_demo_model(cache_root))
