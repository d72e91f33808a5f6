"""The build report: what was built, how long each stage took, and what verification measured (JSON + markdown).
`summary_markdown` puts several builds' reports side by side (docs/build_report_demo.md)."""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from tqdm import tqdm

if TYPE_CHECKING:
    from build_engines.plan import MemoryPlan
    from build_engines.spec import BuildSpec
    from build_engines.verify import LayerCheck, ShardCheck

# A 1-minute load average over this share of the CPUs means other work competed with the tokens/s runs.
BUSY_LOAD_PER_CPU = 0.5


@dataclass(frozen=True)
class Throughput:
    batch: int
    tokens_per_s: float  # output tokens/s, greedy, all requests submitted at once
    prompt_len: int
    new_tokens: int
    load_average: float  # 1-minute load average around the run (the machine may be shared)
    cpus: int


@dataclass
class Verification:
    quality: dict  # quantize/evaluate.py's QualityReport: tokens, perplexity, reference_perplexity, top1_agreement
    seq_len: int
    reference: str
    shard_check: ShardCheck | None = None
    layer_check: LayerCheck | None = None
    throughput: list[Throughput] = field(default_factory=list)

    @property
    def perplexity(self) -> float:
        return self.quality["perplexity"]

    @property
    def top1_agreement(self) -> float:
        return self.quality["top1_agreement"]


@dataclass
class BuildReport:
    name: str
    spec: dict
    source: str
    memory_plan: dict
    memory_plan_text: str
    stages: dict[str, float] = field(default_factory=dict)  # stage -> seconds
    sizes: dict[str, int] = field(default_factory=dict)  # bytes on disk
    verification: Verification | None = None
    trtllm_build_argv: list[str] | None = None
    installed_version: int | None = None
    model_repository: str | None = None
    status: str = "running"
    build_dir: str = ""  # where report.json / report.md are written
    machine: str = field(default_factory=lambda: f"{platform.machine()}, {os.cpu_count()} CPUs, "
                                                  f"Python {platform.python_version()}")

    @classmethod
    def start(cls, spec: BuildSpec, hf_dir: Path, plan: MemoryPlan, build_dir: Path) -> BuildReport:
        return cls(name=spec.name, spec=spec.to_dict(), source=str(hf_dir), memory_plan=plan.to_dict(),
                   memory_plan_text=plan.table(), build_dir=str(build_dir))

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time a stage; a stage that raises leaves a report saying where the build failed, and why."""
        tqdm.write(f"[{self.name}] {name} ...", file=sys.stderr)
        start = time.perf_counter()
        try:
            yield
        except Exception as exc:
            self.status = f"failed in {name}: {type(exc).__name__}: {exc}"
            self.write()
            raise
        self.stages[name] = round(time.perf_counter() - start, 2)
        tqdm.write(f"[{self.name}] {name} done in {self.stages[name]:.1f} s", file=sys.stderr)

    def summary(self) -> dict:
        """What the installed version's artifact.json carries about its build."""
        v = self.verification
        out = {"build": self.name, "dtype": self.spec["dtype"], "quantization": self.spec["quantization"],
               "kv_cache": self.spec["kv_cache"], "tp_size": self.spec["tp_size"], "pp_size": self.spec["pp_size"],
               "target": self.spec["target"], "artifact_bytes": self.sizes.get("artifact_bytes")}
        if v is not None:
            out.update(perplexity=round(v.perplexity, 4), top1_agreement=round(v.top1_agreement, 4))
        return out

    def to_dict(self) -> dict:
        return asdict(self)

    def write(self) -> None:
        out_dir = Path(self.build_dir)
        (out_dir / "report.json").write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        (out_dir / "report.md").write_text(report_markdown(self.to_dict()))


