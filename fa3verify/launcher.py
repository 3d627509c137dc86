"""The ``fa3verify`` console script and ``python -m fa3verify``: records how the tool was started (for the commands
it prints, ``fa3verify.invocation``), then runs the command line (``fa3verify.cli.main``).

Invariant: an installation that cannot load the command line (a data file missing from the package, a dependency
that does not import) ends in exit 3 with one line naming the error, never a traceback with exit 1, which a CI job
would read as "violation found". ``FA3VERIFY_TRACEBACK=1`` prints the traceback as well.
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    from . import invocation

    invocation.record(sys.argv[0] if sys.argv else None)
    try:
        from .cli import main as cli_main

        return cli_main()
    except Exception as exc:  # noqa: BLE001 - anything the command line did not turn into its exit status
        if os.environ.get("FA3VERIFY_TRACEBACK"):
            import traceback

            traceback.print_exc()
        print(f"fa3verify: internal error: {type(exc).__name__}: {exc} (exit 3, inconclusive: the installation "
              f"of fa3-verify is incomplete or broken; set FA3VERIFY_TRACEBACK=1 for the traceback)", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
