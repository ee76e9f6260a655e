// Greedy sampling on the GPU: the index of each row's largest logit, with the CPU sampler's rules
// (models/src/sampler.rs): ties go to the lowest index, NaN is never chosen, and a row of nothing
// but -inf and NaN gives index 0. So the GPU and the CPU pick the same token from the same logits
// (candle's argmax keeps whichever lane's candidate it meets first on ties).
//
// One block of ARGMAX_THREADS per row: each thread scans a strided slice (its candidates come in
// increasing index order, so a strict `>` keeps the lowest index among equals), then the warp and
// then the block merge (value, index) pairs under the same order.
#include "common.cuh"

namespace pace {

constexpr int ARGMAX_THREADS = 256;
constexpr uint32_t NO_INDEX = 0xffffffffu;

// (v, i) beats (w, j): a larger value, or the same value at a lower index. NaN never beats
// anything (every comparison with it is false) and an unset candidate has index NO_INDEX.
PACE_DEVICE bool beats(float v, uint32_t i, float w, uint32_t j) { return v > w || (v == w && i < j); }

template <class E>
PACE_DEVICE void argmax_row(const typename E::T* logits, uint32_t* out, uint32_t cols) {
    const uint32_t row = blockIdx.x, tid = threadIdx.x;
    const typename E::T* x = logits + (uint64_t)row * cols;
    float best = -INFINITY;
    uint32_t at = NO_INDEX;
    for (uint32_t i = tid; i < cols; i += ARGMAX_THREADS) {
        const float v = E::to_f32(x[i]);
        if (v > best) {
            best = v;
            at = i;
        }
    }
    for (int m = 16; m > 0; m >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, best, m);
        const uint32_t j = __shfl_xor_sync(0xffffffffu, at, m);
        if (beats(w, j, best, at)) {
            best = w;
            at = j;
        }
    }
    __shared__ float best_s[ARGMAX_THREADS / 32];
    __shared__ uint32_t at_s[ARGMAX_THREADS / 32];
    if (tid % 32 == 0) {
        best_s[tid / 32] = best;
        at_s[tid / 32] = at;
    }
    __syncthreads();
    if (tid == 0) {
        for (int w = 1; w < ARGMAX_THREADS / 32; ++w) {
            if (beats(best_s[w], at_s[w], best, at)) {
                best = best_s[w];
                at = at_s[w];
            }
        }
        out[row] = at == NO_INDEX ? 0 : at;
    }
}

}  // namespace pace

// argmax_{dtype}(logits [rows, cols], out [rows] u32, cols): grid (rows), block (ARGMAX_THREADS).
#define PACE_ARGMAX(E, NAME)                                                                         \
    extern "C" __global__ void __launch_bounds__(pace::ARGMAX_THREADS)                               \
        NAME(const typename pace::E::T* logits, uint32_t* out, uint32_t cols) {                      \
        pace::argmax_row<pace::E>(logits, out, cols);                                                \
    }
PACE_ARGMAX(F32, argmax_f32)
PACE_ARGMAX(BF16, argmax_bf16)
PACE_ARGMAX(F16, argmax_f16)
