// Runs pace's CUDA kernels under the host emulation (emu.h) against a naive f64 reference that
// gathers K/V through the block table: every cache dtype and q dtype, head sizes 64 and 128,
// block sizes 16 and 32, GQA groups 1 to 9 (more than a block's 8 heads), decode and prefill
// chunks in one batch, split-K partitions, caches full of NaN outside the written slots, and
// prefix caching's block tables: sequences whose leading blocks are the same physical blocks,
// written once by the first of them, the others computing only the positions after them; and
// the greedy argmax kernels (sample.cu) against the CPU sampler's rule on ties, NaN and infinities.
//
// Build: c++ -std=c++17 -O2 -DPACE_EMU -I kernels/cuda kernels/cuda/emu_test.cpp
// Usage: emu_test [quick]   (exit status 0 when every case is within tolerance)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "attention.cu"
#include "attention_mma.cu"
#include "cache.cu"
#include "sample.cu"

namespace {

enum class Dt { F32, F16, BF16 };

const char* name(Dt d) { return d == Dt::F32 ? "f32" : d == Dt::F16 ? "f16" : "bf16"; }
size_t size_of(Dt d) { return d == Dt::F32 ? 4 : 2; }

// Stores `v` as dtype `d` at element `i` of `buf`.
void put(std::vector<unsigned char>& buf, Dt d, size_t i, float v) {
    if (d == Dt::F32) {
        memcpy(&buf[i * 4], &v, 4);
    } else {
        const uint16_t h = d == Dt::F16 ? pace::F16::from_f32(v) : pace::BF16::from_f32(v);
        memcpy(&buf[i * 2], &h, 2);
    }
}

float get(const std::vector<unsigned char>& buf, Dt d, size_t i) {
    if (d == Dt::F32) {
        float v;
        memcpy(&v, &buf[i * 4], 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, &buf[i * 2], 2);
    return d == Dt::F16 ? pace::F16::to_f32(h) : pace::BF16::to_f32(h);
}

float round_to(Dt d, float v) {
    std::vector<unsigned char> b(4);
    put(b, d, 0, v);
    return get(b, d, 0);
}

struct Seq {
    uint32_t ctx, qlen;
    uint32_t cached = 0;  // leading positions in blocks another sequence wrote (prefix caching)
    std::vector<uint32_t> blocks;
    std::vector<float> k, v;  // ctx x kv_heads x head_dim
};

struct Case {
    Dt cache, qdt;
    uint32_t kv_heads, group, head_dim, block_size, num_blocks;
    std::vector<Seq> seqs;
    std::vector<float> q;  // tokens x heads x head_dim (already rounded to qdt)
    bool shared = false;   // sequences share leading blocks
    uint32_t tokens() const {
        uint32_t t = 0;
        for (auto& s : seqs) t += s.qlen;
        return t;
    }
};

// A batch whose sequences share a cached prefix: sequence 0 holds `P` full blocks and wrote
// them; each other sequence's table starts with 0 to `P` of the same block ids (the same keys
// and values there), continues in blocks of its own, and its query chunk lies after the shared
// part, as the scheduler plans a request that found its prefix cached.
Case make_shared_case(std::mt19937_64& rng, Dt cache, Dt qdt, uint32_t kvh, uint32_t group, uint32_t d, uint32_t bs,
                      uint32_t max_ctx) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    Case c{cache, qdt, kvh, group, d, bs, 0, {}, {}, true};
    const uint32_t P = 1 + rng() % std::max<uint32_t>(1, max_ctx / bs / 2);
    const size_t row = (size_t)kvh * d;
    std::vector<float> pk((size_t)P * bs * row), pv(pk.size());
    for (auto& x : pk) x = round_to(cache, u(rng));
    for (auto& x : pv) x = round_to(cache, u(rng));
    const uint32_t nseq = 2 + rng() % 3;
    uint32_t own_blocks = 0;
    for (uint32_t i = 0; i < nseq; ++i) {
        Seq s;
        const uint32_t p = i == 0 ? P : rng() % (P + 1);
        s.cached = i == 0 ? 0 : p * bs;
        s.ctx = p * bs + 1 + rng() % std::max<uint32_t>(1, max_ctx / 2);
        const uint32_t fresh = s.ctx - s.cached;
        s.qlen = i == 0 ? 1 + rng() % std::min<uint32_t>(s.ctx, 24) : (i % 2 ? fresh : 1 + rng() % std::min<uint32_t>(fresh, 24));
        s.blocks.assign(p, 0);  // the shared ids, filled below
        own_blocks += (s.ctx + bs - 1) / bs - p;
        s.k.resize((size_t)s.ctx * row);
        s.v.resize(s.k.size());
        for (size_t e = 0; e < s.k.size(); ++e) {
            const bool in_prefix = e < (size_t)p * bs * row;
            s.k[e] = in_prefix ? pk[e] : round_to(cache, u(rng));
            s.v[e] = in_prefix ? pv[e] : round_to(cache, u(rng));
        }
        c.seqs.push_back(s);
    }
    c.num_blocks = 1 + P + own_blocks + 5;
    std::vector<uint32_t> free_blocks;
    for (uint32_t b = 1; b < c.num_blocks; ++b) free_blocks.push_back(b);
    std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
    std::vector<uint32_t> prefix(free_blocks.end() - P, free_blocks.end());
    free_blocks.resize(free_blocks.size() - P);
    for (auto& s : c.seqs) {
        for (size_t b = 0; b < s.blocks.size(); ++b) s.blocks[b] = prefix[b];
        const uint32_t nb = (s.ctx + bs - 1) / bs - s.blocks.size();
        s.blocks.insert(s.blocks.end(), free_blocks.end() - nb, free_blocks.end());
        free_blocks.resize(free_blocks.size() - nb);
    }
    c.q.resize((size_t)c.tokens() * kvh * group * d);
    for (auto& x : c.q) x = round_to(qdt, u(rng));
    return c;
}

Case make_case(std::mt19937_64& rng, Dt cache, Dt qdt, uint32_t kvh, uint32_t group, uint32_t d, uint32_t bs,
               uint32_t max_ctx) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    Case c{cache, qdt, kvh, group, d, bs, 0, {}, {}};
    const uint32_t nseq = 1 + rng() % 4;
    uint32_t needed = 1;
    for (uint32_t i = 0; i < nseq; ++i) {
        Seq s;
        s.ctx = 1 + rng() % max_ctx;
        s.qlen = i % 2 == 0 ? 1 : 1 + rng() % std::min<uint32_t>(s.ctx, 24);
        needed += (s.ctx + bs - 1) / bs;
        c.seqs.push_back(s);
    }
    c.num_blocks = needed + 7;
    std::vector<uint32_t> free_blocks;
    for (uint32_t b = 1; b < c.num_blocks; ++b) free_blocks.push_back(b);
    std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
    for (auto& s : c.seqs) {
        const uint32_t nb = (s.ctx + bs - 1) / bs;
        s.blocks.assign(free_blocks.end() - nb, free_blocks.end());
        free_blocks.resize(free_blocks.size() - nb);
        s.k.resize((size_t)s.ctx * kvh * d);
        s.v.resize(s.k.size());
        for (auto& x : s.k) x = round_to(cache, u(rng));
        for (auto& x : s.v) x = round_to(cache, u(rng));
    }
    c.q.resize((size_t)c.tokens() * kvh * group * d);
    for (auto& x : c.q) x = round_to(qdt, u(rng));
    return c;
}

