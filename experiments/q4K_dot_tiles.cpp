// q4K_dot_tiles: what the designs of the Q4_K sparse gate/up tile kernel cost with the rows in
// cache, one thread, no memory system in the way.
//
// The gate/up projection computes v_r = row_r . x over the active rows r (Q4_K rows: 256-code
// super-blocks of 144 bytes with 8 six-bit scales and mins; x quantized to Q8_K). Each design
// computes that for a random share of the rows, 8 rows per call, and is checked against an f64
// reference of the same quantized values (nmse). Variants:
//   perm256  kx_dot_q4K before patch 0097: per 32 code bytes one 256-bit load,
//            a shift and an insert to put both nibbles in one register, a maddubs, a word permute
//            of the scales (vpermw) and a dpwssd
//   shuf512  64 code bytes per load: the low nibbles hold sub-blocks 4h and 4h+2, the high ones
//            4h+1 and 4h+3, so the activations are regrouped once per super-block for all rows;
//            the scales are spread by a byte shuffle (vpshufb) of a broadcast instead of vpermw
//   shuf512d shuf512, with d and dmin converted together (one vcvtph2ps per row and super-block)
//   shuf512v shuf512d with the six-bit scales unpacked in vector registers (slower: the vector
//            units are the busy ones)
//   shuf512u shuf512d with the row loop unrolled (GCC 12 otherwise keeps the accumulators on the
//            stack)
//   shuf512g shuf512u with the high nibbles by one GFNI affine transform (patch 0098's kernel)
//
//   g++ -O3 -march=native experiments/q4K_dot_tiles.cpp -o /tmp/q4K_dot_tiles   (AVX-512 BW, GFNI; VNNI if present;
//                                                                              -O3 as the library is built)
//   /tmp/q4K_dot_tiles [k n density]       (default 4096 256 1.0: rows that fit in L2)
//
// Output: per variant, nmse against the f64 reference and the best of 200 timings (us per call,
// ns per row super-block).
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

struct bq4K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };
static_assert(sizeof(bq4K) == 144, "block_q4_K");
struct bq8K { float d; int8_t qs[256]; int16_t bsums[16]; };
static_assert(sizeof(bq8K) == 292, "block_q8_K");
typedef void (*kfn)(int k, const char * const * rows, const void * x, float * out);

static double now_ns() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }

static inline void scale_bytes(const uint8_t * scales, uint64_t & sc8, uint64_t & mn8) {
    uint32_t u[3];
    memcpy(u, scales, 12);
    sc8 = (uint64_t) (u[0] & 0x3f3f3f3f) | (uint64_t) ((u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4)) << 32;
    mn8 = (uint64_t) (u[1] & 0x3f3f3f3f) | (uint64_t) (((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4)) << 32;
}

static inline __m512i dpw(__m512i acc, __m512i a, __m512i b) {
#if defined(__AVX512VNNI__)
    return _mm512_dpwssd_epi32(acc, a, b);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}

static inline float fin(__m512 acc, __m128 accm) {
    __m128 m = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return _mm512_reduce_add_ps(acc) + _mm_cvtss_f32(m);
}

template <int R> static void perm256(int k, const char * const * rows, const void * vx, float * out) {
    const int nb = k / 256;
    const bq8K * y = (const bq8K *) vx;
    const bq4K * w[R];
    __m512 acc[R];
    __m128 accm[R];
    for (int r = 0; r < R; ++r) { w[r] = (const bq4K *) rows[r]; acc[r] = _mm512_setzero_ps(); accm[r] = _mm_setzero_ps(); }
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i sidx[4];
    for (int i = 0; i < 4; ++i) {
        sidx[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short) (2 * i))), _mm256_set1_epi16((short) (2 * i + 1)), 1);
    }
    for (int b = 0; b < nb; ++b) {
        __m512i xv[4];
        for (int i = 0; i < 4; ++i) { xv[i] = _mm512_loadu_si512((const void *) (y[b].qs + 64 * i)); }
        const __m256i bs  = _mm256_loadu_si256((const __m256i *) y[b].bsums);
        const __m128i q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        const float dy = y[b].d;
        for (int r = 0; r < R; ++r) {
            const bq4K * blk = w[r] + b;
            uint64_t sc8, mn8;
            scale_bytes(blk->scales, sc8, mn8);
            const __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long) sc8)));
            const __m128i mn16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long) mn8));
            accm[r] = _mm_fmadd_ps(_mm_set1_ps(-dy * _cvtsh_ss(blk->dmin)), _mm_cvtepi32_ps(_mm_madd_epi16(mn16, q8s)), accm[r]);
            __m512i sum = _mm512_setzero_si512();
            for (int i = 0; i < 4; ++i) {
                const __m256i q  = _mm256_loadu_si256((const __m256i *) (blk->qs + 32 * i));
                const __m512i qn = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1), m4);
                sum = dpw(sum, _mm512_permutexvar_epi16(sidx[i], sc16), _mm512_maddubs_epi16(qn, xv[i]));
            }
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(dy * _cvtsh_ss(blk->d)), _mm512_cvtepi32_ps(sum), acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) { out[r] = fin(acc[r], accm[r]); }
}

