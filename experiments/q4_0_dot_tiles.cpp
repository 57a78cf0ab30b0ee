// q4_0_dot_tiles: what the designs of the Q4_0 sparse gate/up tile kernel cost with the rows in
// cache, one thread, no memory system in the way, next to ggml's repacked dense GEMV.
//
// The gate/up projection computes v_r = row_r . x over the active rows r (Q4_0 rows: 32-code
// blocks of 18 bytes, an fp16 scale and 16 bytes of nibbles; x quantized to Q8_0). Each design
// computes that for a random share of the rows, 8 rows per call, and is checked against an f64
// reference of the same quantized values (nmse). Variants:
//   pairs       kx_dot_q4 (patches 0001-0118): two rows per 256-bit register (row a's nibbles in
//               the low lane, row b's in the high), VNNI dot products of both nibble halves, and
//               per pair and block the float work: both scales broadcast and converted, the int32
//               lanes converted, scaled and accumulated (4 lanes per row)
//   pairs+st    pairs, streaming the next tile's rows in as the library does (kx_stream: a loop
//               of prefetches per block step)
//   pairs+st/N  the stream stepped every N blocks, N times the lines each step
//   red8        the int32 lanes of the 4 pairs reduced to one lane per row first (two rounds of
//               unpack + add), so that the float work is done once per block for all 8 rows: the
//               8 scales by one gather (vpgatherdd of the blocks' first dwords, truncated to
//               words, vcvtph2ps), the Q4_0 offset (-8 sum y) subtracted in int32
//   red8+st     red8 with the stream
// With -DKX_WITH_GGML (linked against the build's ggml, below) it also times ggml's repacked
// 8-row GEMV (ggml_gemv_q4_0_8x8_q8_0, the dense kernel the op table compares with) over all
// rows, repacked here as ggml's CPU backend repacks them.
//
// Found (AMD VM, 2026-11-27, best of 300): 576x1536, all rows: ggml's GEMV 28.1 us (1.02 ns per
// row block), pairs 22.8 (0.82), pairs+st 25.4 (0.92), pairs+st/2 25.7, /3 27.2, red8 32.4 (the
// gather and the reduction cost more than the float work they save); 4096x512: GEMV 54.0 us
// (0.83 ns), pairs 46.7 (0.71), pairs+st 51.0. The row kernel is not slower than the repacked
// one: where the op trails dense on these rows, its reads from memory do (experiments/row_reads.c).
//
//   g++ -O3 -march=native experiments/q4_0_dot_tiles.cpp -o /tmp/q4_0_dot_tiles   (AVX2, F16C; VNNI if present)
//   B=build/dev/vendor/llama.cpp/ggml/src   (then, to time ggml's GEMV too:)
//   g++ -O3 -march=native -DKX_WITH_GGML experiments/q4_0_dot_tiles.cpp $B/libggml-cpu.a $B/libggml-base.a
//       -fopenmp -lpthread -lm -o /tmp/q4_0_dot_tiles
//   /tmp/q4_0_dot_tiles [k n density]       (default 576 1536 1.0: the default model's gate/up)
//
// Output: per variant, nmse against the f64 reference and the best of 300 timings (us for all
// active rows, ns per row block).
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

static double now_ns() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }

struct bq4 { uint16_t d; uint8_t qs[16]; };
static_assert(sizeof(bq4) == 18, "block_q4_0");
struct bq8 { uint16_t d; int8_t qs[32]; };
static_assert(sizeof(bq8) == 34, "block_q8_0");

// the library's row stream (kx_stream), to measure what its per-step loop costs
struct stream {
    const char * const * rows = nullptr;
    int n = 0; size_t bytes = 0; int per = 0; int r = 0;
    const char * p = nullptr; const char * end = nullptr;
    stream() = default;
    stream(const char * const * rows_, int n_, size_t bytes_, int steps) : rows(rows_), n(n_), bytes(bytes_) {
        const size_t lines = (size_t) n * ((bytes + 63) / 64 + 1);
        per = (int) ((lines + steps - 1) / steps);
        start(0);
    }
    void start(int row) { r = row; if (r < n) { p = (const char *) ((uintptr_t) rows[r] & ~(uintptr_t) 63); end = rows[r] + bytes; } }
    inline void step() {
        for (int i = 0; i < per && r < n; ++i) { __builtin_prefetch(p, 0, 2); p += 64; if (p >= end) { start(r + 1); } }
    }
};

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
static inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
#else
static inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
#endif
static inline __m256 bcast_fp16(uint16_t h) { return _mm256_cvtph_ps(_mm_set1_epi16((short) h)); }

