"""vLLM's FA3 flow as a theorem: under a release's profile, the metadata its builder precomputes is safe for the call.

Invariant (theorem ``vllm-flow``): for every configuration of the vLLM domain (:func:`vllm_groups`) and every
decode batch (up to ``B_MAX`` sequences of up to 2^20 tokens, any page-table width >= the longest), the metadata
``get_scheduler_metadata`` computes from the profile's precompute arguments gives no batch more splits than the
consuming ``flash_attn_varlen_func`` call's buffers hold (SPLIT_BOUND, COMBINE_CAPACITY: ``S_c > 1`` and a split
above ``S_c``) and covers every query row (QUERY_COVER). Models ``vllm/v1/attention/backends/flash_attn.py``
(``FlashAttentionMetadataBuilder._get_scheduler_metadata`` / ``build``, ``FlashAttentionImpl.forward``) through
the profile (``gpu_impl/engines/vllm/profiles.json``); the encoding is the decode one of ``spec.theorems.metadata``
(stage 1: can ``S_p > S_c > 1``; stage 2: the full prepare step for b = 1..B_MAX), with the precompute's
``max_seqlen_k`` = the longest sequence and the call's KV extent any page-table width >= it.

Domain: the models of ``spec.model.config`` without MLA (vLLM runs MLA through other backends), tensor parallel 1, 2, 4,
8 (heads ``H // tp``, KV heads ``max(1, Hk // tp)`` on both sides, as the profile's ``layer`` says), block sizes 16
and 64 (FA3 in vLLM needs a multiple of 16), the SM counts of ``spec.model.domain``, each CUDA-graph mode in which the
builder precomputes, with that mode's split counts. Simplified (stated in docs/engines-vllm.md): full-attention
layers only (window (-1, -1), causal), DCP off, bf16 KV cache; batch sizes are equal on both sides (vLLM builds
both from ``num_reqs``). A refutation carries a concrete counterexample replayed through refmodel and, with
``cases_dir``, is written as a case file (fa3verify.case/1 with its vLLM options, ``options.vllm``, engine
``vllm==V``) that ``fa3verify replay`` runs on vLLM's own code (:func:`write_vllm_case`): a profile whose precompute passes the
heuristic (0) while the call passes a fixed count is vLLM #20301's pattern, and the case carries that seeded
defect (``graph-split-count-from-capture``, applied by the vLLM driver from outside vLLM's code); any other
difference a profile claims is no seeded defect, so its case replays the released code as it is.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import time
from typing import Optional

from refmodel.fa3_scheduler import call_inputs, precompute_inputs, resolve_schedule
from refmodel.prepare import prepare_scheduler

from spec.model import domain as D
from spec.model.config import MODELS, ModelConfig
from spec.invariants import evaluate
from spec.theorems.results import TheoremResult
from spec.theorems.symbolic import side_params
from spec.theorems.metadata import Group, Budget, prove_groups
from spec.finding import Outcome, TheoremVerdict

from .options import OPTIONS_KEY
from .profiles import VllmProfile

__all__ = ["THEOREM", "VllmPoint", "vllm_groups", "run_vllm_theorems", "write_vllm_case", "VLLM_TP", "VLLM_BLOCK_SIZES",
           "PR20301_DEFECT"]

#: The seeded defect (gpu_impl.defects) that makes the released vLLM precompute with the heuristic while the call
#: keeps its fixed split count: what a profile with precompute 0 and call N > 0 claims.
PR20301_DEFECT = "graph-split-count-from-capture"

THEOREM = "vllm-flow"
VLLM_TP = (1, 2, 4, 8)
VLLM_BLOCK_SIZES = (16, 64)


def _sides(profile: VllmProfile, model, tp: int, block: int, sm: int, mode: str) -> tuple:
    """(precompute ScheduleInputs, call ScheduleInputs) of one configuration, batch and lengths left symbolic."""
    h, hk = model.num_heads // tp, max(1, model.num_kv_heads // tp)
    ns_p, ns_c = profile.splits(mode)
    common = dict(varlen_q=True, page_size=block, causal=True, num_sm=sm)
    pin = precompute_inputs(1, 1, 0, h, hk, model.head_dim,
                            headdim_v=model.head_dim_v if profile.headdim_v_passed else None,
                            num_splits=ns_p, **common)
    cin = call_inputs(1, 1, 0, h, hk, model.head_dim, headdim_v=model.head_dim_v, has_cache_seqlens=True,
                      num_splits=ns_c, **common)
    return pin, cin


@dataclasses.dataclass(frozen=True)
class VllmPoint:
    """One configuration of the vLLM domain: a model, tp, block size, SM count and CUDA-graph mode."""

    model: ModelConfig
    tp: int
    block: int
    sm: int
    mode: str

    @property
    def label(self) -> str:
        return f"{self.model.name} tp={self.tp} block_size={self.block} num_sm={self.sm} cudagraph={self.mode}"


def vllm_groups(profile: VllmProfile, models=None, num_sms=D.NUM_SMS) -> list:
    """The domain's configurations under ``profile``, grouped by identical queries: [(Group, [VllmPoint], pin,
    cin)]."""
    models = [m for m in (MODELS.values() if models is None else models) if not m.is_mla]
    groups: dict = {}
    for model, tp, block, sm, mode in itertools.product(models, VLLM_TP, VLLM_BLOCK_SIZES, num_sms, profile.modes):
        if model.num_heads % tp:
            continue   # vLLM refuses a tensor-parallel size that does not divide the attention heads
        pin, cin = _sides(profile, model, tp, block, sm, mode)
        g = Group(side_params(pin), side_params(cin), 0, block, False)
        entry = groups.setdefault((g.key, block), [g, [], pin, cin])
        entry[1].append(VllmPoint(model, tp, block, sm, mode))
    return [tuple(v) for v in groups.values()]


def write_vllm_case(cases_dir, profile: VllmProfile, point: VllmPoint, witness: dict,
                    message: str) -> Optional[str]:
    """Write a refutation's counterexample as a replayable case file (module doc); None without ``cases_dir``."""
    from spec.model.cases import Case
    from spec.model.config import ServerConfig

    if cases_dir is None:
        return None
    model, tp, block, sm, mode, label = point.model, point.tp, point.block, point.sm, point.mode, point.label
    ns_p, ns_c = profile.splits(mode)
    seq_lens = [int(x) for x in witness["seq_lens"]]
    server = ServerConfig(tp_size=tp, page_size=block, num_sm=sm, cuda_graph=mode == "full",
                          context_length=max([int(witness["call"]["seqlen_k"])] + seq_lens))
    options: dict = {"piecewise": mode == "piecewise"}
    defects = []
    if ns_p == 0 and ns_c > 0 and mode == "full":
        defects = [PR20301_DEFECT]
        options["max_num_splits_for_cuda_graph"] = ns_c
    release = re.match(r"^\d+\.\d+\.\d+", profile.release)
    notes = (f"vllm-flow counterexample under the profile {profile.release} ({label}): precompute num_splits {ns_p}, "
             f"call {ns_c}; " + ("replays on the released code with the seeded defect " + PR20301_DEFECT
                                 if defects else "no seeded defect makes the released code do this: the replay runs "
                                                 "it as it is"))
    case = Case.from_parts(
        source=f"prove:{THEOREM}", server=server.to_dict(), model=model.to_dict(),
        policy={"guard": "fixed", "metadata_heads": "tp", "clear_stale_cp_metadata": True},
        batches=[{"mode": "decode", "seq_lens": seq_lens, "extend_lens": None}],
        engine={"name": "vllm", "release": release.group(0)} if release else None,
        expected={"outcome": "violation", "invariant": witness["invariant"],
                  "detail": {"S_p": witness["S_p"], "S_c": witness["S_c"], "splits": witness.get("splits"),
                             "call_seqlen_k": witness["call"]["seqlen_k"], "message": message}},
        notes=notes, defects=defects, options={OPTIONS_KEY: options})
    return str(case.save(cases_dir))


