"""The paged decode kernel against the torch path it replaces (gather + SDPA, or the eager soft-capped attention)
on the masks step_tensors builds: full and sliding windows, contexts starting past released blocks, grouped and
plain heads, soft caps, ragged lengths; and where the kernel is and is not chosen."""
from __future__ import annotations

import pytest
import torch

from backend.engine.config import EngineConfig
from backend.model.decoder import attend, gather
from backend.model.kernels.paged_decode import load, paged_decode, resolve_attention_kernel
from backend.model.rope import RopeSpec
from backend.model.rotary import RotaryEmbedding
from backend.model.step_inputs import StepInputs, step_tensors

ROTARY = RotaryEmbedding(RopeSpec("default", 10000.0, 8, 64), torch.device("cpu"))
CPU = torch.device("cpu")


def _decode_step(lengths: list[int], ctx_start: list[int], block: int, slots_total: int, seed: int) -> StepInputs:
    """One decode token per sequence; each sequence's context in shuffled blocks of the pool."""
    g = torch.Generator().manual_seed(seed)
    L = max(n - s for n, s in zip(lengths, ctx_start))
    blocks = torch.randperm(slots_total // block, generator=g)
    per_seq = -(-L // block)
    rows = []
    for b in range(len(lengths)):
        mine = blocks[b * per_seq:(b + 1) * per_seq]
        rows.append((mine[:, None] * block + torch.arange(block)).reshape(-1)[:L])
    end = torch.tensor(lengths)
    return StepInputs.of(tokens=torch.zeros(len(lengths), dtype=torch.long), start=end - 1, end=end,
                         sampled=torch.ones(len(lengths), dtype=torch.long), context_slots=torch.stack(rows),
                         ctx_start=torch.tensor(ctx_start))


# Groups of 1, 2, 3, 4 (two passes of 2) and 8 (3 + 3 + 2) query heads per KV head; head sizes the AVX-512 loops
# take in one, two and three 16-column registers, in two chunks (128, 80 = 64 + 16), and not at all (40: not a
# multiple of 16). Context lengths of 1, 5 (a window), 37 and 200 rows: whole and partial eight-row blocks, odd counts
# (the value loop's paired rows).
@pytest.mark.parametrize("heads,kv,dim", [(8, 4, 32), (12, 4, 64), (4, 4, 16), (16, 2, 128), (6, 2, 80), (6, 3, 40),
                                          (10, 5, 48), (8, 2, 64)])
@pytest.mark.parametrize("window", [None, 5, 100])
@pytest.mark.parametrize("softcap", [None, 50.0])
def test_equals_the_torch_path(heads, kv, dim, window, softcap):
    torch.manual_seed(heads + dim)
    inputs = _decode_step([37, 1, 64, 200], ctx_start=[0, 0, 16, 96], block=16, slots_total=2048, seed=dim)
    _, meta, _ = step_tensors(inputs, ROTARY, {window}, torch.float32, CPU, paged_decode=True)
    assert meta.decode_only and meta.decode_columns is not None
    k_cache, v_cache = torch.randn(2048, kv, dim), torch.randn(2048, kv, dim)
    q = torch.randn(4, heads, dim)
    scale = dim ** -0.5
    want = attend(q[:, :, None], gather(k_cache, meta.context_slots).transpose(1, 2),
                  gather(v_cache, meta.context_slots).transpose(1, 2), meta.masks[window], scale, softcap)[:, :, 0]
    first, stop = meta.decode_columns[window]
    got = paged_decode(q, k_cache, v_cache, meta.context_slots, first, stop, scale, softcap)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)


def test_columns_are_the_masks_columns():
    inputs = _decode_step([10, 30, 3], ctx_start=[0, 8, 0], block=4, slots_total=128, seed=1)
    _, meta, _ = step_tensors(inputs, ROTARY, {None, 6}, torch.float32, CPU, paged_decode=True)
    for window in (None, 6):
        first, stop = meta.decode_columns[window]
        mask = meta.masks[window][:, 0, 0]  # (B, L)
        for b in range(3):
            cols = mask[b].nonzero().flatten()
            assert (int(first[b]), int(stop[b])) == (int(cols[0]), int(cols[-1]) + 1), (window, b)


def test_a_step_with_a_prefill_chunk_has_no_columns():
    inputs = StepInputs.of(tokens=torch.tensor([1, 2, 3]), start=torch.tensor([0, 5]), end=torch.tensor([2, 6]),
                           sampled=torch.tensor([1, 1]), context_slots=torch.arange(12).view(2, 6))
    _, meta, _ = step_tensors(inputs, ROTARY, {None}, torch.float32, CPU, paged_decode=True)
    assert not meta.decode_only and meta.decode_columns is None


def test_bad_column_ranges_and_dtypes_are_refused():
    load()
    q, pool, slots = torch.randn(1, 2, 8), torch.randn(16, 1, 8), torch.arange(4)[None]
    one = torch.tensor([1])
    with pytest.raises(RuntimeError, match="column range of sequence 0"):
        paged_decode(q, pool, pool, slots, one, one, 1.0, None)  # empty
    with pytest.raises(RuntimeError, match="column range of sequence 0"):
        paged_decode(q, pool, pool, slots, torch.tensor([0]), torch.tensor([5]), 1.0, None)  # past L
    with pytest.raises(RuntimeError, match="slot outside the pool, sequence 0"):
        paged_decode(q, pool, pool, torch.tensor([[0, 1, 16, 3]]), torch.tensor([0]), torch.tensor([4]), 1.0, None)
    with pytest.raises(RuntimeError, match="float32 queries, and float32 or bfloat16 pools"):
        paged_decode(q.double(), pool.double(), pool.double(), slots, torch.tensor([0]), one, 1.0, None)
    with pytest.raises(RuntimeError, match="K and V alike"):
        paged_decode(q, pool, pool.bfloat16(), slots, torch.tensor([0]), one, 1.0, None)


@pytest.mark.parametrize("heads,kv,dim", [(8, 4, 32), (12, 4, 64), (4, 2, 12)])  # dim 12: no 8-wide rows
@pytest.mark.parametrize("softcap", [None, 50.0])
def test_bf16_pools_equal_their_float32_widening(heads, kv, dim, softcap):
    """A bf16 pool is widened on load, exactly: the kernel gives bit for bit what it gives on the pool's float32
    copy (bf16 KV beside bf16 linears)."""
    torch.manual_seed(heads * dim)
    inputs = _decode_step([37, 9, 64], [0, 0, 8], block=8, slots_total=256, seed=heads)
    k, v = torch.randn(256, kv, dim).bfloat16(), torch.randn(256, kv, dim).bfloat16()
    q = torch.randn(3, heads, dim)
    stop = inputs.end - inputs.ctx_start
    first = torch.zeros_like(stop)
    got = paged_decode(q, k, v, inputs.context_slots, first, stop, dim ** -0.5, softcap)
    want = paged_decode(q, k.float(), v.float(), inputs.context_slots, first, stop, dim ** -0.5, softcap)
    assert torch.equal(got, want)


def test_the_kernels_run_on_torchs_openmp_runtime_in_parallel_with_the_same_result():
    from backend.model.kernels.build import openmp_runtimes

    load()
    assert len(openmp_runtimes()) == 1, openmp_runtimes()  # one runtime: torch.set_num_threads governs the kernels
    inputs = _decode_step([37, 1, 64, 200], ctx_start=[0, 0, 16, 96], block=16, slots_total=2048, seed=3)
    _, meta, _ = step_tensors(inputs, ROTARY, {None}, torch.float32, CPU, paged_decode=True)
    k_cache, v_cache, q = torch.randn(2048, 4, 32), torch.randn(2048, 4, 32), torch.randn(4, 8, 32)
    threads = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            outs.append(paged_decode(q, k_cache, v_cache, meta.context_slots, *meta.decode_columns[None], 0.2, None))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[1])


