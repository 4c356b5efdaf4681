"""A recorded call's (iosim.workload.AttentionCall) ledger, from iosim's closed forms and
from its executed schedule: the independent references the workload tests compare the
per-layer traffic tables with."""
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
