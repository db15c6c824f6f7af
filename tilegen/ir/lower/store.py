"""StoreFragment -> predicated global stores of alpha * acc + beta * C.

beta == 0 must not read C: the output may hold garbage (or NaN poison), and 0 * NaN is NaN.
So C is read only under a predicate that beta != 0."""
from __future__ import annotations

from ...arch.targets import FEATURE_SM, target
from ...errors import IRError
from .. import tile as T
from ..instr import Comment, Instr
from ..values import Addr, Imm, Value, Vec
from .activations import apply_activation
from .barrier import lower_barrier
from .fragment import split_origin
from .lanes import fit_bit_linear
from .smem import cached_stage_base, emit_offset, shared_address



def _to_f32(b, raw: Value, dtype: str) -> Value:
    """A 16-bit value in the low half of a b32 register, widened to f32."""
    if dtype == "f16":
        return b.op("cvt.f32.f16", "f32", raw)
    if dtype == "bf16":  # bf16 is the top half of an f32; cvt.f32.bf16 needs sm_90
        return b.op("mov.b32", "f32", b.shl(raw, 16))
    raise IRError(f"no widening from {dtype}")


def _elements(cmap):
    """Per register and element: ((row base, col base), deltas) of the C map, in register order."""
    out = []
    for r in range(cmap.regs):
        for e in range(cmap.elems):
            out.append((r, e, fit_bit_linear([cmap.coord(lane, r, e) for lane in range(32)])))
    return out


def _pairs(elements):
    """Group elements two by two when the second sits one column right of the first (same
    lane pattern): such pairs can go out as one vector store."""
    out, k = [], 0
    while k < len(elements):
        if k + 1 < len(elements):
            (_, _, ((r0, c0), d0)), (_, _, ((r1, c1), d1)) = elements[k], elements[k + 1]
            if r0 == r1 and c1 == c0 + 1 and c0 % 2 == 0 and d0 == d1:
                out.append((elements[k], elements[k + 1]))
                k += 2
                continue
        out.append((elements[k],))
        k += 1
    return out


def lower_store(b, ctx, op):
    frag, dst = op.frag, op.dst
    if frag.operand != "C":
        raise IRError(f"only accumulator fragments can be stored, not operand {frag.operand}")
    out = dst.dtype.name
    osize = dst.dtype.bytes
    ld_bytes = ctx.ld_bytes(dst)
    # A column-major destination (or a .T view) stores logical (r, c) at (c, r): fragment rows
    # run along the stored rows, so neighbouring columns are no longer neighbours in memory.
    flip = dst.logical == "col"
    extent = {"r": dst.cols if flip else dst.rows, "c": dst.rows if flip else dst.cols}
    use_beta = None
    if op.beta is not None:
        use_beta = b.op("setp.neu.f32", "pred", op.beta, Imm(0.0, "f32"))
    # Two neighbouring columns go out as one store when the base and the row pitch keep
    # every pair aligned to its size: checked once, at run time.
    vec_ok = None
    if not flip:
        low = b.op("cvt.u32.u64", "b32", dst.ptr)
        vec_ok = b.cmp("eq", b.and_(b.op("or.b32", "b32", low, ld_bytes), 2 * osize - 1), 0)
    bias_cache: dict = {}
    coord, row_address = _addressing(b, ctx, op.row0, op.col0, extent)

    pairs = _pairs(_elements(frag.map)) if not flip else [(e,) for e in _elements(frag.map)]
    tm, tn = frag.tiles
    for i in range(tm):
        for j in range(tn):
            b.comment(f"store {frag.name} atom ({i},{j})")
            for group in pairs:
                places = []
                for (r, e, ((br, bc), deltas)) in group:
                    rkey = ("r", (i, br, tuple(d[0] for d in deltas)))
                    ckey = ("c", (j, bc, tuple(d[1] for d in deltas)))
                    stored_row, stored_col = (ckey, rkey) if flip else (rkey, ckey)
                    row_base = row_address(dst, stored_row)
                    col = coord(*stored_col)[0]
                    inside = b.pred_and(coord(*rkey)[1], coord(*ckey)[1])
                    addr = b.wide_mad(col, osize, row_base)
                    value = _accumulator_value(b, frag, frag.regs[(i, j)][r], e)
                    for vec, along in ((op.row_scale, rkey), (op.col_scale, ckey)):
                        if vec is not None:
                            key = (vec.name, along)
                            if key not in bias_cache:
                                index, ok = coord(*along)
                                bias_cache[key] = _load_f32(b, vec.ptr, index, vec.dtype, ok)
                            value = b.op("mul.f32", "f32", value, bias_cache[key])
                    if op.alpha is not None:
                        value = b.op("mul.f32", "f32", value, op.alpha)
                    if use_beta is not None:
                        value = _add_beta_c(b, value, op.beta, use_beta, inside, addr, out)
                    if op.bias is not None:
                        along = rkey if op.bias_axis == "row" else ckey
                        if along not in bias_cache:
                            index, ok = coord(*along)
                            bias_cache[along] = _load_f32(b, op.bias.ptr, index, op.bias.dtype, ok)
                        value = b.op("add.f32", "f32", value, bias_cache[along])   # (keys: row/col tuples)
                    value = apply_activation(b, op.activation, value)
                    if op.residual is not None:
                        res = op.residual
                        value = b.op("add.f32", "f32", value,
                                     _load_f32(b, row_address(res, stored_row), col, res.dtype, inside))
                    places.append((value, addr, inside))
                if len(places) == 2:
                    _store_pair(b, places, vec_ok, out)
                else:
                    _store(b, *places[0], out)


