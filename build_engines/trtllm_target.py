"""The tensorrt_llm target: compile the built checkpoint with TensorRT-LLM 1.2.x's `trtllm-build`.

The flags are trtllm-build's own (tensorrt_llm/commands/build.py and the plugin flags of its PluginConfig):
limits from the spec; `auto` plugins take the checkpoint's dtype; a paged KV cache with paged context FMHA, so
the executor can reuse KV blocks of shared prefixes (KvCacheConfig.enable_block_reuse) and chunk long prompts.
The engine dir it writes holds config.json {version, pretrained_config, build_config} + rank{N}.engine; the
tensorrt_llm Triton model drives such a dir through tensorrt_llm.bindings.executor (backend/engine/trtllm_executor.py).
"""
from __future__ import annotations

import importlib
import shutil
import subprocess
from pathlib import Path

from backend.formats.checkpoint import TrtllmCheckpointConfig
from build_engines.spec import BuildSpec, SpecError

SUPPORTED_MAJOR_MINOR = "1.2"
GPU_IMAGE_HINT = ("the Dockerfile's gpu image (docker build --target gpu .) has TensorRT-LLM and a GPU runtime; "
                  "here, build with `target: torch`")


class TrtllmUnavailable(RuntimeError):
    """tensorrt_llm cannot run here (not importable, wrong version, or no GPU); the message says where it can."""


GEMMA2_MAX_SEQ_LEN = 4096  # examples/models/core/gemma/README.md (1.2): "The maximum sequence length allowed is 4096"


def check_buildable(cfg: TrtllmCheckpointConfig, spec: BuildSpec) -> None:
    """Refuse, before anything is built, what TensorRT-LLM 1.2 cannot build or would compute differently from the
    checkpoint (the torch target serves all of these). Sliding windows need nothing here: they are run-time
    settings (KvCacheConfig.max_attention_window, set by backend/engine/trtllm_executor.py from the checkpoint)."""
    scaling = cfg.rotary_scaling or {}
    if scaling.get("type", scaling.get("rope_type")) == "dynamic":
        raise SpecError("target tensorrt_llm: rotary_scaling type 'dynamic' (HF's factor-based NTK) is not buildable "
                        "by TensorRT-LLM 1.2 (its attention plugin's dynamic scaling takes Hunyuan's 'alpha'); "
                        "use target: torch")
    if cfg.architecture == "Phi3ForCausalLM" and spec.tp_size > 1:
        raise SpecError("target tensorrt_llm: TensorRT-LLM lists no tensor parallelism for Phi-3 "
                        "(examples/models/core/phi/README.md); use tp_size 1 (pp_size works), or target: torch")
    if cfg.architecture == "Gemma2ForCausalLM" and spec.limits.max_seq_len > GEMMA2_MAX_SEQ_LEN:
        raise SpecError(f"target tensorrt_llm: TensorRT-LLM 1.2 allows Gemma 2 sequences up to {GEMMA2_MAX_SEQ_LEN} "
                        f"tokens; lower limits.max_seq_len ({spec.limits.max_seq_len}), or use target: torch")


def trtllm_build_argv(spec: BuildSpec, checkpoint_dir: Path, output_dir: Path) -> list[str]:
    """trtllm-build's command line for the sharded checkpoint in checkpoint_dir (its mapping sets tp and pp)."""
    lim = spec.limits
    argv = [
        "trtllm-build",
        "--checkpoint_dir", str(checkpoint_dir),
        "--output_dir", str(output_dir),
        "--max_batch_size", str(lim.max_batch_size),
        "--max_input_len", str(lim.max_input_len),
        "--max_seq_len", str(lim.max_seq_len),
        "--max_num_tokens", str(lim.max_num_tokens),
        "--max_beam_width", "1",  # the engine here samples one beam (beam_width > 1 is refused at the API)
        "--kv_cache_type", "paged",
        "--tokens_per_block", str(lim.tokens_per_block),
        "--gpt_attention_plugin", "auto",
        "--gemm_plugin", "auto",
        "--context_fmha", "enable",
        "--use_paged_context_fmha", "enable",  # needed for KV block reuse and chunked context
        "--remove_input_padding", "enable",
        "--workers", str(spec.world_size),  # one engine per rank, built in parallel when there are GPUs for it
    ]
    if spec.kv_cache_quant_algo == "FP8":
        argv += ["--use_fp8_context_fmha", "enable"]  # context attention reads the FP8 KV cache directly
    return argv


def check_available() -> str:
    """The importable tensorrt_llm's version; raises TrtllmUnavailable saying why it cannot build here."""
    try:
        trtllm = importlib.import_module("tensorrt_llm")
    except Exception as exc:  # ImportError, or a CUDA library missing underneath it
        raise TrtllmUnavailable(f"the tensorrt_llm target needs the tensorrt_llm package ({SUPPORTED_MAJOR_MINOR}.x), "
                                f"which is not importable here ({type(exc).__name__}: {exc}); "
                                f"{GPU_IMAGE_HINT}") from None
    version = str(getattr(trtllm, "__version__", "unknown"))
    if not version.startswith(SUPPORTED_MAJOR_MINOR + "."):
        raise TrtllmUnavailable(f"tensorrt_llm {version} is installed; this pipeline writes checkpoints and flags for "
                                f"{SUPPORTED_MAJOR_MINOR}.x")
    import torch

    if not torch.cuda.is_available():
        raise TrtllmUnavailable(f"tensorrt_llm {version} is importable but no CUDA GPU is visible; {GPU_IMAGE_HINT}")
    if shutil.which("trtllm-build") is None:
        raise TrtllmUnavailable(f"tensorrt_llm {version} is importable but `trtllm-build` is not on PATH")
    return version


def run_trtllm_build(argv: list[str], log_path: Path) -> Path:
    """Run trtllm-build, its output in log_path; returns the engine dir. Raises RuntimeError with the log's tail."""
    output_dir = Path(argv[argv.index("--output_dir") + 1])
    with open(log_path, "w") as log:
        proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"trtllm-build exited {proc.returncode} (log: {log_path}):\n{tail}")
    if not list(output_dir.glob("rank*.engine")):
        raise RuntimeError(f"trtllm-build wrote no rank*.engine into {output_dir} (log: {log_path})")
    return output_dir
