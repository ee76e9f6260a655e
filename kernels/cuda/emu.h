// A host emulation of the small part of CUDA that pace's kernels use, so that the kernels'
// own source runs on a machine without a GPU (kernels/tests/cuda_emulated.rs builds
// emu_test.cpp with -DPACE_EMU).
//
// A thread block runs as cooperative fibers (ucontext), one per CUDA thread, scheduled round
// robin on one OS thread; blocks run one after another, so `__shared__` becomes `static`.
// __syncthreads and the warp collectives (shuffles, __syncwarp, mma.sync) are barriers: a fiber
// yields until its block or warp has arrived. The mma emulation gathers the 32 lanes' fragments
// and rebuilds A and B from the PTX ISA's fragment layout of mma.m16n8k16, so a kernel that
// places a fragment element wrongly gives wrong results here too. cp.async is a plain copy.
//
// Not emulated: memory-ordering races between threads (every fiber sees every store at once),
// timing, and anything the kernels do not use.
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <functional>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define PACE_DEVICE inline

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) uint4 {
    uint32_t x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return uint4{x, y, z, w}; }

namespace emu {

struct Fiber {
    ucontext_t ctx;
    dim3 idx;
    unsigned linear = 0;
    bool done = false;
};

struct Warp {
    unsigned arrived = 0;
    unsigned gen = 0;
    alignas(16) unsigned char buf[2][32][64];  // double-buffered: one barrier per collective
    unsigned built = ~0u;                      // collective whose mma operands A, B hold
    float A[16][16], B[16][8];
};

struct State {
    dim3 block_idx, block_dim, grid_dim;
    std::vector<Fiber> fibers;
    std::vector<std::vector<char>> stacks;
    std::vector<Warp> warps;
    Fiber* cur = nullptr;
    ucontext_t sched;
    unsigned bar_arrived = 0, bar_gen = 0;
    unsigned long long progress = 0;
    std::function<void()> body;
};

inline State& st() {
    static State s;
    return s;
}

inline void yield() {
    State& s = st();
    swapcontext(&s.cur->ctx, &s.sched);
}

inline void syncthreads() {
    State& s = st();
    const unsigned gen = s.bar_gen;
    s.progress++;
    if (++s.bar_arrived == s.fibers.size()) {
        s.bar_arrived = 0;
        s.bar_gen++;
        return;
    }
    while (s.bar_gen == gen) yield();
}

inline Warp& warp() { return st().warps[st().cur->linear / 32]; }
inline unsigned lane() { return st().cur->linear % 32; }

inline void warp_barrier(Warp& w) {
    State& s = st();
    const unsigned gen = w.gen;
    s.progress++;
    if (++w.arrived == 32) {  // blocks are whole warps
        w.arrived = 0;
        w.gen++;
        return;
    }
    while (w.gen == gen) yield();
}

inline void syncwarp() { warp_barrier(warp()); }

template <class T>
T shfl_xor(T v, int mask) {
    static_assert(sizeof(T) <= 64, "shuffle payload");
    Warp& w = warp();
    const unsigned slot = w.gen & 1, l = lane();
    memcpy(w.buf[slot][l], &v, sizeof(T));
    warp_barrier(w);
    T r;
    memcpy(&r, w.buf[slot][l ^ (unsigned)mask], sizeof(T));
    return r;
}

inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// IEEE binary16 conversions (round to nearest even), in plain C++ for any host compiler.
inline float half_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0) return (sign ? -1.f : 1.f) * ldexpf((float)mant, -24);
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

inline uint16_t f32_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);   // NaN
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // rounds to infinity
    if (a < 0x38800000u) {                                    // below 2^-14: subnormal or zero
        return (uint16_t)(sign | (uint32_t)nearbyintf(bits_f32(a) * 16777216.f));
    }
    uint32_t h = (((a >> 23) - 112) << 10) | ((a & 0x7fffffu) >> 13);
    const uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) ++h;
    return (uint16_t)(sign | h);
}

