"""``python -m services.agent``: the agent alone, as the ramdisk's init starts it.

The same options as ``ferrum agent``, without importing the rest of Ferrum's
command line (whose other subcommands need packages a ramdisk does not carry).
"""

from __future__ import annotations

import argparse
import sys

from services.agent.cli import add_agent_arguments, run_agent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.agent", description="Ferrum's deploy agent.")
    add_agent_arguments(parser)
    return run_agent(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