std::vector<float> reference(const Case& c) {
    const uint32_t h = c.kv_heads * c.group, d = c.head_dim;
    const double scale = 1.0 / std::sqrt((double)d);
    std::vector<float> out(c.q.size());
    uint32_t tok = 0;
    for (auto& s : c.seqs) {
        for (uint32_t i = 0; i < s.qlen; ++i, ++tok) {
            const uint32_t pos = s.ctx - s.qlen + i;
            for (uint32_t hh = 0; hh < h; ++hh) {
                const uint32_t g = hh / c.group;
                const float* q = &c.q[((size_t)tok * h + hh) * d];
                std::vector<double> sc(pos + 1);
                double mx = -1e300;
                for (uint32_t j = 0; j <= pos; ++j) {
                    const float* k = &s.k[((size_t)j * c.kv_heads + g) * d];
                    double acc = 0;
                    for (uint32_t e = 0; e < d; ++e) acc += (double)q[e] * k[e];
                    sc[j] = acc * scale;
                    mx = std::max(mx, sc[j]);
                }
                double z = 0;
                for (auto& x : sc) z += (x = std::exp(x - mx));
                for (uint32_t e = 0; e < d; ++e) {
                    double acc = 0;
                    for (uint32_t j = 0; j <= pos; ++j) acc += sc[j] * s.v[((size_t)j * c.kv_heads + g) * d + e];
                    out[((size_t)tok * h + hh) * d + e] = (float)(acc / z);
                }
            }
        }
    }
    return out;
}

