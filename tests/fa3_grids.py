"""FA3's own forward test grids (``hopper/test_flash_attn.py`` at 0251105a), restated for the emulated FA3 at CPU sizes.

Written from the grids' parameters, not copied: which dimensions each grid sweeps, FA3's skip rules, what each
item calls (the inner loops over head dim v, ``attention_chunk``, ``num_splits``, pack-GQA, precomputed
metadata and its reuse) and which tolerance rule decides:

* output / varlen (``test_flash_attn_output``, ``test_flash_attn_varlen_output``): ``max|out - ref| <= rtol *
  max|pt - ref| + fwd_atol`` with rtol 2 (3 with softcap) and ``fwd_atol = 2 * max|ref + 0.3 - 0.3 - ref|``;
* kvcache (``test_flash_attn_kvcache``): ``max|out - ref| <= m * max|pt - ref| + 1e-5`` and the same on means with
  ``m_mean`` (m = 2, m_mean = 1.5; 4 and 3 for fp8), and the cache after appending equals the reference cache;
* combine (``test_flash_attn_combine``): LSE within 1e-5 of ``logsumexp``, the output within twice the rounding
  of the exact result to the output dtype (or within 1e-5 of that rounding).

``ref`` is an exact float64 attention written here (not refmodel's: an independent check), rounded to the
reference dtype as FA3's ``attention_ref`` returns it; ``pt`` the same attention in the input precision (scores,
softmax and P@V in bf16/fp16, P through fp8 for fp8 inputs). CPU sizes: sequence lengths about an eighth of
FA3's, batch 3 for output/varlen, 2 heads for the combine. An item's outcome: ``pass``, ``fail`` (with the first failing call) or
``unsupported`` (the emulator raised ``NotImplementedError``, named). ``python tests/fa3_grids.py`` prints the
counts (docs/emulator.md).
"""

from __future__ import annotations

import itertools
import math
import random
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_impl.kernels import fa3_interface as fa3  # noqa: E402

FP8 = torch.float8_e4m3fn
GRIDS = ("kvcache", "combine", "output", "varlen")

# ----------------------------------------------------------------------------------------------------------
# The grids' dimensions (FA3's), with FA3's skip rules; sequence lengths at CPU sizes
# ----------------------------------------------------------------------------------------------------------

OUTPUT_SEQLENS = [(1, 1), (8, 16), (16, 24), (32, 32), (30, 1), (100, 3), (15, 25), (15, 16), (16, 27), (15, 27),
                  (14, 32), (32, 64), (48, 32), (80, 16), (64, 32), (128, 128), (127, 128), (128, 127),
                  (256, 256), (264, 264)]
VARLEN_SEQLENS = [(1, 1), (1, 3), (2, 1), (64, 64), (16, 16), (16, 8), (19, 31), (15, 12), (32, 32), (16, 27),
                  (4, 64), (16, 64), (48, 32), (64, 128), (128, 128), (127, 128), (128, 127)]
KVCACHE_SEQLENS = [(1, 128), (1, 339), (3, 256), (16, 200), (16, 64), (3, 199), (16, 512), (4, 1250), (32, 32),
                   (64, 128), (128, 224)]
HDIMS = [64, 96, 128, 192, 256]
#: FA3's combine seqlens (1, 2, 3, 32, 64, 256, 113, 108, 640, 1024), the longer ones divided by 8
COMBINE_SEQLENS = [1, 2, 3, 4, 8, 32, 14, 13, 80, 128]


def output_items(varlen: bool):
    seqlens = VARLEN_SEQLENS if varlen else OUTPUT_SEQLENS
    for dtype, mha, has_qv, softcap, local, causal, extra, d, (sq, sk) in itertools.product(
            ["bfloat16", "float16", "float8_e4m3fn"], ["mha", "mqa", "gqa"], [False, True], [0.0, 15.0],
            [False, True], [False, True], [False, True] if varlen else [False], HDIMS, seqlens):
        if has_qv and (d != 64 or dtype == "float8_e4m3fn"):
            continue   # FA3: qv needs hdim 64 and fp16/bf16
        yield dict(dtype=dtype, mha_type=mha, has_qv=has_qv, softcap=softcap, local=local, causal=causal,
                   add_unused=extra, d=d, seqlen_q=sq, seqlen_k=sk)


