"""The vLLM driver's FA3 front: what the faked ``_vllm_fa3_C`` ops call (``vllm_glue``), handing both sides of every
FA3 hand-off vLLM makes to ``gpu_impl.fa3_calls.CheckingFA3`` (record mode, deep checks) over a shape-only FA3 whose
metadata comes from refmodel, or over the emulator with numerics; and the seeded defects applied from outside vLLM's
code. Split from ``vllm_driver`` (the worker), which re-exports these names.

Invariant: a call is judged against the precompute whose output it consumed: the checker's address registry, or,
for a persistent CUDA-graph buffer vLLM copies the metadata into, the latest precompute whose bytes the buffer holds
(a captured graph's longer view of it counts when the rest is the zeroed tail; at a replay, a captured view shorter
than the recompute counts when it holds the recompute's first values: the captured kernel reads them at its own layout).
"""

from __future__ import annotations

from gpu_impl.engines.protocol import Unsupported

#: the FA3 build vLLM 0.33.0 and 0.34.0 ship, as modelled (refmodel/fa3_builds.json; refmodel.fa3_builds.build_for_engine)
VLLM_BUILD = "vllm-fork-617264c1"
#: Set by the host (gpu_impl.engines.vllm.host) to the build the driven release ships (refmodel.fa3_builds
#: ``build_for_engine``); absent: VLLM_BUILD.
BUILD_VARIABLE = "FA3VERIFY_FA3_BUILD"


def release_build() -> str:
    """The FA3 build this driver judges under: ``$FA3VERIFY_FA3_BUILD`` (checked), else VLLM_BUILD."""
    import os

    from refmodel.fa3_builds import check_build_name

    name = os.environ.get(BUILD_VARIABLE)
    return check_build_name(name) if name else VLLM_BUILD

class ShapeOnlyFA3:
    """FA3 without numerics: metadata from refmodel, calls return nothing but shapes (record mode)."""

    name = "shape-only"

    def __init__(self, num_sm: int, arch: int = 90, build: str = VLLM_BUILD):
        self.num_sm, self.arch, self.build = num_sm, arch, build

    def get_scheduler_metadata(self, *args, **kwargs):
        from refmodel.metadata import get_scheduler_metadata

        from gpu_impl.fa3_calls import record_precompute

        pre = record_precompute(*args, num_sm=self.num_sm, arch=self.arch, read_tensors=True, build=self.build,
                                **kwargs)
        return get_scheduler_metadata(**pre.scheduler_kwargs())

    def flash_attn_varlen_func(self, *args, **kwargs):
        return None


