"""`quantkit serve`: a real process serving the tiny model, stopped by Ctrl-C; user errors are one line + exit 2."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_process_answers_and_stops_on_ctrl_c(tiny_model):
    port = _free_port()
    exe = Path(sys.executable).with_name("quantkit")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([str(exe), "serve", str(tiny_model), "--port", str(port), "--max-model-len", "128",
                             "--served-model-name", "tiny", "--api-key", "k", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:  # the socket listens before the model is loaded
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.2)
        url = f"http://127.0.0.1:{port}/v1/completions"
        body = {"model": "tiny", "prompt": "Your order", "max_tokens": 3}
        assert requests.post(url, json=body, timeout=30).status_code == 401
        ok = requests.post(url, json=body, headers={"Authorization": "Bearer k"}, timeout=30)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode in (0, 130), err  # uvicorn shuts down, then re-raises the SIGINT it caught
    assert "Traceback" not in err
    assert f"serving tiny on http://127.0.0.1:{port}/v1" in err


def test_busy_port_and_bad_model_are_one_line_errors(run_cli, tiny_model):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        code, _, err = run_cli("serve", tiny_model, "--port", taken.getsockname()[1])
    assert code == 2 and "cannot listen on 127.0.0.1" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli("serve", "/no/such/model", "--port", "0")
    assert code == 2 and "not found" in err
    code, _, err = run_cli("serve", tiny_model, "--max-waiting", "0")
    assert code == 2 and "--max-waiting" in err
