"""The row-parallel strict GEMM as a Gluon kernel (Hopper): the same bits as the Triton kernels of
kernels/gemm_kernels.py, without their pipeline drain at every chunk end.

Contract v5's row-parallel product (gemm.chunk_merge = "sequential"): each of the C K chunks is one fp32
chain of 64-wide K steps from zero; the chunk sums are added in chunk order, ((c0 + c1) + c2) + c3; one
rounding. The Triton kernel writes each chunk as its own pipelined loop, so a tile's loads stop and
restart four times; Triton's one loop over every chunk waited for every MMA (lab/KERNELS_NOTES.md).

Gluon lets the kernel say what Triton's pipeliner could not: TMA loads run STAGES - 1 K steps ahead of
the MMAs across chunk and tile boundaries (the K position of a tile's step j is j * BK whatever its
chunk), the MMAs keep one in flight (wait for all only at a chunk's end, where its sum is added to the
running total), and the finished tile's TMA store overlaps the next tile's loads. Each chunk is still the
same chain (warpgroup MMAs of k16 steps in K order from a +0 accumulator, as the Triton kernels start
it: an all -0 chunk sums to +0 in both), and the chunk sums still meet in the same order: the same bits
as every other launch of the plan (tests/gpu/test_kernels_gpu.py checks it). Two forms: one partition
(the plan's, 64 x 128 tiles two an SM) and a warp-specialized one (a loading warp; measured no faster:
lab/KERNELS_NOTES.md). Either may keep the running total in shared memory (`total_in_smem`): the
registers then hold one accumulator, which lets a tile be 128 x 256 (a second fp32 register tile of that
size does not fit); the plan's "BK" may then be a smaller multiple of 16 dividing the contract's K step
(the same k16 MMAs in the same order, more of them in the ring). A tile's width may be a sum of two
powers of two (Gluon's tensors are powers of two): 192 = 128 + 64 or 160 = 128 + 32 columns are two
column parts, each its own accumulator, weight ring and output box, both fed by the same x tile (two
warpgroup MMAs a K step): 128 x 192 holds its two fp32 tiles (chain and total) in 192 registers a thread
at 8 warps, where 128 x 256 would need 256.

Device code and its launcher only; `kernels/gemm.py` decides when it runs (`plan`). Gluon is Triton's
lower-level language (triton.experimental.gluon: Triton 3.6 on the H200, 3.7 in the compile check here);
without it `AVAILABLE` is False and the plan never picks this kernel.
"""

from __future__ import annotations

import torch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                  warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    _cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier  # Triton 3.6's name, 3.7's
    AVAILABLE = True
except Exception:  # noqa: BLE001 - no Triton, or a Triton without Gluon's Hopper API
    AVAILABLE = False

_GL_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


