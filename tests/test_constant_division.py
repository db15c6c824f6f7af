"""Builder.divmod_const (tilegen.divmod_by in the DSL, the Hopper pipelines' stage and lap of a
k-tile): powers of two as a shift and a mask, other constants as a multiply-high (ptxas computes
div.u32 by an immediate through a float reciprocal each time it runs): exact for every u32
numerator, checked on edges and random values through ScalarEval, the evaluator the static hazard
checks use."""
import random

import pytest

from tilegen.ir.builder import Builder
from tilegen.ir.scalar_eval import ScalarEval
from tilegen.ir.values import Value

U32 = 2 ** 32


def _quotient_and_remainder(d: int):
    b = Builder([])
    x = Value("b32", "x")
    q, r = b.divmod_const(x, d)
    return b.region, x, q, r


@pytest.mark.parametrize("d", [3, 5, 6, 7, 9, 10, 12, 24, 96, 100, 192, 641, 1000, 6700417, 2 ** 31 + 1, U32 - 1,
                               2, 4, 64, 2 ** 31])
def test_division_by_a_constant_is_exact_for_every_u32(d):
    instrs, x, q, r = _quotient_and_remainder(d)
    ops = {i.opcode.split(".")[0] for i in instrs}
    assert not ops & {"div", "rem"}, ops               # no division instruction reaches the PTX
    rng = random.Random(d)
    numerators = [0, 1, 2, d - 1, d, d + 1, U32 - 1, U32 - 2, 2 ** 31, 2 ** 31 - 1] + \
                 [k * d + e for k in (2, 3, U32 // d - 1, U32 // d) for e in (-1, 0, 1)] + \
                 [rng.randrange(U32) for _ in range(2000)]
    for a in (n for n in numerators if 0 <= n < U32):
        ev = ScalarEval()
        ev.env[x] = a
        for i in instrs:
            ev.step(i)
        assert (ev.value(q), ev.value(r)) == (a // d, a % d), (a, d)


def test_divmod_by_takes_u32_constants_only():
    import tilegen.dsl as tg
    from tilegen.errors import DSLError

    @tg.kernel
    def k(n):
        tg.launch(threads=32, grid=(1, 1, 1))
        tg.divmod_by(tg.thread_id(), n)

    k.trace(n=6)
    for n in (0, 2 ** 32, True, 2.0):
        with pytest.raises(DSLError, match="divmod_by"):
            k.trace(n=n)
