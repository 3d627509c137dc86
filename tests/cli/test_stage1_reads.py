"""spec.theorems.metadata `stage1_reads` names everything a stage-1 query reads: families with the same reads pose
the same query (stage1_search asks it once per budget cache and reuses the answer).

The oracle is the query itself: for every family of the theorems' domains (guard soundness, the pre-fix hazard
over replicated and sharded KV, freshness), the assertions z3 gets (their s-expression) are built and compared
within each class of equal reads. A seeded defect (a reads function that forgets a field the query reads) must
merge families whose queries differ. Over the domains, tiles and pack follow from the head dims, so families that
differ in one such field alone are derived (one SideParams field of a real family replaced): the reads must tell
them apart, their queries must differ, and a reads function that forgets the field must be caught merging them.
"""
import dataclasses

import pytest
import z3

from refmodel.fa3_scheduler import get_num_splits
from spec.model import domain as D
from spec.theorems import metadata as M
from spec.theorems import z3ctx
from spec.theorems.metadata_freshness import fresh_decode_groups


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


def _side(side: str, name: str, value):
    """A change of one field of every group's SideParams `side` ("P" or "C") to value(old)."""
    def change(g):
        sp = getattr(g, side)
        return dataclasses.replace(g, **{side: dataclasses.replace(sp, **{name: value(getattr(sp, name))})})
    return change


def _flip_static_free(g):
    return dataclasses.replace(g, p_static_free=not g.p_static_free)


def _other(*choices):
    return lambda x: next(c for c in choices if c != x)


# (id, index of the field in stage1_reads, the change, whether fresh families read it): one field each
_FIELDS = [
    ("p-static-free", 2, _flip_static_free, False),   # a fresh query's precompute length is the call's
    ("P-block_n", 3, _side("P", "block_n", _other(128, 176)), True),
    ("C-block_n", 4, _side("C", "block_n", _other(128, 176)), True),
    ("P-pack_s1", 5, _side("P", "pack_s1", lambda x: not x), True),
    ("P-pack_split", 6, _side("P", "pack_split", lambda x: not x), True),
    ("P-qhpk", 7, _side("P", "qhpk", lambda x: 2 * x), True),
    ("P-block_m", 8, _side("P", "block_m", _other(64, 128)), True),
    ("C-kernel_pack_s1", 9, _side("C", "kernel_pack_s1", lambda x: not x), True),
    ("C-kernel_pack_split", 10, _side("C", "kernel_pack_split", lambda x: not x), True),
    ("C-qhpk", 11, _side("C", "qhpk", lambda x: 2 * x), True),
    ("C-kernel_block_m", 12, _side("C", "kernel_block_m", _other(64, 128)), True),
]


@pytest.fixture(scope="module")
def derived(queries) -> dict:
    """id -> [(real query, derived query)] for a replicated, a sharded and a fresh real family (where read)."""
    bases = [next(q for q in queries if not q[1] and not q[0][0].sharded_cp),
             next(q for q in queries if not q[1] and q[0][0].sharded_cp),
             next(q for q in queries if q[1])]

    def build():
        out = {}
        for name, _, change, fresh_reads in _FIELDS:
            out[name] = []
            for fam, fresh, sexpr in bases:
                if fresh and not fresh_reads:
                    continue
                other = [change(g) for g in fam]
                budget = _Recording()
                assert M._stage1_ask(other, budget, fresh) == ("unknown", None)
                out[name].append(((fam, fresh, sexpr), (other, fresh, budget.seen[0])))
        return out
    return z3ctx.isolated(build)


@pytest.mark.parametrize("name,index", [(f[0], f[1]) for f in _FIELDS], ids=[f[0] for f in _FIELDS])
def test_a_family_differing_in_one_read_field_poses_another_query_and_has_other_reads(derived, name, index):
    assert derived[name]
    for (fam, fresh, sexpr), (other, _, other_sexpr) in derived[name]:
        real, changed = M.stage1_reads(fam, fresh), M.stage1_reads(other, fresh)
        assert sexpr != other_sexpr
        assert real != changed
        assert [i for i, (a, b) in enumerate(zip(real, changed)) if a != b] == [index]   # that field alone


def test_equal_reads_pose_the_same_query_with_the_derived_families(queries, derived):
    extra = [q for pairs in derived.values() for pair in pairs for q in pair]
    assert _mismatches(M.stage1_reads, queries + extra) == []


@pytest.mark.parametrize("name,index", [(f[0], f[1]) for f in _FIELDS], ids=[f[0] for f in _FIELDS])
def test_negative_control_a_reads_function_missing_a_tile_or_pack_field_is_caught(derived, name, index):
    for real, changed in derived[name]:
        assert _without(index)(real[0], real[1]) == _without(index)(changed[0], changed[1])   # merged
        assert _mismatches(_without(index), [real, changed])
