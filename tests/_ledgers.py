"""A recorded call's (iosim.workload.AttentionCall) ledger, from iosim's closed forms and
from its executed schedule, and their sum per layer: the independent references the
workload tests compare the per-layer traffic tables with."""
import iosim
from iosim import Tiling
from iosim.backward import backward_closed_form, execute_backward
from iosim.decode import DecodeProblem, decode_closed_form, execute_decode


def closed(call):
    """The call's closed-form ledger (decode, varlen, forward or backward)."""
    p = call.problem
    if isinstance(p, DecodeProblem):
        return decode_closed_form(call.algorithm, p, num_splits=call.num_splits,
                                  kv_reads=call.kv_reads)
    if isinstance(p, iosim.VarlenProblem):
        if call.backward:
            return iosim.varlen_backward_closed_form(p, Tiling(*call.tiling))
        return iosim.varlen_closed_form(call.algorithm, p, Tiling(*call.tiling))
    f = backward_closed_form if call.backward else iosim.closed_form
    return f(call.algorithm, p, Tiling(*call.tiling))


def executed(call):
    """The ledger of the call's schedule executed through the counting memory (decode,
    forward or backward)."""
    p = call.problem
    if isinstance(p, DecodeProblem):
        return execute_decode(call.algorithm, p, num_splits=call.num_splits,
                              kv_reads=call.kv_reads).ledger
    if call.backward:
        return execute_backward(call.algorithm, p, Tiling(*call.tiling)).ledger
    return iosim.execute(call.algorithm, p, Tiling(*call.tiling)).ledger


def bytes_by_layer(calls, ledger_of, step, backward=False):
    """{layer: ({tensor: read bytes}, {tensor: write bytes})} summed over the calls of one
    step and direction, each call's ledger from `ledger_of` (closed or executed)."""
    out = {}
    for c in calls:
        if c.step != step or c.backward != backward:
            continue
        led = ledger_of(c)
        rd, wr = out.setdefault(c.layer, ({}, {}))
        for t in led.tensors():
            rd[t] = rd.get(t, 0) + led.read_bytes_of(t)
            wr[t] = wr.get(t, 0) + led.write_bytes_of(t)
    return out
