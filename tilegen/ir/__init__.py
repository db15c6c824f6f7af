"""tilegen's IR: tile level (tile.py) and instruction level (instr.py) in one package."""
from .builder import Builder
from .instr import Comment, If, Instr, Loop
from .module import KernelIR
from .passes import PASSES, run_passes
from .printer import print_ir
from .values import Addr, Imm, Sym, Value, Vec
from .verify import verify

__all__ = ["Builder", "Comment", "If", "Instr", "Loop", "KernelIR", "PASSES", "run_passes",
           "print_ir", "Addr", "Imm", "Sym", "Value", "Vec", "verify"]
