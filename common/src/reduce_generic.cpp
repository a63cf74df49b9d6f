// Portable kernels: whatever the baseline x86-64 (SSE2) or other target gives.
#define HOPWISE_ISA generic
#include "reduce_kernels.inc"