// word lanes 0-15 take scale byte a, 16-31 byte b, from a broadcast of the 8 scale bytes
static inline __m512i scale_ctl(int a, int b) {
    alignas(64) int8_t c[64];
    for (int i = 0; i < 64; ++i) { c[i] = (i & 1) ? (int8_t) 0x80 : (int8_t) (i < 32 ? a : b); }
    return _mm512_load_si512(c);
}

// the shuf512 family: DD converts d and dmin together, VEC unpacks the scales in vector registers,
// UNROLL unrolls the row loop, GFNI takes the high nibbles by one affine transform
template <int R, bool DD, bool VEC, bool UNROLL, bool GFNI>
static void shuf512(int k, const char * const * rows, const void * vx, float * out) {
    const int nb = k / 256;
    const bq8K * y = (const bq8K *) vx;
    const bq4K * w[R];
    __m512 acc[R];
    __m128 accm[R];
    for (int r = 0; r < R; ++r) { w[r] = (const bq4K *) rows[r]; acc[r] = _mm512_setzero_ps(); accm[r] = _mm_setzero_ps(); }
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i shr4 = _mm512_set1_epi64(0x1020408000000000LL); // GFNI: each byte >> 4
    // lo[h]: sub-blocks 4h, 4h+2; hi[h]: 4h+1, 4h+3
    const __m512i clo[2] = { scale_ctl(0, 2), scale_ctl(4, 6) }, chi[2] = { scale_ctl(1, 3), scale_ctl(5, 7) };
    // VEC: the 12 scale bytes to sc 0-7 | mn 0-7 with shuffles, shifts and masks
    const __m128i sidx1 = _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11);
    const __m128i sidx2 = _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7);
    const __m128i shv = _mm_setr_epi32(0, 0, 0, 4);
    const __m128i lmask = _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f);
    const __m128i hmask = _mm_set1_epi32(0x30303030);
    auto hi_nib = [&](__m512i q) {
        return GFNI ? _mm512_gf2p8affine_epi64_epi8(q, shr4, 0) : _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    };
    for (int b = 0; b < nb; ++b) {
        const int8_t * q8 = y[b].qs;
        __m512i xlo[2], xhi[2];
        for (int h = 0; h < 2; ++h) {
            xlo[h] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) (q8 + 32 * (4 * h)))),
                                        _mm256_loadu_si256((const __m256i *) (q8 + 32 * (4 * h + 2))), 1);
            xhi[h] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) (q8 + 32 * (4 * h + 1)))),
                                        _mm256_loadu_si256((const __m256i *) (q8 + 32 * (4 * h + 3))), 1);
        }
        const __m256i bs  = _mm256_loadu_si256((const __m256i *) y[b].bsums);
        const __m128i q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        const float dy = y[b].d;
        const __m128 dyv = _mm_setr_ps(dy, -dy, 0.0f, 0.0f);
        auto row = [&](int r) {
            const bq4K * blk = w[r] + b;
            __m512i scb;
            __m128i mn16;
            if constexpr (VEC) {
                const __m128i v  = _mm_loadu_si128((const __m128i *) blk->scales);
                const __m128i t1 = _mm_shuffle_epi8(v, sidx1), t2 = _mm_shuffle_epi8(v, sidx2);
                const __m128i sm = _mm_or_si128(_mm_and_si128(_mm_srlv_epi32(t1, shv), lmask), _mm_and_si128(_mm_srli_epi32(t2, 2), hmask));
                scb  = _mm512_broadcastq_epi64(sm);
                mn16 = _mm_unpackhi_epi8(sm, _mm_setzero_si128());
            } else {
                uint64_t sc8, mn8;
                scale_bytes(blk->scales, sc8, mn8);
                scb  = _mm512_set1_epi64((long long) sc8);
                mn16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long) mn8));
            }
            const __m128i mins = _mm_madd_epi16(mn16, q8s);
            __m512 dsc;
            if constexpr (DD) {
                int32_t dmw;
                memcpy(&dmw, blk, 4);
                const __m128 dd = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dmw)), dyv); // dy*d, -dy*dmin
                accm[r] = _mm_fmadd_ps(_mm_permute_ps(dd, 0x55), _mm_cvtepi32_ps(mins), accm[r]);
                dsc = _mm512_broadcastss_ps(dd);
            } else {
                accm[r] = _mm_fmadd_ps(_mm_set1_ps(-dy * _cvtsh_ss(blk->dmin)), _mm_cvtepi32_ps(mins), accm[r]);
                dsc = _mm512_set1_ps(dy * _cvtsh_ss(blk->d));
            }
            __m512i sum = _mm512_setzero_si512();
            for (int h = 0; h < 2; ++h) {
                const __m512i q = _mm512_loadu_si512((const void *) (blk->qs + 64 * h));
                sum = dpw(sum, _mm512_shuffle_epi8(scb, clo[h]), _mm512_maddubs_epi16(_mm512_and_si512(q, m4), xlo[h]));
                sum = dpw(sum, _mm512_shuffle_epi8(scb, chi[h]), _mm512_maddubs_epi16(hi_nib(q), xhi[h]));
            }
            acc[r] = _mm512_fmadd_ps(dsc, _mm512_cvtepi32_ps(sum), acc[r]);
        };
        if constexpr (UNROLL) {
#pragma GCC unroll 16
            for (int r = 0; r < R; ++r) { row(r); }
        } else {
            for (int r = 0; r < R; ++r) { row(r); }
        }
    }
    for (int r = 0; r < R; ++r) { out[r] = fin(acc[r], accm[r]); }
}