def _replay(pin, cin, w: dict):
    """The witness through refmodel: the Evaluation of precompute vs call for its lengths."""
    b = w["b"]
    P = resolve_schedule(dataclasses.replace(pin, batch_size=b, seqlen_k=w["precompute_seqlen_k"]))
    R = prepare_scheduler(P, w["seq_lens"], seqlens_q=[1] * b)
    C = resolve_schedule(dataclasses.replace(cin, batch_size=b, seqlen_k=w["call_seqlen_k"]))
    return evaluate(P, R, C, {"seqused_k": w["call_seq_lens"], "seqlens_q": [1] * b}), P, C


def run_vllm_theorems(profile: VllmProfile, timeout_s: float = 10.0, models=None,
                      num_sms=D.NUM_SMS, cases_dir: Optional[str] = None) -> list[TheoremResult]:
    """``vllm-flow`` for ``profile``: proved, refuted with a concrete counterexample (written as a case file into
    ``cases_dir`` when given), or inconclusive (z3 unknown)."""
    start = time.perf_counter()
    entries = vllm_groups(profile, models, num_sms)
    by_key = {(g.key, g.page_size): (points, pin, cin) for g, points, pin, cin in entries}
    budget = Budget(timeout_s, cache={})
    n_configs = sum(len(points) for _, points, _, _ in entries)
    for g, verdict, w in prove_groups([e[0] for e in entries], budget):
        if verdict != "witness" or w is None or "b" not in w:
            continue
        points, pin, cin = by_key[(g.key, g.page_size)]
        label = points[0].label
        ev, P, C = _replay(pin, cin, w)
        if ev.outcome != Outcome.VIOLATION:
            budget.unknowns.append(f"{label}: the solver's witness {w} does not replay as a violation")
            continue
        v = ev.violations[0]
        witness = {"config": label, "configs_alike": len(points), "invariant": v.invariant,
                   "precompute": {"num_heads": pin.num_heads, "num_heads_k": pin.num_heads_k,
                                  "max_seqlen_k": w["precompute_seqlen_k"], "num_splits": pin.num_splits},
                   "call": {"num_heads": cin.num_heads, "num_heads_k": cin.num_heads_k,
                            "seqlen_k": w["call_seqlen_k"], "num_splits": cin.num_splits},
                   "seq_lens": w["seq_lens"], "S_p": P.num_splits, "S_c": C.num_splits,
                   "splits": w.get("splits")}
        case_file = write_vllm_case(cases_dir, profile, points[0], witness, v.message)
        return [TheoremResult(THEOREM, TheoremVerdict.REFUTED, time.perf_counter() - start, witness, case_file,
                              f"vllm {profile.release}, {label}: {v.message} (S_p={P.num_splits}, "
                              f"S_c={C.num_splits}; lengths {w['seq_lens']}, the call's KV extent "
                              f"{w['call_seqlen_k']}; counterexample "
                              + (f"case file {case_file})" if case_file else "through refmodel, no case file "
                                                                             "(no cases directory))"),
                              failed=True, expected=False)]
    secs = time.perf_counter() - start
    if budget.unknowns:
        return [TheoremResult(THEOREM, TheoremVerdict.INCONCLUSIVE, secs, {}, None,
                              f"vllm {profile.release}: z3 unknown or unreplayable witness: {budget.unknowns[:3]}",
                              expected=False)]
    return [TheoremResult(THEOREM, TheoremVerdict.PROVED, secs, {}, None,
                          f"vllm {profile.release}: on {n_configs} configurations ({len(entries)} distinct query "
                          f"groups: models x tp {VLLM_TP} x block sizes {VLLM_BLOCK_SIZES} x SM counts x "
                          f"cudagraph {', '.join(profile.modes)}), every decode batch of up to 8 sequences and any "
                          f"page-table width >= the longest: no split above S_c, every query row covered",
                          details={"configs": n_configs, "groups": len(entries)})]
