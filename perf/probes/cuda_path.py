"""The engine's CUDA path on a lent GPU (CI has none; nothing here is a test). One JSON line per result:

- env: torch / transformers versions, the GPU, whether float32 matmuls may use TF32 (they must not: the families'
  check is token for token against float32).
- families: every family fixture (build_engines/family_fixtures.py) with the unit suite's prompts, limits, chunked
  prefill, prefix-cache second pass and (stateful ropes, sliding window) preemption -- the engine on the GPU against
  HF transformers float32 eager on the same GPU; also whether HF on the GPU equals HF on the CPU (near-ties).
- quant: the tiny Llama quantized each way (weights, KV cache): runs on the GPU or is refused with a message, and
  how many greedy tokens agree with the float32 engine on the GPU.
- speed: random-init Llamas (125M, ~1B), float32 and bfloat16, batch 1/16/64, 128 prompt + 128 new tokens, greedy:
  ours in-process (with and without CUDA graphs, --cuda-graph-modes) vs HF static `generate` (its default
  attention), output tok/s, equality with HF, peak memory.
- longrope, hf_batch: where the families' or speed's tokens differ, variants that isolate why.
- decode_profile (first of --models / --dtypes, largest of --sizes): decode-step time per attention variant and a
  torch.profiler table of the steps, CUDA graphs off (a captured graph would not see the variants).
- graph_steps: decode-step time with CUDA graphs off and on, and a CPU profile of the steps with them on.

    python perf/probes/cuda_path.py --out cuda_path.jsonl [--device cuda] [--sections env families quant speed]
        [--models 125m 1b] [--sizes 1 16 64] [--rounds 2]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import backend  # noqa: E402,F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from backend.engine.config import EngineConfig  # noqa: E402
from backend.engine.llm_engine import LLMEngine  # noqa: E402
from backend.engine.sampling_params import SamplingParams  # noqa: E402
from backend.engine.sequence import Request  # noqa: E402
from build_engines.convert import convert_hf_to_trtllm  # noqa: E402
from build_engines.family_fixtures import make_fixture  # noqa: E402
from build_engines.model_dims import LlamaDims  # noqa: E402
from build_engines.random_model import make_random_model, make_tiny_random  # noqa: E402
from build_engines.tokenizer import build_tokenizer  # noqa: E402
from tests.conftest import random_prompts  # noqa: E402
from tests.unit.engine.test_families import CASES, STATEFUL, _limits  # noqa: E402

MODELS = {  # name -> Llama dims (vocabulary: the demo tokenizer's 8,192)
    "125m": LlamaDims(hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=4, intermediate_size=3072),
    "1b": LlamaDims(hidden_size=2048, num_layers=16, num_heads=32, num_kv_heads=8, intermediate_size=8192),
}


class Log:
    def __init__(self, path: Path) -> None:
        self.file = open(path, "a")

    def __call__(self, **row) -> None:
        line = json.dumps(row, default=str)
        self.file.write(line + "\n")
        self.file.flush()
        print(line, flush=True)


def guarded(log: Log, section: str, fn, *args) -> None:
    """One failure is recorded with its traceback and the probe goes on."""
    start = time.perf_counter()
    try:
        fn(log, *args)
    except Exception as exc:  # a probe: record and continue
        log(section=section, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:])
    log(section=section, done_s=round(time.perf_counter() - start, 1))


def env(log: Log, device: str) -> None:
    dev = torch.device(device)
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else None
    log(section="env", torch=torch.__version__, transformers=transformers.__version__, gpu=gpu,
        matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32, cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
        float32_matmul_precision=torch.get_float32_matmul_precision())


def hf_tokens(model, prompt: tuple[int, ...], n: int) -> list[int]:
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=1, max_new_tokens=n,
                         min_new_tokens=n, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def hf_fresh(hf_dir: Path, device: str, prompt: tuple[int, ...], n: int) -> list[int]:
    """A fresh float32 eager model per prompt (dynamic NTK keeps state across generate calls), as the unit suite."""
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
    return hf_tokens(model.to(device).eval(), prompt, n)


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _requests(prompts, n, tag):
    return [Request(f"{tag}{i}", p, SamplingParams(max_tokens=n)) for i, p in enumerate(prompts)]


def one_family(log: Log, device: str, tok: Path, root: Path, name: str) -> None:
    lengths, n = CASES[name]
    prompts = random_prompts(lengths, 8192, seed=len(name))
    hf_dir = make_fixture(name, root / name, tok)
    ckpt = convert_hf_to_trtllm(hf_dir, root / f"{name}.trtllm")
    want = [hf_fresh(hf_dir, device, p, n) for p in prompts]
    cpu = [hf_fresh(hf_dir, "cpu", p, n) for p in prompts]
    engine = LLMEngine(ckpt, _limits(name, device=device))
    first = engine.generate(_requests(prompts, n, "a"))
    second = engine.generate(_requests(prompts, n, "b"))
    got = [first[f"a{i}"] for i in range(len(prompts))]
    again = [second[f"b{i}"] for i in range(len(prompts))]
    row = dict(section="families", name=name, equal=got == want, equal_second_pass=again == want,
               prefix_hits=engine.blocks.prefix_hits, hf_gpu_equals_hf_cpu=want == cpu,
               kernels=[engine.runner.linear_kernel, engine.runner.attention_kernel],
               cuda_graphs=sorted(engine.runner.graphs.graphs) if engine.runner.graphs is not None else None)
    if got != want:
        row["first_mismatch"] = [next((j for j, (a, b) in enumerate(zip(g, w)) if a != b), None)
                                 for g, w in zip(got, want)]
    if name in STATEFUL:
        longest = max(map(len, prompts)) + n
        engine = LLMEngine(ckpt, _limits(name, device=device, max_num_tokens=96, max_input_len=longest - n,
                                         max_seq_len=longest, policy="max_utilization",
                                         max_tokens_in_paged_kv_cache=-(-longest // 8) * 8 + 8,
                                         enable_kv_cache_reuse=False))
        pre = engine.generate(_requests(prompts, n, "p"))
        row["equal_under_preemption"] = [pre[f"p{i}"] for i in range(len(prompts))] == want
        row["preempted"] = engine.scheduler.num_preempted
    log(**row)


def families(log: Log, device: str, tok: Path, root: Path) -> None:
    for name in sorted(CASES):
        guarded(log, f"families/{name}", one_family, device, tok, root, name)


def longrope(log: Log, device: str, tok: Path, root: Path) -> None:
    """The longrope fixtures' first prompt (it crosses original_max_position_embeddings while generating, where the
    engine recomputes the sequence in the long set) alone, under variants that isolate where a device differs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import backend.model.step_inputs as step_inputs
    causal_windows = step_inputs._causal_windows
    ALL_SDPA = [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                SDPBackend.CUDNN_ATTENTION]
    for name in ("phi3_128k", "phi3_partial"):
        lengths, n = CASES[name]
        prompt = random_prompts(lengths, 8192, seed=len(name))[0]
        hf_dir, ckpt = root / name, root / f"{name}.trtllm"
        if not (ckpt / "config.json").exists():
            convert_hf_to_trtllm(make_fixture(name, hf_dir, tok), ckpt)
        want = hf_fresh(hf_dir, device, prompt, n)
        sdpa = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="sdpa")
        log(section="longrope", name=name, variant="hf_sdpa_vs_hf_eager",
            common_prefix=common_prefix(hf_tokens(sdpa.to(device).eval(), prompt, n), want))
        variants = {"alone": {}, "one_chunk": dict(max_num_tokens=96), "no_reuse": dict(enable_kv_cache_reuse=False),
                    "sdpa_math": {}, "no_causal_shortcut": {}}
        for variant, overrides in variants.items():
            step_inputs._causal_windows = ((lambda *a: frozenset()) if variant == "no_causal_shortcut"
                                           else causal_windows)
            engine = LLMEngine(ckpt, _limits(name, device=device, **overrides))
            with sdpa_kernel([SDPBackend.MATH] if variant == "sdpa_math" else ALL_SDPA):
                got = engine.generate(_requests([prompt], n, "v"))["v0"]
            log(section="longrope", name=name, variant=variant, equal=got == want,
                common_prefix=common_prefix(got, want))
        step_inputs._causal_windows = causal_windows