def test_the_kernel_lets_other_python_threads_run():
    """The binding releases the GIL (bindings.cpp, as torch's operators do): a served engine's response-sending
    thread runs while a step is in the kernels. A counting thread advances during one long call; were the GIL held,
    it could not run at all until the call returned."""
    import threading
    import time

    load()
    g = torch.Generator().manual_seed(0)
    # 16 rows of 65,536 tokens: ~70 ms on a Zen 5 core (AVX-512), longer elsewhere; 16,384 took 17.7 ms there.
    slots = torch.randint(0, 8192, (16, 65536), generator=g)
    k_cache, v_cache, q = torch.randn(8192, 4, 64), torch.randn(8192, 4, 64), torch.randn(16, 16, 64)
    first, stop = torch.zeros(16, dtype=torch.long), torch.full((16,), 65536)
    count, done = [0], threading.Event()

    def counter() -> None:
        while not done.is_set():
            count[0] += 1

    def share_during_a_call() -> tuple[float, str]:
        """Counts during one call / the counter's own rate over the call's time (held GIL: at most one switch
        interval, 5 ms, of a ~100 ms call: ~0.1)."""
        alone, began = count[0], time.perf_counter()
        time.sleep(0.05)  # the counter alone: its rate
        rate = (count[0] - alone) / (time.perf_counter() - began)
        before, began = count[0], time.perf_counter()
        paged_decode(q, k_cache, v_cache, slots, first, stop, 0.125, None)
        took, during = time.perf_counter() - began, count[0] - before
        assert took > 0.02, f"the call took {took * 1e3:.1f} ms: too short to tell"
        return during / (rate * took), f"{during} counts in {took * 1e3:.1f} ms at {rate:.0f}/s alone"

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core for the kernel, one for the counter
    worker = threading.Thread(target=counter)
    worker.start()
    try:
        tries = []
        for _ in range(3):  # a busy machine may starve the counter once; a held GIL starves it every time
            tries.append(share_during_a_call())
            if tries[-1][0] > 0.25:
                break
    finally:
        done.set()
        worker.join()
        torch.set_num_threads(threads)
    # released: ~1 on an idle machine, 0.49-0.50 with every core taken by other processes (seen: a fresh-clone CI
    # beside this test); held: at most one switch interval of the call, ~0.01-0.1
    assert tries[-1][0] > 0.25, f"the GIL looks held during the kernel: {tries}"


