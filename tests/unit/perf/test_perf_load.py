"""The benchmark's measuring parts without a server: the in-process closed loop (perf/engine_load.py) keeps at
most `concurrency` requests outstanding and counts what it generated; the perf_analyzer driver
(perf/perf_analyzer/sweep.py) turns an export's timestamps into TTFT, latency and tokens/s, and builds the commands
its quirks need."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

PERF = Path(__file__).resolve().parents[3] / "perf"
sys.path[:0] = [str(PERF), str(PERF / "perf_analyzer")]

import sweep  # noqa: E402
from engine_load import closed_loop  # noqa: E402


@pytest.mark.parametrize("concurrency", [1, 3])
def test_closed_loop_keeps_the_load_and_counts_every_request(make_engine, prompts, concurrency):
    engine = make_engine(device="cpu")
    outstanding, peak = set(), [0]
    add = engine.add_request

    def counting_add(request):
        outstanding.add(request.request_id)
        peak[0] = max(peak[0], len(outstanding))
        add(request)

    engine.add_request = counting_add
    step = engine.step

    def counting_step():
        outs = step()
        outstanding.difference_update(o.request_id for o in outs if o.finished)
        return outs

    engine.step = counting_step
    run = closed_loop(engine, [list(p) for p in prompts([5, 9, 7, 6, 8], engine.vocab_size)], concurrency, 4)
    assert peak[0] == concurrency and not outstanding
    assert len(run.ttfts_ms) == len(run.latencies_ms) == 5
    assert all(0 < t <= lat for t, lat in zip(run.ttfts_ms, run.latencies_ms))
    assert run.output_tok_s > 0


def test_closed_loop_refuses_an_empty_load(make_engine):
    with pytest.raises(ValueError, match="concurrency >= 1"):
        closed_loop(make_engine(device="cpu"), [[1, 2]], 0, 4)


def test_summarize_reads_ttft_latency_and_throughput_from_the_export():
    ms = 1_000_000  # ns
    # (send, [response timestamps]): two requests, the second sent 10 ms after the first; one never answered.
    requests = [(0, [20 * ms, 30 * ms, 100 * ms]), (10 * ms, [50 * ms, 210 * ms]), (20 * ms, [])]
    point = sweep.summarize("ensemble", sweep.Load("concurrency", 2), {"Inferences/Second": "9.5"}, requests, 8)
    assert point.requests == 2 and point.throughput_req_s == 9.5
    assert point.ttfts_ms == (20.0, 40.0) and point.latencies_ms == (100.0, 200.0)
    assert point.output_tok_s == pytest.approx(2 * 8 / 0.210)  # 2 requests x 8 tokens over first send .. last response


def test_commands_follow_perf_analyzer_quirks(tmp_path):
    csv_path, export = tmp_path / "a.csv", tmp_path / "a.json"
    conc = sweep.command("ensemble", "h:1", sweep.Load("concurrency", 4), tmp_path / "d.json", csv_path, export, 16)
    assert conc[conc.index("--warmup-request-count") + 1] == "4" and "--streaming" in conc
    # perf_analyzer 2.60 hangs with warm-up requests in request-rate mode
    rate = sweep.command("ensemble", "h:1", sweep.Load("request_rate", 2.5), tmp_path / "d.json", csv_path, export, 16)
    assert "--warmup-request-count" not in rate and rate[rate.index("--request-rate-range") + 1] == "2.5"
    windows = sweep.command("tensorrt_llm", "h:1", sweep.Load("concurrency", 1), tmp_path / "d.json", csv_path,
                            export, 0)
    assert "--request-count" not in windows and "--measurement-interval" in windows
    with pytest.raises(ValueError, match="must be > 0"):
        sweep.Load("concurrency", 0)
