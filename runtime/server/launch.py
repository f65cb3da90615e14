"""Run the app under uvicorn: in the foreground (`quantkit serve`) or on a background thread (tests,
load tests, the ladder). The socket is bound before uvicorn starts, so port 0 picks a free port without
a race, and a port in use is a one-line error."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from quantkit.errors import QuantkitError
from quantkit.runtime.config import EngineConfig
from quantkit.runtime.engine import LLMEngine
from quantkit.runtime.server.app import build_app


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise QuantkitError(f"cannot listen on {host}:{port}: {exc.strerror}",
                            hint="pick another --port or stop what is using it") from exc
    sock.listen(2048)
    return sock


class Server:
    """uvicorn serving one engine. serve() blocks; start()/stop() (or `with`) run it on a thread."""

    def __init__(self, engine: LLMEngine, model_name: str, host: str = "127.0.0.1", port: int = 0,
                 api_key: str | None = None, max_waiting: int = 256, log_level: str = "warning",
                 sock: socket.socket | None = None):
        self.sock = sock or bind(host, port)
        self.app = build_app(engine, model_name, api_key, max_waiting)
        self.host, self.port = self.sock.getsockname()[:2]
        self._uvicorn = uvicorn.Server(uvicorn.Config(self.app, log_level=log_level, timeout_keep_alive=30,
                                                      timeout_graceful_shutdown=5))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def serve(self) -> None:
        self._uvicorn.run(sockets=[self.sock])

    def start(self, timeout: float = 60) -> Server:
        self._thread = threading.Thread(target=self.serve, name="quantkit-uvicorn", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.sock.close()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def make_server(config: EngineConfig, served_name: str | None = None, host: str = "127.0.0.1", port: int = 0,
                **kwargs) -> Server:
    """Bind, load the engine for `config`, and wrap both in a Server (served as `served_name` or the model
    reference). Binding first makes a busy port fail before the model loads."""
    sock = bind(host, port)
    try:
        engine = LLMEngine(config)
    except BaseException:
        sock.close()
        raise
    return Server(engine, served_name or config.model, host=host, port=port, sock=sock, **kwargs)