if AVAILABLE:

    @gluon.jit
    def _tile_origin(tile, M, N, BM: gl.constexpr, BN: gl.constexpr, GROUP_M: gl.constexpr):
        """First row and column of tile `tile` in grouped order (GROUP_M row tiles share a sweep over
        the columns; the same order as the Triton kernels' `_grouped_origin`)."""
        n_m = gl.cdiv(M, BM)
        width = GROUP_M * gl.cdiv(N, BN)
        first_m = (tile // width) * GROUP_M
        group_rows = gl.minimum(n_m - first_m, GROUP_M)
        return (first_m + (tile % width) % group_rows) * BM, ((tile % width) // group_rows) * BN

    @gluon.jit
    def _load(pred, slot, off_m, off_n, k0, x_desc, w_desc, w2_desc, a_bufs, b_bufs, b2_bufs, ready,
              SPLIT_N: gl.constexpr):
        """TMA loads of one K step (x rows off_m.., weight rows off_n.., K from k0) into ring slot `slot`;
        with SPLIT_N the second column part's weight rows too (off_n + the first part's width ..)."""
        bar = ready.index(slot)
        nbytes: gl.constexpr = x_desc.block_type.nbytes + w_desc.block_type.nbytes + (
            w2_desc.block_type.nbytes if SPLIT_N else 0)
        mbarrier.expect(bar, nbytes, pred=pred)
        tma.async_copy_global_to_shared(x_desc, [off_m, k0], bar, a_bufs.index(slot), pred)
        tma.async_copy_global_to_shared(w_desc, [off_n, k0], bar, b_bufs.index(slot), pred)
        if SPLIT_N:
            tma.async_copy_global_to_shared(w2_desc, [off_n + w_desc.block_type.shape[0], k0], bar,
                                            b2_bufs.index(slot), pred)

    @gluon.constexpr_function
    def _mma_layout(bn, warps):
        """The accumulator's layout: each warp 16 rows of the tile, the whole BN wide (m64nBNk16
        warpgroup MMAs)."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, bn, 16])

    @gluon.jit
    def _next_slot(slot, phase, STAGES: gl.constexpr):
        """The next slot of the ring, and the mbarrier phase parity it is on (flips at each wrap)."""
        slot = slot + 1
        if slot == STAGES:
            slot = 0
            phase = phase ^ 1
        return slot, phase

    @gluon.jit
    def _next_step(slot, phase, k0, tile, off_m, off_n, programs, M, N, K: gl.constexpr, STAGES: gl.constexpr,
                   BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr):
        """The producer's next K step: the next ring slot (and its phase), and the next K offset, or the
        first of this program's next tile (its origin computed once a tile, not once a step: integer
        division by a runtime value costs tens of instructions)."""
        slot, phase = _next_slot(slot, phase, STAGES)
        k0 = k0 + BK
        if k0 == K:
            k0 = 0
            tile = tile + programs
            off_m, off_n = _tile_origin(tile, M, N, BM, BN, GROUP_M)
        return slot, phase, k0, tile, off_m, off_n

    @gluon.jit
    def _mma_step(a, b, b2, acc, acc2, tot, tot2, tot_smem, step, chunk, tile, y_desc, y2_desc, y_smem, y2_smem,
                  programs, M, N, C: gl.constexpr, STEPS: gl.constexpr, GROUP_M: gl.constexpr,
                  mma_layout: gl.constexpr, mma2_layout: gl.constexpr, TOTAL_SMEM: gl.constexpr,
                  SPLIT_N: gl.constexpr):
        """One K step of the MMA warps: acc += a @ b (asynchronously, one K step's MMAs left in flight), and
        at a chunk's last step the chunk sum added to the tile's running sum in chunk order (the accumulator
        reset to +0 for the next chain), at the tile's last the rounded tile stored by TMA (after the
        previous tile's store has read y_smem). The running sum is a second register tile, or with
        TOTAL_SMEM an fp32 tile in shared memory (`tot_smem`; y_smem then aliases it), which leaves the
        registers to one accumulator of twice the width. With SPLIT_N the second column part (b2, acc2,
        tot2, y2) goes the same way beside the first. Returns (acc, acc2, tot, tot2, step, chunk, tile)."""
        BM: gl.constexpr = y_desc.block_type.shape[0]
        BN1: gl.constexpr = y_desc.block_type.shape[1]
        BN2: gl.constexpr = y2_desc.block_type.shape[1]
        BN: gl.constexpr = BN1 + (BN2 if SPLIT_N else 0)
        pending = warpgroup_mma(a, b, acc, is_async=True)
        if SPLIT_N:
            pending2 = warpgroup_mma(a, b2, acc2, is_async=True)
        if step == STEPS - 1:
            if SPLIT_N:
                acc, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(pending, pending2))
                if chunk == 0:
                    tot2 = acc2
                else:
                    tot2 = tot2 + acc2
                acc2 = gl.zeros((BM, BN2), gl.float32, mma2_layout)
            else:
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(pending,))
            if TOTAL_SMEM:
                if chunk == 0:
                    tma.store_wait(pendings=0)  # the previous tile's store has read the buffer
                    run = acc
                else:
                    run = tot_smem.load(mma_layout) + acc
                if chunk < C - 1:
                    tot_smem.store(run)
            else:
                if chunk == 0:
                    tot = acc
                else:
                    tot = tot + acc
                run = tot
            acc = gl.zeros((BM, BN1), gl.float32, mma_layout)
            if chunk == C - 1:
                off_m, off_n = _tile_origin(tile, M, N, BM, BN, GROUP_M)
                tma.store_wait(pendings=0)
                if TOTAL_SMEM:
                    _cta_barrier()  # every warp has read the running sum that y_smem overwrites
                y_smem.store(run.to(y_desc.dtype))
                if SPLIT_N:
                    y2_smem.store(tot2.to(y2_desc.dtype))
                fence_async_shared()
                tma.async_copy_shared_to_global(y_desc, [off_m, off_n], y_smem)
                if SPLIT_N:
                    tma.async_copy_shared_to_global(y2_desc, [off_m, off_n + BN1], y2_smem)
                tile = tile + programs
                chunk = 0
            else:
                chunk = chunk + 1
            step = 0
        else:
            if SPLIT_N:  # each warpgroup MMA is its own group: two a K step
                acc, acc2 = warpgroup_mma_wait(num_outstanding=2, deps=(pending, pending2))
            else:
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(pending,))
            step = step + 1
        return acc, acc2, tot, tot2, step, chunk, tile

    @gluon.jit
    def _second_part(y2_desc, y_smem, mma2_layout: gl.constexpr, SPLIT_N: gl.constexpr):
        """(acc2, tot2, y2_smem): the second column part's accumulator, running sum and staging buffer, or
        scalars and the first part's buffer (never written as the second's) where the tile is one part."""
        if SPLIT_N:
            BM: gl.constexpr = y2_desc.block_type.shape[0]
            BN2: gl.constexpr = y2_desc.block_type.shape[1]
            acc2 = gl.zeros((BM, BN2), gl.float32, mma2_layout)
            tot2 = gl.zeros((BM, BN2), gl.float32, mma2_layout)
            y2_smem = gl.allocate_shared_memory(y2_desc.dtype, [BM, BN2], y2_desc.layout)
        else:
            acc2 = 0.0
            tot2 = 0.0
            y2_smem = y_smem
        return acc2, tot2, y2_smem

    @gluon.jit
    def _tile_buffers(y_desc, mma_layout: gl.constexpr, TOTAL_SMEM: gl.constexpr):
        """(tot, tot_smem, y_smem): the running sum's register tile and the output's staging buffer, or
        with TOTAL_SMEM the running sum's fp32 shared-memory tile with the output staged in its first half
        (a scalar stands in for the register tile)."""
        BM: gl.constexpr = y_desc.block_type.shape[0]
        BN: gl.constexpr = y_desc.block_type.shape[1]
        if TOTAL_SMEM:
            tot_smem = gl.allocate_shared_memory(gl.float32, [BM, BN],
                                                 gl.NVMMASharedLayout.get_default_for([BM, BN], gl.float32))
            y_smem = tot_smem._reinterpret(y_desc.dtype, [BM, BN], y_desc.layout)
            tot = 0.0
        else:
            y_smem = gl.allocate_shared_memory(y_desc.dtype, [BM, BN], y_desc.layout)
            tot_smem = y_smem
            tot = gl.zeros((BM, BN), gl.float32, mma_layout)
        return tot, tot_smem, y_smem

    @gluon.jit
    def _weight_rings(w_desc, w2_desc, STAGES: gl.constexpr, SPLIT_N: gl.constexpr):
        """The weight's ring of STAGES slots, and the second column part's (the first's, unused, where the
        tile is one part)."""
        BK: gl.constexpr = w_desc.block_type.shape[1]
        b_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES, w_desc.block_type.shape[0], BK], w_desc.layout)
        if SPLIT_N:
            b2_bufs = gl.allocate_shared_memory(w2_desc.dtype, [STAGES, w2_desc.block_type.shape[0], BK],
                                                w2_desc.layout)
        else:
            b2_bufs = b_bufs
        return b_bufs, b2_bufs

    @gluon.jit(do_not_specialize=["M", "programs"])
    def _ordered_chunks_kernel(x_desc, w_desc, w2_desc, y_desc, y2_desc, M, N, programs,
                               C: gl.constexpr, STEPS: gl.constexpr, STAGES: gl.constexpr,
                               GROUP_M: gl.constexpr, TOTAL_SMEM: gl.constexpr, SPLIT_N: gl.constexpr,
                               num_warps: gl.constexpr):
        """y[BM x BN tiles] = the C chunk chains of STEPS K steps each, added in chunk order, rounded once.
        A persistent grid of `programs`; program p computes tiles p, p + programs, ... in grouped order.
        With SPLIT_N a tile's BN columns are w_desc's rows and then w2_desc's (two accumulators)."""
        BM: gl.constexpr = x_desc.block_type.shape[0]
        BK: gl.constexpr = x_desc.block_type.shape[1]
        BN: gl.constexpr = w_desc.block_type.shape[0] + (w2_desc.block_type.shape[0] if SPLIT_N else 0)
        K: gl.constexpr = C * STEPS * BK
        pid = gl.program_id(0)
        tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
        total = gl.cdiv(tiles - pid, programs) * (C * STEPS)  # this program's K steps, all its tiles

        a_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BM, BK], x_desc.layout)
        b_bufs, b2_bufs = _weight_rings(w_desc, w2_desc, STAGES, SPLIT_N)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for slot in gl.static_range(STAGES):
            mbarrier.init(ready.index(slot), count=1)

        BN1: gl.constexpr = w_desc.block_type.shape[0]
        mma_layout: gl.constexpr = _mma_layout(BN1, num_warps)
        mma2_layout: gl.constexpr = _mma_layout(w2_desc.block_type.shape[0], num_warps)
        acc = gl.zeros((BM, BN1), gl.float32, mma_layout)
        tot, tot_smem, y_smem = _tile_buffers(y_desc, mma_layout, TOTAL_SMEM)
        acc2, tot2, y2_smem = _second_part(y2_desc, y_smem, mma2_layout, SPLIT_N)

        # the producer runs STAGES - 1 K steps ahead of the MMAs, across chunk and tile ends
        p_slot = 0
        p_phase = 0  # the producer waits on no barrier here: its phase is carried but not read
        p_k = 0
        p_tile = pid
        p_m, p_n = _tile_origin(pid, M, N, BM, BN, GROUP_M)
        for j in gl.static_range(STAGES - 1):
            _load(j < total, p_slot, p_m, p_n, p_k, x_desc, w_desc, w2_desc, a_bufs, b_bufs, b2_bufs, ready, SPLIT_N)
            p_slot, p_phase, p_k, p_tile, p_m, p_n = _next_step(p_slot, p_phase, p_k, p_tile, p_m, p_n, programs,
                                                                M, N, K, STAGES, BM, BN, BK, GROUP_M)
        slot = 0
        phase = 0
        step = 0
        chunk = 0
        tile = pid
        for i in range(total):
            mbarrier.wait(ready.index(slot), phase)
            acc, acc2, tot, tot2, step, chunk, tile = _mma_step(
                a_bufs.index(slot), b_bufs.index(slot).permute((1, 0)), b2_bufs.index(slot).permute((1, 0)), acc,
                acc2, tot, tot2, tot_smem, step, chunk, tile, y_desc, y2_desc, y_smem, y2_smem, programs, M, N, C,
                STEPS, GROUP_M, mma_layout, mma2_layout, TOTAL_SMEM, SPLIT_N)
            # the producer's slot is (i - 1) % STAGES: its MMAs have completed (at most step i's are in flight)
            _load(i + STAGES - 1 < total, p_slot, p_m, p_n, p_k, x_desc, w_desc, w2_desc, a_bufs, b_bufs, b2_bufs,
                  ready, SPLIT_N)
            p_slot, p_phase, p_k, p_tile, p_m, p_n = _next_step(p_slot, p_phase, p_k, p_tile, p_m, p_n, programs,
                                                                M, N, K, STAGES, BM, BN, BK, GROUP_M)
            slot, phase = _next_slot(slot, phase, STAGES)
        tma.store_wait(pendings=0)
        for slot in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(slot))


    @gluon.jit
    def _ws_producer(x_desc, w_desc, w2_desc, a_bufs, b_bufs, b2_bufs, ready, empty, M, N, programs, total,
                     K: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, SPLIT_N: gl.constexpr):
        """Warp-specialized form, the loading warp: every K step of this program's tiles in order, each
        into the next ring slot once the MMAs have released it (`empty`)."""
        BM: gl.constexpr = x_desc.block_type.shape[0]
        BK: gl.constexpr = x_desc.block_type.shape[1]
        BN: gl.constexpr = w_desc.block_type.shape[0] + (w2_desc.block_type.shape[0] if SPLIT_N else 0)
        pid = gl.program_id(0)
        tile = pid
        off_m, off_n = _tile_origin(pid, M, N, BM, BN, GROUP_M)
        slot = 0
        phase = 0
        k0 = 0
        for j in range(total):
            mbarrier.wait(empty.index(slot), phase ^ 1)  # a fresh barrier's previous phase counts as complete
            _load(True, slot, off_m, off_n, k0, x_desc, w_desc, w2_desc, a_bufs, b_bufs, b2_bufs, ready, SPLIT_N)
            slot, phase, k0, tile, off_m, off_n = _next_step(slot, phase, k0, tile, off_m, off_n, programs, M, N,
                                                             K, STAGES, BM, BN, BK, GROUP_M)

    @gluon.jit
    def _ws_consumer(y_desc, y2_desc, a_bufs, b_bufs, b2_bufs, ready, empty, tot_smem, y_smem, y2_smem, M, N,
                     programs, total, C: gl.constexpr, STEPS: gl.constexpr, STAGES: gl.constexpr,
                     GROUP_M: gl.constexpr, TOTAL_SMEM: gl.constexpr, SPLIT_N: gl.constexpr, WARPS: gl.constexpr):
        """Warp-specialized form, the MMA warps: the same chains, chunk sums and stores as
        `_ordered_chunks_kernel`; each slot is released to the loader once its MMA has completed."""
        BM: gl.constexpr = a_bufs.shape[1]
        BN: gl.constexpr = b_bufs.shape[1]
        mma_layout: gl.constexpr = _mma_layout(BN, WARPS)
        BN2: gl.constexpr = b2_bufs.shape[1]
        mma2_layout: gl.constexpr = _mma_layout(BN2, WARPS)
        acc = gl.zeros((BM, BN), gl.float32, mma_layout)
        tot = 0.0
        if not TOTAL_SMEM:
            tot = gl.zeros((BM, BN), gl.float32, mma_layout)
        acc2 = 0.0
        tot2 = 0.0
        if SPLIT_N:
            acc2 = gl.zeros((BM, BN2), gl.float32, mma2_layout)
            tot2 = gl.zeros((BM, BN2), gl.float32, mma2_layout)
        slot = 0
        phase = 0
        prev = 0
        step = 0
        chunk = 0
        tile = gl.program_id(0)
        for i in range(total):
            mbarrier.wait(ready.index(slot), phase)
            acc, acc2, tot, tot2, step, chunk, tile = _mma_step(
                a_bufs.index(slot), b_bufs.index(slot).permute((1, 0)), b2_bufs.index(slot).permute((1, 0)), acc,
                acc2, tot, tot2, tot_smem, step, chunk, tile, y_desc, y2_desc, y_smem, y2_smem, programs, M, N, C,
                STEPS, GROUP_M, mma_layout, mma2_layout, TOTAL_SMEM, SPLIT_N)
            mbarrier.arrive(empty.index(prev), pred=i > 0)  # MMA i - 1 has completed: its slot is free
            prev = slot
            slot, phase = _next_slot(slot, phase, STAGES)
        tma.store_wait(pendings=0)

    @gluon.jit(do_not_specialize=["M", "programs"])
    def _ordered_chunks_ws_kernel(x_desc, w_desc, w2_desc, y_desc, y2_desc, M, N, programs,
                                  C: gl.constexpr, STEPS: gl.constexpr, STAGES: gl.constexpr,
                                  GROUP_M: gl.constexpr, TOTAL_SMEM: gl.constexpr, SPLIT_N: gl.constexpr,
                                  num_warps: gl.constexpr):
        """`_ordered_chunks_kernel` with the TMA loads in a warp of their own (gl.warp_specialize): the
        MMA warps then meet no CTA-wide barrier a K step (the one-partition form syncs every warp around
        each load: Gluon's shared-memory hazard barriers)."""
        BM: gl.constexpr = x_desc.block_type.shape[0]
        BK: gl.constexpr = x_desc.block_type.shape[1]
        BN: gl.constexpr = w_desc.block_type.shape[0] + (w2_desc.block_type.shape[0] if SPLIT_N else 0)
        pid = gl.program_id(0)
        tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
        total = gl.cdiv(tiles - pid, programs) * (C * STEPS)
        a_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BM, BK], x_desc.layout)
        b_bufs, b2_bufs = _weight_rings(w_desc, w2_desc, STAGES, SPLIT_N)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for slot in gl.static_range(STAGES):
            mbarrier.init(ready.index(slot), count=1)
            mbarrier.init(empty.index(slot), count=1)
        _, tot_smem, y_smem = _tile_buffers(y_desc, _mma_layout(w_desc.block_type.shape[0], num_warps), TOTAL_SMEM)
        _, _, y2_smem = _second_part(y2_desc, y_smem, _mma_layout(w2_desc.block_type.shape[0], num_warps), SPLIT_N)
        gl.warp_specialize([
            (_ws_consumer, (y_desc, y2_desc, a_bufs, b_bufs, b2_bufs, ready, empty, tot_smem, y_smem, y2_smem, M, N,
                            programs, total, C, STEPS, STAGES, GROUP_M, TOTAL_SMEM, SPLIT_N, num_warps)),
            (_ws_producer, (x_desc, w_desc, w2_desc, a_bufs, b_bufs, b2_bufs, ready, empty, M, N, programs, total,
                            C * STEPS * BK, STAGES, GROUP_M, SPLIT_N)),
        ], [1], [40])
        for slot in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(slot))
            mbarrier.invalidate(empty.index(slot))


