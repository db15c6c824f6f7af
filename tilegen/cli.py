"""The `tilegen` command line."""
from __future__ import annotations

import argparse
import sys


def _demo(args) -> int:
    from .spec import GemmSpec

    spec = GemmSpec(dtype=args.dtype)
    print(spec)
    atom = spec.mma
    print(f"\nmma atom {atom.name}: {atom.instruction}")
    for frag in (atom.a, atom.b, atom.c):
        print()
        print(frag.lane_grid())
    return 0


def _verify_fragments(argv) -> int:
    from .verify.fragments import main as verify_main

    return verify_main(argv)


# Commands whose own parser takes the rest of the command line.
PASSTHROUGH = {"verify-fragments": _verify_fragments}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tilegen", description="A Python kernel DSL that generates PTX.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="show the default GEMM spec and its mma atom's fragment maps")
    demo.add_argument("--dtype", default="f16", choices=["tf32", "f16", "bf16"], help="operand dtype (default f16)")
    demo.set_defaults(run=_demo)
    sub.add_parser("verify-fragments", add_help=False,
                   help="run probe kernels on the GPU and compare every lane's registers with the tables")
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in PASSTHROUGH:
        return PASSTHROUGH[argv[0]](argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    from .errors import TilegenError

    try:
        return args.run(args)
    except TilegenError as e:
        print(f"tilegen: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