def lower_accumulate(b, ctx, op):
    """frag += src at each element's (row, col), elements outside src adding nothing. The
    addressing is lower_store's, for an f32, f16 or bf16 source widened to f32 (a .T view:
    logical (r, c) at (c, r))."""
    frag, src = op.frag, op.src
    if frag.operand != "C" or frag.reg_type != "f32" or src.dtype.name not in ("f32", "f16", "bf16"):
        raise IRError(f"accumulate adds an f32, f16 or bf16 tensor into an f32 accumulator, not {src.dtype} into "
                      f"{frag.reg_type}")
    flip = src.logical == "col"
    extent = {"r": src.cols if flip else src.rows, "c": src.rows if flip else src.cols}
    coord, row_address = _addressing(b, ctx, op.row0, op.col0, extent)
    tm, tn = frag.tiles
    for i in range(tm):
        for j in range(tn):
            b.comment(f"{frag.name} atom ({i},{j}) += {src.name}")
            for r, e, ((br, bc), deltas) in _elements(frag.map):
                rkey = ("r", (i, br, tuple(d[0] for d in deltas)))
                ckey = ("c", (j, bc, tuple(d[1] for d in deltas)))
                stored_row, stored_col = (ckey, rkey) if flip else (rkey, ckey)
                inside = b.pred_and(coord(*rkey)[1], coord(*ckey)[1])
                reg = frag.regs[(i, j)][r]
                part = _load_f32(b, row_address(src, stored_row), coord(*stored_col)[0], src.dtype, inside)
                b.emit(Instr("add.f32", (reg,), (reg, part)))


