// Paged attention on tensor cores, for prefill chunks (f16 and bf16 caches), FlashAttention-2
// style: a thread block takes 64 query rows of one sequence and one KV head, streams that
// sequence's keys and values through shared memory in tiles of 32 (double-buffered cp.async
// copies gathered through the block table) and keeps the softmax online in f32 registers.
//
// Rows are (query token, query head of the KV head's group) pairs, token-major: row r of a
// sequence is token r / group, head r % group. So grouped-query heads share every K/V tile, and
// a tile of 64 rows spans 64 / group tokens. Row r sees keys 0 ..= its token's position (causal
// inside the chunk); keys at or past the last row's position are never loaded (zeros are stored
// instead, so no NaN from an unused slot can reach the products).
//
// Work items (`p.work`) are pairs (sequence, first row of the tile). Grid: (work items,
// kv_heads); block: 128 threads (4 warps of 16 rows each). Each warp computes S = Q K^T and
// O += P V with mma.sync.m16n8k16 (f32 accumulators); fragments are read from shared memory
// rows padded by 16 bytes, which makes those reads free of bank conflicts.
#include "common.cuh"

namespace pace {

constexpr int MMA_THREADS = 128;
constexpr int BLOCK_M = 64;  // query rows per block
constexpr int BLOCK_N = 32;  // keys per tile

// Two consecutive elements of a query row, as the packed pair an mma A fragment wants.
template <class Q, class C>
PACE_DEVICE uint32_t load_pair(const typename Q::T* ptr) {
    if (sizeof(typename Q::T) == 4) {
        const float2 v = *reinterpret_cast<const float2*>(ptr);
        return pack2<C>(v.x, v.y);
    } else {
        return *reinterpret_cast<const uint32_t*>(ptr);
    }
}

template <class Q>
PACE_DEVICE void store_pair(typename Q::T* ptr, float a, float b) {
    if (sizeof(typename Q::T) == 4) {
        float2 v;
        v.x = a;
        v.y = b;
        *reinterpret_cast<float2*>(ptr) = v;
    } else {
        *reinterpret_cast<uint32_t*>(ptr) = pack2<Q>(a, b);
    }
}

template <class C, class Q, int D>
PACE_DEVICE void attend_mma(const AttnParams& p) {
    typedef typename C::T CT;
    typedef typename Q::T QT;
    static_assert(sizeof(CT) == 2, "tensor-core attention needs a 16-bit cache");
    constexpr int SROW = D + 8;   // shared-memory row, elements
    constexpr int KS = D / 16;    // k-steps of Q K^T
    constexpr int DT = D / 8;     // n-tiles of P V
    constexpr int CPR = D / 8;    // 16-byte chunks per key row
    constexpr int NT = BLOCK_N / 8;

    __shared__ __align__(16) CT k_s[2][BLOCK_N * SROW];
    __shared__ __align__(16) CT v_s[2][BLOCK_N * SROW];

    const uint32_t seq = p.work[2 * blockIdx.x], row0 = p.work[2 * blockIdx.x + 1];
    const uint32_t g = blockIdx.y;
    const uint32_t group = p.num_heads / p.kv_heads;
    const uint32_t ctx = p.context_lens[seq];
    const uint32_t q0 = p.cu_seqlens_q[seq];
    const uint32_t qlen = p.cu_seqlens_q[seq + 1] - q0;
    const uint32_t rows = qlen * group;
    const uint32_t first = ctx - qlen;  // position of the chunk's first token
    const uint32_t last_row = umin(row0 + BLOCK_M, rows) - 1;
    const uint32_t limit = first + last_row / group + 1;      // keys some row of the block sees
    const uint32_t min_visible = first + row0 / group + 1;    // keys every row of the block sees

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int grp = lane / 4, t4 = lane % 4;

    // This thread's two rows: grp and grp + 8 of the warp's 16.
    uint32_t vis[2];
    bool valid[2];
    size_t qoff[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const uint32_t r = row0 + warp * 16 + grp + i * 8;
        valid[i] = r < rows;
        const uint32_t tok = valid[i] ? r / group : 0, hh = valid[i] ? r % group : 0;
        vis[i] = valid[i] ? first + tok + 1 : 1;
        qoff[i] = ((size_t)(q0 + tok) * p.num_heads + g * group + hh) * D;
    }
    const QT* qbase = static_cast<const QT*>(p.q);
    uint32_t qa[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int col = ks * 16 + half * 8 + t4 * 2;
                qa[ks][i + 2 * half] = valid[i] ? load_pair<Q, C>(qbase + qoff[i] + col) : 0u;
            }
        }
    }

    const CT* kc = static_cast<const CT*>(p.k_cache);
    const CT* vc = static_cast<const CT*>(p.v_cache);
    const uint32_t* table = p.block_tables + (size_t)seq * p.max_blocks;
    const uint32_t bs = p.block_size, kvh = p.kv_heads;

    // Loads keys base .. base + BLOCK_N - 1 into stage `st` (zeros past `limit`).
    auto load_tile = [&](int st, uint32_t base) {
        for (int i = tid; i < BLOCK_N * CPR; i += MMA_THREADS) {
            const int r = i / CPR, c = i % CPR;
            const uint32_t j = base + r;
            CT* kd = &k_s[st][r * SROW + c * 8];
            CT* vd = &v_s[st][r * SROW + c * 8];
            if (j < limit) {
                const size_t off = (((size_t)table[j / bs] * kvh + g) * bs + j % bs) * D + c * 8;
                cp_async16(kd, kc + off);
                cp_async16(vd, vc + off);
            } else {
                *reinterpret_cast<uint4*>(kd) = make_uint4(0, 0, 0, 0);
                *reinterpret_cast<uint4*>(vd) = make_uint4(0, 0, 0, 0);
            }
        }
        cp_async_commit();
    };

    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
    float m_i[2] = {-INFINITY, -INFINITY}, l_i[2] = {0.f, 0.f};

    const uint32_t ntiles = (limit + BLOCK_N - 1) / BLOCK_N;
    load_tile(0, 0);
    for (uint32_t t = 0; t < ntiles; ++t) {
        const int st = t & 1;
        if (t + 1 < ntiles) {
            load_tile(st ^ 1, (t + 1) * BLOCK_N);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const uint32_t base = t * BLOCK_N;

        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
        const CT* ks_ = k_s[st];
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const CT* kr = ks_ + (nt * 8 + grp) * SROW + ks * 16 + t4 * 2;
                mma_16816<C>(s[nt], qa[ks], *reinterpret_cast<const uint32_t*>(kr),
                             *reinterpret_cast<const uint32_t*>(kr + 8));
            }
        }

        // Scale, causal mask, online softmax (rows grp and grp + 8; a row's 4 lanes reduce).
        const bool masked = base + BLOCK_N > min_visible;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const uint32_t j = base + nt * 8 + t4 * 2 + (e & 1);
                float x = s[nt][e] * p.scale_log2;
                if (masked && j >= vis[e / 2]) x = -INFINITY;
                s[nt][e] = x;
                mx[e / 2] = fmaxf(mx[e / 2], x);
            }
        }
        float corr[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            const float m_new = fmaxf(m_i[i], mx[i]);  // finite: key 0 is visible to every row
            corr[i] = exp2f(m_i[i] - m_new);
            m_i[i] = m_new;
            l_i[i] *= corr[i];
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[nt][e] = exp2f(s[nt][e] - m_i[e / 2]);
                l_i[e / 2] += s[nt][e];
            }
        }
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
            o[dt][0] *= corr[0];
            o[dt][1] *= corr[0];
            o[dt][2] *= corr[1];
            o[dt][3] *= corr[1];
        }

        // O += P V. The S accumulators of n-tiles 2kk and 2kk + 1 are the A fragment of k-step kk.
        const CT* vs_ = v_s[st];
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
            const uint32_t pa[4] = {pack2<C>(s[2 * kk][0], s[2 * kk][1]), pack2<C>(s[2 * kk][2], s[2 * kk][3]),
                                    pack2<C>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                    pack2<C>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                const CT* vr = vs_ + (kk * 16 + t4 * 2) * SROW + dt * 8 + grp;
                const uint32_t b0 = (uint32_t)vr[0] | ((uint32_t)vr[SROW] << 16);
                const uint32_t b1 = (uint32_t)vr[8 * SROW] | ((uint32_t)vr[9 * SROW] << 16);
                mma_16816<C>(o[dt], pa, b0, b1);
            }
        }
        __syncthreads();  // the stage just read is the next iteration's load target
    }

    QT* obase = static_cast<QT*>(p.out);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l_i[i] += __shfl_xor_sync(0xffffffffu, l_i[i], 1);
        l_i[i] += __shfl_xor_sync(0xffffffffu, l_i[i], 2);
        if (valid[i]) {
            const float inv = 1.f / l_i[i];
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                store_pair<Q>(obase + qoff[i] + dt * 8 + t4 * 2, o[dt][2 * i] * inv, o[dt][2 * i + 1] * inv);
            }
        }
    }
}

}  // namespace pace

#define PACE_MMA(C, Q, D, NAME)                                                            \
    extern "C" __global__ void __launch_bounds__(pace::MMA_THREADS) NAME(const pace::AttnParams p) { \
        pace::attend_mma<pace::C, pace::Q, D>(p);                                          \
    }

// pa_mma_{cache dtype}_{q dtype}_{head_dim}: q (and the output) in f32 or the cache's dtype.
PACE_MMA(F16, F16, 64, pa_mma_f16_f16_64)
PACE_MMA(F16, F16, 128, pa_mma_f16_f16_128)
PACE_MMA(F16, F32, 64, pa_mma_f16_f32_64)
PACE_MMA(F16, F32, 128, pa_mma_f16_f32_128)
PACE_MMA(BF16, BF16, 64, pa_mma_bf16_bf16_64)
PACE_MMA(BF16, BF16, 128, pa_mma_bf16_bf16_128)
PACE_MMA(BF16, F32, 64, pa_mma_bf16_f32_64)
PACE_MMA(BF16, F32, 128, pa_mma_bf16_f32_128)
