"""Whether an sglang release accepts a server configuration, asked of that release's own ``ServerArgs``
(``python/sglang/srt/server_args.py``: ``__post_init__``, ``resolve_once`` and ``check_server_args`` where the
release has them), constructed on CPU with a placeholder model directory holding only an HF config with the
model's attention shapes (:func:`placeholder_model`). Runs inside an engine environment.

Invariant: the verdict is the release's: an ``AssertionError`` or ``ValueError`` from its validation is a
rejection (its message returned); a configuration it constructs and checks is accepted when the release's own
attention module also builds the model's heads on its layout (the model-load head split, run on CPU by
``model_load.head_split``; a rejection there has ``stage`` "model_load"); anything else (its
validation needing a GPU, a model file or the network) is inconclusive (``accepted`` is None), never a pass.
Field names follow the release: ``enable_prefill_cp`` is ``enable_prefill_context_parallel`` where the release
declares that name instead (0.5.13), CUDA graph is ``disable_cuda_graph`` where declared.
"""

from __future__ import annotations

import dataclasses
import os

#: our ServerConfig field -> candidate ServerArgs names, first declared one wins.
FIELD_NAMES = {
    "tp_size": ("tp_size",), "dp_size": ("dp_size",), "attn_cp_size": ("attn_cp_size",),
    "enable_dp_attention": ("enable_dp_attention",),
    "enable_prefill_cp": ("enable_prefill_cp", "enable_prefill_context_parallel"),
    "cp_strategy": ("cp_strategy",), "page_size": ("page_size",), "enable_deterministic_inference": ("enable_deterministic_inference",),
}


#: Fields a launcher fills from the model and the GPU, given placeholder values so validation can run on CPU.
PLACEHOLDERS = {"served_model_name": "dummy"}
#: The backend under test is FA3: validated as ``--attention-backend fa3`` (on a CPU device the release would
#: otherwise pick its CPU backend and judge that one, e.g. refusing deterministic inference for it).
BACKEND = {"attention_backend": "fa3"}
#: Attributes the launcher sets after construction (0.5.13 ``check_server_args`` reads ``enable_grpc``), set only
#: when missing; ``chunked_prefill_size`` is sized from GPU memory and left None on CPU, so it becomes a multiple of
#: the page size (it must divide by it) that decides nothing else.
LAUNCHER_ATTRS = {"enable_grpc": False}
CHUNKED_PREFILL_PAGES = 4096


#: Our fields a release may lack and still run the configuration its own way (0.5.13 names its prefill-CP split
#: ``prefill_cp_mode``, with its own values and default).
UNDECLARED_OK = frozenset({"cp_strategy"})

#: Model dtypes that are also the release's ``--dtype`` (the dtype attention runs in): validated as ``dtype=`` and
#: carried by the placeholder model; another (``float8_e4m3``, a KV-cache dtype here) is validated as bfloat16.
MODEL_DTYPES = ("bfloat16", "float16", "float32")

#: The attention shapes validated when a request names no model.
DEFAULT_MODEL = {"num_heads": 32, "num_kv_heads": 4, "head_dim": 128}


def placeholder_model(model) -> "Path":
    """A directory holding only an HF ``config.json`` with the model's attention shapes (a Qwen3 dense
    architecture), so ServerArgs validates against a real model config without weights or the network
    (``model_path="dummy"`` would skip the validation: ``__post_init__`` returns early for it)."""
    import json
    import tempfile
    from pathlib import Path

    m = dict(model or DEFAULT_MODEL)
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 1,
           "num_attention_heads": int(m["num_heads"]), "num_key_value_heads": int(m["num_kv_heads"]),
           "head_dim": int(m["head_dim"]), "hidden_size": int(m["num_heads"]) * int(m["head_dim"]),
           "intermediate_size": 128, "vocab_size": 1024, "max_position_embeddings": 131072,
           "torch_dtype": m.get("dtype") if m.get("dtype") in MODEL_DTYPES else "bfloat16",
           "rms_norm_eps": 1e-6, "rope_theta": 1000000}
    key = "-".join(str(cfg[k]) for k in ("num_attention_heads", "num_key_value_heads", "head_dim", "torch_dtype"))
    d = Path(tempfile.gettempdir()) / f"fa3verify-placeholder-model-{os.getuid()}" / key
    if not (d / "config.json").exists():
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f"config.json.{os.getpid()}"
        tmp.write_text(json.dumps(cfg))
        os.replace(tmp, d / "config.json")
    return d


