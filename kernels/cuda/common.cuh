// Shared definitions of pace's CUDA kernels: element types, 16-byte chunks, warp reductions and
// the few PTX instructions the kernels use (tensor-core mma, cp.async).
//
// The same sources also compile as host C++ with -DPACE_EMU (emu.h), which runs a thread block
// as cooperative fibers, so the kernels' indexing and numerics are tested on machines without a
// GPU (kernels/tests/cuda_emulated.rs).
#pragma once

#ifdef PACE_EMU
#include "emu.h"
#else
#include <stdint.h>
#define PACE_DEVICE __device__ __forceinline__
#endif

namespace pace {

// Kernel-argument structs. Their layout is mirrored by #[repr(C)] structs in kernels/src/cuda.rs:
// pointers first (8 bytes each), then 4-byte fields; the sizes are checked on both sides.
struct AttnParams {
    const void* q;                 // [tokens, heads, head_dim], q dtype
    void* out;                     // [tokens, heads, head_dim], q dtype
    const void* k_cache;           // [num_blocks, kv_heads, block_size, head_dim]
    const void* v_cache;
    const uint32_t* block_tables;  // [num_seqs, max_blocks]
    const uint32_t* context_lens;  // [num_seqs]
    const uint32_t* cu_seqlens_q;  // [num_seqs + 1]
    const uint32_t* work;          // kernel-specific pairs, see attention.cu / attention_mma.cu
    float* part_out;               // split-K partial outputs [work, heads, parts, head_dim]
    float* part_ml;                // split-K partial (max, sum) [work, heads, parts, 2]
    uint32_t num_work;
    uint32_t num_heads;
    uint32_t kv_heads;
    uint32_t block_size;
    uint32_t max_blocks;
    uint32_t num_parts;            // partitions per query (1: no split)
    uint32_t part_size;            // keys per partition, a multiple of 128
    uint32_t head_dim;
    uint32_t pad_;
    float scale_log2;              // softmax scale times log2(e): scores live in the log2 domain
};
static_assert(sizeof(AttnParams) == 10 * 8 + 10 * 4, "AttnParams layout");

struct CacheParams {
    const void* kv;                // [tokens, kv_heads, head_dim], cache dtype
    void* cache;                   // [num_blocks, kv_heads, block_size, head_dim]
    const uint32_t* slots;         // [tokens]
    uint32_t num_tokens;
    uint32_t kv_heads;
    uint32_t head_dim;
    uint32_t block_size;
    uint32_t num_slots;            // num_blocks * block_size: slots at or past it are skipped
    uint32_t pad_;
};
static_assert(sizeof(CacheParams) == 3 * 8 + 6 * 4, "CacheParams layout");

PACE_DEVICE uint32_t umin(uint32_t a, uint32_t b) { return a < b ? a : b; }

PACE_DEVICE float bits_to_f32(uint32_t u) {
#ifdef PACE_EMU
    float f;
    memcpy(&f, &u, 4);
    return f;
#else
    return __uint_as_float(u);
#endif
}

PACE_DEVICE uint32_t f32_to_bits(float f) {
#ifdef PACE_EMU
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#else
    return __float_as_uint(f);
#endif
}

// Element types. `T` is the storage type; conversions go through f32.
struct F32 {
    typedef float T;
    PACE_DEVICE static float to_f32(T x) { return x; }
    PACE_DEVICE static T from_f32(float x) { return x; }
};

struct BF16 {
    typedef uint16_t T;
    PACE_DEVICE static float to_f32(T x) { return bits_to_f32((uint32_t)x << 16); }
    // Round to nearest even; NaN stays NaN.
    PACE_DEVICE static T from_f32(float f) {
        uint32_t u = f32_to_bits(f);
        if ((u & 0x7fffffffu) > 0x7f800000u) return (T)((u >> 16) | 0x40u);
        u += 0x7fffu + ((u >> 16) & 1u);
        return (T)(u >> 16);
    }
};

struct F16 {
    typedef uint16_t T;
    PACE_DEVICE static float to_f32(T x) {
#ifdef PACE_EMU
        return emu::half_to_f32(x);
#else
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
        return f;
#endif
    }
    PACE_DEVICE static T from_f32(float f) {
#ifdef PACE_EMU
        return emu::f32_to_half(f);
#else
        T h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
#endif
    }
};

// Elements of type E in one 16-byte chunk.
template <class E>
struct Chunk {
    static constexpr int N = 16 / (int)sizeof(typename E::T);
    // Unpacks a chunk to f32, element i to out[i].
    PACE_DEVICE static void unpack(const uint4& c, float* out) {
        const uint32_t w[4] = {c.x, c.y, c.z, c.w};
        if (sizeof(typename E::T) == 4) {
#pragma unroll
            for (int i = 0; i < 4; ++i) out[i] = bits_to_f32(w[i]);
        } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                out[2 * i] = E::to_f32((typename E::T)(w[i] & 0xffffu));
                out[2 * i + 1] = E::to_f32((typename E::T)(w[i] >> 16));
            }
        }
    }
};

// Two 16-bit elements packed in one 32-bit register, `lo` at the lower address.
template <class E>
PACE_DEVICE uint32_t pack2(float lo, float hi) {
    return (uint32_t)E::from_f32(lo) | ((uint32_t)E::from_f32(hi) << 16);
}

PACE_DEVICE float warp_max(float v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
    return v;
}

PACE_DEVICE float warp_sum(float v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

// D (16x8, f32) += A (16x16, row-major) * B (16x8, column-major), A and B in E (f16 or bf16).
// Fragments (lane = 4 * group + t):
//   A: a0 = A[group][2t..2t+1], a1 = A[group+8][2t..2t+1], a2 = A[group][2t+8..2t+9],
//      a3 = A[group+8][2t+8..2t+9];
//   B: b0 = B[2t..2t+1][group], b1 = B[2t+8..2t+9][group];
//   D: d0, d1 = D[group][2t..2t+1], d2, d3 = D[group+8][2t..2t+1].
template <class E>
PACE_DEVICE void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
PACE_DEVICE void mma_16816<BF16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef PACE_EMU
    emu::mma_16816(d, a, b0, b1, false);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

template <>
PACE_DEVICE void mma_16816<F16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef PACE_EMU
    emu::mma_16816(d, a, b0, b1, true);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Asynchronous 16-byte global-to-shared copy (sm_80+), completed by cp_async_wait.
PACE_DEVICE void cp_async16(void* smem, const void* gmem) {
#ifdef PACE_EMU
    memcpy(smem, gmem, 16);
#else
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
#endif
}

PACE_DEVICE void cp_async_commit() {
#ifndef PACE_EMU
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Waits until at most N committed groups are still in flight.
template <int N>
PACE_DEVICE void cp_async_wait() {
#ifndef PACE_EMU
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

}  // namespace pace