def test_where_the_kernel_is_chosen():
    assert resolve_attention_kernel("auto", "cpu", torch.float32) == "paged"
    assert resolve_attention_kernel("auto", "cpu", torch.bfloat16) == "torch"
    assert resolve_attention_kernel("auto", "cuda", torch.float32) == "torch"
    assert resolve_attention_kernel("torch", "cpu", torch.float32) == "torch"
    with pytest.raises(ValueError, match="attention_kernel 'paged' is unavailable: .*float32 only"):
        resolve_attention_kernel("paged", "cpu", torch.bfloat16)
    with pytest.raises(ValueError, match="attention_kernel must be one of"):
        resolve_attention_kernel("flash", "cpu", torch.float32)
    with pytest.raises(ValueError, match="attention_kernel must be one of"):
        EngineConfig(attention_kernel="flash")
    with pytest.raises(ValueError, match="attention_kernel 'paged' runs on CPU only"):
        EngineConfig(attention_kernel="paged", device="cuda")


def test_a_kernel_that_cannot_build_falls_back_under_auto_and_is_refused_when_asked_for(monkeypatch, tmp_path, caplog):
    from torch.utils import cpp_extension

    from backend.model.kernels import build as kernel

    def no_compiler(*args, **kwargs):
        raise RuntimeError("g++: command not found")

    monkeypatch.setattr(kernel, "build_root", lambda: tmp_path)  # nothing built there
    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    kernel.load.cache_clear()
    try:
        with caplog.at_level("WARNING"):
            assert resolve_attention_kernel("auto", "cpu", torch.float32) == "torch"
        assert "g++: command not found" in caplog.text
        with pytest.raises(ValueError, match=r"attention_kernel 'paged' is unavailable: building the kernels \(paged_decode.cpp"):
            resolve_attention_kernel("paged", "cpu", torch.float32)
    finally:
        kernel.load.cache_clear()  # the real build again for the other tests
