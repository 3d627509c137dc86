"""spec.theorems_metadata `stage1_reads` names everything a stage-1 query reads: families with the same reads pose
the same query (stage1_search asks it once per budget cache and reuses the answer).

The oracle is the query itself: for every family of the theorems' domains (guard soundness, the pre-fix hazard
over replicated and sharded KV, freshness), the assertions z3 gets (their s-expression) are built and compared
within each class of equal reads. A seeded defect (a reads function that forgets a field the query reads) must
merge families whose queries differ.
"""
import pytest
import z3

from refmodel.fa3_scheduler import get_num_splits
from spec import domain as D
from spec import theorems_metadata as M
from spec import z3ctx
from spec.theorems_metadata_freshness import fresh_decode_groups


class _Recording(M.Budget):
    """A budget that records each query's assertions instead of asking z3 (every answer: unknown)."""

    def __init__(self):
        super().__init__(10.0)
        self.seen: list = []

    def check(self, s, label):
        self.seen.append(s.sexpr())
        return z3.unknown


def _families() -> list:
    """(family, fresh) over the domains the metadata theorems search."""
    h = get_num_splits
    replicated = [c for c in D.enumerate_configs(frozenset()) if not c.sharded_kv]
    sharded = [c for c in D.enumerate_configs(frozenset()) if c.sharded_kv]
    out = []
    for guard, heads, configs in (("fixed", "tp", replicated), ("pre-fix", "tp", replicated),
                                  ("pre-fix", "attn_tp", replicated), ("pre-fix", "tp", sharded)):
        fn, _ = D.resolve_guard(guard)
        pre = [c for c in configs if D.precomputes(c, fn)]
        out += [(fam, False) for fam in M.family_groups(M.group_configs(pre, heads, h, h))]
    out += [(fam, True) for fam in M.family_groups(fresh_decode_groups(h, h))]
    return out


def _queries() -> list:
    """(family, fresh, assertions as an s-expression) for every family."""
    def build():
        out = []
        for fam, fresh in _families():
            budget = _Recording()
            assert M._stage1_ask(fam, budget, fresh) == ("unknown", None)
            out.append((fam, fresh, budget.seen[0]))
        return out
    return z3ctx.isolated(build)


@pytest.fixture(scope="module")
def queries() -> list:
    return _queries()


def _mismatches(reads, queries) -> list:
    classes: dict = {}
    for fam, fresh, sexpr in queries:
        classes.setdefault(reads(fam, fresh), set()).add(sexpr)
    return [k for k, v in classes.items() if len(v) > 1]


def test_equal_reads_pose_the_same_query(queries):
    assert len(queries) > 200
    assert _mismatches(M.stage1_reads, queries) == []
    # and the reads do merge families (the queries saved)
    assert len({M.stage1_reads(fam, fresh) for fam, fresh, _ in queries}) < len(queries) * 0.8


def _without(index):
    def reads(fam, fresh):
        r = M.stage1_reads(fam, fresh)
        return r[:index] + r[index + 1:]
    return reads


def _without_member_tables(fam, fresh):
    r = M.stage1_reads(fam, fresh)
    return r[:-1] + (tuple(m[:2] + m[3:5] for m in r[-1]),)


# the fields that vary on their own over this domain (tiles and pack follow from the head dims and counts there)
@pytest.mark.parametrize("defect", [_without(0), _without(1), _without(7), _without(11), _without_member_tables],
                         ids=["no-fresh", "no-sharded-cp", "no-P-qhpk", "no-C-qhpk", "no-P-table"])
def test_negative_control_a_reads_function_missing_a_field_is_caught(queries, defect):
    assert _mismatches(defect, queries)


def test_a_reused_answer_is_the_answer_z3_gives():
    def run():
        fams = [f for f, fresh in _families()[:60] if not fresh]
        by_reads: dict = {}
        for fam in fams:
            by_reads.setdefault(M.stage1_reads(fam, False), []).append(fam)
        pairs = [v[:2] for v in by_reads.values() if len(v) > 1][:3]
        assert pairs
        for a, b in pairs:
            shared = M.Budget(10.0)
            assert M.stage1_search(a, shared)[0] == M.stage1_search(b, shared)[0] == \
                M.stage1_search(b, M.Budget(10.0))[0]
            assert shared.queries == 1
    z3ctx.isolated(run)
