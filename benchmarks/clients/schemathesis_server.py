"""schemathesis against tandem's server: every operation of its /openapi.json fuzzed from the schema (bounded
examples, loopback only), checked for no server error (5xx) and for answers the schema documents (status codes,
content types, response shapes). A small server (--max-model-len 256, --max-tokens capped by the context) so
generated requests finish quickly.

    benchmarks/clients/setup_clients.sh
    .venv/bin/python benchmarks/clients/schemathesis_server.py [--max-examples 30]

Exits with schemathesis' code (0: every check passed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-examples", type=int, default=30)
    p.add_argument("--checks", default="not_a_server_error,status_code_conformance,content_type_conformance,"
                                       "response_schema_conformance")
    ns = p.parse_args()
    st = ROOT / ".venv-clients" / "bin" / "schemathesis"
    if not st.exists():
        sys.exit("run benchmarks/clients/setup_clients.sh first")
    from entrypoints.remote import launch

    with launch("--max-model-len", "256", "--max-num-seqs", "8", "--num-kv-blocks", "256") as srv:
        print(f"[schemathesis] server {srv.url}", flush=True)
        done = subprocess.run([str(st), "run", f"{srv.url}/openapi.json", "--checks", ns.checks,
                               "--max-examples", str(ns.max_examples), "--seed", "0",
                               "--generation-deterministic", "--request-timeout", "120"])
        srv.wait_idle()
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
