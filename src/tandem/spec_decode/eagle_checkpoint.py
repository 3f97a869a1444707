"""Draft heads on disk: the public EAGLE / EAGLE-3 layouts, and MTP layers inside a target checkpoint.

Every format is read into one *canonical* form — a :class:`HeadConfig` and a dict of tensors under
short names in the Hugging Face row layout — and written back from it (``head_writer.py``):

| canonical name | EAGLE (``config.json`` + safetensors) | EAGLE-3 | MTP (DeepSeek-V3 naming) |
|---|---|---|---|
| ``fc.weight`` | ``fc.weight`` [H, 2H] (``fc.bias`` optional) | ``fc.weight`` [H, 3·Ht] | ``model.layers.{L}.eh_proj.weight`` [H, 2H] |
| ``enorm.weight``, ``hnorm.weight`` | – | – | ``model.layers.{L}.enorm/hnorm.weight`` |
| layer tensors (``self_attn.*``, ``mlp.*``, norms) | ``layers.0.*`` | ``midlayer.*`` (q/k/v read 2H) | ``model.layers.{L}.*`` |
| ``hidden_norm.weight`` | – | ``midlayer.hidden_norm.weight`` | – |
| ``norm.weight`` | optional | ``norm.weight`` | ``model.layers.{L}.shared_head.norm.weight`` |
| ``embed_tokens.weight`` / ``lm_head.weight`` | optional | optional / [Vd, H] | ignored: MTP uses the target's |
| ``d2t`` / ``t2d`` | optional (a draft vocabulary over the LM head's rows) | optional draft→target offsets / target mask | optional ``model.layers.{L}.d2t`` / ``t2d`` (tandem's addition) |

A leading ``model.`` is accepted on EAGLE files, and ``layers.0.`` / ``midlayer.`` are equivalent. ``L`` is the
target's ``num_hidden_layers`` (the MTP layer is one index past the last decoder layer); the target's
``config.json`` says ``num_nextn_predict_layers: 1``.

Conventions (written down because the public formats leave them implicit):
- EAGLE's target feature is the target's final *normed* hidden state (what the public checkpoints were trained
  on: the base model's output before the LM head); MTP reads the same tensor through its ``hnorm``.
- EAGLE-3 layer ids follow vLLM: id ``i`` is the residual stream entering decoder layer ``i`` (after ``i``
  layers), valid in ``[1, L - 1]``; the default is ``(2, L // 2, L - 3)``.
- ``draft_vocab_size`` < ``vocab_size`` restricts drafting to a draft vocabulary: target id = ``i + d2t[i]``,
  or, without ``d2t``, the first ``draft_vocab_size`` ids (BPE ids are roughly frequency-ordered). For MTP it is
  the target config's ``mtp_draft_vocab_size``, and the map, if any, ``model.layers.{L}.d2t`` (not part of the
  DeepSeek-V3 names, which have no draft vocabulary; other engines ignore the extra tensors). With a map the
  LM head rows of the draft ids are gathered once (a copy: a scattered subset cannot be a view). Drafts are
  verified exactly, so this only changes acceptance.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from tandem.model.model_args import ModelArgs

METHODS = ("eagle", "eagle3", "mtp")
_LAYER_KEYS = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)


@dataclass(frozen=True)
class HeadConfig:
    method: str  # eagle | eagle3 | mtp
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    max_position_embeddings: int = 2048
    aux_layer_ids: tuple[int, ...] = ()  # eagle3, vLLM convention
    target_hidden_size: int | None = None  # eagle3: width of each fused target layer

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"head method must be one of {METHODS}, got {self.method!r}")
        if not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(
                f"draft_vocab_size {self.draft_vocab_size} must be in [1, vocab_size={self.vocab_size}]"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    @property
    def attn_in(self) -> int:
        """Width of the attention input: EAGLE-3 attends over [embedding, hidden] (2H)."""
        return 2 * self.hidden_size if self.method == "eagle3" else self.hidden_size

    @property
    def fc_in(self) -> int:
        if self.method == "eagle3":
            return len(self.aux_layer_ids) * (self.target_hidden_size or self.hidden_size)
        return 2 * self.hidden_size

    @classmethod
    def for_target(
        cls,
        method: str,
        args: ModelArgs,
        draft_vocab_size: int | None = None,
        aux_layer_ids: tuple[int, ...] | None = None,
    ) -> HeadConfig:
        """A head shaped like one decoder layer of ``args`` (how ``train-drafter`` builds them)."""
        ids: tuple[int, ...] = ()
        if method == "eagle3":
            ids = tuple(aux_layer_ids) if aux_layer_ids else default_eagle3_layer_ids(args.num_hidden_layers)
        return cls(
            method=method,
            hidden_size=args.hidden_size,
            intermediate_size=args.intermediate_size,
            num_attention_heads=args.num_attention_heads,
            num_key_value_heads=args.num_key_value_heads,
            head_dim=args.head_dim,
            vocab_size=args.vocab_size,
            draft_vocab_size=draft_vocab_size or args.vocab_size,
            rms_norm_eps=args.rms_norm_eps,
            rope_theta=args.rope_theta,
            rope_scaling=args.rope_scaling,
            max_position_embeddings=args.max_position_embeddings,
            aux_layer_ids=ids,
            target_hidden_size=args.hidden_size if method == "eagle3" else None,
        )


def default_eagle3_layer_ids(num_layers: int) -> tuple[int, ...]:
    return (2, num_layers // 2, num_layers - 3)


def check_eagle3_layer_ids(ids: tuple[int, ...], num_layers: int) -> None:
    if not ids:
        raise ValueError("eagle3 needs at least one target layer id")
    bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 1 <= i <= num_layers - 1]
    if bad:
        raise ValueError(
            f"eagle3 layer ids {list(ids)}: {bad} outside [1, {num_layers - 1}] for a target with "
            f"{num_layers} layers (id i = the hidden state entering layer i)"
        )


# -- shapes and validation ---------------------------------------------------------------------------
def expected_shapes(cfg: HeadConfig) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(required, optional) canonical tensor names with shapes."""
    h, i, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    a = cfg.attn_in
    req: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, cfg.fc_in),
        "post_attention_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (q, a),
        "self_attn.k_proj.weight": (kv, a),
        "self_attn.v_proj.weight": (kv, a),
        "self_attn.o_proj.weight": (h, q),
        "mlp.gate_proj.weight": (i, h),
        "mlp.up_proj.weight": (i, h),
        "mlp.down_proj.weight": (h, i),
    }
    opt: dict[str, tuple[int, ...]] = {}
    vd = cfg.draft_vocab_size
    if cfg.method == "eagle":
        opt |= {
            "fc.bias": (h,),
            "input_layernorm.weight": (h,),
            "norm.weight": (h,),
            "embed_tokens.weight": (cfg.vocab_size, h),
            "lm_head.weight": (cfg.vocab_size, h),
            "d2t": (vd,),
            "t2d": (cfg.vocab_size,),
        }
    elif cfg.method == "eagle3":
        req |= {"input_layernorm.weight": (h,), "hidden_norm.weight": (h,), "norm.weight": (h,)}
        opt |= {
            "embed_tokens.weight": (cfg.vocab_size, h),
            "lm_head.weight": (vd, h),
            "d2t": (vd,),
            "t2d": (cfg.vocab_size,),
        }
    else:
        req |= {
            "enorm.weight": (h,),
            "hnorm.weight": (h,),
            "input_layernorm.weight": (h,),
            "norm.weight": (h,),
        }
        opt |= {"d2t": (vd,), "t2d": (cfg.vocab_size,)}
    return req, opt