typedef void (*kfn)(int k, const char * const * rows, const void * vx, float * out, stream * next);

template <bool ST, int SE = 1>
static void pairs(int k, const char * const * rows, const void * vx, float * out, stream * next) {
    constexpr int R = 8;
    stream st = ST && next ? *next : stream();
    if (SE > 1) { st.per *= SE; }
    const int nb = k / 32;
    const bq8 * y = (const bq8 *) vx;
    const bq4 * w[R];
    __m256 acc[R / 2];
    for (int r = 0; r < R; ++r) { w[r] = (const bq4 *) rows[r]; }
    for (int p = 0; p < R / 2; ++p) { acc[p] = _mm256_setzero_ps(); }
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones8 = _mm256_set1_epi8(1);
    for (int b = 0; b < nb; ++b) {
        const __m256i qy = _mm256_loadu_si256((const __m256i *) y[b].qs);
        const __m256i yl = _mm256_permute2x128_si256(qy, qy, 0x00);
        const __m256i yh = _mm256_permute2x128_si256(qy, qy, 0x11);
        const __m256 dyv = bcast_fp16(y[b].d);
        const __m256i sy = dpbusd(dpbusd(_mm256_setzero_si256(), ones8, yl), ones8, yh);
        const __m256 cor = _mm256_mul_ps(dyv, _mm256_cvtepi32_ps(_mm256_slli_epi32(sy, 3)));
        if (ST && b % SE == 0) { st.step(); }
        for (int p = 0; p < R / 2; ++p) {
            const bq4 * a = w[2 * p] + b;
            const bq4 * c = w[2 * p + 1] + b;
            const __m256i q  = _mm256_loadu2_m128i((const __m128i *) c->qs, (const __m128i *) a->qs);
            const __m256i ql = _mm256_and_si256(q, m4);
            const __m256i qh = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            const __m256i s32 = dpbusd(dpbusd(_mm256_setzero_si256(), ql, yl), qh, yh);
            const __m256 dw = _mm256_cvtph_ps(_mm_unpacklo_epi64(_mm_set1_epi16((short) a->d), _mm_set1_epi16((short) c->d)));
            acc[p] = _mm256_fmadd_ps(dw, _mm256_fmsub_ps(dyv, _mm256_cvtepi32_ps(s32), cor), acc[p]);
        }
    }
    for (int p = 0; p < R / 2; ++p) {
        __m128 lo = _mm256_castps256_ps128(acc[p]);
        __m128 hi = _mm256_extractf128_ps(acc[p], 1);
        lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
        hi = _mm_add_ps(hi, _mm_movehl_ps(hi, hi));
        out[2 * p]     = _mm_cvtss_f32(_mm_add_ss(lo, _mm_movehdup_ps(lo)));
        out[2 * p + 1] = _mm_cvtss_f32(_mm_add_ss(hi, _mm_movehdup_ps(hi)));
    }
}

