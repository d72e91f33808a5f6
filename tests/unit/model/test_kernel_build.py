"""The kernel build's locking: a build killed part-way must not stall the next one (build.build_once).

These drive torch's real JIT builder (cpp_extension.load, with its FileBaton `lock` file) on a tiny C extension
that compiles in seconds, in a temporary directory, so they say what happens to the real kernels' build.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from backend.model.kernels import build

TINY = """
#include <Python.h>
static struct PyModuleDef tiny_def = {PyModuleDef_HEAD_INIT, "%(name)s", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_%(name)s(void) { return PyModule_Create(&tiny_def); }
"""


def _builder(tmp_path: Path, name: str):
    """(directory, build): build() compiles the tiny extension `name` with torch's JIT builder into directory."""
    from torch.utils import cpp_extension

    source = tmp_path / f"{name}.cpp"
    source.write_text(TINY % {"name": name})
    directory = tmp_path / "kernels" / name
    calls = []

    def build():
        calls.append(1)
        return cpp_extension.load(name, [str(source)], build_directory=str(directory), verbose=False)

    build.calls = calls
    return directory, build


def _within(seconds: float, fn):
    """fn() run in a thread; its result, or a failure naming the hang if it takes longer than `seconds`."""
    box = {}
    thread = threading.Thread(target=lambda: box.update(result=fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    return box["result"]


def test_a_lock_left_by_a_killed_build_is_removed_and_the_build_runs(tmp_path):
    directory, builder = _builder(tmp_path, "tiny_stale")
    directory.mkdir(parents=True)
    (directory / "lock").touch()  # what torch's FileBaton leaves when its builder is killed mid-build
    with pytest.warns(RuntimeWarning, match="lock"):
        module = _within(120, lambda: build.build_once("tiny_stale", directory, builder))
    assert module.__name__ == "tiny_stale"
    assert not (directory / "lock").exists()


def test_a_real_build_killed_part_way_does_not_stall_the_next(tmp_path):
    """A process killed (SIGKILL) while it builds, holding both locks; the next build completes."""
    directory, builder = _builder(tmp_path, "tiny_killed")
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from torch.utils import file_baton
        from backend.model.kernels import build
        directory = Path({str(directory)!r})
        def stuck():  # torch's baton taken, then the process dies before releasing it
            directory.mkdir(parents=True, exist_ok=True)
            assert file_baton.FileBaton(str(directory / "lock")).try_acquire()
            print("holding", flush=True)
            time.sleep(600)
        build.build_once("tiny_killed", directory, stuck)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             cwd=Path(build.__file__).resolve().parents[3])
    with pytest.warns(RuntimeWarning, match="lock"):
        try:
            assert child.stdout.readline().strip() == "holding"
            waiter = threading.Thread(target=lambda: build.build_once("tiny_killed", directory, builder),
                                      daemon=True)
            waiter.start()
            time.sleep(1.0)
            assert waiter.is_alive() and not builder.calls, "a second builder must wait while the first is alive"
        finally:
            child.kill()
            child.wait()
        waiter.join(120)
    assert not waiter.is_alive() and builder.calls == [1]
    assert (directory / "tiny_killed.so").is_file()


def test_a_library_cut_short_is_built_again(tmp_path):
    directory, builder = _builder(tmp_path, "tiny_cut")
    directory.mkdir(parents=True)
    (directory / "tiny_cut.so").write_bytes(b"\x7fELF")  # a link killed part-way
    with pytest.warns(RuntimeWarning, match="does not load"):
        module = _within(120, lambda: build.build_once("tiny_cut", directory, builder))
    assert module.__name__ == "tiny_cut" and builder.calls == [1]


def test_a_built_library_loads_without_building(tmp_path):
    directory, builder = _builder(tmp_path, "tiny_built")
    build.build_once("tiny_built", directory, builder)
    assert build.build_once("tiny_built", directory, builder).__name__ == "tiny_built"
    assert builder.calls == [1]


# The instruction sets the sources' #if branches select: baseline x86-64 (the fallbacks), AVX2 + FMA (f32_gemv,
# row_ops, paged_decode), AVX-512 with BF16 (bf16_gemv, causal_prefill, paged_decode's wide loops). -march=native
# compiles one of them; the others reached CI only on a machine that has them (causal_prefill.cpp's AVX-512 branch
# lost its ATen/Parallel.h include to 141ad1c and failed to build on the first AVX-512 BF16 CPU after it).
MARCHES = ("x86-64", "x86-64-v3", "sapphirerapids")


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler: the kernels are optional there")
def test_the_kernels_build_where_a_compiler_is():
    """With a compiler, the kernels must build: a failed build only warns (the engine falls back to ATen), and every
    kernel test skips when they are unavailable, so this is the test that goes red."""
    assert build.load().f32_gemv_available() in (True, False)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or shutil.which("c++") is None,
                    reason="the kernels' branches are x86 instruction sets")
@pytest.mark.parametrize("march", MARCHES)
def test_the_kernels_compile_as_cpp17_for_every_instruction_set(march):
    """Every source parsed as C++17 against this torch's headers for each instruction set its branches select, so
    an AVX2 machine checks the AVX-512 code and the reverse. torch builds extensions with -std=c++17 before 2.13
    (pyproject allows torch>=2.5) and -std=c++20 from it, so CI's own build would not see a C++20-only call:
    causal_prefill.cpp's make_unique_for_overwrite failed to build on a lent GPU machine's torch 2.11
    (perf/CUDA.md). Two compilers at a time, ~15 s a source (bindings.cpp, which alone includes
    torch/extension.h, ~33 s); sources without instruction-set branches are parsed at one level only."""
    import sysconfig

