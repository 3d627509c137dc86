"""Replayable case files, schema "fa3verify.case/1" (documented in docs/case-format.md).

A case is one concrete scenario: a server configuration and model, the backend policy (guard, metadata head
counts, whether stale CP metadata is cleared), a sequence of batches, the kernel to run it on, a tensor seed,
and the expected outcome with the violated invariant, and the seeded defects it runs with (``defects``, names of
gpu_impl.defects). Refuted theorems, the fuzzer and the catalogue write cases; `fa3verify replay` runs them. The
same schema covers kernel-level cases (one FA3 call, a ``call`` object instead of the scenario fields), validated
by spec/model/kernel_cases.py.

`Case.from_json` validates every field and raises `CaseFormatError` (a ValueError) naming the field path, the
allowed values or range, and what was found; bad input never surfaces as a traceback from deeper code.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from spec.model.case_bounds import (MAX_BATCH, MAX_HEADS, MAX_LEN, MAX_NUM_SM, MAX_PAGE_SIZE, MAX_RANKS,  # noqa: F401
                                    MAX_SEED, MAX_STEPS, CaseFormatError, is_int)
from spec.model.case_lifecycle import check_lifecycle
from spec.finding import Outcome

__all__ = ["SCHEMA", "Case", "CaseFormatError", "SERVER_FIELDS", "MODEL_FIELDS", "OUTCOMES", "BATCH_MODES",
           "set_case_options"]

SCHEMA = "fa3verify.case/1"
OUTCOMES = (Outcome.VIOLATION, Outcome.PASS, Outcome.SHAPE_ERROR, Outcome.NAN)
BATCH_MODES = ("decode", "extend", "mixed", "idle")
KERNEL_NAMES = ("emulated", "fa3")
KERNEL_MODES = ("strict", "gpu-like")
BUILTIN_GUARDS = ("fixed", "pre-fix", "none")
METADATA_HEADS = ("tp", "attn_tp")
_SOURCE_RE = re.compile(r"^(prove:[A-Za-z0-9_.:\-]+|fuzz|conform|catalogue:[A-Za-z0-9_.\-]+|manual)$")
_GUARD_RE = re.compile(r"^(fixed|pre-fix|none|[A-Za-z_][\w.]*:[A-Za-z_]\w*|.+\.py:[A-Za-z_]\w*)$")


# field -> (kind, constraint); kinds: int_range (lo, hi), optint_range, bool, str, choice
SERVER_FIELDS: dict[str, tuple[str, Any]] = {
    "tp_size": ("int_range", (1, MAX_RANKS)), "dp_size": ("int_range", (1, MAX_RANKS)),
    "attn_cp_size": ("int_range", (1, MAX_RANKS)),
    "enable_dp_attention": ("bool", None), "enable_prefill_cp": ("bool", None),
    "cp_strategy": ("choice", (None, "zigzag")), "page_size": ("int_range", (1, MAX_PAGE_SIZE)),
    "num_splits": ("int_range", (0, 256)),
    "enable_deterministic_inference": ("bool", None), "cuda_graph": ("bool", None),
    "num_sm": ("int_range", (1, MAX_NUM_SM)),
    "context_length": ("int_range", (1, MAX_LEN)), "cp_decode_sharded_kv": ("bool", None),
}
MODEL_FIELDS: dict[str, tuple[str, Any]] = {
    "name": ("str", None), "num_heads": ("int_range", (1, MAX_HEADS)), "num_kv_heads": ("int_range", (1, MAX_HEADS)),
    "head_dim": ("int_range", (8, 256)),
    "head_dim_v": ("optint_range", (8, 512)), "dtype": ("choice", ("bfloat16", "float16", "float8_e4m3")),
    "is_mla": ("bool", None), "has_sliding_window_layers": ("bool", None),
}
#: Server/model fields that may be omitted (defaults as spec.model.config's ServerConfig/ModelConfig).
_OPTIONAL = {"server": {"cuda_graph", "context_length", "enable_deterministic_inference", "num_splits", "cp_strategy",
                        "page_size", "num_sm", "enable_prefill_cp", "enable_dp_attention", "dp_size", "attn_cp_size",
                        "cp_decode_sharded_kv"},
             "model": {"head_dim_v", "dtype", "is_mla", "has_sliding_window_layers"}}
_TOP = ("schema", "id", "source", "server", "model", "policy", "batches", "kernel", "engine", "seed", "expected",
        "notes", "defects", "lifecycle", "options")
#: A seeded defect's name (gpu_impl.defects' registry, which a replay consults, says whether it exists).
DEFECT_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,79}$")


#: Where the schemas of engine-owned case options come from: a callable giving ``{options key: check(value, server,
#: path) -> dict}``, set by the layer that knows the engines (``gpu_impl`` sets its plugins' schemas,
#: ``gpu_impl.plugin.case_options_schemas``); spec names no engine and no engine's option.
_OPTIONS_SCHEMAS: Optional[Callable[[], dict]] = None


def set_case_options(source: Optional[Callable[[], dict]]) -> None:
    """Let case files carry engine-owned options: ``source()`` gives each options key's validator."""
    global _OPTIONS_SCHEMAS
    _OPTIONS_SCHEMAS = source


