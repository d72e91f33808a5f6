"""Decode attention read in place from the paged KV pool (paged_decode.cpp), built as a torch JIT extension.

Built once per machine and source (the build directory's name carries a hash of the source, the compiler flags, the
torch version and the CPU's feature flags, since it is compiled for this CPU: -march=native) under
`$TRITONLLM_CACHE/kernels`, else `<repo>/.cache/kernels`: about 35 s on 2 cores, then a load takes milliseconds.
`python -m backend.model.kernels.paged_decode` builds it ahead of time (`make kernels` does), so that no model
process compiles while a server starts.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import platform
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_suffix(".cpp")
ATTENTION_KERNELS = ("auto", "torch", "paged")
CFLAGS = ("-O3", "-march=native", "-fopenmp-simd")


class KernelUnavailable(RuntimeError):
    """The kernel cannot be built or loaded here; the message says why."""


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def build_name() -> str:
    """tritonllm_paged_decode_<hash of source, flags, torch, CPU>: a change of any of them builds anew."""
    key = "\n".join([SOURCE.read_text(), " ".join(CFLAGS), torch.__version__, _cpu_flags()])
    return "tritonllm_paged_decode_" + hashlib.sha256(key.encode()).hexdigest()[:12]


def build_root() -> Path:
    cache = os.environ.get("TRITONLLM_CACHE")
    return (Path(cache) if cache else Path(__file__).resolve().parents[3] / ".cache") / "kernels"


def _ninja_on_path() -> None:
    """torch's builder runs `ninja` from PATH; the pip package `ninja` (a dependency) may sit only in the venv."""
    try:
        import ninja
    except ImportError:
        return
    if ninja.BIN_DIR not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])


@functools.lru_cache(maxsize=1)
def load() -> ModuleType:
    """The built extension (built now if needed); KernelUnavailable naming the reason otherwise."""
    from torch.utils import cpp_extension

    name = build_name()
    directory = build_root() / name
    built = directory / f"{name}.so"
    if built.is_file():  # imported as it is: no ninja, no build lock (a process killed holding it stalls the next)
        spec = importlib.util.spec_from_file_location(name, built)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    _ninja_on_path()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        return cpp_extension.load(name, [str(SOURCE)], extra_cflags=list(CFLAGS), build_directory=str(directory),
                                  verbose=False)
    except Exception as exc:  # a compiler, ninja or header missing: say which
        raise KernelUnavailable(f"building {SOURCE.name} in {directory} failed: {exc}") from exc


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                 col_start: torch.Tensor, col_end: torch.Tensor, scale: float, softcap: float | None) -> torch.Tensor:
    """q (B, H, D), pools (S, KV, D), slots (B, L), columns [col_start, col_end) (B,) each -> (B, H, D)."""
    return load().paged_decode(q.contiguous(), k_cache, v_cache, slots, col_start, col_end, scale,
                               0.0 if softcap is None else softcap)


def unsupported(device: torch.device | str, dtype: torch.dtype) -> str | None:
    """Why the paged decode kernel does not apply to this device and dtype (None: it does)."""
    if torch.device(device).type != "cpu":
        return f"the paged decode kernel runs on CPU only, not on {device}"
    if dtype != torch.float32:
        return f"the paged decode kernel is float32 only, not {dtype}"
    return None


def resolve_attention_kernel(kernel: str, device: torch.device | str, dtype: torch.dtype) -> str:
    """"auto" -> "paged" where the kernel runs, else "torch" (gather + SDPA); an explicit "paged" that cannot run
    raises ValueError naming why. Float32 CPU is where it runs; a failed build under "auto" is logged as a warning."""
    if kernel not in ATTENTION_KERNELS:
        raise ValueError(f"attention_kernel must be one of {ATTENTION_KERNELS}, got {kernel!r}")
    if kernel == "torch":
        return kernel
    reason = unsupported(device, dtype)
    if reason is None:
        try:
            load()
            return "paged"
        except KernelUnavailable as exc:  # where it should have run: a failed build
            reason = str(exc)
            if kernel == "auto":
                log.warning("attention_kernel 'auto' uses gather + SDPA: %s", reason)
    if kernel == "paged":
        raise ValueError(f"attention_kernel 'paged' is unavailable: {reason}")
    return "torch"


if __name__ == "__main__":
    load()
    print(build_root() / build_name())