def column_parts(bn: int) -> tuple[int, int]:
    """A tile width as (first part, second part): a power of two is one part (second 0); otherwise the
    largest power of two below it and the rest, which must be a power of two too (192 = 128 + 64)."""
    first = 1 << (bn.bit_length() - 1)
    rest = bn - first
    if rest & (rest - 1) or first > 256 or bn % 16:
        raise ValueError(f"BN={bn}: a Gluon tile is one power of two or the sum of two, a multiple of 16, "
                         f"at most 256 + 128")
    return first, rest


def descriptor(base, shape: list[int], strides: list[int], block: list[int]):
    """A host TMA descriptor of a 2-D tensor (or of a stand-in with its dtype: the compile check's
    MockTensor), in the shared-memory layout the kernel's MMAs read."""
    layout = gl.NVMMASharedLayout.get_default_for(block, getattr(gl, _GL_DTYPES[base.dtype]))
    return TensorDescriptor(base, list(shape), list(strides), block, layout)


def tile_descriptors(x, w, y, bm: int, bn: int, bk: int) -> list:
    """The five TMA descriptors of a launch: x [bm, bk] boxes, the weight's and the output's boxes of each
    column part (`column_parts`; one part repeats its descriptors). x, w, y: (base, shape, strides), the
    base a tensor or a stand-in with its dtype (the compile check's MockTensor)."""
    bn1, bn2 = column_parts(bn)
    wb, yb = [bn1, bk], [bm, bn1]
    w2b, y2b = ([bn2, bk], [bm, bn2]) if bn2 else (wb, yb)
    return [descriptor(*x, [bm, bk]), descriptor(*w, wb), descriptor(*w, w2b), descriptor(*y, yb),
            descriptor(*y, y2b)]