class FrontFA3:
    """The target of the faked ``_vllm_fa3_C`` ops: C++-order arguments back to FA3 names, into the checker.

    vLLM copies the metadata into a persistent buffer under full CUDA graphs (``buf[:n] = md``), which the
    checker's address registry cannot follow; a tensor of unknown origin whose contents equal the latest
    precompute's output is attributed to that precompute (the bytes FA3 reads are exactly those).
    """

    def __init__(self, num_sm: int, numerics: bool = False, lifecycle_defect=None):
        from gpu_impl.fa3_calls import CheckingFA3
        from gpu_impl.engines.lifecycle_judge import LifecycleJudge
        from gpu_impl.engines.vllm.numerics import EmulatorVarlenFA3

        from refmodel.fa3_builds import UPSTREAM

        self.numerics = bool(numerics)
        #: the FA3 build that judges this run (the emulator models upstream's kernel)
        self.build = UPSTREAM if numerics else release_build()
        self.impl = EmulatorVarlenFA3(num_sm) if numerics else ShapeOnlyFA3(num_sm, build=self.build)
        #: numerics: (invariant, message, detail) of every call whose output failed the oracle, since the last drain
        self.output_findings: list = []
        self.checker = CheckingFA3(self.impl, mode="record", deep=True, num_sm=num_sm, arch=90,
                                   record_all=True, impl_signature="fa3", signature="fa3", build=self.build)
        self.last_md = None
        self.last_pre = None
        self.handed_out: list = []
        #: the attention groups whose builders each precompute for one batch (set by the V2 runner's driver: several
        #: with layers that differ or chunked local layers); their latest precomputes, (output bytes, record)
        self.metadata_groups = 1
        self.recent: list = []
        #: calls that consume no metadata and are not checked (DCP's varlen-K call over the new tokens)
        self.unchecked_calls = 0
        #: a list while a FULL CUDA graph is captured (the second generation): every call's arguments, re-issued
        #: at each replay; the capture's own checked pairs go to ``capture_events``
        self.recording = None
        self.capture_events: list = []
        #: where vLLM's code made each side (``call_sites.caller_location``): per checked call, in event order; per
        #: precompute record (by id, the record kept alive beside it)
        self.call_sources: list = []
        self.pre_sources: dict = {}
        #: the metadata-lifecycle checks of every launch (gpu_impl.engines.lifecycle_judge), the (step, 0) the driver
        #: is at, the path of the calls made now ("eager", "capture", "replay") and the step's real rows
        self.judge = LifecycleJudge(lifecycle_defect)
        self.where = (0, 0)
        self.path = "eager"
        self.real_rows = None

    def c_get_scheduler_metadata(self, **a):
        for name in ("cu_seqlens_k", "seqused_q"):
            if a[name] is not None:
                raise Unsupported(f"get_scheduler_metadata({name}=...): not modelled by refmodel")
        if (self.judge.defect == "precompute-over-real-rows" and self.real_rows is not None
                and self.real_rows < int(a["batch_size"])):
            a = _over_real_rows(a, self.real_rows)
        md = self.checker.get_scheduler_metadata(
            batch_size=a["batch_size"], max_seqlen_q=a["max_seqlen_q"], max_seqlen_k=a["max_seqlen_k"],
            num_heads_q=a["num_heads"], num_heads_kv=a["num_heads_k"], headdim=a["headdim"],
            cache_seqlens=a["seqused_k"], qkv_dtype=a["qkv_dtype"], headdim_v=a["headdim_v"],
            cu_seqlens_q=a["cu_seqlens_q"], cu_seqlens_k_new=a["cu_seqlens_k_new"], cache_leftpad=a["leftpad_k"],
            page_size=a["page_size"], max_seqlen_k_new=a["max_seqlen_k_new"], causal=a["is_causal"],
            window_size=(a["window_size_left"], a["window_size_right"]), has_softcap=a["has_softcap"],
            num_splits=a["num_splits"], pack_gqa=a["pack_gqa"], sm_margin=a["sm_margin"])
        self.last_md, self.last_pre = md.clone(), self.checker.origin_of(md)
        self.recent = (self.recent + [(self.last_md, self.last_pre)])[-self.metadata_groups:]
        #: the tensors FA3 handed out, with their precompute: a call passing one of them consumed that precompute
        #: (cascade attention passes the prefix's own metadata beside the suffix's, made after it)
        self.handed_out = [(t, p) for t, p in self.handed_out[-3:] if p is not None] + [(md, self.last_pre)]
        self.judge.note_precompute(self.last_pre, self.where)
        if self.last_pre is not None:
            from gpu_impl.engines.call_sites import caller_location

            self.pre_sources[id(self.last_pre)] = (self.last_pre, caller_location("get_scheduler_metadata"))
        return md

    def _attribute(self, md, heads=None) -> None:
        """Attributes a tensor of unknown origin to the latest precompute whose bytes it holds; with several
        attention groups (``metadata_groups``), each builder's buffer holds its own group's precompute of the batch:
        the group's latest precomputes are candidates, newest first, those made for the call's (query, KV) heads
        (``heads``) before the others (two groups' precomputes may hold equal bytes)."""
        if md is None or self.last_md is None or self.checker.origin_of(md) is self.last_pre:
            return
        if any(md is t and self.checker.origin_of(md) is p for t, p in self.handed_out):
            return  # FA3's own output, passed as it was handed out: its origin is known
        candidates = list(reversed(self.recent)) if self.metadata_groups > 1 else [(self.last_md, self.last_pre)]
        if heads is not None and len(candidates) > 1:
            candidates.sort(key=lambda c: c[1] is None or (c[1].num_heads, c[1].num_heads_k) != heads)
        for last_md, last_pre in candidates:
            if self._holds(md, last_md):
                self.checker.registry.remember(md, last_pre)
                return

    def _holds(self, md, last_md) -> bool:
        import torch

        n = last_md.numel()
        if md.shape == last_md.shape and torch.equal(md, last_md):
            return True
        if md.numel() > n and torch.equal(md[:n], last_md) and not bool(md[n:].any()):
            # a captured graph's view of the persistent buffer, longer than the recompute vLLM copied into it
            # (``_store_scheduler_metadata`` zeroes the tail): the replay reads that recompute at its own layout
            return True
        # a captured graph's view of the persistent buffer, shorter than the recompute vLLM copied into it
        # (the recompute's layout is longer than the captured call's): the replay reads the recompute's first
        # ``md.numel()`` values at its own layout, not the capture-time precompute
        return self.path == "replay" and md.numel() < n and torch.equal(md, last_md[:md.numel()])

    def replay(self, calls) -> None:
        """Re-issue a captured graph's FA3 calls, as a CUDA-graph replay launches them again (labelled ``replay``
        while they run)."""
        self.path, self.checker.replaying = "replay", True
        try:
            for call in calls:
                self.c_fwd(**call)
        finally:
            self.path, self.checker.replaying = "eager", False

    def c_fwd(self, **a):
        import torch

        from gpu_impl.engines.call_sites import caller_location

        #: a replayed call is made where its capture made it (vLLM's FlashAttentionImpl.forward at capture): no Python
        #: runs at a graph replay, so the stack of the replay names the driver, not vLLM
        captured_at = a.pop("_captured_at", None)
        if (self.recording is not None and self.judge.defect == "capture-width-of-capture-batch"
                and a["page_table"] is not None):
            a = _capture_batch_width(a)
        if self.recording is not None:
            self.recording.append(dict(a, _captured_at=caller_location("flash_attn_varlen_func")))
        md = a["scheduler_metadata"]
        q = a["q"]
        if a["cu_seqlens_k"] is not None and md is None and a["page_table"] is None:
            # varlen K without a cache (DCP's attention over the new tokens): consumes no metadata
            self.unchecked_calls += 1
            return self._outputs(q, a["v"])
        for name in ("k_new", "v_new", "q_v", "cu_seqlens_k", "cu_seqlens_k_new", "seqused_q", "kv_batch_idx",
                     "leftpad_k", "rotary_cos", "s_aux", "cp_tot_seqused_k"):
            if a.get(name) is not None:   # cp_tot_seqused_k: absent from 0.10.1 .. 0.11.0's fwd
                raise Unsupported(f"fwd({name}=...): not modelled by the shim")
        self._attribute(md, (int(q.shape[-2]), int(a["k"].shape[-2])) if a["k"] is not None and q.dim() == 3
                        else None)
        where = captured_at or caller_location("flash_attn_varlen_func")
        events = len(self.checker.events)
        self.checker.flash_attn_varlen_func(
            q=q, k=a["k"], v=a["v"], max_seqlen_q=a["max_seqlen_q"], cu_seqlens_q=a["cu_seqlens_q"],
            max_seqlen_k=a["max_seqlen_k"], seqused_k=a["seqused_k"], block_table=a["page_table"],
            causal=a["is_causal"], window_size=(a["window_size_left"], a["window_size_right"]),
            softcap=a["softcap"], scheduler_metadata=md, num_splits=a["num_splits"],
            **({"softmax_scale": a["softmax_scale"]} if self.numerics else {}))
        self.call_sources += [where] * (len(self.checker.events) - events)
        if len(self.checker.events) > events:
            pre, call, violations = self.checker.events[-1]
            path = "capture" if self.recording is not None else self.path
            found = self.judge.before(pre, call, md, self.where, path, violations)
            if found:
                self.checker.events[-1] = (pre, call, list(violations) + found)
            self.judge.after(call, md, path)
        if not self.numerics:
            return self._outputs(q, a["v"])
        return self._judged(a)

    def _judged(self, a: dict) -> list:
        """Numerics: the emulator's output into vLLM's ``out``, judged against the oracle (vllm_numerics.judge)."""
        from gpu_impl.engines.vllm.numerics import judge

        out, lse = self.impl.last
        if a["out"] is not None:
            a["out"].copy_(out.to(a["out"].dtype))
        bad = judge(out, a["q"], a["k"], a["v"], a["cu_seqlens_q"], a["max_seqlen_q"], a["seqused_k"],
                    a["page_table"], a["is_causal"], (a["window_size_left"], a["window_size_right"]), a["softcap"],
                    a["softmax_scale"])
        if bad is not None:
            self.output_findings.append(bad)
        return [a["out"] if a["out"] is not None else out, lse, lse.new_zeros(0), lse.new_zeros(0)]

    @staticmethod
    def _outputs(q, v):
        import torch

        out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=torch.bfloat16 if q.element_size() == 1 else q.dtype)
        lse = torch.zeros(q.shape[-2], q.shape[0], dtype=torch.float32)
        return [out, lse, lse.new_zeros(0), lse.new_zeros(0)]

    def drain(self) -> list:
        """(precompute, call, violations) of every checked call since the last drain; where each side was made
        comes with :meth:`drain_sources` (call it right after)."""
        events, self.checker.events = self.checker.events, []
        sources, self.call_sources = self.call_sources, []
        sources = (sources + [None] * len(events))[:len(events)]
        self._drained_sources = [{"precompute": self._source_of(ev[0]), "call": src}
                                 for ev, src in zip(events, sources)]
        return events

    def _source_of(self, pre):
        kept = self.pre_sources.get(id(pre)) if pre is not None else None
        return kept[1] if kept is not None and kept[0] is pre else None

    def drain_sources(self) -> list:
        """{"precompute", "call"} source locations of the events the last :meth:`drain` returned, in order."""
        return getattr(self, "_drained_sources", [])

    def drain_outputs(self) -> list:
        found, self.output_findings = self.output_findings, []
        return found