def lower_load_accumulator(b, ctx, op):
    """frag (+)= the stage at each element's (row0 + r, col0 + c), widened to f32: the elements'
    rows and columns as lower_accumulate takes them, their shared addresses through the tile's
    layout (its swizzle), one ld.shared each. The fragment lies inside the tile (verify, and the
    hazard check for runtime origins)."""
    frag, tile = op.frag, op.src
    if frag.operand != "C" or frag.reg_type != "f32" or tile.dtype.name not in ("f32", "f16", "bf16"):
        raise IRError(f"an accumulator is read from an f32, f16 or bf16 tile into f32 registers, not {tile.dtype} "
                      f"into {frag.reg_type}")
    esize = tile.dtype.bytes
    coord, _ = _addressing(b, ctx, op.row0, op.col0, {"r": tile.layout.rows, "c": tile.layout.cols})
    base = cached_stage_base(b, ctx, tile, op.stage)
    tm, tn = frag.tiles
    for i in range(tm):
        for j in range(tn):
            b.comment(f"{frag.name} atom ({i},{j}) {'+=' if op.add else '='} {tile.name}")
            for r, e, ((br, bc), deltas) in _elements(frag.map):
                row = coord("r", (i, br, tuple(d[0] for d in deltas)))[0]
                col = coord("c", (j, bc, tuple(d[1] for d in deltas)))[0]
                addr = b.add(base, emit_offset(b, tile.layout, row, b.mul(col, esize)))
                if esize == 4:
                    value = b.op("mov.f32", "f32", Imm(0.0, "f32"))
                    b.emit(Instr("ld.shared.f32", (value,), (Addr(addr),)))
                else:
                    raw = b.op("mov.b32", "b32", Imm(0))
                    b.emit(Instr("ld.shared.b16", (raw,), (Addr(addr),)))
                    value = _to_f32(b, raw, tile.dtype.name)
                reg = frag.regs[(i, j)][r]
                b.emit(Instr("add.f32", (reg,), (reg, value)) if op.add else Instr("mov.f32", (reg,), (value,)))


def lower_store_row_vector(b, ctx, op):
    """dst[row0 + r, col] = the row vector's row r, inside dst: for each row the lanes hold
    (row_slots), the lane whose elements start that row stores it (the others of its quad hold
    the same value), converted to dst's dtype."""
    vec, dst = op.vec, op.dst
    if dst.logical != "row":
        raise IRError(f"a row vector is stored into a row-major tensor; {dst.name} is {dst.logical}-major")
    cmap = vec.atom.c
    col_ok = b.cmp("lt", op.col, dst.cols)
    for s, slot in enumerate(T.row_slots(vec.atom)):
        r, e = next((r, e) for r in range(cmap.regs) for e in range(cmap.elems) if cmap.coord(0, r, e)[0] == slot)
        _, deltas = fit_bit_linear([cmap.coord(lane, r, e) for lane in range(32)])   # per lane-id bit
        row_deltas, col_deltas = [d[0] for d in deltas], [d[1] for d in deltas]
        writes = b.pred_and(col_ok, b.cmp("eq", ctx.lane_term(col_deltas), 0))
        for i in range(vec.tm):
            b.comment(f"{vec.name} rows {vec.atom.m * i + slot}.. (m-atom {i}) -> {dst.name}")
            row = b.add(b.add(op.row0, vec.atom.m * i + slot), ctx.lane_term(row_deltas))
            inside = b.pred_and(writes, b.cmp("lt", row, dst.rows))
            addr = b.wide_mad(op.col, dst.dtype.bytes, b.wide_mad(row, ctx.ld_bytes(dst), dst.ptr))
            _store(b, vec.regs[(i, s)], addr, inside, dst.dtype.name)


def _addressing(b, ctx, row0, col0, extent: dict):
    """coord(axis, key) -> (value, inside) of a logical row ("r") or column ("c") of a
    fragment's elements at (row0, col0), checked against extent[axis]; row_address(tensor,
    stored_row) -> the byte address of that row of `tensor`. Each computed once."""
    coords: dict = {}
    rows: dict = {}

    def coord(axis, key):
        if (axis, key) not in coords:
            origin, step = (row0, 16) if axis == "r" else (col0, 8)
            v = b.add(b.add(origin, step * key[0] + key[1]), ctx.lane_term(key[2]))
            coords[(axis, key)] = (v, b.cmp("lt", v, extent[axis]))
        return coords[(axis, key)]

    def row_address(tensor, stored_row):
        key = (tensor.name, stored_row)
        if key not in rows:
            rows[key] = b.wide_mad(coord(*stored_row)[0], ctx.ld_bytes(tensor), tensor.ptr)
        return rows[key]

    return coord, row_address


