"""One module per fa3verify subcommand: `register(subparsers)` adds it, `run(args)` returns an exit code."""
