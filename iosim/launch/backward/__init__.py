"""Launch geometry of the backward kernels, one module per `gpu.backward` kernel module of
the same name (no Numba): thread and shared-memory layouts, plan errors, default tilings."""