def _over_real_rows(a: dict, rows: int) -> dict:
    """Seeded lifecycle defect ``precompute-over-real-rows``: the precompute's arguments cut to the real rows."""
    out = dict(a, batch_size=rows)
    if out.get("seqused_k") is not None:
        out["seqused_k"] = out["seqused_k"][:rows]
    if out.get("cu_seqlens_q") is not None:
        out["cu_seqlens_q"] = out["cu_seqlens_q"][:rows + 1]
    return out


def _capture_batch_width(a: dict) -> dict:
    """Seeded lifecycle defect ``capture-width-of-capture-batch``: the captured call's block table cut to the
    blocks the capture batch's own longest sequence needs, and its ``max_seqlen_k`` (the fork's KV extent) that
    length instead of ``max_model_len`` (what the V2 runner's ``prepare_attn`` passes at capture: "capture with
    worst-case max_seq_len so the graph is valid at any replay")."""
    table, lens, k = a["page_table"], a.get("seqused_k"), a.get("k")
    block = int(k.shape[1]) if k is not None and k.dim() == 4 else 1
    longest = max(1, int(lens.max()) if lens is not None and lens.numel() else 1)
    return dict(a, page_table=table[:, :max(1, -(-longest // block))], max_seqlen_k=longest)


def seed_defect(front: "FrontFA3", defect) -> "FrontFA3":
    """``front`` with a seeded defect applied from outside; None: unchanged.

    ``{"precompute_num_splits": N}``: the metadata vLLM asks for is computed with ``num_splits=N`` whatever vLLM
    passed (vLLM #20301's pattern); ``{"precompute_max_seqlen_q_delta": K}``: with ``max_seqlen_q + K`` (theorem 9's
    drift under the fork's decode tile)."""
    if not defect:
        return front
    plain = front.c_get_scheduler_metadata

    def seeded(**a):
        if "precompute_num_splits" in defect:
            a = {**a, "num_splits": defect["precompute_num_splits"]}
        if "precompute_max_seqlen_q_delta" in defect:
            a = {**a, "max_seqlen_q": a["max_seqlen_q"] + defect["precompute_max_seqlen_q_delta"]}
        return plain(**a)

    front.c_get_scheduler_metadata = seeded
    return front