def kernel_call(cfg: dict, descs: list, m: int, n: int, programs: int, chunks: int, k_chunk: int,
                bk: int, options: dict):
    """(kernel, args, kwargs) of one launch (descs: `tile_descriptors`): the one-partition or the
    warp-specialized form, as `cfg` says. `launch` makes it; rlkit/bench/compile_plans.py compiles the
    same call for sm_90."""
    split_n = bool(column_parts(cfg["BN"])[1])
    if split_n and cfg.get("total_in_smem"):
        raise ValueError(f"BN={cfg['BN']}: the running total in shared memory takes a one-part tile")
    kernel = _ordered_chunks_ws_kernel if cfg.get("warp_specialize") else _ordered_chunks_kernel
    kwargs = dict(C=chunks, STEPS=k_chunk // bk, STAGES=cfg["num_stages"], GROUP_M=cfg["GROUP_M"],
                  TOTAL_SMEM=bool(cfg.get("total_in_smem")), SPLIT_N=split_n, num_warps=cfg["num_warps"],
                  **options)
    return kernel, (*descs, m, n, programs), kwargs


def supported(x2: torch.Tensor, w: torch.Tensor, y: torch.Tensor, chunks: int, k_chunk: int, bk: int,
              bm: int) -> bool:
    """What this kernel runs: CUDA tensors (Gluon has no interpreter), bf16/fp16 operands and output,
    TMA-aligned rows, chunks of whole K steps, at least one row tile (a TMA box never exceeds the tensor)."""
    return (AVAILABLE and x2.is_cuda and x2.dtype in _GL_DTYPES and w.dtype == x2.dtype and y.dtype == x2.dtype
            and k_chunk % bk == 0 and k_chunk > 0 and x2.shape[0] >= bm
            and all(t.data_ptr() % 16 == 0 and t.stride(-1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0
                    for t in (x2, w, y)))


def launch(x2: torch.Tensor, w: torch.Tensor, y: torch.Tensor, chunks: int, k_chunk: int, bk: int,
           cfg: dict, sms: int, options: dict):
    """y = x2 @ w.T over `chunks` chunks of `k_chunk`, added in chunk order (contract v5), rounded once to
    y's dtype. `cfg`: BM, BN, num_stages (the ring's slots), GROUP_M, num_warps, and optionally
    programs_per_sm (the persistent grid's programs an SM) and warp_specialize. Returns the compiled kernel
    and the grid."""
    bm, bn = cfg["BM"], cfg["BN"]
    m, n = x2.shape[0], w.shape[0]
    tiles = -(-m // bm) * -(-n // bn)
    grid = (min(tiles, sms * cfg.get("programs_per_sm", 1)),)
    descs = tile_descriptors(*((t, list(t.shape), list(t.stride())) for t in (x2, w, y)), bm, bn, bk)
    kernel, args, kwargs = kernel_call(cfg, descs, m, n, grid[0], chunks, k_chunk, bk, options)
    return kernel[grid](*args, **kwargs), grid
