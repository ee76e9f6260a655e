// Paged attention on CUDA cores: one query token at a time, every KV layout and dtype.
//
// A thread block attends one query token to the keys of one partition of its context, for the
// query heads of one KV head (up to GMAX = 4 or 8 of them at once, so each key and value row is
// read from memory once per group). Scores and the softmax are f32 in the log2 domain, with the running
// maximum and sum updated per tile of 32 keys (online softmax): nothing is sized by the context.
//
// Work items (`p.work`) are pairs (query token, its sequence). Query token `tok` of sequence `s`
// sits at position `context_lens[s] - qlen + (tok - cu_seqlens_q[s])` and sees the keys up to
// and including its own position (causal inside a prefill chunk).
//
// Grid: (work items, kv_heads * head chunks, partitions); block: 128 threads (4 warps). Each warp
// takes every fourth tile of 32 keys of the partition:
//   scores:  4 lanes per key (8 keys per round), each lane a quarter of the key's 16-byte chunks,
//            dot products reduced over the 4 lanes;
//   softmax: lane i owns key i of the tile;
//   values:  head_dim / 8 lanes per key (16-byte loads), each lane 8 output dimensions per head.
// The four warps' (max, sum, output) are merged through shared memory at the end. With one
// partition the block writes the normalised output; with several (split-K, long contexts) it
// writes its partial output and (max, sum), and pa_reduce merges the partitions.
//
// Keys at or past a query's visible length are never loaded (their slots may hold anything,
// NaN included).
#include "common.cuh"

