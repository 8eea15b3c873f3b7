// moonmoe/backend/cpu/cpu_features.hpp: the vector instructions of the CPU this process runs on, detected once at
// run time, so that a binary built for any x86-64 CPU can still take an AVX-512 kernel where the CPU has one.
//
// An instruction set counts only if the CPU has it (CPUID) and the operating system saves its registers on a
// context switch (OSXSAVE, then XGETBV's XCR0): AVX needs the SSE and AVX state (XCR0 bits 1-2), AVX-512 also the
// opmask and the upper ZMM state (bits 5-7), AMX the tile configuration and data (bits 17-18; Linux also asks each
// process to request the tile data first: gemm_amx.hpp). Intel 64 and IA-32 Architectures Software Developer's Manual,
// vol. 1, sections 14.3 (AVX) and 15.2 (AVX-512).
//
// Kernels chosen from these flags are compiled with function target attributes (gemm_small.hpp), not with the
// compiler's -m flags, so the rest of the program keeps the instruction set the build chose. On one machine the
// choice never changes, so results stay bitwise repeatable there.
#pragma once

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define MOONMOE_CPU_X86_DISPATCH 1
#include <cpuid.h>
#else
#define MOONMOE_CPU_X86_DISPATCH 0
#endif

namespace moonmoe::backend::cpu_detail {

/// What the running CPU and operating system support (all false off x86 or with other compilers), and which CPU it
/// is: CPUID's vendor string and its display family and model (Intel SDM vol. 2A, CPUID leaf 01H), e.g.
/// "GenuineIntel", 6, 207 for an Emerald Rapids Xeon; "", 0, 0 where unknown.
struct CpuFeatures {
    bool avx2 = false;
    bool fma = false;
    bool avx512f = false;
    bool avx512bw = false;
    bool avx512_bf16 = false;  // VDPBF16PS and the bf16 conversions on AVX-512 registers
    bool amx_bf16 = false;     // AMX-TILE and AMX-BF16, their tile state enabled in XCR0 (bits 17-18)
    char vendor[13] = {};
    unsigned family = 0, model = 0;
};

/// Queries CPUID and XCR0 (a few hundred cycles); cpu_features() caches the answer.
inline CpuFeatures detect_cpu_features() noexcept {
    CpuFeatures f;
#if MOONMOE_CPU_X86_DISPATCH
    unsigned r[4] = {};  // eax, ebx, ecx, edx
    const unsigned max_leaf = __get_cpuid_max(0, nullptr);
    if (max_leaf == 0) return f;
    __cpuid_count(0, 0, r[0], r[1], r[2], r[3]);
    for (int i = 0; i < 4; ++i) {  // the vendor string is EBX, EDX, ECX
        f.vendor[i] = char(r[1] >> (8 * i));
        f.vendor[4 + i] = char(r[3] >> (8 * i));
        f.vendor[8 + i] = char(r[2] >> (8 * i));
    }
    __cpuid_count(1, 0, r[0], r[1], r[2], r[3]);
    const unsigned base_family = (r[0] >> 8) & 0xfu, base_model = (r[0] >> 4) & 0xfu;
    f.family = base_family == 0xfu ? base_family + ((r[0] >> 20) & 0xffu) : base_family;
    f.model = base_family == 0x6u || base_family == 0xfu ? (((r[0] >> 16) & 0xfu) << 4) + base_model : base_model;
    if (max_leaf < 7) return f;
    const bool osxsave = (r[2] >> 27) & 1u, avx = (r[2] >> 28) & 1u, fma = (r[2] >> 12) & 1u;
    if (!osxsave || !avx) return f;
    unsigned xcr0 = 0;  // low half of XCR0; _xgetbv would need -mxsave
    __asm__ volatile("xgetbv" : "=a"(xcr0) : "c"(0u) : "edx");
    const bool ymm_state = (xcr0 & 0x06u) == 0x06u;  // SSE + AVX state
    const bool zmm_state = (xcr0 & 0xe6u) == 0xe6u;  // + opmask, ZMM0-15 upper halves, ZMM16-31
    __cpuid_count(7, 0, r[0], r[1], r[2], r[3]);
    const unsigned leaf7_subleaves = r[0];
    f.fma = ymm_state && fma;
    f.avx2 = ymm_state && ((r[1] >> 5) & 1u);
    f.avx512f = zmm_state && ((r[1] >> 16) & 1u);
    f.avx512bw = f.avx512f && ((r[1] >> 30) & 1u);
    const bool tile_state = (xcr0 & 0x60000u) == 0x60000u;                  // XTILECFG, XTILEDATA
    f.amx_bf16 = tile_state && ((r[3] >> 22) & 1u) && ((r[3] >> 24) & 1u);  // EDX: AMX-BF16, AMX-TILE
    if (leaf7_subleaves >= 1) {
        __cpuid_count(7, 1, r[0], r[1], r[2], r[3]);
        f.avx512_bf16 = f.avx512f && ((r[0] >> 5) & 1u);  // EAX bit 5: AVX512_BF16
    }
#endif
    return f;
}

/// The running CPU's features, detected on first use (thread-safe) and fixed for the life of the process.
inline const CpuFeatures& cpu_features() noexcept {
    static const CpuFeatures features = detect_cpu_features();
    return features;
}

}  // namespace moonmoe::backend::cpu_detail
