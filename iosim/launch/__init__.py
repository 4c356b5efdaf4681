"""Launch plans: what each kernel of `gpu` needs to launch (tiling rule, threads, shared
memory, registers), as data the model reads without importing `gpu`."""
from .plan import (LOCAL, REGISTERS, SPILLS, Launch, Plan, kernel_plan, local_of,  # noqa: F401
                   occupancy)
