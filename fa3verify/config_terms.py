"""A finding's configuration in words, and the fix hint that fits the configuration and the guard that ran.

Invariant: every token of a configuration label (``spec.model.domain.Config.label``: ``llama-3-8b/tp2/cp2+pcp/sm78/
splits=0``) gets one explanation from the same configuration the label was made from, in the label's order, with
the server argument it stands for; the head-count fix hint of a witness names the layer's own head counts computed
for that configuration and the features of that configuration under which the precompute must be off, and says
whether the modelled backend's PR #30439 guard (prefill CP or DP attention) covers them: a witness with attention CP but no
prefill CP is not covered by that guard, so the hint never offers that guard as the fix for it. The words are data
(``finding_hints.json``: ``label_tokens``, ``heads_fix``, ``guard_features``).
"""

from __future__ import annotations

from typing import Optional

from .finding_terms import finding_hints

__all__ = ["config_terms", "heads_hint", "witness_features"]


def config_terms(server, model) -> list:
    """``[token, meaning]`` for every token of ``Config(server, model).label()``, in order ([] when the label
    cannot be read, e.g. an engine's own configuration shape)."""
    from spec.model.domain import Config

    try:
        label = Config(server=server, model=model).label()
    except Exception:  # not a configuration of the model's shape: no label, no terms
        return []
    words = finding_hints()["label_tokens"]
    s = server
    values = {"model": model.name, "H": model.num_heads, "Hk": model.num_kv_heads, "d": model.head_dim,
              "dv": model.head_dim_v, "tp": s.tp_size, "dp": s.dp_size, "cp": s.attn_cp_size, "sm": s.num_sm,
              "splits": s.num_splits, "attn_dp": s.attn_dp_size, "attn_tp": s.attn_tp_size,
              "mla": " (MLA: it never precomputes)" if model.is_mla else ""}
    out = []
    for token in label.split("/"):
        if token == model.name:
            key = "model"
        elif token.startswith("tp"):
            key = "tp"
        elif token.startswith("dp"):
            key = "dp+dpa" if token.endswith("+dpa") else "dp"
        elif token.startswith("cp"):
            key = "cp+pcp" if "+pcp" in token else "cp"
        elif token.startswith("sm"):
            key = "sm"
        elif token == "det":
            key = "det"
        else:
            key = "splits=0" if s.num_splits <= 0 else "splits=N"
        meaning = words[key].format(**values)
        if key.startswith("cp") and "+sharded-kv" in token:
            meaning += words["sharded-kv"]
        out.append([token, meaning])
    return out


def witness_features(server) -> list:
    """The features of ``server`` that make the layer's attention TP size differ from ``tp_size`` (the reason a
    precompute with ``H // tp_size`` heads is wrong): keys of ``guard_features`` in the hint data."""
    feats = []
    if server.enable_dp_attention and server.dp_size > 1:
        feats.append("dp_attention")
    if server.attn_cp_size > 1:
        feats.append("prefill_cp" if server.enable_prefill_cp else "attn_cp_without_prefill_cp")
    return feats


def heads_hint(server, model, guard_kept: Optional[str] = None) -> str:
    """The fix hint of a head-count finding for this configuration: the layer's own head counts (with this
    configuration's numbers), or a guard that disables the precompute under this witness's features; whether
    PR #30439's guard covers them. ``guard_kept``: who kept the precompute (``guard 'fixed'``, ``ENGINE==V's own
    guard``), named in the hint."""
    data = finding_hints()
    h, hk = server.layer_heads(model)
    fix = data["heads_fix"].format(H=model.num_heads, Hk=model.num_kv_heads, attn_tp=server.attn_tp_size, h=h,
                                   hk=hk, tp=server.tp_size)
    feats = witness_features(server)
    if not feats:
        return fix
    names = [data["guard_features"][f]["condition"] for f in feats]
    who = guard_kept or "the guard"
    text = f"{fix}; or make the precompute off when {' or '.join(names)} ({who} kept it here)"
    uncovered = [f for f in feats if not data["guard_features"][f]["pr_30439_covers"]]
    if uncovered:
        text += "; " + data["pr_30439_not_enough"].format(
            what=" and ".join(data["guard_features"][f]["condition"] for f in uncovered))
    else:
        text += "; " + data["pr_30439_enough"]
    return text
