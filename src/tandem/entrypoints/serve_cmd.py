"""``tandem serve``: the OpenAI-compatible server (vLLM's ``vllm serve`` flags where they exist).

The socket is bound here, before uvicorn starts, so ``--port 0`` works: the line
``tandem serve: listening on http://HOST:PORT`` on stdout names the port the kernel chose.

SIGTERM / SIGINT drain: the server stops accepting connections, lets running requests go on for
``--shutdown-timeout`` seconds (vLLM's flag, default 0), then ends every open request — a stream with an error
event and ``[DONE]``, a non-streamed request with a 503 — shuts the engine down and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import signal
import socket
import sys
from typing import TYPE_CHECKING, Any

from tandem import overrides
from tandem.entrypoints.engine_args import add_engine_args, engine_kwargs

if TYPE_CHECKING:
    from tandem.engine.builder import EnginePlan

READY_PREFIX = "tandem serve: listening on "


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it (Linux): a response's header and body writes must not wait
    # for the client's delayed ACK (40 ms per request otherwise).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def plan_line(plan: EnginePlan) -> str:
    """What the server runs, in one line beside the async decision: model, dtype, device, context, KV pool,
    speculation, executor."""
    spec = plan.config.speculative
    return (
        f"model={plan.config.model.model} dtype={plan.config.model.resolved_dtype()} "
        f"device={plan.config.model.device} quantization={plan.quantization.resolved} "
        f"max_model_len={plan.max_model_len} kv_blocks={plan.num_kv_blocks} "
        f"kv_bytes={plan.num_kv_blocks * plan.bytes_per_block} "
        f"speculative={'none' if spec is None else f'{spec.method}(k={spec.num_speculative_tokens})'} "
        f"executor={plan.config.parallel.executor_backend} tp={plan.config.parallel.tensor_parallel_size}"
    )


def _json_list(text: str) -> list[str]:
    """vLLM's CORS flags: a JSON list of strings (a bare word is taken as a one-item list)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = [text]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError(f"expected a JSON list of strings, got {text!r}")
    return value


def _draining_server(uvicorn: Any, config: Any, ctx: Any, grace: float) -> Any:
    """uvicorn's server, which on the first exit signal also ends every open request ``grace`` seconds later
    (``ServerContext.end_open_requests``): streams close with a final event, so uvicorn's graceful shutdown
    finds no connection to cancel."""

    class DrainingServer(uvicorn.Server):  # type: ignore[misc, name-defined]
        loop: asyncio.AbstractEventLoop | None = None

        async def serve(self, sockets: Any = None) -> None:
            self.loop = asyncio.get_running_loop()
            await super().serve(sockets=sockets)

        def handle_exit(self, sig: int, frame: Any) -> None:
            first = not self.should_exit
            super().handle_exit(sig, frame)
            if first and self.loop is not None:
                end = functools.partial(ctx.end_open_requests, "the server is shutting down")
                self.loop.call_soon_threadsafe(self.loop.call_later, grace, end)

    return DrainingServer(config)


def cmd_serve(ns: argparse.Namespace) -> int:
    import uvicorn

    from tandem.engine.async_llm import AsyncLLM
    from tandem.entrypoints.openai.server import build_app

    model = ns.model_tag or ns.model
    api_key = ns.api_key or overrides.api_key() or None
    if ns.enable_auto_tool_choice != (ns.tool_call_parser is not None):
        print("tandem serve: --enable-auto-tool-choice and --tool-call-parser go together", file=sys.stderr)
        return 2
    # The port first: a second server on a used port says so in one line, before loading any weights.
    try:
        sock = _bind(ns.host, ns.port)
    except OSError as exc:
        print(f"tandem serve: cannot listen on {ns.host}:{ns.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        engine = AsyncLLM(model, **{"disable_log_stats": False, **engine_kwargs(ns)})  # vLLM's server default
    except BaseException:
        sock.close()
        raise
    try:
        from tandem.entrypoints.openai.tool_parsers import get_tool_parser

        parser = get_tool_parser(ns.tool_call_parser) if ns.tool_call_parser else None
        cors = None
        if ns.allowed_origins is not None:
            cors = {"allow_origins": ns.allowed_origins, "allow_methods": ns.allowed_methods,
                    "allow_headers": ns.allowed_headers, "allow_credentials": ns.allow_credentials}
        app = build_app(engine, ns.served_model_name, api_key, parser, cors)
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        print(f"{READY_PREFIX}http://{shown}:{port}", flush=True)
        print(f"[{engine.async_scheduling.log_line()}]", file=sys.stderr, flush=True)
        print(f"[{plan_line(engine.engine.plan)}]", file=sys.stderr, flush=True)
        grace = float(ns.shutdown_timeout or 0)
        config = uvicorn.Config(
            app,
            log_level=ns.uvicorn_log_level,
            access_log=not ns.disable_uvicorn_access_log,
            timeout_graceful_shutdown=grace + 10,  # a backstop: the drain ends every request by `grace`
            timeout_keep_alive=5,
        )
        # uvicorn shuts down gracefully on SIGINT / SIGTERM, then re-raises the signal: let both end
        # here as KeyboardInterrupt so the engine is shut down too.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            asyncio.run(_draining_server(uvicorn, config, app.state.ctx, grace).serve(sockets=[sock]))
        except KeyboardInterrupt:
            pass
    finally:
        engine.shutdown()
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (completions, chat, metrics)")
    p.add_argument("model_tag", nargs="?", default=None, help="the model (same as --model)")
    add_engine_args(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on; default 127.0.0.1")
    g.add_argument("--port", type=int, default=8000, help="0: any free port (printed on start); default 8000")
    g.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1 routes (default: env TANDEM_API_KEY)",
    )
    g.add_argument(
        "--uvicorn-log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
        help="the HTTP server's log level; default info",
    )
    g.add_argument("--disable-uvicorn-access-log", action="store_true", help="no line per request in the log")
    g.add_argument("--allowed-origins", type=_json_list, default=None,
                   help='CORS: origins browsers may call from, JSON (\'["https://a.example"]\', \'["*"]\'); '
                        "default: no CORS headers")
    g.add_argument("--allowed-methods", type=_json_list, default=["*"], help='CORS methods; default ["*"]')
    g.add_argument("--allowed-headers", type=_json_list, default=["*"], help='CORS headers; default ["*"]')
    g.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials; default off")
    g.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='tool_choice "auto" (the default with tools): parse calls out of the text; needs '
                        "--tool-call-parser; default off")
    g.add_argument("--tool-call-parser", choices=["hermes", "json"], default=None,
                   help="hermes: <tool_call>{...}</tool_call> blocks; json: the output is the call; default none")
    g.add_argument("--trace", default=None, help="write a Chrome trace of the session on shutdown")
    p.set_defaults(func=cmd_serve)
