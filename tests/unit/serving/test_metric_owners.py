"""MetricOwners (backend/serving/metric_owners.py): whether another live process holds the same model version's
metrics, by flocks on files in a folder; keep_forever's objects are never freed."""
from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

from backend.serving.metric_owners import MetricOwners, keep_forever


def test_a_second_copy_of_the_version_is_seen_until_it_closes(tmp_path):
    old = MetricOwners("/repo/tensorrt_llm", "1", directory=tmp_path)
    assert not old.others_alive()
    new = MetricOwners("/repo/tensorrt_llm", "1", directory=tmp_path)  # a reload's copy
    other_version = MetricOwners("/repo/tensorrt_llm", "2", directory=tmp_path)  # its own labels: not shared
    assert old.others_alive() and new.others_alive()
    new.close()
    assert not old.others_alive() and not other_version.others_alive()
    old.close()
    other_version.close()
    assert list(tmp_path.iterdir()) == []


def test_a_file_nobody_locks_is_a_dead_process_and_goes(tmp_path):
    owners = MetricOwners("/repo/tensorrt_llm", "1", directory=tmp_path)
    dead = tmp_path / f"{owners.prefix}00000000deadbeef"
    dead.write_bytes(b"")
    assert not owners.others_alive() and not dead.exists()
    owners.close()


def test_another_process_holding_the_version_is_alive_until_it_exits(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from backend.serving.metric_owners import MetricOwners
        owners = MetricOwners("/repo/tensorrt_llm", "1", directory=Path({str(tmp_path)!r}))
        print("ready", flush=True)
        sys.stdin.readline()  # exits without close(): its file stays, unlocked
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        owners = MetricOwners("/repo/tensorrt_llm", "1", directory=tmp_path)
        assert owners.others_alive()
    finally:
        child.communicate("\n", timeout=30)
    assert not owners.others_alive()
    owners.close()
    assert list(tmp_path.iterdir()) == []


class _Metric:
    def __init__(self, name: str, freed: list[str]) -> None:
        self.name, self.freed = name, freed

    def __del__(self) -> None:
        self.freed.append(self.name)


_AT_EXIT = """
import os
from backend.serving.metric_owners import keep_forever
class Metric:
    def __del__(self, write=os.write):
        write(1, b"freed")
metric = Metric()
"""


def test_kept_objects_are_never_freed_not_even_at_exit():
    freed: list[str] = []
    keep_forever(_Metric("kept", freed))
    dropped = _Metric("dropped", freed)
    del dropped
    gc.collect()
    assert freed == ["dropped"]
    runs = [subprocess.run([sys.executable, "-c", _AT_EXIT + tail], capture_output=True, text=True, timeout=60)
            for tail in ("", "keep_forever(metric)\n")]
    assert [run.returncode for run in runs] == [0, 0], runs
    assert [run.stdout for run in runs] == ["freed", ""], runs  # freed at the interpreter's exit, unless kept


def test_without_its_file_a_copy_keeps_its_metrics(tmp_path):
    """No lock folder (no /dev/shm, say): the copy cannot know whether another one shares its metrics."""
    owners = MetricOwners("/repo/tensorrt_llm", "1", directory=tmp_path / "missing")
    assert owners.others_alive()
    owners.close()


def test_finish_keeps_shared_metrics_and_leaves_its_own_to_be_deleted(tmp_path):
    old = MetricOwners("/repo/router", "1", directory=tmp_path)
    new = MetricOwners("/repo/router", "1", directory=tmp_path)
    freed: list[str] = []
    shared = _Metric("shared", freed)
    assert old.finish(shared)  # the new copy lives: kept
    del shared
    gc.collect()
    assert freed == []
    assert not new.finish(_Metric("alone", freed))  # the last copy: its caller deletes them
    assert freed == ["alone"]  # not kept
    assert list(tmp_path.iterdir()) == []