def _options_schemas() -> dict:
    return _OPTIONS_SCHEMAS() if _OPTIONS_SCHEMAS is not None else {}


def _check_options(data: dict, server: dict) -> dict:
    """The case's engine-owned options, ``{key: object}``, each validated by its engine's schema: the ``options``
    object, or (a file written before ``options``) a top-level field named by an engine's options key."""
    schemas = _options_schemas()
    legacy = {k: data[k] for k in data if k not in _TOP and k in schemas}
    raw = data.get("options", {})
    if not isinstance(raw, dict):
        raise CaseFormatError("options", "a JSON object {engine options key: object}", _short(raw))
    if legacy and raw:
        key = sorted(legacy)[0]
        raise CaseFormatError(key, f"absent when the case has an options object (write it as options.{key})", key)
    out = {}
    for key, value in (legacy or raw).items():
        path = key if legacy else f"options.{key}"
        if key not in schemas:
            known = ", ".join(sorted(schemas)) or "none registered"
            raise CaseFormatError(path, f"the options of an engine that takes options ({known})", key)
        out[key] = schemas[key](value, server, path)
    return out


def check_defect_names(value: Any, path: str = "defects") -> list:
    """A list of seeded-defect names (lowercase letters, digits and dashes), sorted and without repeats."""
    if not isinstance(value, list) or not all(isinstance(d, str) and DEFECT_NAME.match(d) for d in value):
        raise CaseFormatError(path, "a list of seeded-defect names such as 'graph-split-count-from-capture'",
                              _short(value))
    return sorted(set(value))


#: The engine names a case file may record and the field each one's value fills (the ``takes`` of its registry row,
#: gpu_impl/engine_forms.json); an engine registered from outside adds itself (:func:`register_engine`).
ENGINE_TAKES = {"model": None, "sglang": "release", "sglang-src": "path", "vllm": "release", "vllm-src": "path",
                "sut": "target"}
ENGINE_NAMES = tuple(ENGINE_TAKES)
_BUILTIN_ENGINES = frozenset(ENGINE_TAKES)


def register_engine(name: str, takes) -> None:
    """Let case files record engine ``name``, whose value fills ``takes`` (None, "release", "path", "target")."""
    global ENGINE_NAMES
    ENGINE_TAKES[name] = takes
    ENGINE_NAMES = tuple(ENGINE_TAKES)


def unregister_engine(name: str) -> None:
    global ENGINE_NAMES
    if name not in _BUILTIN_ENGINES:
        ENGINE_TAKES.pop(name, None)
        ENGINE_NAMES = tuple(ENGINE_TAKES)


#: what a missing value of each field is asked for, in the message naming it
_TAKES_WANT = {"release": "a release number such as '0.5.23' for engine {name!r}",
               "path": "the checkout's path for engine {name!r}", "target": "MODULE:CLASS for engine {name!r}"}
#: The fields of a case's ``engine`` object, in the order a case file writes them.
ENGINE_FIELDS = ("name", "release", "path", "target", "revision")
_RELEASE_RE = re.compile(r"^\d+\.\d+\.\d+(\.\d+)?(\.post\d+)?$")


