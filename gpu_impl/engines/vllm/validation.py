"""Whether a vLLM release accepts a configuration, asked of that release's own config classes
(``vllm/config/parallel.py`` ``ParallelConfig``, ``vllm/config/cache.py`` ``CacheConfig``, ``vllm/config/model.py``
``ModelConfig`` and its ``verify_with_parallel_config``), constructed on CPU. Runs inside a vLLM engine
environment, after ``vllm_glue.install`` (the sm90-on-CPU platform).

Invariant: the verdict is vLLM's: a ``ValueError`` (pydantic's validation errors are ones), ``TypeError`` or
``AssertionError`` from its config validation is a rejection with vLLM's message; the model checks run on a
placeholder HF config holding only the model's attention shapes (``validation.placeholder_model``) and, where
``ModelConfig`` cannot be built on CPU, are reported as not run (the parallel and cache checks still decide).
``distributed_executor_backend`` is "mp" (what a one-node server selects; vLLM's automatic choice would compare
the world size with the platform's device count, which the CPU platform fake does not model).
"""

from __future__ import annotations

from gpu_impl.engines.sglang.validation import placeholder_model

__all__ = ["validate_vllm_config"]


def validate_vllm_config(s: dict) -> dict:
    """``{"accepted": bool | None, "message": str}`` for the driver's scenario fields ``s`` (tp, dcp,
    block_size, kv_cache_dtype, heads, head_dim, dtype, max_model_len)."""
    from vllm.config import CacheConfig, ModelConfig, ParallelConfig

    def rejected(where, exc):
        text = " ".join(str(exc).split())
        return {"accepted": False, "message": f"{where}: {type(exc).__name__}: {text[:400]}"}

    import dataclasses

    dcp = int(s.get("dcp", 1))
    has_dcp = "decode_context_parallel_size" in {f.name for f in dataclasses.fields(ParallelConfig)}
    if dcp > 1 and not has_dcp:  # releases before 0.11 have no decode context parallelism
        return {"accepted": False, "message": "ParallelConfig: this release has no decode_context_parallel_size "
                                              "(no decode context parallelism)"}
    try:
        pc = ParallelConfig(tensor_parallel_size=int(s["tp"]), distributed_executor_backend="mp",
                            **({"decode_context_parallel_size": dcp} if has_dcp else {}))
    except (ValueError, TypeError, AssertionError) as exc:
        return rejected("ParallelConfig", exc)
    try:
        CacheConfig(block_size=int(s["block_size"]), cache_dtype=s.get("kv_cache_dtype") or "auto")
    except (ValueError, TypeError, AssertionError) as exc:
        return rejected("CacheConfig", exc)
    model = {"num_heads": s["num_heads"], "num_kv_heads": s["num_kv_heads"], "head_dim": s["head_dim"],
             "dtype": s.get("dtype", "bfloat16")}
    path = str(placeholder_model(model))
    # ModelConfig of 0.8.5 is a plain class whose task, tokenizer and seed have no defaults: the values a server's
    # defaults give them
    required = {"task": "auto", "tokenizer": path, "tokenizer_mode": "auto", "trust_remote_code": False, "seed": 0}
    import inspect

    params = inspect.signature(ModelConfig).parameters
    given = {k: v for k, v in required.items() if k in params and params[k].default is inspect.Parameter.empty}
    try:
        mc = ModelConfig(model=path, skip_tokenizer_init=True, max_model_len=int(s["max_model_len"]),
                         dtype=model["dtype"], **given)
    except (ValueError, TypeError, AssertionError) as exc:
        return rejected("ModelConfig", exc)
    except Exception as exc:  # noqa: BLE001 - a model config that cannot be built on CPU decides nothing
        return {"accepted": True, "message": f"accepted by ParallelConfig and CacheConfig (ModelConfig not run on "
                                             f"CPU: {type(exc).__name__}: {str(exc)[:200]})"}
    try:
        mc.verify_with_parallel_config(pc)
    except (ValueError, TypeError, AssertionError) as exc:
        return rejected("ModelConfig.verify_with_parallel_config", exc)
    return {"accepted": True, "message": "accepted by ParallelConfig, CacheConfig and ModelConfig"}