    from torch.utils import cpp_extension

    includes = [f"-isystem{path}" for path in (*cpp_extension.include_paths(), sysconfig.get_paths()["include"])]
    flags = [f"-march={march}" if flag == "-march=native" else flag for flag in build.CFLAGS]
    command = ["c++", "-std=c++17", "-fsyntax-only", *flags, *includes, "-DTORCH_EXTENSION_NAME=cpp17_check",
               "-DTORCH_API_INCLUDE_EXTENSION_H"]
    pending = [s for s in build.SOURCES if march == MARCHES[-1] or "#if defined(__AVX" in s.read_text()]
    running: list[tuple[Path, subprocess.Popen]] = []
    failures = []
    while pending or running:
        while pending and len(running) < 2:
            source = pending.pop()
            running.append((source, subprocess.Popen([*command, str(source)], stderr=subprocess.PIPE, text=True)))
        source, proc = running.pop(0)
        _, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            failures.append(f"{source.name} (-march={march}):\n{err[-2000:]}")
    assert not failures, "\n".join(failures)


# The kernels' tests whose code paths differ between AVX2 and AVX-512 builds (paged_decode.cpp's vector widths,
# row_ops.cpp, which is exact only beside ATen's AVX2 kernels, f32_gemv.cpp and the decode layers around them).
AVX2_PATH_TESTS = ("test_paged_decode.py", "test_row_ops.py", "test_f32_gemv.py", "test_decode_layers.py",
                   "test_prepacked_linear.py")


@pytest.mark.skipif("avx512f" not in build._cpu_flags().split() or shutil.which("c++") is None,
                    reason="an AVX-512 CPU with a compiler (elsewhere the native build is the AVX2 one: its tests run)")
def test_the_avx2_code_paths_pass_their_tests_on_this_avx512_cpu():
    """The issue's machines have AVX2 and no AVX-512: on a CPU with AVX-512, build the kernels for x86-64-v3
    (TRITONLLM_KERNEL_MARCH) and run ATen's AVX2 kernels (ATEN_CPU_CAPABILITY), so that the AVX2 branches and the
    fused row operations are tested here too instead of skipped or never compiled."""
    here = Path(__file__).resolve().parent
    env = {**os.environ, "TRITONLLM_KERNEL_MARCH": "x86-64-v3", "ATEN_CPU_CAPABILITY": "avx2"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           *[str(here / name) for name in AVX2_PATH_TESTS]],
                          cwd=here.parents[2], env=env, capture_output=True, text=True, timeout=1800)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    # Only the AVX-512 BF16 kernels may be missing from an x86-64-v3 build; the row operations and the float32 GEMV ran.
    assert not [line for line in skipped if "row operations" in line or "float32 GEMV" in line or "build" in line], \
        skipped
    assert [line for line in skipped if "bf16 GEMV" in line], "the native build ran, not the x86-64-v3 one"