def kvcache_items():
    for dtype, mha, new_kv, (causal, local), eq, inter, frac, page, leftpad, batch_idx, varlen_q, (sq, sk) in \
            itertools.product(["bfloat16", "float8_e4m3fn"], ["mha", "mqa", "gqa"], [False, True],
                              [(False, False), (True, False), (False, True)], [True, False], [False, True],
                              [0.0, 0.5, 1.0], [None, 1, 4, 128], [False, True], [False, True], [False, True],
                              KVCACHE_SEQLENS):
        if page is not None and sk % page:
            continue
        if sq > sk and new_kv:
            continue
        if not new_kv and frac > 0.0:
            continue
        yield dict(dtype=dtype, mha_type=mha, new_kv=new_kv, causal=causal, local=local, seqlen_new_eq_seqlen_q=eq,
                   rotary_interleaved=inter, rotary_fraction=frac, page_size=page, has_leftpad=leftpad,
                   has_batch_idx=batch_idx, varlen_q=varlen_q, d=128, seqlen_q=sq, seqlen_k=sk)


def combine_items():
    for dtype, d, seqlen, splits in itertools.product(["float32", "float16", "bfloat16"], [64, 96, 128, 192, 256, 512],
                                                      COMBINE_SEQLENS,
                                                      [1, 2, 3, 5, 17, 32, 55, 97, 133]):
        yield dict(dtype=dtype, d=d, seqlen=seqlen, num_splits=splits)


ITEMS = {"kvcache": kvcache_items, "combine": combine_items,
         "output": lambda: output_items(False), "varlen": lambda: output_items(True)}


def sample(grid: str, count: int, seed: int = 0) -> list:
    items = list(ITEMS[grid]())
    if count >= len(items):
        return items
    return random.Random(seed).sample(items, count)


# ----------------------------------------------------------------------------------------------------------
# Independent references
# ----------------------------------------------------------------------------------------------------------

def _visible(lq: int, lk: int, causal: bool, window, chunk: int) -> torch.Tensor:
    i = torch.arange(lq).unsqueeze(1)
    j = torch.arange(lk).unsqueeze(0)
    p = i + lk - lq
    ok = torch.ones(lq, lk, dtype=torch.bool)
    left, right = int(window[0]), (0 if causal else int(window[1]))
    if right >= 0:
        ok &= j <= p + right
    if left >= 0:
        ok &= j >= p - left
    if chunk > 0:
        start = torch.div(p, chunk, rounding_mode="floor") * chunk
        ok &= (j >= start) & (j < start + chunk)
    return ok


def reference(q, k, v, q_lens, k_ranges, causal=False, window=(-1, -1), chunk=0, softcap=0.0, qv=None,
              exact=True, p_dtype=None):
    """Attention over padded ``q (b, sq, h, d)``, ``k/v (b, sk, h_k, d/dv)``: batch ``bb`` has ``q_lens[bb]`` rows
    and keys ``k_ranges[bb] = (lo, hi)``. ``exact``: float64; else in q's dtype with P rounded through
    ``p_dtype`` (fp8). Rows past ``q_lens`` and rows that see no key are 0."""
    b, sq, h, d = q.shape
    dv = v.shape[-1]
    group = h // k.shape[2]
    work = torch.float64 if exact else q.dtype
    scale = (d + (qv.shape[-1] if qv is not None else 0)) ** -0.5
    out = torch.zeros(b, sq, h, dv, dtype=work)
    for bb in range(b):
        lq, (lo, hi) = q_lens[bb], k_ranges[bb]
        if lq == 0 or hi <= lo:
            continue
        qb = q[bb, :lq].to(work)
        kb = k[bb, lo:hi].to(work).repeat_interleave(group, dim=1)
        vb = v[bb, lo:hi].to(work).repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", qb * scale if not exact else qb, kb)
        if qv is not None:
            s = s + torch.einsum("qhd,khd->hqk", qv[bb, :lq].to(work) * (scale if not exact else 1.0), vb)
        if exact:
            s = s * scale
        if softcap > 0:
            s = torch.tanh(s / softcap) * softcap
        vis = _visible(lq, hi - lo, causal, window, chunk)
        s = s.masked_fill(~vis, float("-inf"))
        seen = vis.any(dim=-1)
        p = torch.softmax(s.masked_fill(~seen.unsqueeze(-1), 0.0), dim=-1).masked_fill(~seen.unsqueeze(-1), 0.0)
        p = p.to(work)
        if p_dtype is not None:
            p = p.to(p_dtype).to(work)
        out[bb, :lq] = torch.einsum("hqk,khd->qhd", p, vb)
    return out


