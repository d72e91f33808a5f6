"""The serving stack's wiring: Triton's HTTP on loopback (metrics stay public), the front's command line, and the
rendered repository's tokenizer / limits file found for `serve --model-repository`."""
from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys

import psutil
import pytest

from ensembles.cli import limits_file_of, tokenizer_dir_of
from ensembles.server import ServerOptions, TritonInstall, server_command
from ensembles.stack import FrontOptions, ServingStack, front_command


def test_triton_http_binds_loopback_and_metrics_stay_public(tmp_path):
    stack = ServingStack(ServerOptions(tmp_path, 8003, 8001, 8002), FrontOptions())
    cmd = server_command(TritonInstall(tmp_path / "tritonserver", None), stack.opts)
    assert "--http-address=127.0.0.1" in cmd and "--metrics-address=0.0.0.0" in cmd
    assert stack.http_url == "127.0.0.1:8000" and stack.openai_url == "http://127.0.0.1:9000/v1"


def test_front_command(tmp_path):
    opts = ServerOptions(tmp_path, 8003, 8001, 8002)
    cmd = front_command(FrontOptions(tokenizer_dir=tmp_path, openai_port=None), opts)
    assert cmd[:3] == [sys.executable, "-m", "frontend"]
    args = dict(zip(cmd[3::2], cmd[4::2]))
    assert args["--triton-http-url"] == "http://127.0.0.1:8003" and args["--triton-grpc-url"] == "127.0.0.1:8001"
    assert args["--openai-port"] == "0" and args["--tokenizer-dir"] == str(tmp_path)
    assert "--limits-file" not in args


def test_front_ports_are_checked():
    with pytest.raises(ValueError, match="distinct"):
        FrontOptions(http_port=9000, openai_port=9000)
    assert dataclasses.replace(FrontOptions(), openai_port=None).openai_port is None


def test_paths_of_a_rendered_repository(tmp_path):
    (tmp_path / "preprocessing").mkdir()
    (tmp_path / "preprocessing" / "config.pbtxt").write_text(
        'parameters { key: "tokenizer_dir" value: { string_value: "/models/tok" } }\n')
    (tmp_path / "tensorrt_llm").mkdir()
    (tmp_path / "tensorrt_llm" / "config.pbtxt").write_text(
        'parameters { key: "limits_file" value: { string_value: "" } }\n')
    assert str(tokenizer_dir_of(tmp_path)) == "/models/tok" and limits_file_of(tmp_path) is None


def test_serve_refuses_two_uses_of_one_port(capsys, tmp_path):
    from ensembles.cli import main

    (tmp_path / "ensemble").mkdir()
    rc = main(["serve", "--model-repository", str(tmp_path), "--http-port", "18000", "--triton-http-port", "18000",
               "--admin-key", "k"])
    assert rc == 2 and "--http-port and --triton-http-port are both 18000" in capsys.readouterr().err


def test_a_dead_front_makes_the_launcher_unready(tmp_path):
    from ensembles.stack import FrontProcess
    from ensembles.supervisor import Supervisor, SupervisorOptions

    opts = ServerOptions(tmp_path, 18003, 18001, 18002)
    front = FrontProcess(FrontOptions(http_port=18000, openai_port=None), opts)
    front.proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
    front.proc.wait()
    sup = Supervisor(opts, SupervisorOptions(), install=TritonInstall(tmp_path / "tritonserver", None), front=front)
    sup.state = "serving"
    assert sup.current() == ("restarting", "the front exited with code 7")
    shutil.rmtree(sup.control.path, ignore_errors=True)


def test_the_front_ends_with_the_process_that_started_it(tmp_path):
    """A launcher killed with SIGKILL leaves no front holding the public ports (prctl PDEATHSIG)."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        "from ensembles.stack import _term_with_parent\n"
        "import subprocess\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], preexec_fn=_term_with_parent)\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    child_pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    child = psutil.Process(child_pid)
    child.wait(10)  # raises TimeoutExpired if it outlives its parent
    assert not child.is_running()
