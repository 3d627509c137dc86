"""``conform --engine vllm==V``: each claim of the release's vLLM profile, checked on the released code.

Invariant: a profile passes conformance only if, on every probe scenario run through vLLM's own metadata builder
and attention impl (``gpu_impl.engines.vllm.driver``), the FA3 hand-off is what the profile says the prover plays
(``gpu_impl/engines/vllm/profiles.json``, block ``model``): the builder precomputes in exactly the profile's CUDA-graph
modes; the precompute's heads equal the call's (``layer`` on both sides); the precompute's ``max_seqlen_k`` is the
batch's longest sequence and the call's KV extent (block-table width x block size) is at least that; each side
passes the profile's ``num_splits`` for the mode; ``headdim_v`` is passed or not as the profile says; and the
checking shim reports no finding. Each claim on each scenario is one check; a claim the code contradicts is a
failed check and a finding (exit 1). Models ``vllm/v1/attention/backends/flash_attn.py`` by running it.

vLLM's plugin answers ``own-profile`` conformance with it (``VllmPlugin.check_own_profile``); the harness
(``fa3verify.commands.conform``) turns the :class:`gpu_impl.plugin.ClaimReport` into its summary's rows.
"""

from __future__ import annotations

import time

from gpu_impl.plugin import ClaimCheck, ClaimReport
from spec.finding import Finding

__all__ = ["PROBES", "conform_vllm"]

#: (name, driver scenario fields): decode batches within the smallest capture sizes (a full CUDA graph's split
#: count applies to tokens <= the capture size), one per mode and tensor-parallel shape.
PROBES = (
    ("eager tp4", {"tp": 4, "cuda_graph": "none"}),
    ("piecewise tp4", {"tp": 4, "cuda_graph": "piecewise"}),
    ("full-graph tp4", {"tp": 4, "cuda_graph": "full"}),
    ("full-graph tp8", {"tp": 8, "cuda_graph": "full"}),
    ("eager tp1 block 64", {"tp": 1, "cuda_graph": "none", "block_size": 64}),
)
BATCHES = ([32768] + [100] * 7, [300, 200, 100])


def _claims(profile, mode: str, pair: dict, seq_lens) -> list:
    """(claim, holds, what the code did) for one precompute/call pair of the given mode."""
    out = [("precomputes in this mode", bool(pair.get("aot")) == (mode in profile.modes),
            f"aot={pair.get('aot')}")]
    if not pair.get("aot"):
        return out
    pre, call = pair["precompute"], pair["call"]
    ns_p, ns_c = profile.splits(mode)
    out += [
        ("heads equal on both sides (layer/layer)",
         (pre["num_heads"], pre["num_heads_k"]) == (call["num_heads"], call["num_heads_k"]),
         f"precompute ({pre['num_heads']}, {pre['num_heads_k']}), call ({call['num_heads']}, {call['num_heads_k']})"),
        ("precompute max_seqlen_k = the longest sequence", pre["max_seqlen_k"] == max(seq_lens),
         f"max_seqlen_k {pre['max_seqlen_k']}, longest {max(seq_lens)}"),
        ("call KV extent >= precompute max_seqlen_k", call["seqlen_k"] >= pre["max_seqlen_k"],
         f"call seqlen_k {call['seqlen_k']}"),
        (f"precompute num_splits = {ns_p}", pre["num_splits"] == ns_p, f"precompute num_splits {pre['num_splits']}"),
        (f"call num_splits = {ns_c}", call["num_splits"] == ns_c, f"call num_splits {call['num_splits']}"),
        ("headdim_v " + ("passed" if profile.headdim_v_passed else "not passed (defaults to headdim)"),
         profile.headdim_v_passed or pre["headdim_v"] == pre["headdim"], f"precompute headdim_v {pre['headdim_v']}"),
    ]
    return out


def conform_vllm(sut, profile, probes=PROBES) -> ClaimReport:
    """Run ``probes`` (default :data:`PROBES`) on ``sut`` (a VllmSUT) and check every claim of ``profile``; a claim
    the code contradicts, or a finding of the checking shim, is a failed claim and a finding."""
    from refmodel.fa3_builds import build_for_engine

    build = build_for_engine("vllm", profile.release)
    report = ClaimReport(policy={"engine": str(sut.spec), "engine_profile": f"vllm=={profile.release}",
                                  "fa3_build": build, **profile.to_dict()})
    start = time.perf_counter()
    worker = sut.worker
    reported = worker.hello.get("release")
    report.claims.append(ClaimCheck(name="release", holds=reported == profile.release, seconds=0.0,
                                     message=f"the worker reports vllm {reported}; profile {profile.release}"))
    for name, fields in probes:
        mode = fields["cuda_graph"]
        for seq_lens in BATCHES:
            t = time.perf_counter()
            resp = worker.run({**fields, "steps": [{"seq_lens": list(seq_lens)}]})
            # a FULL graph's capture-time pair (the V2 runner's driver traces it as "<path>: capture") is the
            # capture's own dummy batch; the profile's claims are about the replayed batches
            pairs = [e for e in resp["trace"] if "s_c" in e and not str(e.get("path", "")).endswith(": capture")]
            results = [c for p in pairs for c in _claims(profile, mode, p, seq_lens)]
            if not pairs:
                results.append(("a precompute/call pair is traced", False, "no FA3 call traced"))
            results.append((f"judged under FA3 build {build}", resp.get("fa3_build") == build,
                            f"the shim judged under {resp.get('fa3_build')}"))
            for f in resp.get("findings", []) + resp.get("shape_errors", []):
                results.append((f"no finding by the checking shim", False, f"{f['invariant']}: {f['message'][:200]}"))
            secs = time.perf_counter() - t
            for claim, holds, did in results:
                label = f"{claim} [{name}, {len(seq_lens)} seqs]"
                report.claims.append(ClaimCheck(name=label, holds=holds, seconds=secs, message=did))
                if not holds:
                    report.findings.append(Finding(invariant="PROFILE", case_file=None, engine=str(sut.spec),
                                                    message=f"vllm {profile.release} profile: {label}: the code "
                                                            f"did {did}", replay=None))
    report.elapsed_s = time.perf_counter() - start
    return report