def _check_field(path: str, value: Any, kind: str, arg: Any) -> None:
    if kind == "int":
        if not is_int(value) or value < arg:
            raise CaseFormatError(path, f"an integer >= {arg}", value)
    elif kind == "int_range":
        lo, hi = arg
        if not is_int(value) or not lo <= value <= hi:
            raise CaseFormatError(path, f"an integer in [{lo}, {hi}]", value)
    elif kind == "optint_range":
        lo, hi = arg
        if value is not None and (not is_int(value) or not lo <= value <= hi):
            raise CaseFormatError(path, f"null or an integer in [{lo}, {hi}]", value)
    elif kind == "bool":
        if not isinstance(value, bool):
            raise CaseFormatError(path, "true or false", value)
    elif kind == "str":
        if not isinstance(value, str) or not value:
            raise CaseFormatError(path, "a non-empty string", value)
    elif kind == "choice":
        if value not in arg:
            raise CaseFormatError(path, "one of " + ", ".join("null" if a is None else repr(a) for a in arg), value)


def _check_object(path: str, obj: Any, spec: dict, optional: set) -> dict:
    if not isinstance(obj, dict):
        raise CaseFormatError(path, "a JSON object", obj)
    unknown = sorted(set(obj) - set(spec))
    if unknown:
        raise CaseFormatError(f"{path}.{unknown[0]}", f"one of the fields {sorted(spec)}", unknown[0])
    for name, (kind, arg) in spec.items():
        if name not in obj:
            if name in optional:
                continue
            raise CaseFormatError(f"{path}.{name}", f"a value ({kind})", "<missing>")
        _check_field(f"{path}.{name}", obj[name], kind, arg)
    return dict(obj)


def _check_batches(batches: Any) -> list:
    if not isinstance(batches, list) or not batches:
        raise CaseFormatError("batches", "a non-empty list of batch objects", batches)
    if len(batches) > MAX_STEPS:
        raise CaseFormatError("batches", f"at most {MAX_STEPS} batches", f"{len(batches)} batches")
    out = []
    for i, b in enumerate(batches):
        p = f"batches[{i}]"
        if not isinstance(b, dict):
            raise CaseFormatError(p, "a JSON object with mode, seq_lens, extend_lens", b)
        unknown = sorted(set(b) - {"mode", "seq_lens", "extend_lens", "dp_rank", "cp_metadata"})
        if unknown:
            raise CaseFormatError(f"{p}.{unknown[0]}", "one of mode, seq_lens, extend_lens, dp_rank, cp_metadata",
                                  unknown[0])
        if b.get("mode") not in BATCH_MODES:
            raise CaseFormatError(f"{p}.mode", "one of " + ", ".join(BATCH_MODES), b.get("mode", "<missing>"))
        lens = b.get("seq_lens", "<missing>")
        if isinstance(lens, list) and len(lens) > MAX_BATCH:
            raise CaseFormatError(f"{p}.seq_lens", f"at most {MAX_BATCH} sequences", f"{len(lens)} sequences")
        if not isinstance(lens, list) or not all(is_int(x) and 1 <= x <= MAX_LEN for x in lens):
            raise CaseFormatError(f"{p}.seq_lens", "a list of integers in [1, 2^31)", _short(lens))
        if b["mode"] != "idle" and not lens:
            raise CaseFormatError(f"{p}.seq_lens", f"a non-empty list for mode {b['mode']!r}", lens)
        ext = b.get("extend_lens")
        if ext is not None:
            if not isinstance(ext, list) or len(ext) != len(lens):
                raise CaseFormatError(f"{p}.extend_lens", f"null or a list of {len(lens)} integers (one per seq_len)",
                                      ext)
            for j, (e, s) in enumerate(zip(ext, lens)):
                if not is_int(e) or not 1 <= e <= s:
                    raise CaseFormatError(f"{p}.extend_lens[{j}]", f"an integer in [1, seq_lens[{j}]={s}]", e)
        elif b["mode"] in ("extend", "mixed"):
            raise CaseFormatError(f"{p}.extend_lens", f"a list of {len(lens)} integers for mode {b['mode']!r}", ext)
        out.append({"mode": b["mode"], "seq_lens": list(lens), "extend_lens": None if ext is None else list(ext),
                    **{k: b[k] for k in ("dp_rank", "cp_metadata") if k in b}})
    return out


