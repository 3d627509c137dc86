"""``--shard K/N``: one of N disjoint parts of a campaign, so a CI job matrix spreads it over N machines.

Invariant: shard K of N owns the draws (the engine matrix: the releases) whose 0-based index i has
``i % N == K - 1``; every draw still takes its seed from the campaign's one seeded generator
(:func:`fa3verify.campaign.run_campaign`), so the N shards of a campaign run exactly the cases the unsplit
campaign runs, each once, with the same seeds. Under ``--cases M`` each shard stops at the same global draw M;
under a time budget each shard runs its own draws for that budget (how many fit depends on the machine, as
unsplit). A shard's report carries ``shard`` (``{"k", "n", "campaign"}``); ``fa3verify report merge``
(:mod:`fa3verify.report_merge`) joins the N reports of one campaign into one verdict.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from .errors import UsageError

#: Largest N (a CI job matrix with more jobs than this is not one).
MAX_SHARDS = 4096

_SHARD = re.compile(r"^\s*(\d{1,6})\s*/\s*(\d{1,6})\s*$")


@dataclass(frozen=True)
class Shard:
    """Shard ``k`` (1-based) of ``n``."""

    k: int
    n: int

    def owns(self, index: int) -> bool:
        """Whether the draw (or release) with 0-based ``index`` is this shard's."""
        return index % self.n == self.k - 1

    def pick(self, items) -> list:
        """This shard's items of a sequence, in order."""
        return [x for i, x in enumerate(items) if self.owns(i)]

    def to_dict(self, campaign: dict) -> dict:
        """The report's ``shard`` object: K, N and what identifies the campaign (the same in every shard)."""
        return {"k": self.k, "n": self.n, "campaign": campaign}

    def __str__(self) -> str:
        return f"{self.k}/{self.n}"


def parse_shard(text: Optional[str]) -> Optional[Shard]:
    """The Shard ``--shard K/N`` names (None when absent); anything but integers 1 <= K <= N is a UsageError."""
    if text is None:
        return None
    m = _SHARD.match(str(text))
    if not m:
        raise UsageError(f"--shard: expected K/N with integers 1 <= K <= N <= {MAX_SHARDS} (e.g. 2/4), got {text!r}")
    k, n = int(m.group(1)), int(m.group(2))
    if not (1 <= k <= n <= MAX_SHARDS):
        raise UsageError(f"--shard: expected 1 <= K <= N <= {MAX_SHARDS}, got K={k}, N={n}")
    return Shard(k, n)


def add_shard_argument(parser, what: str = "draws") -> None:
    """Add ``--shard K/N`` to a subcommand parser."""
    parser.add_argument("--shard", default=None, metavar="K/N",
                        help=f"run shard K of N (1 <= K <= N): the {what} whose index i has i %% N == K-1; the N "
                             f"shards' reports, joined with `fa3verify report merge`, cover the unsplit run")


def check_cases(shard: Optional[Shard], cases: Optional[int]) -> None:
    """A shard must own at least one of ``cases`` draws (else it would pass having run nothing)."""
    if shard is not None and cases is not None and shard.k > cases:
        raise UsageError(f"--shard: shard {shard} owns no draw of --cases {cases}; want K <= --cases")
