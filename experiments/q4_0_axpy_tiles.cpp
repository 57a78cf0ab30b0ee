// q4_0_axpy_tiles: what the designs of the Q4_0 sparse down projection's tile kernel cost with
// the rows in cache, one thread, no memory system in the way.
//
// The down projection sums y += h_r * row_r over the active rows r of ffn_down_t (Q4_0: one fp16
// scale d per 32 codes). Each design below computes that for a random share of the rows, in
// tiles, and is checked against an f64 reference (nmse). Variants:
//   float8   the float tiles (kx_axpy_q4 in kairox-sparse.cpp): 8 rows; each code widened to a
//            float, one FMA per code and row, the coefficient h_r * d_rb scalar per row-block
//   i16g8    int16 coefficients, 8 rows: each block's 8 coefficients quantized together (lanes =
//            16 blocks), the d's gathered, two rows' codes per dpwssd (an earlier attempt)
//   i16p16   int16 coefficients, 16 rows, the d's picked out by word permutes, lo + 16 hi
//            multiplied whole (kx_axpy_q4_0_i16, the kept design)
//   i8p16    int8 coefficients, 16 rows: four rows' codes interleaved by vpermb into each VNNI
//            dpbusd (faster in cache; nmse ~4e-5, and no faster from memory)
//
//   g++ -O2 -march=native experiments/q4_0_axpy_tiles.cpp -o /tmp/q4_0_axpy_tiles   (AVX-512 BW, VBMI, VNNI)
//   /tmp/q4_0_axpy_tiles [d n density]       (default 576 1536 0.75: the default model's down)
//
// Output: per variant, nmse against the f64 reference and the best of 200 timings (us per call,
// ns per row-block of 32 codes).
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

struct blk { uint16_t d; uint8_t qs[16]; } __attribute__((packed));
static_assert(sizeof(blk) == 18, "block_q4_0");
typedef void (*kfn)(int d, const char * const * rows, const float * coef, float * y);

static double now_ns() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }

template <int R> static void float8(int d, const char * const * rows, const float * coef, float * y) {
    for (int b = 0; b < d / 32; ++b) {
        float * yb = y + 32 * b;
        __m512 z0 = _mm512_loadu_ps(yb), z1 = _mm512_loadu_ps(yb + 16);
        float bias = 0;
        for (int r = 0; r < R; ++r) {
            const blk * k = (const blk *) rows[r] + b;
            const float c = coef[r] * _cvtsh_ss(k->d);
            bias -= 8 * c;
            const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *) k->qs));
            const __m512 cv = _mm512_set1_ps(c);
            z0 = _mm512_fmadd_ps(cv, _mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(15))), z0);
            z1 = _mm512_fmadd_ps(cv, _mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), z1);
        }
        _mm512_storeu_ps(yb, _mm512_add_ps(z0, _mm512_set1_ps(bias)));
        _mm512_storeu_ps(yb + 16, _mm512_add_ps(z1, _mm512_set1_ps(bias)));
    }
}

// h * d of blocks b0 .. b0 + nbc - 1 of a row (p at block b0), lanes = blocks
static __m512 coefs_gather(const char * p, int nbc, float h) {
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(18));
    const __mmask16 m = (__mmask16) ((1u << nbc) - 1);
    const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, p, 1);
    return _mm512_mul_ps(_mm512_set1_ps(h), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)));
}
static __m512 coefs_permute(const char * p, int nbc, float h) {
    const __m512i ia = _mm512_setr_epi32(0 | 9 << 16, 18 | 27 << 16, 36 | 45 << 16, 54 | 63 << 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i ib = _mm512_setr_epi32(0, 0, 0, 0, 0 | 9 << 16, 18 | 27 << 16, 36 | 45 << 16, 54 | 63 << 16, 0, 0, 0, 0, 0, 0, 0, 0);
    const int need = 18 * (nbc - 1) + 2;
    auto part = [&](int off) {
        const int left = need - off;
        return left >= 64 ? _mm512_loadu_si512(p + off) : left > 0 ? _mm512_maskz_loadu_epi8((__mmask64) ((1ull << left) - 1), p + off) : _mm512_setzero_si512();
    };
    __m512i dd = _mm512_permutex2var_epi16(part(0), ia, part(64));
    if (nbc > 8) { dd = _mm512_mask_blend_epi16((__mmask32) 0xFF00, dd, _mm512_permutex2var_epi16(part(144), ib, part(208))); }
    return _mm512_mul_ps(_mm512_set1_ps(h), _mm512_maskz_cvtph_ps((__mmask16) ((1u << nbc) - 1), _mm512_castsi512_si256(dd)));
}

// per lane (block): the scale that maps the largest of the R |coefficients| to `top`; unit = one step
template <int R> static __m512 scale(const __m512 * c, float top, float * unit) {
    __m512 amax = _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) { amax = _mm512_max_ps(amax, _mm512_abs_ps(c[r])); }
    _mm512_storeu_ps(unit, _mm512_mul_ps(amax, _mm512_set1_ps(1.0f / top)));
    return _mm512_maskz_div_ps(_mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_GT_OQ), _mm512_set1_ps(top), amax);
}
// bias = -8 * unit * (sum of the quantized coefficients): the codes' -8
static void offsets(const float * unit, __m512i sum, float * bias) {
    _mm512_storeu_ps(bias, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(unit), _mm512_set1_ps(-8.0f)), _mm512_cvtepi32_ps(sum)));
}