def _short(value: Any) -> Any:
    """A value short enough to quote in an error message."""
    text = repr(value)
    return value if len(text) <= 80 else text[:60] + f"... ({len(text)} characters)"


def _check_parallel_layout(server: dict, model: dict) -> None:
    """Cross-field rules without which the rank layout has no attention-TP rank or no head per rank.

    attn_tp_size = tp_size // (attn_dp_size * attn_cp_size) >= 1 (sglang dp_attention.py
    compute_dp_attention_world_info) and the precompute's num_heads // tp_size >= 1 (flashattention_backend.py).
    """
    tp = server["tp_size"]
    cp = server.get("attn_cp_size", 1)
    dp_attn = server.get("dp_size", 1) if server.get("enable_dp_attention", False) else 1
    if cp > tp:
        raise CaseFormatError("server.attn_cp_size", f"an integer in [1, tp_size={tp}]", cp)
    if dp_attn > tp:
        raise CaseFormatError("server.dp_size", f"an integer in [1, tp_size={tp}] with DP attention", dp_attn)
    if dp_attn * cp > tp:
        raise CaseFormatError("server.attn_cp_size", f"dp_size * attn_cp_size <= tp_size={tp} with DP attention "
                                                     f"(dp_size={dp_attn})", cp)
    if model["num_heads"] < tp:
        raise CaseFormatError("server.tp_size", f"an integer in [1, num_heads={model['num_heads']}]", tp)


def _check_policy(policy: Any) -> dict:
    if not isinstance(policy, dict):
        raise CaseFormatError("policy", "a JSON object with guard, metadata_heads, clear_stale_cp_metadata", policy)
    g = policy.get("guard", "<missing>")
    if not isinstance(g, str) or not _GUARD_RE.match(g):
        raise CaseFormatError("policy.guard", "'fixed', 'pre-fix', 'none', 'package.module:function' or "
                                              "'path/to/file.py:function'", g)
    mh = policy.get("metadata_heads", "tp")
    if mh not in METADATA_HEADS:
        raise CaseFormatError("policy.metadata_heads", "'tp' or 'attn_tp'", mh)
    cs = policy.get("clear_stale_cp_metadata", True)
    if not isinstance(cs, bool):
        raise CaseFormatError("policy.clear_stale_cp_metadata", "true or false", cs)
    kv = policy.get("cp_decode_kv", "replicated")
    if kv not in ("replicated", "sharded"):
        raise CaseFormatError("policy.cp_decode_kv", "'replicated' or 'sharded'", kv)
    rk = policy.get("graph_replay_seqlen_k", "max_seq_len")
    if rk not in ("max_seq_len", "context_length"):
        raise CaseFormatError("policy.graph_replay_seqlen_k", "'max_seq_len' or 'context_length'", rk)
    from refmodel.fa3_builds import builds

    fb = policy.get("fa3_build", "upstream-0251105a")
    if fb not in builds():
        raise CaseFormatError("policy.fa3_build", "one of " + ", ".join(sorted(builds())), fb)
    out = {"guard": g, "metadata_heads": mh, "clear_stale_cp_metadata": cs}
    if "fa3_build" in policy:
        out["fa3_build"] = fb
    if "cp_decode_kv" in policy:
        out["cp_decode_kv"] = kv
    if "graph_replay_seqlen_k" in policy:
        out["graph_replay_seqlen_k"] = rk
    known = {"guard", "metadata_heads", "clear_stale_cp_metadata", "cp_decode_kv", "graph_replay_seqlen_k", "fa3_build"}
    unknown = sorted(set(policy) - known)
    if unknown:
        raise CaseFormatError(f"policy.{unknown[0]}", "one of guard, metadata_heads, clear_stale_cp_metadata, "
                                                      "cp_decode_kv, graph_replay_seqlen_k, fa3_build", unknown[0])
    return out


def _check_kernel(kernel: Any) -> dict:
    if not isinstance(kernel, dict):
        raise CaseFormatError("kernel", "a JSON object with name and mode", kernel)
    if kernel.get("name") not in KERNEL_NAMES:
        raise CaseFormatError("kernel.name", "'emulated' or 'fa3'", kernel.get("name", "<missing>"))
    if kernel.get("mode", "strict") not in KERNEL_MODES:
        raise CaseFormatError("kernel.mode", "'strict' or 'gpu-like'", kernel.get("mode"))
    return {"name": kernel["name"], "mode": kernel.get("mode", "strict")}


