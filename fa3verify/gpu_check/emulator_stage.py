"""gpu-check's ``emulator_agreement`` stage: the CPU emulator's verdicts against the real kernel on the same stale cases.

The emulator (``gpu_impl.kernels.emulated``, ``pytest --fa3verify-emulate-fa3``) claims to behave like FA3 on stale
metadata: where the metadata overflows the call's buffers it returns NaN rows as the real kernel would return NaN,
garbage or an illegal memory access, and where the metadata is sound it agrees with the oracle. This stage runs the
same cases on both: the worked example's backend (Qwen3-30B-A3B, tp=4, attn_cp=4, one long and seven 100-token
sequences) with the pre-fix guard (stale head counts) and the fixed guard, at several long lengths, the emulator told
the GPU's SM count. Invariant: the two agree on whether the call is sound (the real kernel's NaN, crash or mismatch
against the emulator's NaN or mismatch; agreement against agreement). The exact outcome classes are recorded beside
it (the emulator has no illegal memory access: it reports the overflow as NaN).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Optional

from spec.finding import DeviceOutcome, StageStatus

from .worked_example import worked_example_task

if TYPE_CHECKING:
    from .runner import GpuCheck, Stage

#: (guard, long sequence length) of each case; the short sequences are the worked example's
CASES = (("pre-fix", 32768), ("fixed", 32768), ("pre-fix", 8192), ("fixed", 8192), ("pre-fix", 65536),
         ("fixed", 65536), ("pre-fix", 2048), ("fixed", 2048))
BAD = frozenset({DeviceOutcome.NAN, DeviceOutcome.CRASH, DeviceOutcome.MISMATCH})


def soundness(outcome) -> Optional[bool]:
    """True for a sound call (agrees with the oracle), False for an unsound one (NaN, crash, mismatch), None for an
    outcome that says nothing (an error of the harness, not run)."""
    if outcome == DeviceOutcome.AGREES:
        return True
    if outcome in BAD:
        return False
    return None


def run(check: GpuCheck, stage: Stage) -> None:
    p = check.plan
    stage.expectation = ("the emulator and the real kernel agree on every case whether the call is sound (NaN, "
                         "crash or mismatch vs agreement with the oracle)")
    if p.dry_run:
        stage.status = StageStatus.SKIPPED
        stage.message = "dry run: the emulator is the only kernel here"
        return
    num_sm = check.num_sm
    rows, agree, disagree, unknown = [], 0, 0, 0
    for guard, long_len in CASES:
        left = check.budget(90.0, reserve=60)
        if left < 10:
            rows.append({"guard": guard, "long": long_len, "error": "no time left"})
            unknown += 1
            continue
        real = _outcome(check, p.adapter, guard, long_len, None, p.seed, left)
        emu = _outcome(check, {"name": "emulated", "device": "cpu"}, guard, long_len, num_sm, p.seed,
                       check.budget(90.0, reserve=60))
        r, e = soundness(real["outcome"]), soundness(emu["outcome"])
        row = {"guard": guard, "long": long_len, "real": real["outcome"], "emulated": emu["outcome"],
               "real_s_c": real.get("observed_num_splits") or real.get("s_c"), "emulated_s_c": emu.get("s_c"),
               "refmodel_s_p": emu.get("refmodel_s_p"), "emulated_violations": emu.get("predicted_violations"),
               "real_error": real.get("error", "")[-300:], "emulated_error": emu.get("error", "")[-300:]}
        if r is None or e is None:
            unknown += 1
            row["agree"] = None
        else:
            row["agree"] = r == e
            agree += r == e
            disagree += r != e
            if r != e:
                path = check.save_case("emulator_agreement", f"{guard}-{long_len}", {"row": row, "real": real,
                                                                                      "emulated": emu})
                check.finding("emulator_agreement", f"{guard}:{long_len}",
                              f"{guard} guard, long {long_len}: real kernel {real['outcome']}, emulator "
                              f"{emu['outcome']}", case_file=path)
        rows.append(row)
    stage.numbers.update(cases=len(rows), agree=agree, disagree=disagree, unknown=unknown, rows=rows,
                         exact_class_agree=sum(1 for x in rows if x.get("real") == x.get("emulated")))
    stage.status = (StageStatus.FAIL if disagree else StageStatus.INCONCLUSIVE if unknown or not agree
                    else StageStatus.PASS)
    stage.message = f"{agree} of {len(rows)} cases agree, {disagree} disagree, {unknown} undecided"


def _outcome(check: GpuCheck, adapter: dict, guard: str, long_len: int, num_sm, seed: int, limit: float) -> dict:
    if limit < 5:
        return {"outcome": DeviceOutcome.NOT_RUN, "error": "no time left"}
    res = check.pool.run(functools.partial(worked_example_task, adapter, guard, long_len, num_sm, seed),
                         timeout_s=limit)
    if res.ok:
        return dict(res.value)
    return {"outcome": DeviceOutcome.CRASH if res.crashed else DeviceOutcome.ERROR, "kind": res.kind,
            "error": res.error_text[-1500:]}
