"""`tformer serve` refusals before serving: a missing extra, a bad flag; SIGTERM ends it at 0."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tformer.cli.commands import app
from tformer.training.run import TrainResult

from .conftest import Client

ROOT = Path(__file__).resolve().parents[2]


def test_without_the_extra_one_line_says_what_to_install(
    trained: TrainResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "fastapi" else real(name, *a)
    )
    result = CliRunner().invoke(app, ["serve", str(trained.run_dir)])
    assert result.exit_code == 2
    assert "tformer serve needs the serve extra" in result.output
    assert "pip install 'tformer[serve]'" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--port", "70000"], "--port 70000 must be in 0..65535"),
        (["--max-inputs", "0"], "--max-inputs 0 must be >= 1"),
        (["--max-queue", "0"], "--max-queue 0 must be >= 1"),
        (["--max-rows", "5000"], "--max-rows 5000 is over 4096"),
        (["--batch-window-ms", "-1"], "--batch-window-ms -1 must be in 0..10000"),
        (["--quantize", "int4"], "--quantize"),
        (["--request-timeout", "0"], "--request-timeout 0 must be in 0.1..3600"),
        (["--allowed-hosts", "a b,localhost"], "--allowed-hosts 'a b,localhost': 'a b' is not a"),
    ],
)
def test_bad_flags_are_refused(trained: TrainResult, flags: list[str], message: str) -> None:
    pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
    result = CliRunner().invoke(app, ["serve", str(trained.run_dir), *flags])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_an_address_in_use_is_refused_before_loading(tmp_path: Path) -> None:
    pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # No checkpoint there: the address is checked first.
        result = CliRunner().invoke(app, ["serve", str(tmp_path), "--port", str(port)])
    assert result.exit_code == 2, result.output
    assert f"--port {port}: cannot listen there" in " ".join(result.output.split())


@pytest.mark.slow
def test_sigterm_finishes_requests_in_flight_and_exits_0(trained: TrainResult) -> None:
    """A long batch window keeps a request in flight while SIGTERM arrives (the model int8).
    With --port 0 the port really listened on is printed; --max-input-tokens over the
    model's max_len is warned of."""
    pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "tformer", "serve", str(trained.run_dir), "--port", "0",
               "--batch-window-ms", "1500", "--quantize", "int8", "--max-input-tokens", "100"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stderr is not None
        printed: list[str] = []
        while len(printed) < 2:  # after the line naming the checkpoint served, if any
            line = proc.stderr.readline()
            if not line.startswith("using "):
                printed.append(line)
        assert printed[0].startswith(
            "warning: --max-input-tokens 100 is over the model's max_len of 64"
        ), printed
        found = re.search(r"at http://127\.0\.0\.1:(\d+)/ ", printed[1])
        assert found and found.group(1) != "0", printed
        client = Client(int(found.group(1)))
        client.wait_ready(120)
        assert client.get("/v1/model").json()["quantize"] == "int8"
        replies = []
        sender = threading.Thread(
            target=lambda: replies.append(client.post("/v1/translate", {"inputs": "4 2"}))
        )
        sender.start()
        time.sleep(0.5)  # the request waits in the batch window now
        proc.send_signal(signal.SIGTERM)
        sender.join(timeout=60)
        _, stderr = proc.communicate(timeout=60)
        stderr = "".join(printed) + stderr
    finally:
        if proc.poll() is None:
            proc.kill()
    assert replies and replies[0].status == 200
    assert replies[0].json()["results"][0]["outputs"][0]["output"] == "four two"
    assert proc.returncode == 0, stderr
    assert "serving" in stderr and "Traceback" not in stderr


@pytest.mark.slow
def test_the_command_line_loads_no_server_package_until_serve_runs() -> None:
    code = (
        "import sys, tformer.cli.commands; "
        "print(sorted({'fastapi', 'uvicorn', 'starlette', 'pydantic'} & set(sys.modules)))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, env=env)
    assert done.stdout.strip() == "[]"
