# Sourced by the device scripts (scripts/*.sh), from the repository root:
#   . scripts/_wheel_env.sh || exit 1
# numba-cuda 0.30.4 cannot compile kernels on numpy >= 2.5, so a numpy<2.5 wheel carried in
# .whl/ is installed into /tmp/site and put first on PYTHONPATH, then the repository root.
# Without a wheel in .whl/: the repository root only (the machine's numpy must then be
# < 2.5). Returns 1, and the caller exits, where the wheel does not install.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || return 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
