"""Contract v6's TP chain in one process (shared by the CPU, interpreter and GPU tests)."""


def ranks_in_turn(chain_partial, x, w, contract, tp: int):
    """What `tp` ranks of a row-parallel layer hold at the end of the chained merge, the ranks run one
    after another here: rank r's K slice (`chain_partial`: the reference or `gemm.strict_chain_partial`)
    continues the running fp32 sum of the ranks before it; the last rank's sum is returned, unrounded."""
    width = w.shape[1] // tp
    total = None
    for s in range(0, w.shape[1], width):
        total = chain_partial(x[:, s : s + width], w[:, s : s + width], contract, total, shards=tp)
    return total
