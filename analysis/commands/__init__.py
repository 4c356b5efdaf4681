"""One module per `flashsim` subcommand; each defines register(subparsers)."""