namespace pace {

constexpr int SIMT_WARPS = 4;
constexpr int SIMT_THREADS = 32 * SIMT_WARPS;
constexpr int TILE = 32;          // keys per warp step
constexpr int MAX_PARTS = 1024;   // partitions the reduce kernel can merge
// Blocks of SIMT_THREADS each SM should keep resident (__launch_bounds__' second argument, which
// caps registers at 65536 / (128 x blocks)). Decode attention waits on memory, so more resident
// warps hide more latency. Each value is the most ptxas fits without spilling for sm_80/sm_90
// (the build records registers and spills: kernels/build.rs, -Xptxas -v): a bf16 cache with up
// to 4 heads per KV head (Llama-3's 4:1 GQA) fits 80 registers, 6 blocks, on sm_90 (5 on
// sm_80); f16 fits 5; wider groups (g8) need about 145 registers, 3 blocks. f32 caches (for
// checks, not speed) spill under any bound with g4, so they have none.
template <class C, int G>
struct SimtOccupancy {
    static constexpr int blocks = G <= 4 ? 5 : 3;
};
template <int G>
struct SimtOccupancy<BF16, G> {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    static constexpr int blocks = G <= 4 ? 6 : 3;
#else
    static constexpr int blocks = G <= 4 ? 5 : 3;
#endif
};
template <int G>
struct SimtOccupancy<F32, G> {
    static constexpr int blocks = G <= 4 ? 1 : 3;
};
constexpr uint32_t FULL = 0xffffffffu;

struct Query {
    uint32_t tok, seq, visible;
};

PACE_DEVICE Query locate(const AttnParams& p, uint32_t wi) {
    Query r;
    r.tok = p.work[2 * wi];
    r.seq = p.work[2 * wi + 1];
    const uint32_t ctx = p.context_lens[r.seq];
    const uint32_t q0 = p.cu_seqlens_q[r.seq];
    const uint32_t qlen = p.cu_seqlens_q[r.seq + 1] - q0;
    r.visible = ctx - qlen + (r.tok - q0) + 1;
    return r;
}

template <class C, class Q, int D, int GMAX>
PACE_DEVICE void attend_simt(const AttnParams& p) {
    typedef typename C::T CT;
    typedef typename Q::T QT;
    constexpr int EPC = Chunk<C>::N;                // elements per 16-byte chunk
    constexpr int CPK = D / EPC;                    // chunks per key row
    constexpr int KC = CPK / 4;                     // scores: chunks per lane
    constexpr int V_LANES = CPK < 32 ? CPK : 32;    // values: lanes per key
    constexpr int VC = CPK / V_LANES;               // values: chunks per lane
    constexpr int KPR = 32 / V_LANES;               // values: keys per round
    constexpr int VE = VC * EPC;                    // values: output dimensions per lane and head
    static_assert(CPK % 4 == 0 && KC >= 1 && TILE % KPR == 0, "unsupported head_dim");

    __shared__ __align__(16) float q_s[GMAX][D];
    __shared__ float p_s[SIMT_WARPS][GMAX][TILE];
    __shared__ float ml_s[SIMT_WARPS][GMAX][2];
    __shared__ __align__(16) float o_s[SIMT_WARPS][GMAX][D];

    const Query qy = locate(p, blockIdx.x);
    const uint32_t group = p.num_heads / p.kv_heads;
    const uint32_t chunks = (group + GMAX - 1) / GMAX;
    const uint32_t g = blockIdx.y / chunks;
    const uint32_t hc = blockIdx.y % chunks;
    const uint32_t h0 = g * group + hc * GMAX;      // first query head of the block
    const int nh = (int)umin(GMAX, group - hc * GMAX);
    const uint32_t part = blockIdx.z;
    const uint32_t kb = part * p.part_size;
    if (kb >= qy.visible) return;  // an empty partition: pa_reduce never reads it
    const uint32_t ke = umin(kb + p.part_size, qy.visible);

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

    const QT* qp = static_cast<const QT*>(p.q) + ((size_t)qy.tok * p.num_heads + h0) * D;
    for (int i = tid; i < GMAX * D; i += SIMT_THREADS) {
        const int h = i / D;
        q_s[h][i % D] = h < nh ? Q::to_f32(qp[i]) : 0.f;
    }
    __syncthreads();

    const CT* kc = static_cast<const CT*>(p.k_cache);
    const CT* vc = static_cast<const CT*>(p.v_cache);
    const uint32_t* table = p.block_tables + (size_t)qy.seq * p.max_blocks;
    const uint32_t bs = p.block_size;
    const uint32_t kvh = p.kv_heads;

    float m[GMAX], l[GMAX], acc[GMAX][VE];
#pragma unroll
    for (int h = 0; h < GMAX; ++h) {
        m[h] = -INFINITY;
        l[h] = 0.f;
#pragma unroll
        for (int e = 0; e < VE; ++e) acc[h][e] = 0.f;
    }
    const int kg = lane / 4, qq = lane % 4;              // scores: key of the round, quarter
    const int vk = lane / V_LANES, vl = lane % V_LANES;  // values: key of the round, lane in key

    for (uint32_t base = kb + warp * TILE; base < ke; base += SIMT_WARPS * TILE) {
#pragma unroll
        for (int r = 0; r < TILE / 8; ++r) {
            const uint32_t j = base + r * 8 + kg;
            float dot[GMAX];
#pragma unroll
            for (int h = 0; h < GMAX; ++h) dot[h] = 0.f;
            if (j < ke) {
                const size_t row = (((size_t)table[j / bs] * kvh + g) * bs + j % bs) * D;
                const uint4* kr = reinterpret_cast<const uint4*>(kc + row);
                uint4 raw[KC];
#pragma unroll
                for (int c = 0; c < KC; ++c) raw[c] = kr[c * 4 + qq];
#pragma unroll
                for (int c = 0; c < KC; ++c) {
                    float kf[EPC];
                    Chunk<C>::unpack(raw[c], kf);
                    const int d0 = (c * 4 + qq) * EPC;
#pragma unroll
                    for (int h = 0; h < GMAX; ++h) {
                        if (h < nh) {
#pragma unroll
                            for (int e = 0; e < EPC; ++e) dot[h] += q_s[h][d0 + e] * kf[e];
                        }
                    }
                }
            }
#pragma unroll
            for (int h = 0; h < GMAX; ++h) {
                if (h < nh) {
                    float s = dot[h];
                    s += __shfl_xor_sync(FULL, s, 1);
                    s += __shfl_xor_sync(FULL, s, 2);
                    if (qq == 0) p_s[warp][h][r * 8 + kg] = j < ke ? s * p.scale_log2 : -INFINITY;
                }
            }
        }
        __syncwarp();
        // Online softmax, lane i owning key base + i; the tile's first key is always visible.
#pragma unroll
        for (int h = 0; h < GMAX; ++h) {
            if (h < nh) {
                const float s = p_s[warp][h][lane];
                const float m_new = fmaxf(m[h], warp_max(s));
                const float corr = exp2f(m[h] - m_new);
                const float e = exp2f(s - m_new);
                l[h] = l[h] * corr + e;
                p_s[warp][h][lane] = e;
#pragma unroll
                for (int i = 0; i < VE; ++i) acc[h][i] *= corr;
                m[h] = m_new;
            }
        }
        __syncwarp();
#pragma unroll 4
        for (int r = 0; r < TILE / KPR; ++r) {
            const int jj = r * KPR + vk;
            const uint32_t j = base + jj;
            if (j < ke) {
                const size_t row = (((size_t)table[j / bs] * kvh + g) * bs + j % bs) * D;
                const uint4* vr = reinterpret_cast<const uint4*>(vc + row);
                float vf[VE];
#pragma unroll
                for (int c = 0; c < VC; ++c) Chunk<C>::unpack(vr[c * V_LANES + vl], vf + c * EPC);
#pragma unroll
                for (int h = 0; h < GMAX; ++h) {
                    if (h < nh) {
                        const float pj = p_s[warp][h][jj];
#pragma unroll
                        for (int i = 0; i < VE; ++i) acc[h][i] += pj * vf[i];
                    }
                }
            }
        }
        __syncwarp();  // p_s is rewritten by the next tile
    }

    // Merge the lanes that held different keys of a round, then the warps.
#pragma unroll
    for (int h = 0; h < GMAX; ++h) {
        if (h < nh) {
#pragma unroll
            for (int x = V_LANES; x < 32; x <<= 1) {
#pragma unroll
                for (int i = 0; i < VE; ++i) acc[h][i] += __shfl_xor_sync(FULL, acc[h][i], x);
            }
            l[h] = warp_sum(l[h]);
            if (lane == 0) {
                ml_s[warp][h][0] = m[h];
                ml_s[warp][h][1] = l[h];
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < GMAX; ++h) {
        if (h < nh && vk == 0) {
            float mx = -INFINITY;
#pragma unroll
            for (int w = 0; w < SIMT_WARPS; ++w) mx = fmaxf(mx, ml_s[w][h][0]);
            const float f = exp2f(m[h] - mx);  // 0 for a warp that saw no key
#pragma unroll
            for (int c = 0; c < VC; ++c) {
#pragma unroll
                for (int e = 0; e < EPC; ++e) o_s[warp][h][(c * V_LANES + vl) * EPC + e] = acc[h][c * EPC + e] * f;
            }
        }
    }
    __syncthreads();
    for (int i = tid; i < nh * D; i += SIMT_THREADS) {
        const int h = i / D, d = i % D;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < SIMT_WARPS; ++w) mx = fmaxf(mx, ml_s[w][h][0]);
        float sum = 0.f, o = 0.f;
#pragma unroll
        for (int w = 0; w < SIMT_WARPS; ++w) {
            sum += ml_s[w][h][1] * exp2f(ml_s[w][h][0] - mx);
            o += o_s[w][h][d];
        }
        const uint32_t head = h0 + h;
        if (p.num_parts == 1) {
            QT* out = static_cast<QT*>(p.out) + ((size_t)qy.tok * p.num_heads + head) * D;
            out[d] = Q::from_f32(o / sum);
        } else {
            const size_t slot = ((size_t)blockIdx.x * p.num_heads + head) * p.num_parts + part;
            p.part_out[slot * D + d] = o;
            if (d == 0) {
                p.part_ml[slot * 2] = mx;
                p.part_ml[slot * 2 + 1] = sum;
            }
        }
    }
}

// Merges the partitions of split-K attention. Grid: (work items, heads); block: 128 threads.
template <class Q>
PACE_DEVICE void reduce_parts(const AttnParams& p) {
    typedef typename Q::T QT;
    __shared__ float w_s[MAX_PARTS];
    __shared__ float stat_s[2];
    const Query qy = locate(p, blockIdx.x);
    const uint32_t head = blockIdx.y;
    const uint32_t np = (qy.visible + p.part_size - 1) / p.part_size;
    const size_t slot0 = ((size_t)blockIdx.x * p.num_heads + head) * p.num_parts;
    const int tid = threadIdx.x;
    if (tid < 32) {
        float mx = -INFINITY;
        for (uint32_t i = tid; i < np; i += 32) mx = fmaxf(mx, p.part_ml[(slot0 + i) * 2]);
        mx = warp_max(mx);
        float sum = 0.f;
        for (uint32_t i = tid; i < np; i += 32) {
            const float w = exp2f(p.part_ml[(slot0 + i) * 2] - mx);
            w_s[i] = w;
            sum += w * p.part_ml[(slot0 + i) * 2 + 1];
        }
        sum = warp_sum(sum);
        if (tid == 0) stat_s[0] = 1.f / sum;
    }
    __syncthreads();
    const float inv = stat_s[0];
    const uint32_t D = p.head_dim;
    QT* out = static_cast<QT*>(p.out) + ((size_t)qy.tok * p.num_heads + head) * D;
    for (uint32_t d = tid; d < D; d += blockDim.x) {
        float o = 0.f;
        for (uint32_t i = 0; i < np; ++i) o += w_s[i] * p.part_out[(slot0 + i) * D + d];
        out[d] = Q::from_f32(o * inv);
    }
}

}  // namespace pace

#define PACE_SIMT(C, Q, D, G, NAME)                                                         \
    extern "C" __global__ void __launch_bounds__(pace::SIMT_THREADS, pace::SimtOccupancy<pace::C, G>::blocks) NAME(const pace::AttnParams p) { \
        pace::attend_simt<pace::C, pace::Q, D, G>(p);                                       \
    }
#define PACE_SIMT_D(C, Q, c, q)                         \
    PACE_SIMT(C, Q, 64, 4, pa_simt_##c##_##q##_64_g4)   \
    PACE_SIMT(C, Q, 128, 4, pa_simt_##c##_##q##_128_g4) \
    PACE_SIMT(C, Q, 64, 8, pa_simt_##c##_##q##_64_g8)   \
    PACE_SIMT(C, Q, 128, 8, pa_simt_##c##_##q##_128_g8)

// pa_simt_{cache dtype}_{q dtype}_{head_dim: 64 or 128}_g{heads per block}: q (and the output) in f32 or
// the cache's dtype; g4 for groups of up to 4 query heads per KV head, g8 above (in chunks of 8).
PACE_SIMT_D(F32, F32, f32, f32)
PACE_SIMT_D(F16, F16, f16, f16)
PACE_SIMT_D(F16, F32, f16, f32)
PACE_SIMT_D(BF16, BF16, bf16, bf16)
PACE_SIMT_D(BF16, F32, bf16, f32)

#define PACE_REDUCE(Q, NAME)                                                                \
    extern "C" __global__ void __launch_bounds__(128) NAME(const pace::AttnParams p) {     \
        pace::reduce_parts<pace::Q>(p);                                                     \
    }
// pa_reduce_{q dtype}
PACE_REDUCE(F32, pa_reduce_f32)
PACE_REDUCE(F16, pa_reduce_f16)
PACE_REDUCE(BF16, pa_reduce_bf16)