inline float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: every lane deposits its fragments, then
// each lane computes its four accumulators from the rebuilt matrices.
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bool f16) {
    struct Regs {
        uint32_t a[4], b[2];
    };
    Warp& w = warp();
    const unsigned slot = w.gen & 1, l = lane();
    Regs mine = {{a[0], a[1], a[2], a[3]}, {b0, b1}};
    memcpy(w.buf[slot][l], &mine, sizeof(Regs));
    warp_barrier(w);
    if (w.built != w.gen) {  // the first lane past the barrier rebuilds A and B for all
        w.built = w.gen;
        auto cvt = [f16](uint32_t v) { return f16 ? half_to_f32((uint16_t)v) : bf16_to_f32((uint16_t)v); };
        for (int ln = 0; ln < 32; ++ln) {
            Regs r;
            memcpy(&r, w.buf[slot][ln], sizeof(Regs));
            const int g = ln / 4, t = ln % 4;
            const int rows[4] = {g, g + 8, g, g + 8};
            const int cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
            for (int i = 0; i < 4; ++i) {
                w.A[rows[i]][cols[i]] = cvt(r.a[i] & 0xffff);
                w.A[rows[i]][cols[i] + 1] = cvt(r.a[i] >> 16);
            }
            w.B[2 * t][g] = cvt(r.b[0] & 0xffff);
            w.B[2 * t + 1][g] = cvt(r.b[0] >> 16);
            w.B[2 * t + 8][g] = cvt(r.b[1] & 0xffff);
            w.B[2 * t + 9][g] = cvt(r.b[1] >> 16);
        }
    }
    const int g = (int)l / 4, t = (int)l % 4;
    for (int i = 0; i < 4; ++i) {
        const int row = g + (i / 2) * 8, col = 2 * t + (i & 1);
        float acc = 0.f;
        for (int k = 0; k < 16; ++k) acc += w.A[row][k] * w.B[k][col];
        d[i] += acc;
    }
}

inline void trampoline() {
    State& s = st();
    s.body();
    s.cur->done = true;
}

// Runs `body` as a kernel over `grid` x `block`.
inline void launch(dim3 grid, dim3 block, std::function<void()> body) {
    State& s = st();
    const unsigned n = block.x * block.y * block.z;
    s.grid_dim = grid;
    s.block_dim = block;
    s.body = std::move(body);
    s.stacks.resize(n);
    for (auto& stk : s.stacks) stk.resize(256 * 1024);
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                s.block_idx = dim3(bx, by, bz);
                s.fibers.assign(n, Fiber());
                s.warps.assign((n + 31) / 32, Warp());
                s.bar_arrived = 0;
                for (unsigned i = 0; i < n; ++i) {
                    Fiber& f = s.fibers[i];
                    f.linear = i;
                    f.idx = dim3(i % block.x, (i / block.x) % block.y, i / (block.x * block.y));
                    getcontext(&f.ctx);
                    f.ctx.uc_stack.ss_sp = s.stacks[i].data();
                    f.ctx.uc_stack.ss_size = s.stacks[i].size();
                    f.ctx.uc_link = &s.sched;
                    makecontext(&f.ctx, trampoline, 0);
                }
                unsigned long long idle_rounds = 0;
                for (bool live = true; live;) {
                    live = false;
                    const unsigned long long before = s.progress;
                    for (auto& f : s.fibers) {
                        if (f.done) continue;
                        s.cur = &f;
                        swapcontext(&s.sched, &f.ctx);
                        if (!f.done) live = true;
                        else s.progress++;
                    }
                    idle_rounds = s.progress == before ? idle_rounds + 1 : 0;
                    if (live && idle_rounds > 1000) {
                        fprintf(stderr, "emu: deadlock in block (%u,%u,%u)\n", bx, by, bz);
                        abort();
                    }
                }
            }
}

}  // namespace emu

#define threadIdx (::emu::st().cur->idx)
#define blockIdx (::emu::st().block_idx)
#define blockDim (::emu::st().block_dim)
#define gridDim (::emu::st().grid_dim)
#define __syncthreads() ::emu::syncthreads()
#define __syncwarp(...) ::emu::syncwarp()
#define __shfl_xor_sync(mask, v, m) ::emu::shfl_xor((v), (m))
