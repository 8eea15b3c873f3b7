// The checks of the GPU programs in test/nvcc/ that have a main of their own (nccl_run.cu, sticky_fault.cu): a line
// "ok" or "FAIL" per check, and the number of failures for the exit status (tools/gpu_check.sh reads both).
#pragma once

#include <cstdio>
#include <string>

namespace test_support {

inline int failures = 0;

inline void expect(bool ok, const std::string& what) {
    std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
    failures += ok ? 0 : 1;
}

}  // namespace test_support