def declared_fields(server_args_cls) -> set:
    names = set(getattr(server_args_cls, "__struct_fields__", ()) or ())
    if dataclasses.is_dataclass(server_args_cls):
        names |= {f.name for f in dataclasses.fields(server_args_cls)}
    return names


def server_args_kwargs(server: dict, declared: set) -> tuple:
    """(ServerArgs keyword arguments, our fields the release does not declare)."""
    kwargs, missing = {}, []
    for ours, candidates in FIELD_NAMES.items():
        if ours not in server:
            continue
        name = next((c for c in candidates if c in declared), None)
        if name is None:
            if server[ours] not in (False, 1, None) and ours not in UNDECLARED_OK:
                missing.append(ours)
            continue
        kwargs[name] = server[ours]
    if "cuda_graph" in server and "disable_cuda_graph" in declared:
        kwargs["disable_cuda_graph"] = not server["cuda_graph"]
    return kwargs, missing


def rejection_message(exc: BaseException) -> str:
    """The release's message for a rejection; a bare ``assert`` has none, so its own source line is the message
    (the statement that failed, read from the traceback's last frame)."""
    text = str(exc)
    if not text.strip():
        import traceback

        frames = traceback.extract_tb(exc.__traceback__)
        line = (frames[-1].line or "").strip() if frames else ""
        where = f"{os.path.basename(frames[-1].filename)} line {frames[-1].lineno}" if frames else ""
        text = f"{line} ({where})" if line else "(no message)"
    return f"{type(exc).__name__}: {text}"


def _launcher_set(sa, name: str, value) -> None:
    """Set what a launcher sets after construction; a release that refuses the assignment once its arguments are
    resolved (0.5.17 - 0.5.18: "assigned after resolution") resolves that attribute itself and does not take it."""
    try:
        setattr(sa, name, value)
    except AttributeError as exc:
        if "after resolution" not in str(exc):
            raise


def validate_server_args(engine, server: dict, model=None) -> dict:
    from sglang.srt.server_args import ServerArgs

    declared = declared_fields(ServerArgs)
    kwargs, missing = server_args_kwargs(server, declared)
    if missing:
        return {"accepted": False, "message": f"this release's ServerArgs has no field for {missing}",
                "kwargs": kwargs}
    base = {"model_path": str(placeholder_model(model)), "device": "cpu"}
    if (model or {}).get("dtype") in MODEL_DTYPES and "dtype" in declared:
        base["dtype"] = model["dtype"]
    base.update({k: v for k, v in {**PLACEHOLDERS, **BACKEND}.items() if k in declared})
    try:
        sa = ServerArgs(**base, **kwargs)
        for name, value in LAUNCHER_ATTRS.items():
            if not hasattr(sa, name):
                _launcher_set(sa, name, value)
        if getattr(sa, "chunked_prefill_size", 0) is None:
            _launcher_set(sa, "chunked_prefill_size", CHUNKED_PREFILL_PAGES * int(server.get("page_size", 1)))
        if hasattr(sa, "resolve_once"):
            sa.resolve_once()
        if hasattr(sa, "check_server_args"):
            sa.check_server_args()
    except (AssertionError, ValueError) as exc:
        return {"accepted": False, "message": rejection_message(exc), "kwargs": kwargs}
    except Exception as exc:  # noqa: BLE001 - validation that cannot run on CPU decides nothing
        return {"accepted": None, "message": f"inconclusive: {type(exc).__name__}: {exc}", "kwargs": kwargs}
    from gpu_impl.engines.sglang.model_load import head_split

    loaded = head_split(sa, dict(model or DEFAULT_MODEL))
    if loaded is not None:
        return {**loaded, "kwargs": kwargs}
    return {"accepted": True, "message": "accepted by ServerArgs and at model load", "kwargs": kwargs}
