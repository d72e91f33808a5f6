"""decode_delta of another revision against this checkout's, interleaved in one process: microseconds per streamed
token (one token at a time, with its CONTEXT_TOKENS context, over json's source), and their texts compared.
A measurement, not a test.

    git show 3e70c91:backend/serving/detokenizer.py > /tmp/detokenizer_old.py
    .venv/bin/python perf/probes/detokenizer_ab.py /tmp/detokenizer_old.py
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path

from backend.serving import detokenizer
from backend.serving.preprocess import load_tokenizer
from ensembles import artifacts


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location("detokenizer_other", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stream(module, tok, ids: list[int]) -> tuple[float, list[str]]:
    """(us per token, texts) of decoding ids one token at a time."""
    n = detokenizer.CONTEXT_TOKENS
    began = time.perf_counter()
    texts = [module.decode_delta(tok, ids[i - n:i], ids[i:i + 1], False) for i in range(n, len(ids))]
    return (time.perf_counter() - began) / (len(ids) - n) * 1e6, texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("other", type=Path, help="another revision's backend/serving/detokenizer.py")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    tok = load_tokenizer(artifacts.demo().tokenizer_dir)
    ids = tok.encode(Path(json.decoder.__file__).read_text(), add_special_tokens=False)[:600]
    modules = {"other": load_module(args.other), "this": detokenizer}
    times: dict[str, list[float]] = {name: [] for name in modules}
    texts = {}
    for _ in range(args.rounds):
        for name, module in modules.items():
            us, texts[name] = stream(module, tok, ids)
            times[name].append(us)
    assert texts["other"] == texts["this"], "the two revisions stream different text"
    for name, runs in times.items():
        print(f"{name}: median {statistics.median(runs):.1f} us a token (min {min(runs):.1f})")


if __name__ == "__main__":
    main()
