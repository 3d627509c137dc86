"""spec.theorems.z3ctx `checked` runs each check on one long-lived helper thread per process: the same answers as a direct
check, one thread for many checks, a fresh helper in a forked child, and SIGINT left to the main thread.
(tests/robustness/test_prover_interrupts.py and tests/robustness/test_sigint_paths.py cover Ctrl-C during a check.)
"""
import os
import signal
import threading

import z3

from spec.theorems import z3ctx


def _query(ctx, n):
    s = z3.Solver(ctx=ctx)
    x = z3.BitVec("x", 32, ctx)
    s.add(z3.UGT(x, n), z3.ULT(x, n + 2))
    return s, x


def test_answers_and_models_equal_a_direct_check_on_one_helper_thread():
    ctx = z3.Context()
    helpers = set()
    for n in range(20):
        s, x = _query(ctx, n)
        assert z3ctx.checked(s) == z3.sat
        assert s.model().eval(x).as_long() == n + 1
        helpers.add(z3ctx._HELPER[0])
        direct, _ = _query(ctx, n)
        assert direct.check() == z3.sat
    s = z3.Solver(ctx=ctx)
    s.add(z3.BoolVal(False, ctx))
    assert z3ctx.checked(s) == z3.unsat
    assert len(helpers) == 1
    assert sum(t.name == "z3-check" for t in threading.enumerate()) == 1


def test_an_error_in_the_check_reaches_the_caller():
    class Broken:
        def check(self, *a):
            raise RuntimeError("boom")

    try:
        z3ctx.checked(Broken())
    except RuntimeError as exc:
        assert str(exc) == "boom"
    else:
        raise AssertionError("the helper swallowed the error")


def test_a_forked_child_starts_its_own_helper():
    ctx = z3.Context()
    s, _ = _query(ctx, 3)
    assert z3ctx.checked(s) == z3.sat  # the parent's helper exists before the fork
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            s2, x = _query(ctx, 5)
            ok = z3ctx.checked(s2) == z3.sat and s2.model().eval(x).as_long() == 6
            code = 0 if ok and z3ctx._HELPER[0][0] == os.getpid() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


def test_the_helper_thread_blocks_sigint():
    z3ctx.checked(_query(z3.Context(), 1)[0])
    seen = []
    jobs = z3ctx._HELPER[0][1]
    done = threading.Lock()
    done.acquire()

    class Probe:
        def check(self):
            seen.append(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set()))
            return z3.sat

    jobs.put((Probe(), (), [], done))
    done.acquire()
    assert seen == [True]
    # negative control: the main thread itself does not block SIGINT
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