def rotate_reference(x, cos, sin, start, interleaved: bool, same_position: bool = False):
    """Rotary of ``x (s, h, d)`` whose row ``i`` sits at ``start + i`` (or ``start`` for all rows), as complex
    products: the pairs are (even, odd) channels when interleaved, (first half, second half) otherwise."""
    half = cos.shape[1]
    if half == 0 or x.shape[0] == 0:
        return x.clone()
    pos = torch.full((x.shape[0],), start) if same_position else torch.arange(x.shape[0]) + start
    angle = torch.complex(cos.float()[pos], sin.float()[pos])
    rot = x[..., :2 * half].float()
    pairs = torch.complex(rot[..., 0::2], rot[..., 1::2]) if interleaved else \
        torch.complex(rot[..., :half], rot[..., half:])
    turned = pairs * angle.unsqueeze(1)
    if interleaved:
        back = torch.stack((turned.real, turned.imag), dim=-1).flatten(-2)
    else:
        back = torch.cat((turned.real, turned.imag), dim=-1)
    return torch.cat((back, x[..., 2 * half:].float()), dim=-1).to(x.dtype)


# ----------------------------------------------------------------------------------------------------------
# Running items
# ----------------------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    status: str          # pass | fail | unsupported | undefined
    calls: int
    detail: str = ""


class FA3TestDisagrees(Exception):
    """FA3's test reference and FA3's kernel disagree on the item; the emulator was checked against the kernel's rule.

    The one case: a local window that covers the whole sequence (``window_left >= seqlen_k - 1`` and
    ``window_right >= seqlen_q - 1``, no chunk, not causal) is no longer local after ``mha_fwd``'s resolution, so
    the kernel rotates every query row at one position (``Rotary<..., !(Is_causal || Is_local)>``,
    ``hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp``) while the test's reference, keyed on the ``local`` flag, moves them."""


class UndefinedInFA3(Exception):
    """The item's result is undefined on FA3 itself (the combine of one split: its kernel exits early and the
    output keeps ``torch.empty``'s contents), so FA3's comparison cannot decide it; the model's answer was checked."""


def _dtypes(name: str):
    dtype = getattr(torch, name)
    return dtype, (torch.bfloat16 if dtype == FP8 else dtype)


def _heads(mha_type: str, h: int, gqa: int) -> int:
    return h if mha_type == "mha" else (1 if mha_type == "mqa" else gqa)


def _run(fn, item) -> Outcome:
    try:
        calls = fn(item)
    except NotImplementedError as exc:
        return Outcome("unsupported", 0, str(exc).split(":")[0])
    except AssertionError as exc:
        return Outcome("fail", 0, str(exc)[:300])
    except UndefinedInFA3 as exc:
        return Outcome("undefined", 1, str(exc))
    except FA3TestDisagrees as exc:
        return Outcome("fa3_test_disagrees", int(exc.args[1]), exc.args[0])
    return Outcome("pass", calls)