def validate(cfg: HeadConfig, tensors: Mapping[str, torch.Tensor], source: object) -> None:
    req, opt = expected_shapes(cfg)
    for name, shape in req.items():
        if name not in tensors:
            raise ValueError(f"{source}: {cfg.method} head is missing tensor {name!r} (shape {shape})")
    for name, t in tensors.items():
        want = req.get(name, opt.get(name))
        if want is None:
            raise ValueError(f"{source}: unexpected tensor {name!r} for an {cfg.method} head")
        if tuple(t.shape) != want:
            raise ValueError(
                f"{source}: tensor {name!r} has shape {tuple(t.shape)}, expected {want} from the "
                f"head's config (hidden {cfg.hidden_size}, vocab {cfg.vocab_size}, draft vocab "
                f"{cfg.draft_vocab_size})"
            )
    if "d2t" in tensors:
        ids = tensors["d2t"].long() + torch.arange(cfg.draft_vocab_size)
        if int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size:
            raise ValueError(f"{source}: d2t maps draft ids outside the vocabulary [0, {cfg.vocab_size})")


def check_against_target(cfg: HeadConfig, args: ModelArgs, source: object) -> None:
    """The clear errors of a head that does not fit its target."""
    name = {"eagle": "EAGLE", "eagle3": "EAGLE-3", "mtp": "MTP"}[cfg.method]
    if cfg.hidden_size != args.hidden_size:
        raise ValueError(
            f"{source}: {name} head has hidden size {cfg.hidden_size}, the target {args.hidden_size}"
        )
    if cfg.vocab_size != args.vocab_size:
        raise ValueError(
            f"{source}: {name} head has a vocabulary of {cfg.vocab_size} tokens, the target "
            f"{args.vocab_size}: a head must share the target's tokenizer"
        )
    if cfg.method == "eagle3":
        check_eagle3_layer_ids(cfg.aux_layer_ids, args.num_hidden_layers)
        if (cfg.target_hidden_size or cfg.hidden_size) != args.hidden_size:
            raise ValueError(
                f"{source}: EAGLE-3 head fuses target layers of width {cfg.target_hidden_size}, "
                f"the target's hidden size is {args.hidden_size}"
            )