// red8: rows as 32-bit offsets from rows[0] (a gather's index vector); the result lanes come out
// in the order a0 a2 a4 a6 | a1 a3 a5 a7 of the pairs (a_p: the low row of pair p, then the high)
template <bool ST>
static void red8(int k, const char * const * rows, const void * vx, float * out, stream * next) {
    constexpr int R = 8;
    stream st = ST && next ? *next : stream();
    const int nb = k / 32;
    const bq8 * y = (const bq8 *) vx;
    const char * base = rows[0];
    int32_t off[R];
    for (int r = 0; r < R; ++r) { off[r] = (int32_t) (rows[r] - base); }
    // lane order of the reduced vector: pairs p0..p3 = rows (0,1) (2,3) (4,5) (6,7); after the
    // two rounds lane j (low half) holds row 2j... computed below, gathered scales follow it
    const __m256i gidx = _mm256_setr_epi32(off[0], off[2], off[4], off[6], off[1], off[3], off[5], off[7]);
    __m256 acc = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int b = 0; b < nb; ++b) {
        const __m256i qy = _mm256_loadu_si256((const __m256i *) y[b].qs);
        const __m256i yl = _mm256_permute2x128_si256(qy, qy, 0x00);
        const __m256i yh = _mm256_permute2x128_si256(qy, qy, 0x11);
        if (ST) { st.step(); }
        __m256i s[4];
        for (int p = 0; p < 4; ++p) {
            const char * a = base + off[2 * p] + 18 * b;
            const char * c = base + off[2 * p + 1] + 18 * b;
            const __m256i q  = _mm256_loadu2_m128i((const __m128i *) (c + 2), (const __m128i *) (a + 2));
            const __m256i ql = _mm256_and_si256(q, m4);
            const __m256i qh = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            s[p] = dpbusd(dpbusd(_mm256_setzero_si256(), ql, yl), qh, yh);
        }
        // s[p] = [a a a a | c c c c] (4 partial sums of the pair's rows); two rounds of adds
        const __m256i t0 = _mm256_add_epi32(_mm256_unpacklo_epi32(s[0], s[1]), _mm256_unpackhi_epi32(s[0], s[1]));
        const __m256i t1 = _mm256_add_epi32(_mm256_unpacklo_epi32(s[2], s[3]), _mm256_unpackhi_epi32(s[2], s[3]));
        // t0 = [a0 a1 a0 a1 | c0 c1 c0 c1] partials (p0, p1 rows), sum the two halves of each 64 bits
        const __m256i u  = _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
        // u = [r0 r2 r4 r6 | r1 r3 r5 r7]
        int32_t sumy = 0; // (scalar: once per block for the 8 rows)
        for (int i = 0; i < 32; ++i) { sumy += y[b].qs[i]; }
        const __m256i si = _mm256_sub_epi32(u, _mm256_set1_epi32(8 * sumy));
        const __m256i dg = _mm256_i32gather_epi32((const int *) (base + 18 * b), gidx, 1);
        const __m256 dw = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(dg));
        acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, bcast_fp16(y[b].d)), _mm256_cvtepi32_ps(si), acc);
    }
    alignas(32) float o[8];
    _mm256_store_ps(o, acc);
    out[0] = o[0]; out[2] = o[1]; out[4] = o[2]; out[6] = o[3];
    out[1] = o[4]; out[3] = o[5]; out[5] = o[6]; out[7] = o[7];
}

#if defined(KX_WITH_GGML)
// ggml's repacked Q4_0 GEMV (8 rows interleaved, 8 bytes at a time), the dense kernel to match
extern "C" void ggml_gemv_q4_0_8x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
extern "C" void ggml_cpu_init(void); // its fp16 table
struct bq4x8 { uint16_t d[8]; uint8_t qs[128]; };
#endif