def _store_pair(b, places, vec_ok, out):
    """One vector store when the second column is inside and aligned; else each element alone."""
    (v0, addr, in0), (v1, _, in1) = places
    vec = b.pred_and(in1, vec_ok)  # the second column inside implies the first is
    if out == "f32":
        b.emit(Instr("st.global.v2.f32", (), (Addr(addr), Vec((v0, v1))), pred=vec))
    else:
        packed = b.op(f"cvt.rn.{out}x2.f32", "b32", v1, v0)  # first operand goes to the high half
        b.emit(Instr("st.global.b32", (), (Addr(addr), packed), pred=vec))
    alone = b.op("not.pred", "pred", vec)
    _store(b, v0, addr, b.pred_and(in0, alone), out)
    _store(b, v1, places[1][1], b.pred_and(in1, alone), out)


def _load_f32(b, base, index, dtype, pred) -> Value:
    """base[index] widened to f32, or 0 where `pred` is false (the address is not touched)."""
    addr = b.wide_mad(index, dtype.bytes, base)
    if dtype.name == "f32":
        v = b.op("mov.f32", "f32", Imm(0.0, "f32"))
        b.emit(Instr("ld.global.f32", (v,), (Addr(addr),), pred=pred))
        return v
    raw = b.op("mov.b32", "b32", Imm(0))
    b.emit(Instr("ld.global.b16", (raw,), (Addr(addr),), pred=pred))
    return _to_f32(b, raw, dtype.name)


def _accumulator_value(b, frag, reg: Value, e: int) -> Value:
    if frag.reg_type == "f32":
        return reg
    half = reg if e == 0 else b.shr(reg, 16)
    return b.op("cvt.f32.f16", "f32", half)


def _add_beta_c(b, value, beta, use_beta, inside, addr, out):
    read = b.pred_and(use_beta, inside)
    if out == "f32":
        old = b.op("mov.f32", "f32", Imm(0.0, "f32"))
        b.emit(Instr("ld.global.f32", (old,), (Addr(addr),), pred=read))
    else:
        raw = b.op("mov.b32", "b32", Imm(0))
        b.emit(Instr("ld.global.b16", (raw,), (Addr(addr),), pred=read))
        old = _to_f32(b, raw, out)
    # only where beta != 0: adding beta * 0 would turn a -0.0 of alpha * acc into +0.0
    total = b.op("mov.f32", "f32", value)
    b.emit(Instr("fma.rn.f32", (total,), (old, beta, value), pred=use_beta))
    return total


def _store(b, value, addr, inside, out):
    if out == "f32":
        b.emit(Instr("st.global.f32", (), (Addr(addr), value), pred=inside))
        return
    if out == "f16":
        packed = b.op("cvt.rn.f16.f32", "b32", value)
    else:  # cvt.rn.bf16.f32 wants a 16-bit register; the x2 form packs into a b32 (low half = value)
        packed = b.op("cvt.rn.bf16x2.f32", "b32", Imm(0.0, "f32"), value)
    b.emit(Instr("st.global.b16", (), (Addr(addr), packed), pred=inside))


LOAD_CHUNK = 4   # atoms whose bias / residual loads are issued together, ahead of their use


def _staged_base(b, ctx, sv, buffer):
    """Shared address of buffer `buffer` (an int or a value) of a staged vector's tile."""
    if isinstance(buffer, int):
        return b.add(ctx.smem, sv.tile.offset + buffer * sv.tile.layout.bytes)
    return b.add(b.add(ctx.smem, sv.tile.offset), b.mul(buffer, sv.tile.layout.bytes))


def _staged_address(b, ctx, sv, local, buffer):
    """Shared address of element `local` of a staged vector's buffer."""
    return b.add(_staged_base(b, ctx, sv, buffer), b.mul(local, sv.vec.dtype.bytes))


def _staged_f32(b, ctx, sv, local, buffer) -> Value:
    """Element `local` of a staged vector's buffer, widened to f32."""
    dt = sv.vec.dtype
    addr = _staged_address(b, ctx, sv, local, buffer)
    if dt.name == "f32":
        return b.op("ld.shared.f32", "f32", Addr(addr))
    return _to_f32(b, b.op("ld.shared.b16", "b32", Addr(addr)), dt.name)