def hf_batch(log: Log, device: str, tok: Path, root: Path) -> None:
    """Whether HF float32 on this device gives a prompt the same greedy tokens in a batch of 16 as alone (and ours)."""
    hf_dir = root / "llama1b"
    if not (hf_dir / "config.json").exists():
        make_random_model(hf_dir, tok, MODELS["1b"], seed=0)
    ckpt = convert_hf_to_trtllm(hf_dir, root / "llama1b.float32", dtype="float32")
    batch = [list(p) for p in random_prompts([128] * 16, 8192, seed=1)]
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).to(device).eval()
    engine = LLMEngine(ckpt, EngineConfig(max_batch_size=16, max_num_tokens=4096, max_input_len=512,
                                          max_seq_len=1024, device=device))
    hf16, ours16 = _hf(model, batch, 128)[1], _ours(engine, batch, 128, "b16")[1]
    for i in range(4):
        hf1, ours1 = _hf(model, batch[i:i + 1], 128)[1][0], _ours(engine, batch[i:i + 1], 128, f"b1-{i}")[1][0]
        log(section="hf_batch", prompt=i, hf_b1_vs_hf_b16=common_prefix(hf1, hf16[i]),
            ours_b1_vs_hf_b1=common_prefix(ours1, hf1), ours_b16_vs_hf_b16=common_prefix(ours16[i], hf16[i]),
            ours_b1_vs_ours_b16=common_prefix(ours1, ours16[i]), of=128)


