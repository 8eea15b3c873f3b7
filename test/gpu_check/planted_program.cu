// A stand-in for a GPU program in test/gpu_check/self_test.sh: `tools/gpu_check.sh device` rebuilds a binary that
// will not load from its manifest line with nvcc, and this is the unit that rebuild compiles. Host code only, so it
// runs where there is no GPU.
#include <cstdio>

int main() {
    std::printf("ok   planted program rebuilt and run\n");
    return 0;
}