int main(int argc, char ** argv) {
    const int k = argc > 1 ? atoi(argv[1]) : 576, n = argc > 2 ? atoi(argv[2]) : 1536;
    const double dens = argc > 3 ? atof(argv[3]) : 1.0;
    if (k <= 0 || k % 32 || n <= 0) { fprintf(stderr, "k must be a positive multiple of 32\n"); return 1; }
    srand(1);
    const int nb = k / 32;
    const size_t rb = nb * sizeof(bq4);
    std::vector<char> W(rb * n + 64);
    for (int r = 0; r < n; ++r) {
        for (int b = 0; b < nb; ++b) {
            bq4 * q = (bq4 *) (W.data() + r * rb) + b;
            q->d = _cvtss_sh((rand() / (float) RAND_MAX) * 0.01f + 0.001f, 0);
            for (int i = 0; i < 16; ++i) { q->qs[i] = rand() & 255; }
        }
    }
    std::vector<bq8> X(nb);
    for (int b = 0; b < nb; ++b) {
        X[b].d = _cvtss_sh(0.01f, 0);
        for (int i = 0; i < 32; ++i) { X[b].qs[i] = (int8_t) (rand() % 255 - 127); }
    }
    std::vector<int> L;
    for (int r = 0; r < n; ++r) { if (rand() / (double) RAND_MAX < dens) { L.push_back(r); } }
    L.resize(L.size() / 8 * 8);
    std::vector<double> ref(L.size(), 0.0);
    for (size_t i = 0; i < L.size(); ++i) {
        double s = 0;
        for (int b = 0; b < nb; ++b) {
            const bq4 * q = (const bq4 *) (W.data() + L[i] * rb) + b;
            for (int l = 0; l < 16; ++l) {
                s += (double) _cvtsh_ss(q->d) * _cvtsh_ss(X[b].d) *
                     (((q->qs[l] & 15) - 8) * X[b].qs[l] + ((q->qs[l] >> 4) - 8) * X[b].qs[l + 16]);
            }
        }
        ref[i] = s;
    }
    struct variant { const char * name; kfn f; } vs[] = {
        { "pairs", pairs<false> }, { "pairs+st", pairs<true> }, { "pairs+st/2", pairs<true, 2> }, { "pairs+st/3", pairs<true, 3> },
        { "red8", red8<false> },   { "red8+st", red8<true> },
    };
    std::vector<float> v(L.size());
#if defined(KX_WITH_GGML)
    {
        // all n rows repacked as ggml does for its 8x8 GEMV; timed over every row (the dense op)
        ggml_cpu_init();
        std::vector<bq4x8> P((size_t) n / 8 * nb);
        for (int g = 0; g < n / 8; ++g) {
            for (int b = 0; b < nb; ++b) {
                bq4x8 & o = P[(size_t) g * nb + b];
                for (int j = 0; j < 8; ++j) { o.d[j] = ((const bq4 *) (W.data() + (8 * g + j) * rb))[b].d; }
                for (int i = 0; i < 16; ++i) {
                    const bq4 * src = (const bq4 *) (W.data() + (8 * g + i % 8) * rb) + b;
                    for (int e = 0; e < 8; ++e) { o.qs[8 * i + e] = src->qs[(i / 8) * 8 + e] ^ 0x88; }
                }
            }
        }
        std::vector<float> d(n);
        double best = 1e30;
        for (int round = 0; round < 2; ++round) {
            for (int rep = 0; rep < 300; ++rep) {
                const double t0 = now_ns();
                ggml_gemv_q4_0_8x8_q8_0(k, d.data(), n, P.data(), X.data(), 1, n);
                best = std::min(best, now_ns() - t0);
            }
        }
        double err = 0, sig = 0;
        for (size_t i = 0; i < L.size(); ++i) { err += (d[L[i]] - ref[i]) * (d[L[i]] - ref[i]); sig += ref[i] * ref[i]; }
        printf("ggml repacked 8x8 GEMV, all %d rows: nmse %.2e, %.1f us, %.3f ns per row block\n", n, err / sig, best / 1e3, best / ((double) n * nb));
    }
#endif
    printf("k %d, %zu of %d rows\n| variant | nmse | us per call | ns per row block |\n|---|---|---|---|\n", k, L.size(), n);
    for (int round = 0; round < 2; ++round) {
        for (const auto & var : vs) {
            double best = 1e30, err = 0, sig = 0;
            for (int rep = 0; rep < 300; ++rep) {
                const double t0 = now_ns();
                for (size_t i = 0; i + 8 <= L.size(); i += 8) {
                    const char * rp[8], * rn[8];
                    for (int j = 0; j < 8; ++j) {
                        rp[j] = W.data() + L[i + j] * rb;
                        rn[j] = W.data() + L[(i + 8 + j) % L.size()] * rb;
                    }
                    stream st(rn, 8, rb, nb);
                    var.f(k, rp, X.data(), v.data() + i, &st);
                }
                best = std::min(best, now_ns() - t0);
            }
            for (size_t i = 0; i < L.size(); ++i) { err += (v[i] - ref[i]) * (v[i] - ref[i]); sig += ref[i] * ref[i]; }
            if (round == 1) {
                printf("| %s | %.2e | %.1f | %.3f |\n", var.name, err / sig, best / 1e3, best / (L.size() * nb));
            }
        }
    }
    return 0;
}
