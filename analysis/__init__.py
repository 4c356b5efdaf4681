"""analysis: experiments over the iosim model and the gpu kernels (theory checks, sweeps,
figures, benchmarks) and the `flashsim` command line."""