# -- reading -----------------------------------------------------------------------------------------
def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def _safetensors_files(directory: Path) -> list[Path]:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        bins = sorted(directory.glob("*.bin"))
        extra = " (found .bin files: convert them to safetensors)" if bins else ""
        raise FileNotFoundError(f"{directory}: no *.safetensors weights{extra}")
    return files


def _read_tensors(files: list[Path], keep: Any = None) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - not a mapping
                if keep is None or keep(name):
                    out[name] = f.get_tensor(name)
    return out


def _head_config_from_json(method: str, c: dict[str, Any], source: Path) -> HeadConfig:
    def need(key: str) -> Any:
        if key not in c:
            raise ValueError(f"{source}: missing field {key!r}")
        return c[key]

    hidden, heads = int(need("hidden_size")), int(need("num_attention_heads"))
    vocab = int(need("vocab_size"))
    rope = c.get("rope_parameters") or {}
    ids: tuple[int, ...] = ()
    if method == "eagle3":
        eagle_cfg = c.get("eagle_config") or {}
        raw = eagle_cfg.get("eagle_aux_hidden_state_layer_ids") or c.get("eagle_aux_hidden_state_layer_ids")
        ids = tuple(int(i) for i in raw) if raw else ()
    return HeadConfig(
        method=method,
        hidden_size=hidden,
        intermediate_size=int(need("intermediate_size")),
        num_attention_heads=heads,
        num_key_value_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=int(c.get("head_dim") or hidden // heads),
        vocab_size=vocab,
        draft_vocab_size=int(c.get("draft_vocab_size") or vocab),
        rms_norm_eps=float(c.get("rms_norm_eps", 1e-5)),
        rope_theta=float(c.get("rope_theta", rope.get("rope_theta", 10000.0))),
        rope_scaling=c.get("rope_scaling"),
        max_position_embeddings=int(c.get("max_position_embeddings", 2048)),
        aux_layer_ids=ids,
        target_hidden_size=(int(c.get("target_hidden_size") or hidden) if method == "eagle3" else None),
    )


def _canonical_eagle_name(name: str) -> str:
    n = name.removeprefix("model.")
    for prefix in ("midlayer.", "layers.0."):
        if n.startswith(prefix):
            return n[len(prefix) :]
    if re.match(r"layers\.\d+\.", n):
        raise ValueError(f"tensor {name!r}: heads with more than one decoder layer are not supported")
    return n


def load_eagle_head(
    path: str | Path,
    method: str,
    num_target_layers: int,
    layer_ids: tuple[int, ...] | None = None,
) -> tuple[HeadConfig, dict[str, torch.Tensor]]:
    """An EAGLE (``method='eagle'``) or EAGLE-3 head directory in the public layout.

    EAGLE-3 layer ids: ``layer_ids`` if given, else the checkpoint's ``eagle_config``, else the default
    for a target of ``num_target_layers`` layers."""
    directory = Path(path).expanduser()
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{directory}: not an {method} head directory (no config.json)")
    config = _read_json(directory / "config.json")
    if int(config.get("num_hidden_layers", 1)) != 1:
        raise ValueError(f"{directory}: only single-layer heads are supported")
    cfg = _head_config_from_json(method, config, directory / "config.json")
    if method == "eagle3":
        ids = tuple(layer_ids or ()) or cfg.aux_layer_ids or default_eagle3_layer_ids(num_target_layers)
        check_eagle3_layer_ids(ids, num_target_layers)
        cfg = replace(cfg, aux_layer_ids=ids)
    raw = _read_tensors(_safetensors_files(directory))
    tensors = {_canonical_eagle_name(n): t for n, t in raw.items() if not n.endswith("rotary_emb.inv_freq")}
    validate(cfg, tensors, directory)
    return cfg, tensors


def mtp_layer_prefix(args: ModelArgs) -> str:
    return f"model.layers.{args.num_hidden_layers}."


def has_mtp_weights(directory: Path, args: ModelArgs) -> bool:
    if not directory.is_dir() or not (directory / "config.json").is_file():
        return False
    config = _read_json(directory / "config.json")
    if not int(config.get("num_nextn_predict_layers") or 0):
        return False
    prefix = mtp_layer_prefix(args) + "eh_proj.weight"
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            if prefix in f.keys():  # noqa: SIM118
                return True
    return False


def load_mtp_layer(directory: str | Path, args: ModelArgs) -> tuple[HeadConfig, dict[str, torch.Tensor]]:
    """The MTP layer of a target checkpoint directory (DeepSeek-V3 naming), against the target's args."""
    d = Path(directory).expanduser()
    config_path = d / "config.json"
    config = _read_json(config_path) if config_path.is_file() else {}
    n = int(config.get("num_nextn_predict_layers") or 0)
    prefix = mtp_layer_prefix(args)
    raw: dict[str, torch.Tensor] = {}
    if n and d.is_dir():
        raw = _read_tensors(sorted(d.glob("*.safetensors")), keep=lambda name: name.startswith(prefix))
    if not raw:
        raise ValueError(
            f"{d}: the target checkpoint has no MTP weights (expected num_nextn_predict_layers >= 1 "
            f"in config.json and tensors {prefix}eh_proj.weight, enorm, hnorm, shared_head ...); "
            "use method 'eagle' or 'draft_model', or a checkpoint with an MTP layer"
        )
    tensors: dict[str, torch.Tensor] = {}
    for name, t in raw.items():
        short = name[len(prefix) :]
        if short in ("shared_head.head.weight", "embed_tokens.weight"):
            continue  # MTP always uses the target's embedding and LM head
        short = {"eh_proj.weight": "fc.weight", "shared_head.norm.weight": "norm.weight"}.get(short, short)
        tensors[short] = t
    cfg = HeadConfig.for_target("mtp", args, int(config.get("mtp_draft_vocab_size") or args.vocab_size))
    validate(cfg, tensors, d)
    return cfg, tensors
