"""``tandem serve``: the OpenAI-compatible server (vLLM's ``vllm serve`` flags where they exist).

The socket is bound here, before uvicorn starts, so ``--port 0`` works: the line
``tandem serve: listening on http://HOST:PORT`` on stdout names the port the kernel chose.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import sys

from tandem import overrides
from tandem.entrypoints.engine_args import add_engine_args, engine_kwargs

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


def cmd_serve(ns: argparse.Namespace) -> int:
    import uvicorn

    from tandem.engine.async_llm import AsyncLLM
    from tandem.entrypoints.openai.server import build_app

    model = ns.model_tag or ns.model
    api_key = ns.api_key or overrides.api_key() or None
    engine = AsyncLLM(model, **engine_kwargs(ns))
    try:
        app = build_app(engine, ns.served_model_name, api_key)
        sock = _bind(ns.host, ns.port)
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        print(f"{READY_PREFIX}http://{shown}:{port}", flush=True)
        print(f"[{engine.async_scheduling.log_line()}]", file=sys.stderr, flush=True)
        config = uvicorn.Config(
            app,
            log_level=ns.uvicorn_log_level,
            access_log=not ns.disable_uvicorn_access_log,
            timeout_graceful_shutdown=5,
            timeout_keep_alive=5,
        )
        # uvicorn shuts down gracefully on SIGINT / SIGTERM, then re-raises the signal: let both end
        # here as KeyboardInterrupt so the engine is shut down too.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))
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
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000, help="0: any free port (printed on start)")
    g.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="name(s) clients use in 'model' (default: the --model value)",
    )
    g.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1 routes (default: env TANDEM_API_KEY)",
    )
    g.add_argument(
        "--uvicorn-log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
    )
    g.add_argument("--disable-uvicorn-access-log", action="store_true")
    g.add_argument("--trace", default=None, help="write a Chrome trace of the session on shutdown")
    p.set_defaults(func=cmd_serve)