static inline void add32(float * yb, __m512i lo, __m512i hi, float unit, float bias) {
    const __m512 u = _mm512_set1_ps(unit), b = _mm512_set1_ps(bias);
    _mm512_storeu_ps(yb, _mm512_add_ps(_mm512_loadu_ps(yb), _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), u, b)));
    _mm512_storeu_ps(yb + 16, _mm512_add_ps(_mm512_loadu_ps(yb + 16), _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), u, b)));
}

template <int R, bool GATHER> static void int16(int d, const char * const * rows, const float * coef, float * y) {
    const int nb = d / 32;
    const __m256i perm = _mm256_setr_epi8(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int b0 = 0; b0 < nb; b0 += 16) {
        const int nbc = std::min(16, nb - b0);
        __m512 c[R];
        alignas(64) int32_t pc[R / 2][16];
        float unit[16], bias[16];
        for (int r = 0; r < R; ++r) { c[r] = (GATHER ? coefs_gather : coefs_permute)(rows[r] + 18 * b0, nbc, coef[r]); }
        const __m512 inv = scale<R>(c, 32767.0f, unit);
        __m512i sum = _mm512_setzero_si512();
        for (int p = 0; p < R / 2; ++p) {
            const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(c[2 * p], inv)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(c[2 * p + 1], inv));
            _mm512_store_si512(pc[p], _mm512_or_si512(_mm512_and_si512(q0, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(q1, 16)));
            sum = _mm512_add_epi32(sum, _mm512_add_epi32(q0, q1));
        }
        offsets(unit, sum, bias);
        for (int i = 0; i < nbc; ++i) {
            const int b = b0 + i;
            __m512i all = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
            for (int p = 0; p < R / 2; ++p) {
                const __m128i a = _mm_loadu_si128((const __m128i *) ((const blk *) rows[2 * p] + b)->qs);
                const __m128i e = _mm_loadu_si128((const __m128i *) ((const blk *) rows[2 * p + 1] + b)->qs);
                const __m256i x = _mm256_permutexvar_epi8(perm, _mm256_inserti128_si256(_mm256_castsi128_si256(a), e, 1));
                const __m512i cv = _mm512_set1_epi32(pc[p][i]);
                all = _mm512_dpwssd_epi32(all, _mm512_cvtepu8_epi16(x), cv);
                hi = _mm512_dpwssd_epi32(hi, _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(x, 4), m4)), cv);
            }
            add32(y + 32 * b, _mm512_sub_epi32(all, _mm512_slli_epi32(hi, 4)), hi, unit[i], bias[i]);
        }
    }
}

