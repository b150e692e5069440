"""`python tests/subcommands_cli.py export|evaluate|predict ...`: predict.register's subcommands,
dispatched as cli.main dispatches them; tests use it only while cli.py does not add them."""

import sys

from accel_mnist.cli import EXIT_USAGE, _Parser
from accel_mnist.errors import UsageError
from accel_mnist.export.predict import register


def main() -> int:
    parser = _Parser(prog="accel-mnist")
    register(parser.add_subparsers(dest="command", required=True, parser_class=_Parser))
    args = parser.parse_args()
    try:
        return args.handler(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