def report_markdown(r: dict) -> str:
    """One build's report as markdown (from its JSON dict, so saved reports render the same)."""
    s, v = r["spec"], r["verification"]
    lines = [f"# Build report: {r['name']}", "", f"status: {r['status']}", "",
             f"source `{r['source']}`; dtype {s['dtype']}, quantization {s['quantization']}, kv_cache {s['kv_cache']}, "
             f"tp {s['tp_size']} x pp {s['pp_size']}, target {s['target']}; machine: {r['machine']}", "",
             "## Memory plan", "", r["memory_plan_text"], "",
             "## Stages", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {k} | {t} |" for k, t in r["stages"].items()]
    lines += ["", "## Size on disk", "", "| what | MiB |", "|---|---|"]
    lines += [f"| {k.removesuffix('_bytes')} | {b / 2**20:.2f} |" for k, b in r["sizes"].items()]
    if v:
        q = v["quality"]
        lines += ["", "## Verification", "",
                  f"{q['tokens']} held-out next-token predictions (windows of {v['seq_len']} tokens, held-out part 1; "
                  f"calibration used part 0); reference: {v['reference']}.", "",
                  f"- perplexity: {q['perplexity']:.3f} (reference {q['reference_perplexity']:.3f})",
                  f"- top-1 agreement with the reference: {q['top1_agreement']:.4f}"]
        if v["shard_check"]:
            c = v["shard_check"]
            lines.append(f"- sharded engine vs single-rank checkpoint, greedy: {c['equal']}/{c['tokens']} tokens equal "
                         f"({c['prompts']} held-out prompts)")
        if v["layer_check"]:
            c = v["layer_check"]
            lines += [f"- ONNX layer 0 vs torch runtime (polygraphy, onnxruntime CPU): "
                      f"{'passed' if c['passed'] else 'FAILED'} at atol {c['atol']} / rtol {c['rtol']}, "
                      f"max |diff| {c['max_abs_diff']:.2e}; rerun: `{c['command']}`"]
        for t in v["throughput"]:
            lines.append(f"- tokens/s at batch {t['batch']}: {t['tokens_per_s']:.1f} ({t['prompt_len']} prompt + "
                         f"{t['new_tokens']} new tokens; load average {t['load_average']} on {t['cpus']} CPUs"
                         f"{', busy' if t['load_average'] > BUSY_LOAD_PER_CPU * t['cpus'] else ''})")
    if r.get("trtllm_build_argv"):
        ran = "trtllm-build" in r["stages"]
        lines += ["", "## trtllm-build" + ("" if ran else " (the command; not run)"), "", "```",
                  " ".join(r["trtllm_build_argv"]), "```"]
    if r.get("installed_version") is not None:
        lines += ["", f"Installed as version {r['installed_version']} of tensorrt_llm in `{r['model_repository']}`."]
    return "\n".join(lines) + "\n"


def summary_markdown(reports: list[dict]) -> str:
    """Several builds side by side: size on disk, perplexity, top-1 agreement, tokens/s."""
    batches = sorted({t["batch"] for r in reports if r["verification"] for t in r["verification"]["throughput"]})
    head = ("| build | dtype | quant | kv | tp x pp | size on disk (MiB) | perplexity (ref) | top-1 agreement | "
            + " | ".join(f"tok/s bs{b}" for b in batches) + " |")
    lines = [head, "|" + "---|" * (8 + len(batches))]
    for r in reports:
        s, v = r["spec"], r["verification"]
        tps = {t["batch"]: t["tokens_per_s"] for t in v["throughput"]} if v else {}
        lines.append(f"| {r['name']} | {s['dtype']} | {s['quantization']} | {s['kv_cache']} | {s['tp_size']} x "
                     f"{s['pp_size']} | {r['sizes'].get('artifact_bytes', 0) / 2**20:.2f} | "
                     + (f"{v['quality']['perplexity']:.3f} ({v['quality']['reference_perplexity']:.3f}) | "
                        f"{v['quality']['top1_agreement']:.4f} | " if v else "- | - | ")
                     + " | ".join(f"{tps[b]:.1f}" if b in tps else "-" for b in batches) + " |")
    return "\n".join(lines) + "\n"


def dir_bytes(directory: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in Path(directory).glob(pattern) if p.is_file())