def _attend_variant(name: str):
    """decoder.attend under a variant: "expand" repeats K/V heads instead of SDPA's enable_gqa, "float_mask" turns
    the boolean mask into an additive one (which SDPA backends take which inputs differs)."""
    import torch.nn.functional as F

    from backend.model import decoder
    base = decoder.attend

    def attend(q, k, v, mask, scale, softcap, causal=False):
        if softcap is not None:
            return base(q, k, v, mask, scale, softcap, causal)
        gqa = True
        if "expand" in name:
            groups = q.shape[1] // k.shape[1]
            k, v, gqa = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1), False
        if causal:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
        if "float_mask" in name:
            mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)

    return attend


def decode_profile(log: Log, device: str, tok: Path, root: Path, args) -> None:
    """One model, dtype and batch: median decode-step time per attention variant, and a torch.profiler table of
    the current code's decode steps (self device time, then self CPU time)."""
    from torch.profiler import ProfilerActivity, profile

    from backend.model import decoder
    name, dtype, size = args.models[0], args.dtypes[0], max(args.sizes)
    hf_dir = root / f"llama{name}"
    if not (hf_dir / "config.json").exists():
        make_random_model(hf_dir, tok, MODELS[name], seed=0)
    ckpt = convert_hf_to_trtllm(hf_dir, root / f"llama{name}.{dtype}", dtype=dtype)
    batch = [tuple(p) for p in random_prompts([args.prompt_len] * size, 8192, seed=1)]
    engine = LLMEngine(ckpt, EngineConfig(max_batch_size=size, max_num_tokens=8192, max_input_len=512,
                                          max_seq_len=1024, device=device, cuda_graph_mode="off"))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    base = decoder.attend
    for rnd in range(2):
        for variant in ("current", "expand", "float_mask", "expand_float_mask"):
            decoder.attend = base if variant == "current" else _attend_variant(variant)
            for r in _requests(batch, 40, f"{variant}{rnd}-"):
                engine.add_request(r)
            engine.step()  # the prefill
            steps = []
            for _ in range(24):
                sync()
                start = time.perf_counter()
                engine.step()
                sync()
                steps.append(time.perf_counter() - start)
            while engine.has_work():
                engine.step()
            steps.sort()
            log(section="decode_profile", model=name, dtype=dtype, size=size, variant=variant, round=rnd,
                median_step_ms=round(steps[len(steps) // 2] * 1e3, 3), min_step_ms=round(steps[0] * 1e3, 3))
    decoder.attend = base
    for r in _requests(batch, 24, "prof-"):
        engine.add_request(r)
    engine.step()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=acts) as prof:
        for _ in range(8):
            engine.step()
        sync()
    while engine.has_work():
        engine.step()
    key = "self_device_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    log(section="decode_profile", table_by_device=prof.key_averages().table(sort_by=key, row_limit=18),
        table_by_cpu=prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


def graph_steps(log: Log, device: str, tok: Path, root: Path, args) -> None:
    """Each of --models / --dtypes at each of --sizes: median decode-step time (engine.step(), sampling and
    bookkeeping included) with CUDA graphs off and on, then a CPU profile of the steps with graphs on (what the
    host still spends per step)."""
    from torch.profiler import ProfilerActivity, profile

    for name in args.models:
        hf_dir = root / f"llama{name}"
        if not (hf_dir / "config.json").exists():
            make_random_model(hf_dir, tok, MODELS[name], seed=0)
        for dtype in args.dtypes:
            ckpt = convert_hf_to_trtllm(hf_dir, root / f"llama{name}.{dtype}", dtype=dtype)
            for size in args.sizes:
                batch = [tuple(p) for p in random_prompts([args.prompt_len] * size, 8192, seed=1)]
                for mode in ("off", "on"):
                    engine = LLMEngine(ckpt, EngineConfig(max_batch_size=size, max_num_tokens=8192, max_input_len=512,
                                                          max_seq_len=1024, device=device, cuda_graph_mode=mode))
                    for rnd in range(2):
                        steps = _decode_steps(engine, batch, f"{mode}{rnd}-", 32)
                        log(section="graph_steps", model=name, dtype=dtype, size=size, cuda_graph_mode=mode,
                            round=rnd, median_step_ms=round(steps[len(steps) // 2] * 1e3, 3),
                            min_step_ms=round(steps[0] * 1e3, 3))
                    if mode == "on":
                        with profile(activities=[ProfilerActivity.CPU]) as prof:
                            _decode_steps(engine, batch, "prof-", 8)
                        log(section="graph_steps", model=name, dtype=dtype, size=size, cuda_graph_mode=mode,
                            table_by_cpu=prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))
                    del engine
                    torch.cuda.empty_cache()


def _decode_steps(engine: LLMEngine, batch, tag: str, n: int) -> list[float]:
    """Seconds of each of n decode steps (after the prefill step), sorted; the requests then run to their end."""
    for r in _requests(batch, n + 8, tag):
        engine.add_request(r)
    engine.step()  # the prefill
    steps = []
    for _ in range(n):
        torch.cuda.synchronize()
        start = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        steps.append(time.perf_counter() - start)
    while engine.has_work():
        engine.step()
    return sorted(steps)


def quant(log: Log, device: str, tok: Path, root: Path) -> None:
    from build_engines.quantize.apply import KV_CACHE_METHODS, METHODS, quantize_checkpoint
    hf_dir = make_tiny_random(root / "tiny", tok, seed=0)
    ckpt = convert_hf_to_trtllm(hf_dir, root / "tiny.trtllm", dtype="float32")
    prompts = random_prompts([40, 12, 25], 8192, seed=3)
    limits = dict(max_batch_size=4, max_num_tokens=256, max_input_len=96, max_seq_len=160, tokens_per_block=8,
                  device=device)
    ref = LLMEngine(ckpt, EngineConfig(**limits)).generate(_requests(prompts, 24, "r"))
    combos = [(m, "none") for m in METHODS] + [("none", kv) for kv in KV_CACHE_METHODS if kv != "none"]
    for method, kv in combos:
        if method == "none" and kv == "none":
            continue

        def run(log: Log, method=method, kv=kv) -> None:
            q = quantize_checkpoint(ckpt, root / f"q-{method}-{kv}", method, kv, group_size=32, tokenizer_dir=tok,
                                    max_calib_tokens=1024, progress=False)
            try:
                engine = LLMEngine(q, EngineConfig(**limits))
            except (ValueError, NotImplementedError) as exc:
                log(section="quant", method=method, kv_cache=kv, refused=str(exc))
                return
            got = engine.generate(_requests(prompts, 24, "r"))
            on_cpu = LLMEngine(q, EngineConfig(**{**limits, "device": "cpu"})).generate(_requests(prompts, 24, "r"))
            log(section="quant", method=method, kv_cache=kv, ran=True, of=24,
                common_prefix_with_float32=[common_prefix(got[k], ref[k]) for k in ref],
                common_prefix_with_same_on_cpu=[common_prefix(got[k], on_cpu[k]) for k in ref])

        guarded(log, f"quant/{method}/{kv}", run)


def _ours(engine: LLMEngine, batch, n: int, tag: str) -> tuple[float, list[list[int]]]:
    reqs = _requests(batch, n, tag)
    start = time.perf_counter()
    out = engine.generate(reqs)
    elapsed = time.perf_counter() - start
    tokens = [out[r.request_id] for r in reqs]
    return sum(map(len, tokens)) / elapsed, tokens


def _hf(model, batch, n: int) -> tuple[float, list[list[int]]]:
    ids = torch.tensor(batch, device=model.device)
    with torch.no_grad():
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                             min_new_tokens=n, pad_token_id=0)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    new = out[:, ids.shape[1]:]
    return new.numel() / elapsed, new.tolist()


def speed_model(log: Log, device: str, tok: Path, root: Path, name: str, dtype: str, args) -> None:
    hf_dir = root / f"llama{name}"
    if not (hf_dir / "config.json").exists():
        make_random_model(hf_dir, tok, MODELS[name], seed=0)
    ckpt = convert_hf_to_trtllm(hf_dir, root / f"llama{name}.{dtype}", dtype=dtype)
    batch = [list(p) for p in random_prompts([args.prompt_len] * max(args.sizes), 8192, seed=1)]
    engines, memory = {}, {}
    for mode in args.cuda_graph_modes:  # memory: what this engine allocated (the others stay alive beside it)
        before = torch.cuda.memory_allocated() if device.startswith("cuda") else 0
        engines[mode] = LLMEngine(ckpt, EngineConfig(max_batch_size=max(args.sizes), max_num_tokens=8192,
                                                     max_input_len=512, max_seq_len=1024, device=device,
                                                     cuda_graph_mode=mode))
        memory[mode] = torch.cuda.memory_allocated() - before if device.startswith("cuda") else None
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=getattr(torch, dtype)).to(device).eval()
    for engine in engines.values():
        _ours(engine, batch[:1], 8, "warm")
    _hf(model, batch[:1], 8)
    for r in range(args.rounds):
        for size in args.sizes:
            ref_tok_s, ref = _hf(model, batch[:size], args.new_tokens)
            for mode, engine in engines.items():
                tok_s, out = _ours(engine, batch[:size], args.new_tokens, f"r{r}s{size}")
                prefix = sorted(common_prefix(o, f) for o, f in zip(out, ref))
                log(section="speed", model=name, dtype=dtype, size=size, round=r, cuda_graph_mode=mode,
                    cuda_graphs=engine.runner.graphs is not None, ours_tok_s=round(tok_s, 1),
                    hf_tok_s=round(ref_tok_s, 1), ratio=round(tok_s / ref_tok_s, 3), equal_to_hf=out == ref,
                    common_prefix_min_median=[prefix[0], prefix[len(prefix) // 2]], of=args.new_tokens,
                    kv_blocks=engine.blocks.num_blocks, engine_mib=memory[mode] and memory[mode] // 2**20,
                    graphs=len(engine.runner.graphs.graphs) if engine.runner.graphs is not None else None)
            if len(engines) > 1:  # the same greedy tokens with and without graphs?
                outs = [_ours(e, batch[:size], 16, f"c{r}s{size}")[1] for e in engines.values()]
                log(section="speed", model=name, dtype=dtype, size=size, round=r,
                    modes_agree_16_tokens=all(o == outs[0] for o in outs),
                    modes_common_prefix_min=min(common_prefix(a, b) for a, b in zip(outs[0], outs[-1])))
    del engines, model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def speed(log: Log, device: str, tok: Path, root: Path, args) -> None:
    for name in args.models:
        for dtype in args.dtypes:
            guarded(log, f"speed/{name}/{dtype}", speed_model, device, tok, root, name, dtype, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sections", nargs="+", default=["env", "families", "quant", "speed"])
    parser.add_argument("--models", nargs="+", default=["125m", "1b"], choices=sorted(MODELS))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--cuda-graph-modes", nargs="+", default=["off", "on"], choices=["auto", "on", "off"],
                        help="speed: one engine per mode, side by side (families and quant run the default, auto)")
    args = parser.parse_args()
    log = Log(args.out)
    tok = build_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for section in args.sections:
            if section == "env":
                guarded(log, "env", env, args.device)
            elif section in ("speed", "decode_profile", "graph_steps"):
                guarded(log, section, globals()[section], args.device, tok, root, args)
            else:
                guarded(log, section, globals()[section], args.device, tok, root)


if __name__ == "__main__":
    main()