struct Device {
    std::vector<unsigned char> k_cache, v_cache;
    std::vector<uint32_t> tables, ctx, cu;
    uint32_t max_blocks = 0;
};

// Fills NaN caches and writes every sequence's K/V with the reshape_and_cache kernel.
Device upload(const Case& c) {
    Device dev;
    const size_t elems = (size_t)c.num_blocks * c.kv_heads * c.block_size * c.head_dim;
    dev.k_cache.resize(elems * size_of(c.cache));
    for (size_t i = 0; i < elems; ++i) put(dev.k_cache, c.cache, i, NAN);
    dev.v_cache = dev.k_cache;
    for (auto& s : c.seqs) dev.max_blocks = std::max<uint32_t>(dev.max_blocks, s.blocks.size());
    dev.cu.push_back(0);
    for (auto& s : c.seqs) {
        // A cached prefix was written by the sequence that computed it; this one writes the rest.
        std::vector<uint32_t> slots;
        for (uint32_t p = s.cached; p < s.ctx; ++p) slots.push_back(s.blocks[p / c.block_size] * c.block_size + p % c.block_size);
        const size_t skip = (size_t)s.cached * c.kv_heads * c.head_dim;
        for (int which = 0; which < 2 && !slots.empty(); ++which) {
            const std::vector<float>& src = which == 0 ? s.k : s.v;
            std::vector<unsigned char> kv((src.size() - skip) * size_of(c.cache));
            for (size_t i = skip; i < src.size(); ++i) put(kv, c.cache, i - skip, src[i]);
            pace::CacheParams p{};
            p.kv = kv.data();
            p.cache = which == 0 ? dev.k_cache.data() : dev.v_cache.data();
            p.slots = slots.data();
            p.num_tokens = slots.size();
            p.kv_heads = c.kv_heads;
            p.head_dim = c.head_dim;
            p.block_size = c.block_size;
            p.num_slots = c.num_blocks * c.block_size;
            emu::launch(dim3(slots.size()), dim3(128), [&] {
                if (c.cache == Dt::F32) reshape_and_cache_b32(p);
                else reshape_and_cache_b16(p);
            });
        }
        std::vector<uint32_t> row = s.blocks;
        row.resize(dev.max_blocks, 0);
        dev.tables.insert(dev.tables.end(), row.begin(), row.end());
        dev.ctx.push_back(s.ctx);
        dev.cu.push_back(dev.cu.back() + s.qlen);
    }
    // Rows were appended before max_blocks was final for earlier sequences: rebuild.
    dev.tables.clear();
    for (auto& s : c.seqs) {
        std::vector<uint32_t> row = s.blocks;
        row.resize(dev.max_blocks, 0);
        dev.tables.insert(dev.tables.end(), row.begin(), row.end());
    }
    return dev;
}

typedef void (*Kernel)(const pace::AttnParams);

