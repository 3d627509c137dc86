"""The case schema's size bounds and its one error type (every case-file check raises CaseFormatError naming the
field, the allowed values or range, and what was found). Below spec.model.cases and its engine options, which both
use them."""

from __future__ import annotations

from typing import Any

#: Bounds on case sizes (docs/case-format.md, "Bounds"): far above every real deployment, low enough that a case
#: replays in seconds and bounded memory. A case beyond them is refused (CaseFormatError, exit 2).
MAX_RANKS = 1024          #: tp_size, dp_size, attn_cp_size
MAX_HEADS = 1024          #: num_heads, num_kv_heads (real models: <= 128)
MAX_NUM_SM = 1024
MAX_PAGE_SIZE = 1 << 20
MAX_LEN = 2 ** 31 - 1     #: seq_lens, context_length (FA3 lengths are int32)
MAX_STEPS = 256           #: batches per case
MAX_BATCH = 4096          #: sequences per batch (above FA3's b > 992 rule in flash_prepare_scheduler.cu)
MAX_SEED = 2 ** 63 - 1


class CaseFormatError(ValueError):
    """A malformed case file; the message names the field, the allowed values or range, and what was found."""

    def __init__(self, field_path: str, allowed: str, got: Any):
        self.field = field_path
        self.allowed = allowed
        self.got = got
        super().__init__(f"{field_path}: expected {allowed}, got {got!r}")


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