def _staged_f32_pair(b, ctx, sv, local, buffer) -> tuple:
    """Elements `local` and `local + 1` (local even) of a staged vector's buffer, widened
    to f32, in one load."""
    dt = sv.vec.dtype
    addr = _staged_address(b, ctx, sv, local, buffer)
    if dt.name == "f32":
        pair = (Value("f32"), Value("f32"))
        b.emit(Instr("ld.shared.v2.f32", (Vec(pair),), (Addr(addr),)))
        return pair
    both = b.op("ld.shared.b32", "b32", Addr(addr))   # the first element in the low half
    return _to_f32(b, both, dt.name), _to_f32(b, b.shr(both, 16), dt.name)


def _staged_element(b, ctx, sv, i):
    """(block index of this thread's i-th element of sv, predicate that it is one of the
    slice's, or None when every thread's is)."""
    t = b.sub(ctx.tid, sv.first_thread) if sv.first_thread else ctx.tid
    index = b.add(t, i * sv.threads)
    return index, (None if (i + 1) * sv.threads <= sv.length else b.cmp("lt", index, sv.length))


def lower_fetch_vector(b, ctx, op):
    """Each thread's elements of the block's slice (0 past the vector's end) into its
    registers, or with cp.async into the tile (StagedVector.by_copy)."""
    sv, vec = op.sv, op.sv.vec
    size = vec.dtype.bytes
    base = _staged_base(b, ctx, sv, op.buffer) if sv.by_copy else None
    for i in range(sv.per_thread):
        index, mine = _staged_element(b, ctx, sv, i)
        at = b.add(op.origin, index)
        addr = b.wide_mad(at, size, vec.ptr)
        if sv.by_copy:   # past the end: src-size 0 zero-fills, from a mapped address (the vector's own)
            past = b.cmp("ge", at, vec.length)
            src = b.op("selp.b64", "b64", vec.ptr, addr, past)
            src_size = b.selp(0, size, past)   # (PTX 7.0; the ignore-src predicate needs 7.5)
            b.emit(Instr("cp.async.ca.shared.global", (), (Addr(b.add(base, b.mul(index, size))), Addr(src),
                                                          Imm(size), src_size), pred=mine))
            continue
        reg = sv.regs[i]
        inside = b.cmp("lt", at, vec.length)
        if mine is not None:
            inside = b.pred_and(inside, mine)
        b.emit(Instr("mov.b32", (reg,), (Imm(0),)))
        b.emit(Instr("ld.global.b16", (reg,), (Addr(addr),), pred=inside))


def lower_park_vector(b, ctx, op):
    """Each thread's fetched elements into the staged vector's shared tile (by_copy: the
    thread's copies waited for)."""
    sv = op.sv
    if sv.by_copy:   # (one wait for several vectors parked in a row)
        last = next((n for n in reversed(b.region) if not isinstance(n, Comment)), None)
        if not (isinstance(last, Instr) and last.opcode == "cp.async.wait_all"):
            b.emit(Instr("cp.async.wait_all"))
        return
    base = _staged_base(b, ctx, sv, op.buffer)
    for i, reg in enumerate(sv.regs):
        index, mine = _staged_element(b, ctx, sv, i)
        addr = b.add(base, b.mul(index, sv.vec.dtype.bytes))
        b.emit(Instr("st.shared.b16", (), (Addr(addr), reg), pred=mine))