Kernel simt_kernel(Dt cache, Dt q, uint32_t d, bool wide) {
#define PICK(c, qq)                                                                     \
    if (wide) return d == 64 ? pa_simt_##c##_##qq##_64_g8 : pa_simt_##c##_##qq##_128_g8; \
    return d == 64 ? pa_simt_##c##_##qq##_64_g4 : pa_simt_##c##_##qq##_128_g4;
    if (cache == Dt::F32) { PICK(f32, f32) }
    if (cache == Dt::F16) {
        if (q == Dt::F32) { PICK(f16, f32) }
        PICK(f16, f16)
    }
    if (q == Dt::F32) { PICK(bf16, f32) }
    PICK(bf16, bf16)
#undef PICK
}

Kernel mma_kernel(Dt cache, Dt q, uint32_t d) {
    if (cache == Dt::F16) {
        if (q == Dt::F32) return d == 64 ? pa_mma_f16_f32_64 : pa_mma_f16_f32_128;
        return d == 64 ? pa_mma_f16_f16_64 : pa_mma_f16_f16_128;
    }
    if (q == Dt::F32) return d == 64 ? pa_mma_bf16_f32_64 : pa_mma_bf16_f32_128;
    return d == 64 ? pa_mma_bf16_bf16_64 : pa_mma_bf16_bf16_128;
}

Kernel reduce_kernel(Dt q) { return q == Dt::F32 ? pa_reduce_f32 : q == Dt::F16 ? pa_reduce_f16 : pa_reduce_bf16; }

enum class Mode { Simt, SimtSplit, Mma };

std::vector<float> run(const Case& c, Device& dev, Mode mode) {
    const uint32_t heads = c.kv_heads * c.group, d = c.head_dim, t = c.tokens();
    std::vector<unsigned char> q(c.q.size() * size_of(c.qdt)), out(c.q.size() * size_of(c.qdt));
    for (size_t i = 0; i < c.q.size(); ++i) put(q, c.qdt, i, c.q[i]);
    for (size_t i = 0; i < c.q.size(); ++i) put(out, c.qdt, i, NAN);
    pace::AttnParams p{};
    p.q = q.data();
    p.out = out.data();
    p.k_cache = dev.k_cache.data();
    p.v_cache = dev.v_cache.data();
    p.block_tables = dev.tables.data();
    p.context_lens = dev.ctx.data();
    p.cu_seqlens_q = dev.cu.data();
    p.num_heads = heads;
    p.kv_heads = c.kv_heads;
    p.block_size = c.block_size;
    p.max_blocks = dev.max_blocks;
    p.head_dim = d;
    p.scale_log2 = (float)(1.0 / std::sqrt((double)d) * 1.4426950408889634);
    std::vector<uint32_t> work;
    std::vector<float> part_out, part_ml;
    if (mode == Mode::Mma) {
        for (uint32_t s = 0; s < c.seqs.size(); ++s)
            for (uint32_t r = 0; r < c.seqs[s].qlen * c.group; r += pace::BLOCK_M) {
                work.push_back(s);
                work.push_back(r);
            }
        p.work = work.data();
        p.num_work = work.size() / 2;
        p.num_parts = 1;
        Kernel k = mma_kernel(c.cache, c.qdt, d);
        emu::launch(dim3(p.num_work, c.kv_heads), dim3(pace::MMA_THREADS), [&] { k(p); });
    } else {
        for (uint32_t s = 0; s < c.seqs.size(); ++s)
            for (uint32_t i = dev.cu[s]; i < dev.cu[s + 1]; ++i) {
                work.push_back(i);
                work.push_back(s);
            }
        p.work = work.data();
        p.num_work = t;
        uint32_t max_ctx = 0;
        for (auto& s : c.seqs) max_ctx = std::max(max_ctx, s.ctx);
        p.part_size = mode == Mode::SimtSplit ? 128 : (max_ctx + 127) / 128 * 128;
        p.num_parts = (max_ctx + p.part_size - 1) / p.part_size;
        part_out.assign((size_t)t * heads * p.num_parts * d, NAN);
        part_ml.assign((size_t)t * heads * p.num_parts * 2, NAN);
        p.part_out = part_out.data();
        p.part_ml = part_ml.data();
        const bool wide = c.group > 4;
        const uint32_t gmax = wide ? 8 : 4;
        const uint32_t chunks = (c.group + gmax - 1) / gmax;
        Kernel k = simt_kernel(c.cache, c.qdt, d, wide);
        emu::launch(dim3(t, c.kv_heads * chunks, p.num_parts), dim3(pace::SIMT_THREADS), [&] { k(p); });
        if (p.num_parts > 1) {
            Kernel r = reduce_kernel(c.qdt);
            emu::launch(dim3(t, heads), dim3(128), [&] { r(p); });
        }
    }
    std::vector<float> res(c.q.size());
    for (size_t i = 0; i < res.size(); ++i) res[i] = get(out, c.qdt, i);
    return res;
}

