"""Launch geometry of the forward kernels, one module per `gpu.forward` kernel module of
the same name (no Numba): thread and shared-memory layouts, plan errors, default tilings."""
