// SPILLWAY_HD: marks a function body that both g++ (cpu backend) and nvcc (cuda backend) compile.
// Elementwise math lives in such bodies so the CPU tests exercise the code the GPU runs.
#pragma once

#if defined(__CUDACC__)
#define SPILLWAY_HD __host__ __device__
#else
#define SPILLWAY_HD
#endif