def _check_engine(engine: Any) -> Optional[dict]:
    """The system under test a case was found on: ``{name, release|path|target, revision}`` (None: the model;
    ``target``: the ``MODULE:CLASS[@ARG]`` of a ``sut=`` engine)."""
    if engine is None:
        return None
    if not isinstance(engine, dict):
        raise CaseFormatError("engine", "a JSON object with name and release or path", engine)
    unknown = sorted(set(engine) - set(ENGINE_FIELDS))
    if unknown:
        raise CaseFormatError(f"engine.{unknown[0]}", "one of " + ", ".join(ENGINE_FIELDS), unknown[0])
    name = engine.get("name", "<missing>")
    if name not in ENGINE_NAMES:
        raise CaseFormatError("engine.name", "one of " + ", ".join(repr(n) for n in ENGINE_NAMES), name)
    release, path, revision = engine.get("release"), engine.get("path"), engine.get("revision")
    if release is not None and (not isinstance(release, str) or not _RELEASE_RE.match(release)):
        raise CaseFormatError("engine.release", "a release number such as '0.5.23', '0.9.0.1' or '0.8.5.post1'",
                              release)
    takes = ENGINE_TAKES[name]
    if takes == "release" and release is None:
        raise CaseFormatError("engine.release", _TAKES_WANT[takes].format(name=name), release)
    if path is not None and (not isinstance(path, str) or not path):
        raise CaseFormatError("engine.path", "a non-empty path string", path)
    if takes == "path" and path is None:
        raise CaseFormatError("engine.path", _TAKES_WANT[takes].format(name=name), path)
    target = engine.get("target")
    if target is not None and (not isinstance(target, str) or ":" not in target):
        raise CaseFormatError("engine.target", "MODULE:CLASS or MODULE:CLASS@ARG", target)
    if takes == "target" and target is None:
        raise CaseFormatError("engine.target", _TAKES_WANT[takes].format(name=name), target)
    if revision is not None and not isinstance(revision, str):
        raise CaseFormatError("engine.revision", "null or a string (a git revision)", revision)
    if takes is None:
        return {"name": name}
    return {k: engine[k] for k in ENGINE_FIELDS if engine.get(k) is not None}


def _check_expected(expected: Any) -> dict:
    if not isinstance(expected, dict):
        raise CaseFormatError("expected", "a JSON object with outcome, invariant, detail", expected)
    if expected.get("outcome") not in OUTCOMES:
        raise CaseFormatError("expected.outcome", "one of " + ", ".join(OUTCOMES), expected.get("outcome", "<missing>"))
    inv = expected.get("invariant")
    if inv is not None and (not isinstance(inv, str) or not inv):
        raise CaseFormatError("expected.invariant", "null or an invariant name such as 'SPLIT_BOUND'", inv)
    if expected["outcome"] == Outcome.VIOLATION and inv is None:
        raise CaseFormatError("expected.invariant", "an invariant name when outcome is 'violation'", inv)
    detail = expected.get("detail", {})
    if not isinstance(detail, dict):
        raise CaseFormatError("expected.detail", "a JSON object", detail)
    return {"outcome": expected["outcome"], "invariant": inv, "detail": dict(detail)}


#: Largest case file text, and deepest JSON nesting, a reader accepts.
MAX_CASE_CHARS = 16 * 1024 * 1024
MAX_JSON_DEPTH = 32


def json_nesting(text: str) -> int:
    """Deepest [ / { nesting of JSON text (brackets inside strings ignored), without recursion."""
    depth = best = 0
    in_str = escaped = False
    for ch in text:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    return best