bool check(const Case& c, Mode mode, const std::vector<float>& got, const std::vector<float>& want) {
    const bool exact = c.cache == Dt::F32 && c.qdt == Dt::F32;
    double worst = 0;
    size_t bad = 0, first_bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double err = std::fabs((double)got[i] - want[i]);
        const double tol = exact ? 1e-4 * std::max(1.0, std::fabs((double)want[i])) : 1.5e-2;
        if (!(err <= tol)) {
            if (bad++ == 0) first_bad = i;
        }
        if (err > worst || std::isnan(err)) worst = std::isnan(err) ? INFINITY : err;
    }
    const char* m = mode == Mode::Simt ? "simt" : mode == Mode::SimtSplit ? "simt-split" : "mma";
    std::printf("%-4s %-10s cache=%-4s q=%-4s kvh=%u group=%u d=%u bs=%u seqs=%zu tokens=%u%s: max err %.3g",
                bad ? "FAIL" : "ok", m, name(c.cache), name(c.qdt), c.kv_heads, c.group, c.head_dim, c.block_size,
                c.seqs.size(), c.tokens(), c.shared ? " shared-prefix" : "", worst);
    if (bad) std::printf(" (%zu bad, first [%zu] %g vs %g)", bad, first_bad, got[first_bad], want[first_bad]);
    std::printf("\n");
    return bad == 0;
}

// The reference of the argmax kernels: the CPU sampler's rule (highest value, lowest index on
// ties, NaN never chosen, 0 for a row of nothing else).
uint32_t argmax_reference(const std::vector<float>& row) {
    uint32_t at = 0;
    float best = -INFINITY;
    bool found = false;
    for (uint32_t i = 0; i < row.size(); ++i) {
        if (row[i] > best) {
            best = row[i];
            at = i;
            found = true;
        }
    }
    return found ? at : 0;
}

