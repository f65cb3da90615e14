"""quantkit.runtime.server: an OpenAI-compatible HTTP server with Prometheus metrics over LLMEngine.

    from quantkit.runtime.server import make_server
    with make_server(EngineConfig("smollm2-135m"), port=8000) as server:
        ...  # POST server.url + "/v1/completions"

Modules: protocol (request bodies, error JSON), engine_loop (the thread that owns the engine),
serving (OpenAI responses and SSE), metrics (vLLM's Prometheus names), app (routes), launch (uvicorn).
"""

from quantkit.runtime.server.app import build_app
from quantkit.runtime.server.launch import Server, make_server

__all__ = ["build_app", "Server", "make_server"]