int main(int argc, char ** argv) {
    const int k = argc > 1 ? atoi(argv[1]) : 4096, n = argc > 2 ? atoi(argv[2]) : 256;
    const double dens = argc > 3 ? atof(argv[3]) : 1.0;
    if (k <= 0 || k % 256 || n <= 0) { fprintf(stderr, "k must be a positive multiple of 256\n"); return 1; }
    srand(1);
    const int nb = k / 256;
    const size_t rb = nb * sizeof(bq4K);
    std::vector<char> W(rb * n + 64);
    for (int r = 0; r < n; ++r) {
        for (int b = 0; b < nb; ++b) {
            bq4K * q = (bq4K *) (W.data() + r * rb) + b;
            q->d = _cvtss_sh((rand() / (float) RAND_MAX) * 0.01f + 0.001f, 0);
            q->dmin = _cvtss_sh((rand() / (float) RAND_MAX) * 0.01f + 0.001f, 0);
            for (int i = 0; i < 12; ++i) { q->scales[i] = rand() & 255; }
            for (int i = 0; i < 128; ++i) { q->qs[i] = rand() & 255; }
        }
    }
    std::vector<bq8K> X(nb);
    for (int b = 0; b < nb; ++b) {
        X[b].d = 0.01f;
        for (int i = 0; i < 256; ++i) { X[b].qs[i] = (int8_t) (rand() % 255 - 127); }
        for (int j = 0; j < 16; ++j) { int s = 0; for (int i = 0; i < 16; ++i) { s += X[b].qs[16 * j + i]; } X[b].bsums[j] = (int16_t) s; }
    }
    std::vector<int> L;
    for (int r = 0; r < n; ++r) { if (rand() / (double) RAND_MAX < dens) { L.push_back(r); } }
    L.resize(L.size() / 8 * 8);
    std::vector<double> ref(L.size(), 0.0);
    for (size_t i = 0; i < L.size(); ++i) {
        double s = 0;
        for (int b = 0; b < nb; ++b) {
            const bq4K * q = (const bq4K *) (W.data() + L[i] * rb) + b;
            uint64_t sc8, mn8;
            scale_bytes(q->scales, sc8, mn8);
            for (int j = 0; j < 8; ++j) {
                const double sc = _cvtsh_ss(q->d) * (double) ((sc8 >> (8 * j)) & 255), mn = _cvtsh_ss(q->dmin) * (double) ((mn8 >> (8 * j)) & 255);
                for (int l = 0; l < 32; ++l) {
                    const int c = (j & 1) ? q->qs[32 * (j / 2) + l] >> 4 : q->qs[32 * (j / 2) + l] & 15;
                    s += (sc * c - mn) * X[b].d * X[b].qs[32 * j + l];
                }
            }
        }
        ref[i] = s;
    }
    struct variant { const char * name; kfn f; } vs[] = {
        { "perm256", perm256<8> },
        { "shuf512", shuf512<8, false, false, false, false> },
        { "shuf512d", shuf512<8, true, false, false, false> },
        { "shuf512v", shuf512<8, true, true, false, false> },
        { "shuf512u", shuf512<8, true, false, true, false> },
        { "shuf512g", shuf512<8, true, false, true, true> },
    };
    std::vector<float> v(L.size());
    printf("| variant | nmse | us per call | ns per row super-block |\n|---|---|---|---|\n");
    for (const auto & var : vs) {
        double best = 1e30, err = 0, sig = 0;
        for (int rep = 0; rep < 200; ++rep) {
            const double t0 = now_ns();
            for (size_t i = 0; i + 8 <= L.size(); i += 8) {
                const char * rp[8];
                for (int j = 0; j < 8; ++j) { rp[j] = W.data() + L[i + j] * rb; }
                var.f(k, rp, X.data(), v.data() + i);
            }
            best = std::min(best, now_ns() - t0);
        }
        for (size_t j = 0; j < L.size(); ++j) { err += (v[j] - ref[j]) * (v[j] - ref[j]); sig += ref[j] * ref[j]; }
        printf("| %s | %.2e | %.1f | %.2f |\n", var.name, err / sig, best / 1e3, best / (L.size() * (double) nb));
    }
    return 0;
}
