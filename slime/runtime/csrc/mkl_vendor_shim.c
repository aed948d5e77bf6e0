/* Preloaded (LD_PRELOAD) into slime-rl's torch processes on x86 CPUs not made by Intel: see
   slime/runtime/mkl_vendor.py. Intel MKL asks this function whether the CPU is Intel's before it
   looks at the CPU's instruction sets; answering yes lets it pick its kernels by those (CPUID
   feature bits), e.g. AVX-512 on an AMD Zen 4/5, instead of its generic path for other vendors. */
int mkl_serv_intel_cpu_true(void) { return 1; }