@dataclass
class Case:
    """One replayable scenario (schema fa3verify.case/1); see docs/case-format.md."""

    id: str
    source: str
    server: dict
    model: dict
    policy: dict
    batches: list
    kernel: dict = field(default_factory=lambda: {"name": "emulated", "mode": "strict"})
    seed: int = 0
    expected: dict = field(default_factory=lambda: {"outcome": Outcome.PASS, "invariant": None, "detail": {}})
    notes: str = ""
    schema: str = SCHEMA
    #: the system under test the case was found on (``{name, release|path, revision}``); None means the model
    engine: Optional[dict] = None
    #: seeded defects (gpu_impl.defects names) the scenario runs with; absent in a file means none
    defects: list = field(default_factory=list)
    #: engine-owned options, by the key the engine's plugin files them under (``gpu_impl.plugin.EnginePlugin
    #: .options_key``; their schema is the plugin's): what that engine's configuration adds to server/model; empty
    #: for a case any engine runs
    options: dict = field(default_factory=dict)
    #: the driven sequence of a lifecycle finding (``spec.model.case_lifecycle``: layers a step, the seeded engine
    #: defect); None: one layer a step, no engine defect
    lifecycle: Optional[dict] = None

    # -- construction ----------------------------------------------------------------------------------------

    @classmethod
    def from_parts(cls, *, source: str, server: dict, model: dict, policy: dict, batches: list,
                   kernel: Optional[dict] = None, seed: int = 0, expected: Optional[dict] = None, notes: str = "",
                   id: Optional[str] = None, engine: Optional[dict] = None,
                   defects: Optional[list] = None, options: Optional[dict] = None,
                   lifecycle: Optional[dict] = None) -> "Case":
        """Build and validate a case; `id` defaults to the signature hash."""
        data = {"schema": SCHEMA, "id": id or "pending", "source": source, "server": server, "model": model,
                "policy": policy, "batches": batches, "kernel": kernel or {"name": "emulated", "mode": "strict"},
                "seed": seed, "expected": expected or {"outcome": Outcome.PASS, "invariant": None, "detail": {}},
                "notes": notes}
        if engine is not None:
            data["engine"] = engine
        if defects:
            data["defects"] = list(defects)
        if options:
            data["options"] = {key: dict(value) for key, value in options.items()}
        if lifecycle is not None:
            data["lifecycle"] = dict(lifecycle)
        case = cls.from_dict(data)
        if id is None:
            case.id = case.signature()
        return case

    @classmethod
    def from_dict(cls, data: Any) -> "Case":
        """Validate a decoded JSON object; CaseFormatError names the first bad field."""
        if not isinstance(data, dict):
            raise CaseFormatError("case", "a JSON object", type(data).__name__)
        unknown = sorted(set(data) - set(_TOP) - set(_options_schemas()))
        if unknown:
            raise CaseFormatError(unknown[0], "one of the top-level fields " + ", ".join(_TOP), unknown[0])
        if data.get("schema") != SCHEMA:
            raise CaseFormatError("schema", repr(SCHEMA), data.get("schema", "<missing>"))
        cid = data.get("id", "<missing>")
        if not isinstance(cid, str) or not cid:
            raise CaseFormatError("id", "a non-empty string", cid)
        src = data.get("source", "<missing>")
        if not isinstance(src, str) or not _SOURCE_RE.match(src):
            raise CaseFormatError("source", "'prove:<theorem>', 'fuzz', 'conform', 'catalogue:<id>' or 'manual'", src)
        server = _check_object("server", data.get("server", "<missing>"), SERVER_FIELDS, _OPTIONAL["server"])
        model = _check_object("model", data.get("model", "<missing>"), MODEL_FIELDS, _OPTIONAL["model"])
        if model["num_heads"] % model["num_kv_heads"] != 0:
            raise CaseFormatError("model.num_kv_heads", f"a divisor of num_heads={model['num_heads']}",
                                  model["num_kv_heads"])
        _check_parallel_layout(server, model)
        seed = data.get("seed", 0)
        if not is_int(seed) or not 0 <= seed <= MAX_SEED:
            raise CaseFormatError("seed", "an integer in [0, 2^63)", _short(seed))
        notes = data.get("notes", "")
        if not isinstance(notes, str):
            raise CaseFormatError("notes", "a string", notes)
        options = _check_options(data, server)
        return cls(id=cid, source=src, server=server, model=model, policy=_check_policy(data.get("policy", "<missing>")),
                   batches=_check_batches(data.get("batches", "<missing>")),
                   kernel=_check_kernel(data.get("kernel", {"name": "emulated"})), seed=seed,
                   expected=_check_expected(data.get("expected", "<missing>")), notes=notes,
                   engine=_check_engine(data.get("engine")),
                   defects=check_defect_names(data.get("defects", [])),
                   options=options, lifecycle=check_lifecycle(data.get("lifecycle"), options))

    # -- serialisation ---------------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """JSON-ready dict in the schema's field order (``engine`` only when the case names one)."""
        out = {"schema": self.schema, "id": self.id, "source": self.source, "server": self.server,
               "model": self.model, "policy": self.policy, "batches": self.batches, "kernel": self.kernel,
               "seed": self.seed, "expected": self.expected, "notes": self.notes}
        if self.engine is not None:
            out["engine"] = self.engine
        if self.defects:
            out["defects"] = list(self.defects)
        if self.options:
            out["options"] = {key: dict(value) for key, value in self.options.items()}
        if self.lifecycle is not None:
            out["lifecycle"] = dict(self.lifecycle)
        return out

    @property
    def on_real_engine(self) -> bool:
        """True when the case was found on real engine code (not on the model)."""
        return bool(self.engine) and self.engine.get("name") != "model"

    def to_json(self) -> str:
        """The case as indented JSON text."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Case":
        """Parse and validate JSON text; malformed JSON or fields raise CaseFormatError."""
        if len(text) > MAX_CASE_CHARS:
            raise CaseFormatError("case", f"at most {MAX_CASE_CHARS} characters of JSON", f"{len(text)} characters")
        depth = json_nesting(text)
        if depth > MAX_JSON_DEPTH:
            raise CaseFormatError("case", f"JSON nested at most {MAX_JSON_DEPTH} levels deep", f"{depth} levels")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CaseFormatError("case", f"valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
                                  text[:40]) from None
        except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4300 digits
            raise CaseFormatError("case", "JSON with integers of at most 4300 digits", str(exc)[:80]) from None
        return cls.from_dict(data)

    @classmethod
    def load(cls, path) -> "Case":
        """Read a case file (FileNotFoundError if absent; CaseFormatError if malformed or not a regular file)."""
        import os
        import stat

        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise CaseFormatError("case", "a regular file (not a directory, FIFO or device)", str(path))
        if st.st_size > MAX_CASE_CHARS * 4:
            raise CaseFormatError("case", f"at most {MAX_CASE_CHARS} characters of JSON", f"{st.st_size} bytes")
        raw = Path(path).read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CaseFormatError("case", "UTF-8 JSON text", f"{len(raw)} undecodable bytes") from None
        return cls.from_json(text)

    def signature(self) -> str:
        """Stable hash of what makes the violation distinct: source kind, config, policy, batches, expected outcome."""
        key = {"source": self.source.split(":")[0], "server": self.server, "model": self.model, "policy": self.policy,
               "batches": self.batches, "outcome": self.expected.get("outcome"),
               "invariant": self.expected.get("invariant")}
        if self.on_real_engine:  # the same violation on real code is a distinct finding; model cases keep their ids
            key["engine"] = {k: v for k, v in self.engine.items() if k != "revision"}
        if self.defects:  # a seeded defect makes a distinct case; cases without one keep their ids
            key["defects"] = list(self.defects)
        for name, value in self.options.items():  # engine options make a distinct case; other cases keep their ids
            key[name] = value
        if self.lifecycle is not None:  # the driven sequence makes a distinct case; cases without one keep their ids
            key["lifecycle"] = self.lifecycle
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    def save(self, directory) -> Path:
        """Write `<source kind>-<invariant>-<signature>.json` into `directory` (one file per distinct signature).

        A file with the same signature that already exists is kept as it is (the first finder's notes win).
        """
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        slug = self.source.split(":")[0] or "case"  # one file per signature, whichever theorem found it
        inv = (self.expected.get("invariant") or self.expected.get("outcome") or "case").lower()
        path = d / f"{slug}-{re.sub(r'[^a-z0-9]+', '-', inv)}-{self.signature()}.json"
        try:  # "x": never replaces an existing file, never follows a (dangling) symlink planted at that name
            with open(path, "x", encoding="utf-8") as fh:
                fh.write(self.to_json())
        except FileExistsError:
            pass
        return path