def _lengths(gen, n, top, zero_ok=False, last_zero=False):
    """Random valid-prefix lengths near ``top`` (FA3's "random" padding: within 20 of the maximum, here scaled to
    CPU sizes: within a quarter); ``last_zero``: the last sequence empty, as FA3's zero-length keys."""
    lens = torch.randint(max(0 if zero_ok else 1, top - max(2, top // 4)), top + 1, (n,), generator=gen)
    if last_zero:
        lens[-1] = 0
    return [int(x) for x in lens]


def _seed(item: dict) -> int:
    return zlib.crc32(repr(sorted(item.items())).encode())


def run_output(item, varlen: bool) -> int:
    gen = torch.Generator().manual_seed(_seed(item))
    dtype, dtype_ref = _dtypes(item["dtype"])
    d, sq, sk, softcap = item["d"], item["seqlen_q"], item["seqlen_k"], item["softcap"]
    b, h = 3, 6
    hk = _heads(item["mha_type"], h, 2)
    fp8 = dtype == FP8
    dv_vals = [128, d] if 128 < d <= 192 else ([256, 512, d] if d <= 64 else [d])
    dv_vals = [d] if fp8 else ([256, 512] if item["has_qv"] else dv_vals)
    chunks = [int(torch.randint(1, 2 * sk, (1,), generator=gen)), 0] if (not varlen or sq <= sk) else [0]
    calls = 0
    for dv, chunk in itertools.product(dv_vals, chunks):
        q = torch.randn(b, sq, h, d, generator=gen).to(dtype_ref)
        if softcap > 0:
            q = q * softcap / 4
        q = q.to(dtype).to(dtype_ref)
        k = torch.randn(b, sk, hk, d, generator=gen).to(dtype_ref).to(dtype).to(dtype_ref)
        v = torch.randn(b, sk, hk, dv, generator=gen).to(dtype_ref).to(dtype).to(dtype_ref)
        qv = torch.randn(b, sq, h, dv, generator=gen).to(dtype_ref) if item["has_qv"] else None
        window = (-1, -1) if not item["local"] else tuple(int(x) for x in torch.randint(0, sk, (2,), generator=gen))
        descales = [torch.rand(b, hk, generator=gen) * 2 for _ in range(3)] if fp8 else [None] * 3
        q_lens, k_lens, used_q, used_k = [sq] * b, [sk] * b, [sq] * b, [sk] * b
        if varlen:
            q_lens = _lengths(gen, b, sq)
            k_lens = _lengths(gen, b, sk, zero_ok=True, last_zero=True)
            used_q, used_k = list(q_lens), list(k_lens)
            if item["add_unused"]:
                used_q = [min(a, c) for a, c in zip(q_lens, _lengths(gen, b, sq))]
                used_k = [min(a, c) for a, c in zip(k_lens, _lengths(gen, b, sk))]
        qr, kr, vr = q.double(), k.double(), v.double()
        if fp8:
            qr = qr * descales[0].double().repeat_interleave(h // hk, dim=1)[:, None, :, None]
            kr = kr * descales[1].double()[:, None, :, None]
            vr = vr * descales[2].double()[:, None, :, None]
        ranges = [(0, n) for n in used_k]
        ref = reference(qr, kr, vr, used_q, ranges, item["causal"], window, chunk, softcap, qv).to(dtype_ref)
        pt = reference(qr.to(dtype_ref), kr.to(dtype_ref), vr.to(dtype_ref), used_q, ranges, item["causal"], window,
                       chunk, softcap, None if qv is None else qv, exact=False, p_dtype=FP8 if fp8 else None)
        fwd_atol = 2 * (ref + 0.3 - 0.3 - ref).abs().max().item()
        rtol = 2 if softcap == 0 else 3
        pt_err = (pt.double() - ref.double()).abs().max().item()
        qd, kd, vd = q.to(dtype), k.to(dtype), v.to(dtype)
        qvd = None if qv is None else qv.to(dtype)
        for pack_gqa, splits in itertools.product([False, True], [1, 3, 0] if varlen else [1, 3]):
            common = dict(causal=item["causal"], qv=None, q_descale=descales[0], k_descale=descales[1],
                          v_descale=descales[2], window_size=window, attention_chunk=chunk, softcap=softcap,
                          pack_gqa=pack_gqa, num_splits=splits)
            if not varlen:
                out = fa3.flash_attn_func(qd, kd, vd, **{**common, "qv": qvd})
            else:
                pack = lambda x, lens: torch.cat([x[bb, :n] for bb, n in enumerate(lens)])  # noqa: E731
                cu = lambda lens: torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)  # noqa
                out_p = fa3.flash_attn_varlen_func(
                    pack(qd, q_lens), pack(kd, k_lens), pack(vd, k_lens), cu(q_lens), cu(k_lens), sq, sk,
                    seqused_q=torch.tensor(used_q, dtype=torch.int32) if item["add_unused"] else None,
                    seqused_k=torch.tensor(used_k, dtype=torch.int32) if item["add_unused"] else None,
                    **{**common, "qv": None if qvd is None else pack(qvd, q_lens)})
                out = torch.zeros(b, sq, h, dv, dtype=out_p.dtype)
                start = 0
                for bb, n in enumerate(q_lens):
                    out[bb, :used_q[bb]] = out_p[start:start + used_q[bb]]
                    start += n
            calls += 1
            err = (out.double() - ref.double()).abs().max().item()
            assert err <= rtol * pt_err + fwd_atol, (f"dv={dv} chunk={chunk} pack_gqa={pack_gqa} num_splits={splits}: "
                                                     f"max error {err:.3g} > {rtol} * {pt_err:.3g} + {fwd_atol:.3g}")
    return calls


def _paged(gen, sk, page, bcache, hk, d, dv, dtype_ref, dtype):
    blocks_per_seq = math.ceil(sk / page)
    num_blocks = blocks_per_seq * bcache * 3
    kp = torch.randn(num_blocks, page, hk, d, generator=gen).to(dtype_ref).to(dtype).to(dtype_ref)
    vp = torch.randn(num_blocks, page, hk, dv, generator=gen).to(dtype_ref).to(dtype).to(dtype_ref)
    table = torch.randperm(num_blocks, generator=gen, dtype=torch.int32)[:bcache * blocks_per_seq]
    table = table.reshape(bcache, blocks_per_seq)
    logical = lambda x: x[table.flatten().long()].reshape(bcache, blocks_per_seq * page, *x.shape[2:])[:, :sk]  # noqa
    return logical(kp), logical(vp), table, kp, vp, num_blocks


def run_kvcache(item) -> int:
    gen = torch.Generator().manual_seed(_seed(item))
    dtype, dtype_ref = _dtypes(item["dtype"])
    d, sq, sk, page = item["d"], item["seqlen_q"], item["seqlen_k"], item["page_size"]
    causal, local, new_kv, varlen_q = item["causal"], item["local"], item["new_kv"], item["varlen_q"]
    b, h = 5, 6
    bcache = 2 * b if item["has_batch_idx"] else b
    hk = _heads(item["mha_type"], h, 3)
    rotary_dim = math.floor(int(item["rotary_fraction"] * d) / 16) * 16
    fp8 = dtype == FP8
    dv_vals = [d] if fp8 else ([128, d] if 128 < d <= 192 else ([256, 512, d] if d <= 64 else [d]))
    chunks = [int(torch.randint(1, 2 * sk, (1,), generator=gen)), 0] if (causal or local) else [0]
    calls = 0
    disagreements = []
    for dv, chunk in itertools.product(dv_vals, chunks):
        has_qv = d == 64 and dv >= 256
        q = torch.randn(b, sq, h, d, generator=gen).to(dtype_ref).to(dtype).to(dtype_ref)
        qv = torch.randn(b, sq, h, dv, generator=gen).to(dtype_ref).to(dtype).to(dtype_ref) if has_qv else None
        q_lens = _lengths(gen, b, sq) if varlen_q else [sq] * b
        window = (-1, -1) if not local else tuple(int(x) for x in torch.randint(0, sk, (2,), generator=gen))
        seqlen_new = sq if item["seqlen_new_eq_seqlen_q"] else int(torch.randint(1, sq + 1, (1,), generator=gen))
        new_lens = [0] * b
        k_new = v_new = None
        if new_kv:
            k_new = torch.randn(b, seqlen_new, hk, d, generator=gen).to(dtype_ref).to(dtype).to(dtype_ref)
            v_new = torch.randn(b, seqlen_new, hk, dv, generator=gen).to(dtype_ref).to(dtype).to(dtype_ref)
            new_lens = _lengths(gen, b, seqlen_new) if varlen_q else [seqlen_new] * b
        if page is None:
            k_cache = torch.randn(bcache, sk, hk, d, generator=gen).to(dtype_ref).to(dtype).to(dtype_ref)
            v_cache = torch.randn(bcache, sk, hk, dv, generator=gen).to(dtype_ref).to(dtype).to(dtype_ref)
            table = k_paged = v_paged = None
            rotary_len = sk
        else:
            k_cache, v_cache, table, k_paged, v_paged, blocks = _paged(gen, sk, page, bcache, hk, d, dv, dtype_ref,
                                                                      dtype)
            rotary_len = blocks * page
        hi = (sk - (sq if (causal or local) and rotary_dim > 1 else seqlen_new) + 1) if new_kv else sk + 1
        cache_seqlens = torch.randint(0 if new_kv else 1, hi, (b,), generator=gen, dtype=torch.int32)
        leftpad = None
        if item["has_leftpad"]:
            leftpad = torch.tensor([int(torch.randint(0, int(c), (1,), generator=gen)) if c > 0 else 0
                                    for c in cache_seqlens], dtype=torch.int32)
        batch_idx = torch.randperm(bcache, generator=gen, dtype=torch.int32)[:b] if item["has_batch_idx"] else None
        cos = sin = None
        q_ro, k_ro = q, k_new
        if rotary_dim > 0:
            angle = torch.rand(rotary_len, rotary_dim // 2, generator=gen) * 2 * math.pi
            cos = torch.cos(angle).to(dtype_ref).to(dtype).to(dtype_ref)
            sin = torch.sin(angle).to(dtype_ref).to(dtype).to(dtype_ref)
            moving = causal or local
            width = sk if page is None else table.shape[1] * page
            if local and not causal and chunk == 0 and window[0] >= width - 1 and window[1] >= sq - 1:
                moving = False   # mha_fwd resolves the window away: the kernel's rotary rule (FA3TestDisagrees)
                disagreements.append(f"dv={dv}: window {window} covers seqlen_k={width}, seqlen_q={sq}")
            q_ro = torch.stack([rotate_reference(q[bb], cos, sin, int(cache_seqlens[bb]), item["rotary_interleaved"],
                                                 same_position=not moving) for bb in range(b)])
            k_ro = torch.stack([rotate_reference(k_new[bb], cos, sin, int(cache_seqlens[bb]),
                                                 item["rotary_interleaved"]) for bb in range(b)])
        k_ref = (k_cache if batch_idx is None else k_cache[batch_idx.long()]).clone()
        v_ref = (v_cache if batch_idx is None else v_cache[batch_idx.long()]).clone()
        for bb in range(b):
            c, n = int(cache_seqlens[bb]), new_lens[bb]
            if n:
                k_ref[bb, c:c + n], v_ref[bb, c:c + n] = k_ro[bb, :n], v_new[bb, :n]
        ranges = [(0 if leftpad is None else int(leftpad[bb]), int(cache_seqlens[bb]) + new_lens[bb]) for bb in range(b)]
        ref = reference(q_ro.double(), k_ref.double(), v_ref.double(), q_lens, ranges, causal, window, chunk,
                        qv=qv).to(dtype_ref)
        pt = reference(q_ro, k_ref, v_ref, q_lens, ranges, causal, window, chunk, qv=qv, exact=False,
                       p_dtype=FP8 if fp8 else None)
        valid = torch.zeros(b, sq, dtype=torch.bool)
        for bb, n in enumerate(q_lens):
            valid[bb, :n] = True
        pt_err = (pt.double() - ref.double())[valid].abs()
        mult, mult_mean = (4, 3) if fp8 else (2, 1.5)
        pack = lambda x, lens: torch.cat([x[bb, :n] for bb, n in enumerate(lens)])  # noqa: E731
        cu = lambda lens: torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)  # noqa: E731
        cache_kd, cache_vd = (k_cache, v_cache) if page is None else (k_paged, v_paged)
        saved_k, saved_v = cache_kd.to(dtype), cache_vd.to(dtype)
        for splits, precompute in itertools.product([1, 3, 0], [False, True]):
            md = None
            if precompute:
                md = fa3.get_scheduler_metadata(
                    b, max(q_lens) if varlen_q else sq, sk if page is None else table.shape[1] * page, h, hk, d,
                    cache_seqlens, dtype, headdim_v=dv, cu_seqlens_q=cu(q_lens) if varlen_q else None,
                    cu_seqlens_k_new=cu(new_lens) if new_kv and varlen_q else None, cache_leftpad=leftpad,
                    max_seqlen_k_new=seqlen_new, page_size=page, causal=causal, window_size=window,
                    attention_chunk=chunk, num_splits=splits)
            for _ in range(2 if precompute else 1):
                kc, vc = saved_k.clone(), saved_v.clone()
                out, lse, *rest = fa3.flash_attn_with_kvcache(
                    pack(q.to(dtype), q_lens) if varlen_q else q.to(dtype), kc, vc,
                    None if not new_kv else (pack(k_new.to(dtype), new_lens) if varlen_q else k_new.to(dtype)),
                    None if not new_kv else (pack(v_new.to(dtype), new_lens) if varlen_q else v_new.to(dtype)),
                    qv=None if qv is None else (pack(qv.to(dtype), q_lens) if varlen_q else qv.to(dtype)),
                    rotary_cos=None if cos is None else cos.to(dtype), rotary_sin=None if sin is None else sin.to(dtype),
                    cache_seqlens=cache_seqlens, cache_batch_idx=batch_idx, cache_leftpad=leftpad, page_table=table,
                    cu_seqlens_q=cu(q_lens) if varlen_q else None,
                    cu_seqlens_k_new=cu(new_lens) if new_kv and varlen_q else None,
                    max_seqlen_q=max(q_lens) if varlen_q else None, rotary_seqlens=cache_seqlens, causal=causal,
                    window_size=window, attention_chunk=chunk, rotary_interleaved=item["rotary_interleaved"],
                    scheduler_metadata=md, num_splits=splits, return_softmax_lse=True)
                calls += 1
                if varlen_q:
                    full = torch.zeros(b, sq, h, dv, dtype=out.dtype)
                    full[valid] = out
                    out = full
                where = f"dv={dv} chunk={chunk} num_splits={splits} precompute={precompute}"
                if new_kv:
                    got_k = kc if page is None else kc[table.long().flatten()].reshape(bcache, -1, hk, d)[:, :sk]
                    got_v = vc if page is None else vc[table.long().flatten()].reshape(bcache, -1, hk, dv)[:, :sk]
                    if batch_idx is not None:
                        got_k, got_v = got_k[batch_idx.long()], got_v[batch_idx.long()]
                    want_k, want_v = k_ref.to(dtype).to(dtype_ref), v_ref.to(dtype).to(dtype_ref)
                    assert torch.equal(got_v.to(dtype_ref), want_v), f"{where}: appended v differs from the reference"
                    if rotary_dim == 0:
                        assert torch.equal(got_k.to(dtype_ref), want_k), f"{where}: appended k differs"
                    else:
                        tol = 1e-1 if fp8 else 1e-3
                        assert torch.allclose(got_k.to(dtype_ref), want_k, rtol=tol, atol=tol), \
                            f"{where}: rotated appended k differs from the reference"
                err = (out.double() - ref.double())[valid].abs()
                assert err.max().item() <= mult * pt_err.max().item() + 1e-5, \
                    f"{where}: max error {err.max().item():.3g} > {mult} * {pt_err.max().item():.3g} + 1e-5"
                assert err.mean().item() <= mult_mean * pt_err.mean().item(), \
                    f"{where}: mean error {err.mean().item():.3g} > {mult_mean} * {pt_err.mean().item():.3g}"
    if disagreements:
        raise FA3TestDisagrees("a local window covering the whole sequence: FA3's kernel rotates q at one "
                               "position, FA3's test reference moves it (checked against the kernel's rule; "
                               + "; ".join(disagreements) + ")", calls)
    return calls


def run_combine(item) -> int:
    gen = torch.Generator().manual_seed(1)
    dtype = getattr(torch, item["dtype"])
    s, d, seqlen = item["num_splits"], item["d"], item["seqlen"]
    b, h = 5, 2
    out_partial = torch.randn(2 * s, b, h, seqlen, d, generator=gen).transpose(2, 3)[:s]
    lse_partial = torch.randn(s, b, 2 * h, seqlen, generator=gen).transpose(-1, -2)[:, :, :, :h]
    lse_partial[s // 2:, :b // 3] = -float("inf")
    out, lse = fa3.flash_attn_combine(out_partial, lse_partial, out_dtype=dtype)
    if s == 1:   # FA3's combine kernel returns before writing (num_splits <= 1): out and lse are torch.empty
        assert torch.equal(out, out_partial[0].to(dtype)) and torch.equal(lse, lse_partial[0]), \
            "one split: the model passes split 0 through"
        raise UndefinedInFA3("num_splits=1: FA3's combine writes nothing (undefined output); the model passes "
                             "split 0 through")
    lse_ref = torch.logsumexp(lse_partial.double(), dim=0)
    scale = torch.exp(lse_partial.double() - lse_ref)
    scale = torch.where(torch.isinf(scale) | torch.isnan(scale), torch.zeros_like(scale), scale)
    out_ref = (scale.unsqueeze(-1) * out_partial.double()).sum(0)
    out_pt = out_ref.to(dtype)
    assert torch.allclose(lse.double(), lse_ref, atol=1e-5, rtol=1e-5), "LSE differs from logsumexp"
    err = (out.double() - out_ref).abs().max().item()
    pt_err = (out_pt.double() - out_ref).abs().max().item()
    assert err <= 2 * pt_err or torch.allclose(out.double(), out_pt.double(), atol=1e-5, rtol=1e-5), \
        f"output error {err:.3g} > 2 * {pt_err:.3g}"
    return 1


RUNNERS = {"kvcache": run_kvcache, "combine": run_combine, "output": lambda it: run_output(it, False),
           "varlen": lambda it: run_output(it, True)}


def run_item(grid: str, item: dict) -> Outcome:
    return _run(RUNNERS[grid], item)


def main(argv=None) -> int:
    import argparse
    import collections
    import json
    import time

    parser = argparse.ArgumentParser(description="FA3's test grids on the emulated FA3: pass/fail/unsupported counts")
    parser.add_argument("--samples", type=int, default=40, help="items sampled per grid (default 40)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--grids", default=",".join(GRIDS), help=f"comma-separated subset of {','.join(GRIDS)}")
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error(f"--samples: must be >= 1, got {args.samples}")
    grids = [g for g in args.grids.split(",") if g]
    bad = [g for g in grids if g not in GRIDS]
    if bad:
        parser.error(f"--grids: must name grids among {', '.join(GRIDS)}, got {', '.join(bad)}")
    failed = False
    for grid in grids:
        start = time.process_time()
        items = sample(grid, args.samples, args.seed)
        counts, calls, unsupported, failures = collections.Counter(), 0, collections.Counter(), []
        for item in items:
            outcome = run_item(grid, item)
            counts[outcome.status] += 1
            calls += outcome.calls
            if outcome.status == "unsupported":
                unsupported[outcome.detail] += 1
            elif outcome.status == "fail":
                failures.append((item, outcome.detail))
        failed |= bool(failures)
        print(json.dumps({"grid": grid, "items": len(items), "of": sum(1 for _ in ITEMS[grid]()),
                          "pass": counts["pass"], "fail": counts["fail"], "unsupported": counts["unsupported"],
                          "undefined_in_fa3": counts["undefined"],
                          "fa3_test_disagrees": counts["fa3_test_disagrees"],
                          "calls_passed": calls, "unsupported_features": dict(unsupported),
                          "runnable_share": round(1 - counts["unsupported"] / len(items), 3) if items else None,
                          "cpu_s": round(time.process_time() - start, 1)}))
        for item, detail in failures[:5]:
            print(f"  FAIL {item}: {detail}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
