"""The FastAPI app: routes, the API-key check, and OpenAI-shaped errors. The engine loop starts and stops
with the app's lifespan."""

from __future__ import annotations

import json
import secrets
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from quantkit.models import load_tokenizer
from quantkit.runtime.engine import LLMEngine
from quantkit.runtime.server.engine_loop import EngineLoop
from quantkit.runtime.server.metrics import ServerMetrics
from quantkit.runtime.server.protocol import ChatCompletionRequest, CompletionRequest, error_response
from quantkit.runtime.server.serving import BadRequest, ModelNotFound, OpenAIServing

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def build_app(engine: LLMEngine, model_name: str, api_key: str | None = None, max_waiting: int = 256) -> FastAPI:
    """An app serving `engine` as `model_name`; the engine belongs to the app's loop thread from here on."""
    metrics = ServerMetrics(model_name)
    engine_loop = EngineLoop(engine, metrics, max_waiting)
    vocab_size = json.loads((engine.path / "config.json").read_text())["vocab_size"]
    serving = OpenAIServing(engine_loop, load_tokenizer(engine.path), model_name, engine.max_model_len, vocab_size)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        engine_loop.start()
        try:
            yield
        finally:
            engine_loop.stop()

    app = FastAPI(title="quantkit", lifespan=lifespan)
    app.state.engine_loop = engine_loop
    app.state.metrics = metrics

    @app.middleware("http")
    async def check_api_key(request: Request, call_next):
        # Like vLLM: only the OpenAI routes need the key; /health and /metrics stay open to probes.
        if api_key and request.url.path.startswith("/v1"):
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return error_response(401, "invalid or missing API key (send 'Authorization: Bearer <key>')")
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
        return error_response(400, f"{where}: {message}" if where else message, where or None)

    @app.exception_handler(BadRequest)
    async def bad_request(_request: Request, exc: BadRequest):
        return error_response(400, exc.message, exc.param)

    @app.exception_handler(ModelNotFound)
    async def not_found(_request: Request, exc: ModelNotFound):
        return error_response(404, f"The model `{exc.model}` does not exist; this server serves `{model_name}`.",
                              "model")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await serving.run(serving.completion_call(body), request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await serving.run(serving.chat_call(body), request)

    @app.get("/v1/models")
    async def models():
        card = {"id": model_name, "object": "model", "created": created, "owned_by": "quantkit",
                "root": str(engine.path), "max_model_len": engine.max_model_len}
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health():
        if engine_loop.healthy:
            return Response(status_code=200)
        return error_response(503, f"the engine stopped: {engine_loop.error or 'not running'}")

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=PROMETHEUS_CONTENT_TYPE)

    @app.get("/stats")  # the engine's own numbers as JSON (tests and the load test read it)
    async def stats():
        return JSONResponse(engine_loop.stats.as_dict())

    return app
