"""One attention rank of a real sglang engine: its runner, its ``FlashAttentionBackend`` and one attention layer,
built through the release's own test kit, and the decode paths driven on it (eager, CUDA-graph capture/replay).

Invariant: the backend sees only what the release's own code builds: the kit's ``MockModelRunner`` and forward
batches, the layout set where the release reads it (``sglang_glue``), and sglang's own ``ModelConfig
.get_num_kv_heads``; the layer's q/k/v carry the heads an attention module of the model holds on that rank,
``H // attn_tp_size`` and ``max(1, Hk // attn_tp_size)`` (``spec.model.config.ServerConfig.layer_heads``, as
``python/sglang/srt/models/qwen3_moe.py`` computes them). Runs inside an engine environment.
"""

from __future__ import annotations

import contextlib
import inspect

#: Pages of the KV pool in record mode: no numerics read the pool, and FA3's schedule reads only the page table's
#: width, so every row's pages alias a few physical pages (a 32k-token context then costs nothing).
RECORD_POOL_PAGES = 8
DTYPES = {"bfloat16": "bfloat16", "float16": "float16"}


class RankBackend:
    """sglang's FA3 backend for one attention DP rank of one scenario."""

    def __init__(self, engine, server, model, dp_rank: int, steps, numerics: bool, seed: int):
        import torch

        self.engine, self.server, self.model, self.dp_rank = engine, server, model, dp_rank
        self.numerics, self.seed = numerics, seed
        self.glue = engine.glue
        self.dense = engine.kit["dense"]
        self.graph_kit = engine.kit["graph"]
        self.values = self.glue.layout_values(server, dp_rank)
        self.h, self.hk = server.layer_heads(model)
        self.dtype = getattr(torch, DTYPES[model.dtype])
        self.page = server.page_size
        self.ctx = -(-server.context_length // self.page) * self.page
        self.pool_bs = self._pool_batch(steps)
        self.graph_bs_ready = False
        self.captured: dict = {}
        with self.layout():
            self._build()

    # -- construction ----------------------------------------------------------------------------------
    def _pool_batch(self, steps) -> int:
        from gpu_impl.backend import cuda_graph_batch_size
        from gpu_impl.scenario import distribute_over_dp

        most = 1
        for st in steps:
            if st.mode == "decode":
                shares = distribute_over_dp(st.seq_lens, self.server.attn_dp_size)
                most = max(most, max(len(r) for r in shares))
        return cuda_graph_batch_size(most) if self.server.cuda_graph else most

    @contextlib.contextmanager
    def layout(self):
        with self.glue.parallel_layout(self.engine.release, self.values):
            yield

    def _case(self, seq_lens):
        d = self.dense
        return d.DenseAttentionCase(name="fa3verify", backend="fa3", forward_mode=d.ForwardMode.DECODE,
                                    num_heads=self.h, num_kv_heads=self.hk, page_size=self.page,
                                    prefix_lens=tuple(int(s) - 1 for s in seq_lens))

    def _model_config(self):
        d = self.dense
        from sglang.srt.configs.model_config import ModelConfig as SglModelConfig

        total_kv = self.model.num_kv_heads

        class EngineModelConfig(d.TinyModelConfig):
            """The kit's tiny config with sglang's own KV-head rule (``ModelConfig.get_num_kv_heads``)."""

            get_num_kv_heads = SglModelConfig.get_num_kv_heads
            is_draft_model = False

            def get_total_num_kv_heads(self):
                return total_kv

        kwargs = dict(num_heads=self.model.num_heads, num_kv_heads=self.model.num_kv_heads,
                      head_dim=self.model.head_dim, hidden_size=self.model.num_heads * self.model.head_dim,
                      context_len=self.server.context_length)  # ModelConfig.context_len: the server's, unrounded
        cfg = EngineModelConfig(**_accepted(d.TinyModelConfig.__init__, kwargs))
        cfg.v_head_dim = self.model.head_dim_v
        return cfg

    def _build(self) -> None:
        d = self.dense
        case = self._case([1] * self.pool_bs)
        kwargs = dict(case=case, model_config=self._model_config(), dtype=self.dtype, device="cpu",
                      max_context_len=self.ctx, head_dim=self.model.head_dim,
                      disable_cuda_graph=not self.server.cuda_graph, disable_piecewise_cuda_graph=True,
                      runner_batch_size=self.pool_bs)
        with self._small_pool(), self.glue.kit_server_args(d, self.values):
            self.runner = d.MockModelRunner(**_accepted(d.MockModelRunner.__init__, kwargs))
        self.glue.apply_runner_layout(self.engine.release, self.runner, self.values)
        self.backend = d.ATTENTION_BACKENDS["fa3"](self.runner)
        self.layer = d.RadixAttention(num_heads=self.h, head_dim=self.model.head_dim,
                                      scaling=self.model.head_dim ** -0.5, num_kv_heads=self.hk, layer_id=0)
        #: the layers each step runs (``Engine.layers``), all over pool layer 0 and the step's one precompute; the
        #: seeded ``shared-precompute-heterogeneous-heads`` gives the last one half the query heads (the pool's KV
        #: heads stay: a pool view of other KV heads is refused by sglang's paged_kv_view)
        self.layers = [self.layer]
        for i in range(1, getattr(self.engine, "layers", 1)):
            h = self.h
            if i == self.engine.layers - 1 and self.engine.lifecycle_defect == "shared-precompute-heterogeneous-heads":
                h = max(self.hk, self.h // 2)
            self.layers.append(d.RadixAttention(num_heads=h, head_dim=self.model.head_dim,
                                                scaling=self.model.head_dim ** -0.5, num_kv_heads=self.hk, layer_id=0))

    @contextlib.contextmanager
    def _small_pool(self):
        """Record mode: the kit's KV pool capped at a few pages (see RECORD_POOL_PAGES)."""
        d = self.dense
        if self.numerics:
            yield
            return
        real = d.MHATokenToKVPool
        cap = self.page * (RECORD_POOL_PAGES + 2)

        def capped(*args, size, **kwargs):
            return real(*args, size=min(size, cap), **kwargs)

        d.MHATokenToKVPool = capped
        try:
            yield
        finally:
            d.MHATokenToKVPool = real

    def _loc_fn(self):
        page, ctx = self.page, self.ctx
        if self.numerics:
            return lambda req, pos: page + req * ctx + pos
        span = RECORD_POOL_PAGES * page
        return lambda req, pos: page + (req * ctx + pos) % span

    def _fill_req_to_token(self, seq_lens) -> None:
        """``req_to_token[row, :len] = loc(row, pos)`` for every row, vectorised (the same map as ``_loc_fn``)."""
        import torch

        table = self.runner.req_to_token_pool.req_to_token
        page, ctx, span = self.page, self.ctx, RECORD_POOL_PAGES * self.page
        for row, n in enumerate(seq_lens):
            pos = torch.arange(int(n), dtype=torch.int64)
            locs = page + row * ctx + pos if self.numerics else page + (row * ctx + pos) % span
            table[row, :int(n)] = locs.to(table.dtype)

    def batch(self, seq_lens):
        """A decode forward batch for these rows, built by the kit (``_make_forward_batch``).

        The kit writes ``req_to_token`` one token at a time (a second per 32k tokens); it writes into a sink here
        and the same entries are then written vectorised (:meth:`_fill_req_to_token`), so the batch and the
        table are the kit's.
        """
        pool = self.runner.req_to_token_pool
        self.runner.req_to_token_pool = _SinkPool(pool)
        try:
            fb = self.dense._make_forward_batch(self._case(seq_lens), self.runner, max_context_len=self.ctx,
                                                device="cpu", loc_fn=self._loc_fn())
        finally:
            self.runner.req_to_token_pool = pool
        self._fill_req_to_token(seq_lens)
        return fb

    def _qkv(self, bs: int):
        """q as (bs, h*d) and k/v as (bs, hk, d) / (bs, hk, dv), as RadixAttention hands them to the backend."""
        import torch

        d, dv = self.model.head_dim, self.model.head_dim_v
        shapes = ((bs, self.h * d), (bs, self.hk, d), (bs, self.hk, dv))
        if not self.numerics:
            return tuple(torch.zeros(s, dtype=self.dtype) for s in shapes)
        gen = torch.Generator().manual_seed(self.seed * 1000003 + self.dp_rank)
        return tuple(torch.randn(s, generator=gen).to(self.dtype) for s in shapes)

    @contextlib.contextmanager
    def _forward_context(self):
        d = self.dense
        if hasattr(d, "forward_context") and hasattr(d, "ForwardContext"):
            with d.forward_context(d.ForwardContext(attn_backend=self.backend)):
                yield
        else:
            yield

    def _forward(self, fb):
        """Every layer's ``forward_decode`` over the step's metadata; the first layer's output (the first layer
        writes the step's K/V into the pool; the others read the pool only)."""
        import torch

        q, k, v = self._qkv(int(fb.batch_size))
        with torch.no_grad(), self._forward_context():
            first = self.backend.forward_decode(q, k, v, self.layer, fb)
            for layer in self.layers[1:]:
                lq = q if layer.tp_q_head_num == self.h else q[:, :layer.tp_q_head_num * self.model.head_dim]
                self.backend.forward_decode(lq.contiguous(), None, None, layer, fb, save_kv_cache=False)
            return first

    # -- the decode paths ------------------------------------------------------------------------------
    def eager_decode(self, rows) -> None:
        """``init_forward_metadata`` then ``forward_decode`` (flashattention_backend.py, eager decode)."""
        front = self.engine.front
        front.path = "eager"
        fb = self.batch(rows)
        with self._forward_context():
            self.backend.init_forward_metadata(fb)
        self._note_output(self._forward(fb), len(rows))

    def graph_decode(self, graph_bs: int, rows) -> None:
        """CUDA graph: state once, capture per graph batch size (metadata init + the captured call), then the
        replay-time metadata init with the replayed batch (real rows, then padding rows of length 1)."""
        front = self.engine.front
        if not self.graph_bs_ready:
            self.backend.init_cuda_graph_state(max_bs=self.pool_bs, max_num_tokens=self.pool_bs)
            self.graph_bs_ready = True
        if graph_bs not in self.captured:
            cap = self.batch([1] * graph_bs)
            front.path, front.capturing, front.captured = "capture", True, []
            try:
                with self._forward_context():
                    self._capture_metadata(graph_bs, cap)
                self._forward(cap)
            finally:
                front.capturing = False
            if not front.captured:
                raise RuntimeError("CUDA-graph capture made no FA3 call")
            self.captured[graph_bs] = list(front.captured[-len(self.layers):])
        replay = self.batch(list(rows) + [1] * (graph_bs - len(rows)))
        front.path = "replay"
        front.real_rows = len(rows)
        try:
            with self._forward_context():
                self.graph_kit._init_cuda_graph_replay_metadata(self.backend, graph_bs, replay)
        finally:
            front.real_rows = None
        for call in self.captured[graph_bs]:
            front.replay(*call)

    def _capture_metadata(self, graph_bs: int, cap) -> None:
        """The capture-time metadata init: the stand-in kit's call (0.5.11 / 0.5.12,
        ``init_forward_metadata_capture_cuda_graph``), else ``init_forward_metadata_out_graph(in_capture=True)``
        and, where the release has it, ``init_forward_metadata_in_graph`` (0.5.13+)."""
        if self.engine.kit.get("standin"):
            self.graph_kit.legacy_capture_metadata(self.backend, graph_bs, cap)
            return
        self.backend.init_forward_metadata_out_graph(cap, in_capture=True)
        if hasattr(self.backend, "init_forward_metadata_in_graph"):
            self.backend.init_forward_metadata_in_graph(cap)

    def _note_output(self, result, rows: int) -> None:
        """Numerics: NaN in a real row's output is recorded on the front (NO_NAN findings:
        ``gpu_impl.oracle_check.nan_rows``)."""
        if not self.numerics:
            return
        from gpu_impl.oracle_check import nan_rows

        out = result[0] if isinstance(result, tuple) else result
        bad = nan_rows(out[:rows])
        if bad:
            self.engine.front.nan_rows.append(bad)


class _Sink:
    def __setitem__(self, key, value):
        pass


class _SinkPool:
    """A ReqToTokenPool whose token table swallows writes (everything else is the real pool's)."""

    def __init__(self, pool):
        self._pool = pool
        self.req_to_token = _Sink()

    def __getattr__(self, name):
        return getattr(self._pool, name)


def _accepted(fn, kwargs: dict) -> dict:
    """The keyword arguments ``fn`` takes (kit signatures differ a little between releases)."""
    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}
