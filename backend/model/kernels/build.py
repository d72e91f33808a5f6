"""The compiled CPU kernels (paged_decode.cpp, decode_layers.cpp, bound in bindings.cpp) as one torch JIT extension.

Built once per machine and source (the build directory's name carries a hash of the sources, the compiler flags, the
torch version and the CPU's feature flags, since it is compiled for this CPU: -march=native) under
`$TRITONLLM_CACHE/kernels`, else `<repo>/.cache/kernels`: about a minute on 2 cores, then a load takes milliseconds.
`python -m backend.model.kernels.build` builds it ahead of time (`make kernels` does), so that no model process
compiles while a server starts.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import platform
import re
from pathlib import Path
from types import ModuleType

import torch

HERE = Path(__file__).resolve().parent
SOURCES = tuple(HERE / name for name in ("paged_decode.cpp", "decode_layers.cpp", "bindings.cpp"))
HEADERS = tuple(HERE / name for name in ("kernels.h",))
# -fopenmp: at::parallel_for is inlined from ATen's headers and runs serially unless the code is compiled with OpenMP.
# The library links against the OpenMP runtime torch has loaded (openmp_runtimes()), so that the process keeps one
# runtime: one thread pool, and torch.set_num_threads governs the kernels too.
CFLAGS = ("-O3", "-march=native", "-fopenmp")
_OPENMP = re.compile(r"/lib(gomp|iomp5|omp)[^/]*\.so[^/]*$")


class KernelUnavailable(RuntimeError):
    """The kernels cannot be built or loaded here; the message says why."""


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def openmp_runtimes() -> list[str]:
    """Paths of the OpenMP runtimes mapped into this process (torch's, once torch is imported)."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    paths = {fields[-1] for fields in map(str.split, lines) if len(fields) >= 6}  # the 6th field: the mapped file
    return sorted(path for path in paths if _OPENMP.search(path))


def ldflags() -> list[str]:
    """torch's OpenMP runtime by path (its own soname then resolves to the loaded copy), else the compiler's."""
    runtimes = openmp_runtimes()
    torch_own = [r for r in runtimes if "/torch/lib/" in r or "/torch.libs/" in r]
    return (torch_own or runtimes or ["-fopenmp"])[:1]


def build_name() -> str:
    """tritonllm_kernels_<hash of sources, flags, torch, CPU>: a change of any of them builds anew."""
    texts = [path.read_text() for path in SOURCES + HEADERS]
    key = "\n".join([*texts, " ".join(CFLAGS + tuple(ldflags())), torch.__version__, _cpu_flags()])
    return "tritonllm_kernels_" + hashlib.sha256(key.encode()).hexdigest()[:12]


def build_root() -> Path:
    cache = os.environ.get("TRITONLLM_CACHE")
    return (Path(cache) if cache else HERE.parents[2] / ".cache") / "kernels"


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
        return cpp_extension.load(name, [str(s) for s in SOURCES], extra_cflags=list(CFLAGS),
                                  extra_ldflags=ldflags(), build_directory=str(directory), verbose=False)
    except Exception as exc:  # a compiler, ninja or header missing: say which
        raise KernelUnavailable(f"building the kernels ({', '.join(s.name for s in SOURCES)}) in {directory} "
                                f"failed: {exc}") from exc


if __name__ == "__main__":
    load()
    print(build_root() / build_name())