template <int R> static void int8(int d, const char * const * rows, const float * coef, float * y) {
    const int nb = d / 32;
    alignas(64) uint8_t pv[64];
    for (int i = 0; i < 64; ++i) { pv[i] = (uint8_t) (16 * (i % 4) + i / 4); }
    const __m512i perm = _mm512_load_si512(pv), m4 = _mm512_set1_epi8(15), lo8 = _mm512_set1_epi32(0xFF);
    for (int b0 = 0; b0 < nb; b0 += 16) {
        const int nbc = std::min(16, nb - b0);
        __m512 c[R];
        alignas(64) int32_t pc[R / 4][16];
        float unit[16], bias[16];
        for (int r = 0; r < R; ++r) { c[r] = coefs_permute(rows[r] + 18 * b0, nbc, coef[r]); }
        const __m512 inv = scale<R>(c, 127.0f, unit);
        __m512i sum = _mm512_setzero_si512();
        for (int g = 0; g < R / 4; ++g) {
            __m512i s[4];
            for (int k = 0; k < 4; ++k) { s[k] = _mm512_cvtps_epi32(_mm512_mul_ps(c[4 * g + k], inv)); sum = _mm512_add_epi32(sum, s[k]); }
            _mm512_store_si512(pc[g], _mm512_or_si512(_mm512_or_si512(_mm512_and_si512(s[0], lo8), _mm512_slli_epi32(_mm512_and_si512(s[1], lo8), 8)),
                                                      _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(s[2], lo8), 16), _mm512_slli_epi32(s[3], 24))));
        }
        offsets(unit, sum, bias);
        for (int i = 0; i < nbc; ++i) {
            const int b = b0 + i;
            __m512i all = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
            for (int g = 0; g < R / 4; ++g) {
                auto qs = [&](int k) { return _mm_loadu_si128((const __m128i *) ((const blk *) rows[4 * g + k] + b)->qs); };
                __m512i x = _mm512_castsi128_si512(qs(0));
                x = _mm512_inserti32x4(x, qs(1), 1);
                x = _mm512_inserti32x4(x, qs(2), 2);
                x = _mm512_inserti32x4(x, qs(3), 3);
                x = _mm512_permutexvar_epi8(perm, x);
                const __m512i cv = _mm512_set1_epi32(pc[g][i]);
                all = _mm512_dpbusd_epi32(all, x, cv);
                hi = _mm512_dpbusd_epi32(hi, _mm512_and_si512(_mm512_srli_epi16(x, 4), m4), cv);
            }
            add32(y + 32 * b, _mm512_sub_epi32(all, _mm512_slli_epi32(hi, 4)), hi, unit[i], bias[i]);
        }
    }
}

int main(int argc, char ** argv) {
    const int d = argc > 1 ? atoi(argv[1]) : 576, n = argc > 2 ? atoi(argv[2]) : 1536;
    const double dens = argc > 3 ? atof(argv[3]) : 0.75;
    if (d <= 0 || d % 32 || n <= 0) { fprintf(stderr, "d must be a positive multiple of 32\n"); return 1; }
    srand(1);
    const int nb = d / 32;
    const size_t rb = nb * sizeof(blk);
    std::vector<char> W(rb * n + 64);
    for (int r = 0; r < n; ++r) {
        for (int b = 0; b < nb; ++b) {
            blk * k = (blk *) (W.data() + r * rb) + b;
            k->d = _cvtss_sh((rand() / (float) RAND_MAX) * 0.02f + 0.001f, 0);
            for (int i = 0; i < 16; ++i) { k->qs[i] = rand() & 255; }
        }
    }
    std::vector<float> h(n);
    for (auto & v : h) { v = (rand() / (float) RAND_MAX - 0.5f) * (rand() % 4 == 0 ? 4 : 1); } // heavy-ish tails
    std::vector<int> L;
    for (int r = 0; r < n; ++r) { if (rand() / (double) RAND_MAX < dens) { L.push_back(r); } }
    L.resize(L.size() / 16 * 16);
    std::vector<double> ref(d, 0.0);
    for (int r : L) {
        for (int b = 0; b < nb; ++b) {
            const blk * k = (const blk *) (W.data() + r * rb) + b;
            const double c = h[r] * (double) _cvtsh_ss(k->d);
            for (int j = 0; j < 16; ++j) { ref[32 * b + j] += c * ((k->qs[j] & 15) - 8); ref[32 * b + 16 + j] += c * ((k->qs[j] >> 4) - 8); }
        }
    }
    struct variant { const char * name; kfn f; int rows; } vs[] = {
        { "float8", float8<8>, 8 }, { "i16g8", int16<8, true>, 8 }, { "i16p16", int16<16, false>, 16 }, { "i8p16", int8<16>, 16 },
    };
    std::vector<float> y(d);
    printf("| variant | nmse | us per call | ns per row-block |\n|---|---|---|---|\n");
    for (const auto & v : vs) {
        double best = 1e30, err = 0, sig = 0;
        for (int rep = 0; rep < 200; ++rep) {
            std::fill(y.begin(), y.end(), 0.0f);
            const double t0 = now_ns();
            for (size_t i = 0; i + v.rows <= L.size(); i += v.rows) {
                const char * rp[16];
                float c[16];
                for (int j = 0; j < v.rows; ++j) { rp[j] = W.data() + L[i + j] * rb; c[j] = h[L[i + j]]; }
                v.f(d, rp, c, y.data());
            }
            best = std::min(best, now_ns() - t0);
        }
        for (int j = 0; j < d; ++j) { err += (y[j] - ref[j]) * (y[j] - ref[j]); sig += ref[j] * ref[j]; }
        printf("| %s | %.2e | %.1f | %.2f |\n", v.name, err / sig, best / 1e3, best / (L.size() * (double) nb));
    }
    return 0;
}
