// reshape_and_cache: writes a step's new K (or V) rows into their slots of the paged cache.
//
// kv is [tokens, kv_heads, head_dim] in the cache's dtype (the Rust side converts first), the
// cache [num_blocks, kv_heads, block_size, head_dim]; slot = block * block_size + offset. One
// thread block per token copies its kv_heads * head_dim elements, 16 bytes per thread and step
// when a head's row is a whole number of 16-byte chunks, element by element otherwise.
#include "common.cuh"

namespace pace {

template <typename T>
PACE_DEVICE void write_cache(const CacheParams& p) {
    const uint32_t t = blockIdx.x;
    if (t >= p.num_tokens) return;
    const uint32_t slot = p.slots[t];
    if (slot >= p.num_slots) return;  // validated on the host; never write out of bounds
    const uint32_t blk = slot / p.block_size, off = slot % p.block_size;
    const T* src = static_cast<const T*>(p.kv) + (size_t)t * p.kv_heads * p.head_dim;
    T* cache = static_cast<T*>(p.cache);
    const uint32_t row_bytes = p.head_dim * (uint32_t)sizeof(T);
    const bool aligned = ((uintptr_t)src % 16 == 0) && ((uintptr_t)cache % 16 == 0);
    if (row_bytes % 16 == 0 && aligned) {
        const uint32_t per_row = row_bytes / 16, n = p.kv_heads * per_row;
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
            const uint32_t h = i / per_row, c = i % per_row;
            const size_t dst = (((size_t)blk * p.kv_heads + h) * p.block_size + off) * p.head_dim;
            reinterpret_cast<uint4*>(cache + dst)[c] =
                reinterpret_cast<const uint4*>(src + (size_t)h * p.head_dim)[c];
        }
    } else {
        const uint32_t n = p.kv_heads * p.head_dim;
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
            const uint32_t h = i / p.head_dim, d = i % p.head_dim;
            cache[(((size_t)blk * p.kv_heads + h) * p.block_size + off) * p.head_dim + d] = src[i];
        }
    }
}

}  // namespace pace

// Grid: (tokens), block: 128 threads. 16-bit caches (f16, bf16) and f32 caches.
extern "C" __global__ void __launch_bounds__(128) reshape_and_cache_b16(const pace::CacheParams p) {
    pace::write_cache<uint16_t>(p);
}

extern "C" __global__ void __launch_bounds__(128) reshape_and_cache_b32(const pace::CacheParams p) {
    pace::write_cache<float>(p);
}
