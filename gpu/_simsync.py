"""An event-driven thread-block scheduler for Numba's CUDA simulator (its speed only).

The simulator runs every CUDA thread of a block as a Python thread; its BlockManager finds
out that all of them have reached `syncthreads()` by polling them in a busy loop on the
main thread. That loop competes for the GIL with the simulated threads, and loses whole
switch intervals (5 ms) to them at every barrier: most of the test suite's simulator time.

`install()` replaces the polling with a condition variable: a thread that blocks in
`syncthreads()` or finishes notifies the manager, which then applies exactly the rules of
the original loop (release the block when every live thread is blocked; re-raise the
first thread exception after aborting the others). What a kernel computes and which
kernels the simulator accepts are unchanged; only the waiting is. The patch applies to the
numba-cuda versions whose simulator has the structure it replaces (checked), else it is
a no-op; FLASHSIM_SIM_POLL=1 keeps the original scheduler. `gpu._env.use_backend`
installs it wherever the kernels run in the simulator (a small example that ran for
minutes under the polling loop runs in seconds).
"""
import os
import threading


def install():
    if os.environ.get("FLASHSIM_SIM_POLL") == "1":
        return False
    try:
        from numba.cuda.simulator import kernel as K
    except ImportError:
        return False
    BT, BM = getattr(K, "BlockThread", None), getattr(K, "BlockManager", None)
    if BT is None or BM is None or getattr(BM, "_flashsim_event_driven", False):
        return False
    if not all(hasattr(BT, a) for a in ("syncthreads", "run")) or not hasattr(BM, "run"):
        return False
    orig_thread_run = BT.run

    def _cond(thread):
        return thread._manager._flashsim_cond

    def syncthreads(self):
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads call")
        cond = _cond(self)
        with cond:
            self.syncthreads_blocked = True
            cond.notify()
        self.syncthreads_event.wait()
        self.syncthreads_event.clear()
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads clear")

    def thread_run(self):
        try:
            orig_thread_run(self)       # sets self.exception on an exception
        finally:
            cond = _cond(self)
            with cond:
                self._flashsim_done = True
                cond.notify()

    def manager_run(self, grid_point, *args):
        self._flashsim_cond = cond = threading.Condition()
        threads = []
        for block_point in K.np.ndindex(*self._block_dim):

            def target():
                self._f(*args)

            t = BT(target, self, grid_point, block_point, self._debug)
            t._flashsim_done = False
            threads.append(t)
        for t in threads:
            t.start()
        with cond:
            while True:
                live = [t for t in threads if not t._flashsim_done]
                for t in threads:
                    if t.exception:
                        for o in threads:   # abort all others, as the original does
                            o.abort = True
                            o.syncthreads_blocked = False
                            o.syncthreads_event.set()
                        raise t.exception[0].with_traceback(t.exception[1])
                if not live:
                    break
                if all(t.syncthreads_blocked for t in live):
                    for t in live:
                        t.syncthreads_blocked = False
                        t.syncthreads_event.set()
                    continue
                cond.wait()
        for t in threads:
            t.join()

    BT.syncthreads = syncthreads
    BT.run = thread_run
    BM.run = manager_run
    BM._flashsim_event_driven = True
    return True
