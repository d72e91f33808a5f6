"""engine_cpus: the CPU list notation, the split between the engine and tritonserver, and the engine thread's pin."""
from __future__ import annotations

import os
import threading

import pytest

from backend.serving.cpu_placement import (
    CpuSplit,
    check_engine_threads,
    format_cpu_list,
    parse_cpu_list,
    pin_calling_thread,
    split_cpus,
)
from backend.serving.parameters import ModelParameters, ServingConfig


@pytest.mark.parametrize(("text", "cpus"), [("0", {0}), ("3", {3}), ("0-2", {0, 1, 2}), ("0,2-3", {0, 2, 3}),
                                            (" 1 , 5 ", {1, 5}), ("2-2", {2})])
def test_cpu_lists_read_as_taskset_writes_them(text, cpus):
    assert parse_cpu_list(text) == cpus
    assert parse_cpu_list(format_cpu_list(cpus)) == cpus


@pytest.mark.parametrize("text", ["", "x", "1-", "-1", "1,,2", "1.5", "0x1", "1 2"])
def test_malformed_lists_are_refused_naming_the_value(text):
    with pytest.raises(ValueError, match="engine_cpus must be a CPU list"):
        parse_cpu_list(text)


def test_a_backwards_range_is_refused():
    with pytest.raises(ValueError, match="'3-1' ends before it starts"):
        parse_cpu_list("3-1")


def test_format_joins_runs():
    assert format_cpu_list({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"


def test_no_spec_means_no_placement():
    assert split_cpus("", 1, {0, 1}) is None


def test_auto_gives_the_engine_the_last_cpus_and_tritonserver_the_others():
    assert split_cpus("auto", 1, {0, 1}) == CpuSplit(frozenset({1}), frozenset({0}))
    assert split_cpus("auto", 2, {0, 1, 2, 3}) == CpuSplit(frozenset({2, 3}), frozenset({0, 1}))


def test_auto_places_nothing_when_no_cpu_would_be_left():
    assert split_cpus("auto", 2, {0, 1}) is None


def test_auto_needs_the_thread_count():
    with pytest.raises(ValueError, match="engine_cpus auto needs engine_threads"):
        split_cpus("auto", None, {0, 1})


def test_a_list_must_name_usable_cpus_and_leave_some():
    assert split_cpus("1", 1, {0, 1}) == CpuSplit(frozenset({1}), frozenset({0}))
    with pytest.raises(ValueError, match="names CPUs 4-5 this process may not use"):
        split_cpus("1,4-5", 1, {0, 1})
    with pytest.raises(ValueError, match="must leave CPUs to both the engine and tritonserver"):
        split_cpus("0-1", 1, {0, 1})


@pytest.mark.parametrize("threads", [None, 3])
def test_more_threads_than_engine_cpus_are_refused(threads):
    with pytest.raises(ValueError, match=f"engine_cpus 1-2 needs engine_threads set to at most 2, got {threads}"):
        check_engine_threads(frozenset({1, 2}), threads)


def test_the_split_must_be_disjoint():
    with pytest.raises(ValueError, match="CPUs 1 are both"):
        CpuSplit(frozenset({0, 1}), frozenset({1}))


def test_serving_config_reads_the_parameter_and_checks_threads():
    base = {"gpt_model_path": "/ckpt", "engine_device": "cpu"}
    assert ServingConfig.from_parameters(ModelParameters(base)).engine_cpus is None
    assert ServingConfig.from_parameters(ModelParameters({**base, "engine_cpus": "${engine_cpus}"})).engine_cpus is None
    cfg = ServingConfig.from_parameters(ModelParameters({**base, "engine_cpus": "1", "engine_threads": "1"}))
    assert cfg.engine_cpus == {1}
    with pytest.raises(ValueError, match="engine_cpus 1 needs engine_threads set to at most 1, got 2"):
        ServingConfig.from_parameters(ModelParameters({**base, "engine_cpus": "1", "engine_threads": "2"}))
    with pytest.raises(ValueError, match="engine_cpus must be a CPU list"):
        ServingConfig.from_parameters(ModelParameters({**base, "engine_cpus": "one", "engine_threads": "1"}))


def test_pinning_moves_only_the_calling_thread():
    before = os.sched_getaffinity(0)
    target = frozenset({max(before)})
    seen = {}

    def pinned() -> None:
        pin_calling_thread(target)
        seen["inside"] = os.sched_getaffinity(0)
        child = threading.Thread(target=lambda: seen.setdefault("child", os.sched_getaffinity(0)))
        child.start()
        child.join()

    thread = threading.Thread(target=pinned)
    thread.start()
    thread.join()
    assert seen["inside"] == target and seen["child"] == target  # threads it starts (OpenMP's) inherit it
    assert os.sched_getaffinity(0) == before