// Rows with ties (the maximum repeated in several threads' slices and warps), NaN, infinities and
// rows of only -inf / NaN, in every dtype, after rounding to it.
int check_argmax(std::mt19937_64& rng, bool quick) {
    int failures = 0;
    std::uniform_real_distribution<float> u(-4.0f, 4.0f);
    const std::vector<uint32_t> widths = quick ? std::vector<uint32_t>{1, 33, 300, 4099}
                                               : std::vector<uint32_t>{1, 33, 300, 4099, 49152};
    for (Dt d : {Dt::F32, Dt::BF16, Dt::F16}) {
        for (uint32_t cols : widths) {
            const uint32_t rows = 7;
            std::vector<std::vector<float>> want_rows(rows);
            std::vector<unsigned char> buf(rows * cols * size_of(d));
            for (uint32_t r = 0; r < rows; ++r) {
                std::vector<float> row(cols);
                for (auto& x : row) x = round_to(d, u(rng));
                std::uniform_int_distribution<uint32_t> pick(0, cols - 1);
                switch (r) {
                    case 1:  // the maximum at several places, the lowest in the last thread's slice
                        for (int k = 0; k < 5; ++k) row[pick(rng)] = 8.0f;
                        break;
                    case 2:  // NaN and +inf: +inf wins, the first of two
                        row[pick(rng)] = NAN;
                        row[cols - 1] = INFINITY;
                        row[cols / 2] = INFINITY;
                        break;
                    case 3:  // nothing but -inf and NaN: index 0
                        for (uint32_t i = 0; i < cols; ++i) row[i] = i % 3 ? -INFINITY : NAN;
                        break;
                    case 4:  // NaN first, then all equal: the lowest non-NaN index
                        for (auto& x : row) x = 1.0f;
                        row[0] = NAN;
                        break;
                    case 5:  // ties that bf16 rounding makes: values that differ below its precision
                        for (uint32_t i = 0; i < cols; ++i) row[i] = round_to(d, 3.0f + 1e-4f * (float)(i % 7));
                        break;
                    default:
                        break;
                }
                for (uint32_t i = 0; i < cols; ++i) put(buf, d, r * cols + i, row[i]);
                for (auto& x : row) x = std::isnan(x) ? x : round_to(d, x);
                want_rows[r] = row;
            }
            std::vector<uint32_t> got(rows, 12345);
            const void* src = buf.data();
            emu::launch(dim3(rows), dim3(pace::ARGMAX_THREADS), [&] {
                if (d == Dt::F32) pace::argmax_row<pace::F32>((const float*)src, got.data(), cols);
                else if (d == Dt::BF16) pace::argmax_row<pace::BF16>((const uint16_t*)src, got.data(), cols);
                else pace::argmax_row<pace::F16>((const uint16_t*)src, got.data(), cols);
            });
            for (uint32_t r = 0; r < rows; ++r) {
                const uint32_t want = argmax_reference(want_rows[r]);
                if (got[r] != want) {
                    std::printf("FAIL argmax %s cols %u row %u: got %u, want %u\n", name(d), cols, r, got[r], want);
                    ++failures;
                }
            }
        }
    }
    std::printf("%s: argmax, %d failing row(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures;
}

}  // namespace

int main(int argc, char** argv) {
    const bool quick = argc > 1 && std::string(argv[1]) == "quick";
    std::mt19937_64 rng(7);
    struct Spec {
        Dt cache, q;
        uint32_t kvh, group, d, bs;
    };
    const std::vector<Spec> specs = {
        {Dt::F32, Dt::F32, 2, 2, 64, 16},   {Dt::F32, Dt::F32, 1, 9, 128, 32},
        {Dt::BF16, Dt::BF16, 3, 3, 64, 16}, {Dt::BF16, Dt::F32, 2, 4, 128, 16},
        {Dt::F16, Dt::F16, 1, 8, 64, 32},   {Dt::F16, Dt::F32, 2, 1, 128, 32},
        {Dt::BF16, Dt::BF16, 1, 5, 128, 16}, {Dt::F32, Dt::F32, 1, 12, 64, 16},
    };
    int failures = 0;
    for (const Spec& s : specs) {
        const int reps = quick ? 1 : 2;
        for (int rep = 0; rep < reps + 1; ++rep) {
            const uint32_t max_ctx = quick ? 150 : 300;
            Case c = rep < reps ? make_case(rng, s.cache, s.q, s.kvh, s.group, s.d, s.bs, max_ctx)
                                : make_shared_case(rng, s.cache, s.q, s.kvh, s.group, s.d, s.bs, max_ctx);
            Device dev = upload(c);
            const std::vector<float> want = reference(c);
            failures += !check(c, Mode::Simt, run(c, dev, Mode::Simt), want);
            failures += !check(c, Mode::SimtSplit, run(c, dev, Mode::SimtSplit), want);
            if (s.cache != Dt::F32 && s.d <= 128) failures += !check(c, Mode::Mma, run(c, dev, Mode::Mma), want);
        }
    }
    failures += check_argmax(rng, quick);
    std::printf("%s: %d failing case(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