def _stmatrix_pairs(ctx, frag, pairs):
    """(index of the pair in an atom's top 8 rows, of the one in its bottom 8) where the
    atoms' element pairs are stmatrix's fragments (lane l: row l/4, columns 2(l%4) and
    2(l%4)+1 of an 8x8 block) and the target has stmatrix (sm_90); else None."""
    if target(ctx.kernel.target).sm < FEATURE_SM["stmatrix"] or len(pairs) != 2:
        return None
    tops = {}
    for k, ((r, e, ((br, bc), _)), _second) in enumerate(pairs):
        if bc != 0 or [frag.map.coord(lane, r, e) for lane in range(32)] != \
                [(br + lane // 4, 2 * (lane % 4)) for lane in range(32)]:
            return None
        tops[br] = k
    return (tops[0], tops[8]) if set(tops) == {0, 8} else None


def _chunks(atoms, first_column: int, whole_pairs: bool):
    """The atoms in chunks of LOAD_CHUNK (their loads issued together); with whole_pairs, a
    chunk never parts the two atoms of one stmatrix.x4 (an even atom column and the next)."""
    if not whole_pairs:
        return [atoms[k:k + LOAD_CHUNK] for k in range(0, len(atoms), LOAD_CHUNK)]
    units, k = [], 0
    while k < len(atoms):
        i, j = atoms[k]
        pair = k + 1 < len(atoms) and atoms[k + 1] == (i, j + 1) and (j - first_column) % 2 == 0
        take = 2 if pair else 1
        units.append(atoms[k:k + take])
        k += take
    chunks = [[]]
    for unit in units:
        if len(chunks[-1]) + len(unit) > LOAD_CHUNK:
            chunks.append([])
        chunks[-1].extend(unit)
    return chunks


def _store_matrices(b, ctx, op, chunk, words, matrices, row_rt, row_ct, per):
    """The packed pairs of a chunk's atoms into the stage as 8x8 matrices: two neighbouring
    atoms (16 rows x 16 columns) per stmatrix.x4, an atom left alone per .x2. Lane l
    addresses row l % 16 of the pair's block, 16 bytes to the right for l >= 16 (the
    second atom; ignored by .x2)."""
    top, bottom = matrices
    lanes = range(32)
    row_term = ctx.lane_term([1, 2, 4, 8, 0])
    col_term = ctx.lane_term([0, 0, 0, 0, 16])
    todo = list(chunk)
    while todo:
        i, j = todo.pop(0)
        atoms = [(i, j)]
        first = j - op.part * per
        if first % 2 == 0 and (i, j + 1) in todo:
            todo.remove((i, j + 1))
            atoms.append((i, j + 1))
        row = (row_rt, row_term, [lane % 16 for lane in lanes], row_ct + 16 * i)
        col = (0, col_term, [16 * (lane // 16) for lane in lanes], 8 * first * op.dst.dtype.bytes)
        addr, disp = shared_address(b, ctx, op.dst, op.stage, row, col)
        regs = tuple(words[(a, c, k)] for a, c in atoms for k in (top, bottom))
        b.comment(f"{op.frag.name} atoms {atoms} -> {op.dst.name} (stmatrix)")
        b.emit(Instr(f"stmatrix.sync.aligned.m8n8.x{len(regs)}.shared.b16", (), (Addr(addr, disp), Vec(regs))))
    ctx.kernel.features.add("stmatrix")


def lower_store_stage(b, ctx, op):
    """The accumulator's elements of one column slice into a shared stage (row-major, the
    stage's swizzle), through the fused epilogue (alpha, bias, activation, residual; no beta)
    and converted to its dtype: two neighbouring columns per 32-bit store (one 64-bit store
    for f32). Addresses split as in ir/lower/smem.py: one register per thread, the atoms'
    offsets in the instruction."""
    frag, tile = op.frag, op.dst
    if frag.operand != "C":
        raise IRError(f"only accumulator fragments can be stored, not operand {frag.operand}")
    out, esize = tile.dtype.name, tile.dtype.bytes
    tm, tn = frag.tiles
    per = tn // op.parts
    row_rt, row_ct = split_origin(op.row0)
    pairs = _pairs(_elements(frag.map))
    if any(len(g) != 2 for g in pairs):
        raise IRError(f"{frag.name}: its accumulator elements do not come in column pairs")
    fused = op.bias is not None or op.residual is not None or op.row_scale is not None or op.col_scale is not None
    # stmatrix where it was measured to pay: the plain and bias / activation / residual epilogues
    # (fp8 per-tensor at 8192^3 2.2% faster held at the power cap, bf16 bias + GELU 0.2-0.4%); with
    # scale vectors (fp8 row-wise) it ran 4.5-7% slower than per-element stores (run 348)
    scaled = op.row_scale is not None or op.col_scale is not None
    matrices = _stmatrix_pairs(ctx, frag, pairs) if out != "f32" and not scaled else None
    where: dict = {}
    bias_cache: dict = {}

    def placed(axis, key, local_ct, lane_deltas):
        """(global index, inside, index from the block's first row / column) of a row or
        column of the slice (fused epilogues only)."""
        if (axis, key) not in where:
            if axis == "r":
                local = b.add(b.add(row_rt, ctx.lane_term(lane_deltas)), local_ct)
                v = b.add(op.out_row0, local)
                where[(axis, key)] = (v, b.cmp("lt", v, op.out.rows), local)
            else:
                local = b.add(ctx.lane_term(lane_deltas), local_ct)
                v = b.add(op.out_col0, local)
                where[(axis, key)] = (v, b.cmp("lt", v, op.out.cols), b.add(local, 8 * per * op.part))
        return where[(axis, key)]

    def cache_key(vec, at):
        return vec.name, id(at[0])

    def vector(vec, at):
        """vec[index] for the row or column `at` ((index, inside, block index)), loaded once
        per kernel region: from global memory, or a staged vector's shared tile."""
        index, ok, local = at
        key = cache_key(vec, at)
        if key not in bias_cache:
            bias_cache[key] = _staged_f32(b, ctx, vec, local, op.vector_buffer) if isinstance(vec, T.StagedVector) else \
                _load_f32(b, vec.ptr, index, vec.dtype, ok)
        return bias_cache[key]

    def vector_pair(vec, c0, c1, even: bool):
        """vec at two neighbouring columns (c1 = c0 + 1) in one shared load where vec is staged
        and c0 even (8- or 4-byte aligned in the 16-byte aligned tile); else one load each."""
        keys = (cache_key(vec, c0), cache_key(vec, c1))
        if isinstance(vec, T.StagedVector) and even and not all(k in bias_cache for k in keys):
            bias_cache[keys[0]], bias_cache[keys[1]] = _staged_f32_pair(b, ctx, vec, c0[2], op.vector_buffer)

    def with_alpha(vec, at):
        """vec at `at` times alpha, once per row or column (an element then takes one multiply
        per scale vector, alpha folded into the first)."""
        key = ("alpha", *cache_key(vec, at))
        if key not in bias_cache:
            bias_cache[key] = b.op("mul.f32", "f32", vector(vec, at), op.alpha)
        return bias_cache[key]

    def multipliers(vectors):
        """What an element is multiplied by: its scale vectors' values ((vector, at) pairs),
        alpha folded into the first, or alpha alone."""
        if op.alpha is None:
            return [vector(v, at) for v, at in vectors]
        if not vectors:
            return [op.alpha]
        return [with_alpha(*vectors[0])] + [vector(v, at) for v, at in vectors[1:]]

    def loads(r_at, c_at):
        """The multipliers (scales, alpha folded into the first), bias and residual values an
        element needs, loaded (before any is used: the loads of a chunk of atoms overlap their
        latency)."""
        bias = res = None
        vectors = [(v, at) for v, at in ((op.row_scale, r_at), (op.col_scale, c_at)) if v is not None]
        scales = multipliers(vectors)
        if op.bias is not None:
            bias = vector(op.bias, r_at if op.bias_axis == "row" else c_at)
        if op.residual is not None:
            inside = b.pred_and(r_at[1], c_at[1])
            row_base = b.wide_mad(r_at[0], ctx.ld_bytes(op.residual), op.residual.ptr)
            res = _load_f32(b, row_base, c_at[0], op.residual.dtype, inside)
        return scales, bias, res

    def finish(value, scales, bias, res):
        for s in scales:
            value = b.op("mul.f32", "f32", value, s)
        if bias is not None:
            value = b.op("add.f32", "f32", value, bias)
        value = apply_activation(b, op.activation, value)
        if res is not None:
            value = b.op("add.f32", "f32", value, res)
        return value

    def where_of(i, j, r, br, bc, deltas):
        """(row, first column, second column) placements of an element pair."""
        row_deltas, col_deltas = [d[0] for d in deltas], [d[1] for d in deltas]
        local_row, local_col = row_ct + 16 * i + br, 8 * (j - op.part * per) + bc
        r_at = placed("r", (i, br, tuple(row_deltas)), local_row, row_deltas)
        c0 = placed("c", (j, bc, tuple(col_deltas)), local_col, col_deltas)
        c1 = placed("c", (j, bc + 1, tuple(col_deltas)), local_col + 1, col_deltas)
        return r_at, c0, c1, bc % 2 == 0 and all(d % 2 == 0 for d in col_deltas)

    atoms = [(i, j) for i in range(tm) for j in range(op.part * per, (op.part + 1) * per)]
    if op.sync is not None:
        # the staged vectors (published before the op) into registers, then the barrier that
        # protects the stage: their loads' latency overlaps its wait; the arithmetic and the
        # stores follow, interleaved as without sync
        if fused:
            for i, j in atoms:
                for (r, e, ((br, bc), deltas)), _ in pairs:
                    r_at, c0, c1, even = where_of(i, j, r, br, bc, deltas)
                    for vec in (op.col_scale, op.bias if op.bias_axis == "col" else None):
                        if isinstance(vec, T.StagedVector):
                            vector_pair(vec, c0, c1, even)
                    for vec in (op.row_scale, op.bias if op.bias_axis == "row" else None):
                        if isinstance(vec, T.StagedVector):
                            vector(vec, r_at)
        b.comment("the staged vectors are read: wait for the stage's previous readers")
        lower_barrier(b, ctx, op.sync)
    for chunk in _chunks(atoms, op.part * per, bool(matrices)):
        fetched = {}
        if fused:   # every load of the chunk first
            for i, j in chunk:
                for (r, e, ((br, bc), deltas)), _ in pairs:
                    r_at, c0, c1, even = where_of(i, j, r, br, bc, deltas)
                    for vec in (op.col_scale, op.bias if op.bias_axis == "col" else None):
                        if vec is not None:
                            vector_pair(vec, c0, c1, even)
                    fetched[(i, j, r, e)] = (loads(r_at, c0), loads(r_at, c1))
        words = {}   # (i, j, pair index) -> packed pair, for stmatrix
        for i, j in chunk:
            b.comment(f"{frag.name} atom ({i},{j}) -> {tile.name}")
            for k, ((r, e, ((br, bc), deltas)), (r1, e1, _)) in enumerate(pairs):
                if not matrices:
                    lanes = [frag.map.coord(lane, r, e) for lane in range(32)]
                    row_deltas, col_deltas = [d[0] for d in deltas], [d[1] for d in deltas]
                    local_row, local_col = row_ct + 16 * i + br, 8 * (j - op.part * per) + bc
                    row = (row_rt, ctx.lane_term(row_deltas), [x - br for x, _ in lanes], local_row)
                    col = (0, ctx.lane_term([d * esize for d in col_deltas]), [(c - bc) * esize for _, c in lanes],
                           local_col * esize)
                    addr, disp = shared_address(b, ctx, tile, op.stage, row, col)
                v0 = _accumulator_value(b, frag, frag.regs[(i, j)][r], e)
                v1 = _accumulator_value(b, frag, frag.regs[(i, j)][r1], e1)
                plain = (multipliers(()), None, None)
                (s0, bias0, res0), (s1, bias1, res1) = fetched.get((i, j, r, e), (plain, plain))
                v0, v1 = finish(v0, s0, bias0, res0), finish(v1, s1, bias1, res1)
                if out == "f32":
                    b.emit(Instr("st.shared.v2.f32", (), (Addr(addr, disp), Vec((v0, v1)))))
                    continue
                packed = b.op(f"cvt.rn.{out}x2.f32", "b32", v1, v0)  # the first operand goes high
                if matrices:
                    words[(i, j, k)] = packed
                else:
                    b.emit(Instr("st.shared.b32", (), (Addr(addr, disp), packed)))
        if matrices:
            _store_matrices(b, ctx, op, chunk, words, matrices, row_rt, row_ct, per)
