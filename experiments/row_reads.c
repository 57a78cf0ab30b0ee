// row_reads: what reading a random share of a matrix's rows costs, with no arithmetic at all.
//
// The sparse FFN kernels read only the active rows; this measures the memory system's side of
// that alone: each call loads every byte of the listed rows (32-byte loads summed into one
// register) of a weight copy from memory, the rows of a random mask split between the threads
// as the kernels split them, with the next rows requested ahead (prefetcht1, 16 rows ahead, as
// kx_stream does). "all" reads every row in order (what a dense kernel reads); each density's
// calls alternate call by call with "all" calls, so the ratio is measured side by side. If
// reading 75% of the rows takes as long as reading all of them, no kernel that reads the rows'
// bytes can beat a dense kernel that reads at the same speed.
//
//   cc -O2 -march=native -pthread experiments/row_reads.c -o /tmp/row_reads
//   /tmp/row_reads [row_bytes:rows ...]        (default: the rows of the op table's shapes)
//
// Output: a Markdown table, one line per shape and density: median microseconds per matrix of
// "all" and of the sparse reads, their ratio, and the share of 64-byte lines the rows touch.
//
//   /tmp/row_reads [--huge] --ways [row_bytes:rows ...]
//
// compares ways of requesting the rows (75% and 90% of them), each against "all" read the same
// way and against the fastest "all" of any way (a dense kernel streams with the hardware
// prefetchers alone): "ahead" (the default above), "hw" (no software prefetch), "gaps" (hardware
// prefetchers, and the skipped rows' lines requested too, so that the stream has no holes),
// "after-gap" (hardware prefetchers, and only the rows that follow a gap requested, 4 rows ahead),
// "ahead32" (as "ahead", 32 rows ahead), "nta" (as "ahead", prefetchnta), "hw4" (no software
// prefetch, each thread's rows read as 4 interleaved streams, so that one stream's stall at a
// gap overlaps the others' reads). --huge puts the copies in 2 MiB pages (transparent huge
// pages by madvise): the hardware prefetchers' sequential reads gain from them (AMD VM, all
// 1152-byte rows: 41-43 -> 31-34 us), the random 90% with requests ahead do not (44-45 us).
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>

enum { NTH = 2, PER_CALL = 32, MASKS = 16, AHEAD = 16, REPS = 120 };
enum way { WAY_AHEAD, WAY_HW, WAY_GAPS, WAY_AFTER_GAP, WAY_AHEAD32, WAY_NTA, WAY_HW4, N_WAYS };
static const char * const way_names[N_WAYS] = { "ahead", "hw", "gaps", "after-gap", "ahead32", "nta", "hw4" };

typedef struct {
    const char * buf;
    size_t rb, mat;
    int ncopy;
    const int * list[MASKS];
    int nlist[MASKS];
    int first_copy, mask0;       // this call's first weight copy and mask
    int way;                     // enum way: how the rows are requested
    _Atomic int go, done;
    long long sink[NTH];
} shared_t;

static shared_t S;

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

// Requests every line of rows [r0, r1) of the copy at base: into L2 for the rows ahead (as
// kx_stream does), into L1 for the gaps, which are needed at once.
static void prefetch_rows(const char * base, int r0, int r1) {
    for (int r = r0; r < r1; ++r) {
        const char * q = base + (size_t) r * S.rb;
        for (size_t o = 0; o < S.rb + 63; o += 64) {
            if (S.way == WAY_GAPS) {
                _mm_prefetch(q + o, _MM_HINT_T0);
            } else if (S.way == WAY_NTA) {
                _mm_prefetch(q + o, _MM_HINT_NTA);
            } else {
                _mm_prefetch(q + o, _MM_HINT_T1);
            }
        }
    }
}

// every byte of one row, 32-byte loads summed into acc
static inline __m256i read_row(__m256i acc, const char * r) {
    size_t o = 0;
    for (; o + 32 <= S.rb; o += 32) {
        acc = _mm256_add_epi8(acc, _mm256_loadu_si256((const __m256i *) (r + o)));
    }
    for (; o < S.rb; ++o) {
        acc = _mm256_add_epi8(acc, _mm256_set1_epi8(r[o]));
    }
    return acc;
}

static void read_share(int th) {
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < PER_CALL; ++c) {
        const char * base = S.buf + (size_t) ((S.first_copy + c) % S.ncopy) * S.mat;
        const int m = (S.mask0 + c) % MASKS;
        const int * L = S.list[m];
        const int n = S.nlist[m], i0 = n * th / NTH, i1 = n * (th + 1) / NTH;
        if (S.way == WAY_HW4) {
            const int len = (i1 - i0 + 3) / 4;
            for (int k = 0; k < len; ++k) {
                for (int st = 0; st < 4; ++st) {
                    const int i = i0 + st * len + k;
                    if (i >= i1) { continue; }
                    acc = read_row(acc, base + (size_t) L[i] * S.rb);
                }
            }
            continue;
        }
        for (int i = i0; i < i1; ++i) {
            if ((S.way == WAY_AHEAD || S.way == WAY_NTA) && i + AHEAD < i1) {
                prefetch_rows(base, L[i + AHEAD], L[i + AHEAD] + 1);
            } else if (S.way == WAY_AHEAD32 && i + 32 < i1) {
                prefetch_rows(base, L[i + 32], L[i + 32] + 1);
            } else if (S.way == WAY_GAPS && i + 1 < i1) {
                prefetch_rows(base, L[i] + 1, L[i + 1]);
            } else if (S.way == WAY_AFTER_GAP && i + 4 < i1 && L[i + 4] != L[i + 3] + 1) {
                prefetch_rows(base, L[i + 4], L[i + 4] + 1);
            }
            acc = read_row(acc, base + (size_t) L[i] * S.rb);
        }
    }
    S.sink[th] += _mm256_extract_epi64(acc, 0);
}

static void * worker(void * arg) {
    const int th = (int) (intptr_t) arg;
    int seen = 0;
    for (;;) {
        int g;
        while ((g = atomic_load(&S.go)) == seen) { _mm_pause(); }
        if (g < 0) { return NULL; }
        seen = g;
        read_share(th);
        atomic_fetch_add(&S.done, 1);
    }
}

static int call_no = 0;
static double timed_call(const int * const * lists, const int * nlists, int way) {
    S.way = way;
    for (int m = 0; m < MASKS; ++m) { S.list[m] = lists[m]; S.nlist[m] = nlists[m]; }
    S.first_copy = rand() % S.ncopy;
    S.mask0 = rand() % MASKS;
    atomic_store(&S.done, 0);
    const double t0 = now_us();
    atomic_store(&S.go, ++call_no);
    read_share(0);
    while (atomic_load(&S.done) < NTH - 1) { _mm_pause(); }
    return (now_us() - t0) / PER_CALL;
}

static int cmp_d(const void * a, const void * b) {
    const double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

static double median(double * v, int n) {
    qsort(v, n, sizeof(double), cmp_d);
    return v[n / 2];
}

// ways: 0 = the default table (way "ahead", densities 10-90%), 1 = every way at 75% and 90%.
static int huge = 0; // --huge: the weight copies in 2 MiB pages
static void run_shape(size_t rb, int rows, int ways) {
    static const double dens_all[] = { 0.10, 0.25, 0.50, 0.75, 0.90 };
    const double * dens = ways ? dens_all + 3 : dens_all;
    const size_t n_dens = ways ? 2 : 5;
    const int n_ways = ways ? N_WAYS : 1;
    S.rb = rb;
    S.mat = rb * rows;
    S.ncopy = (int) ((512u << 20) / S.mat); // 512 MiB of copies: far beyond the L3
    if (S.ncopy < 2) { S.ncopy = 2; }
    // 2 MiB-aligned, so that --huge can ask for transparent huge pages (madvise)
    const size_t bsz = (S.mat * S.ncopy + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    char * buf = aligned_alloc(2u << 20, bsz);
    if (huge) { madvise(buf, bsz, MADV_HUGEPAGE); }
    memset(buf, 1, S.mat * S.ncopy);
    S.buf = buf;

    int * all = malloc(sizeof(int) * rows);
    for (int r = 0; r < rows; ++r) { all[r] = r; }
    const int * all_l[MASKS];
    int all_n[MASKS];
    for (int m = 0; m < MASKS; ++m) { all_l[m] = all; all_n[m] = rows; }

    for (size_t di = 0; di < n_dens; ++di) {
        int * lists[MASKS];
        int nl[MASKS];
        double lines = 0;
        const size_t nlines = (S.mat + 63) / 64;
        char * touched = malloc(nlines);
        for (int m = 0; m < MASKS; ++m) {
            lists[m] = malloc(sizeof(int) * rows);
            nl[m] = 0;
            memset(touched, 0, nlines);
            for (int r = 0; r < rows; ++r) {
                if ((double) rand() / RAND_MAX < dens[di]) {
                    lists[m][nl[m]++] = r;
                    for (size_t l = (size_t) r * rb / 64; l <= ((size_t) r * rb + rb - 1) / 64; ++l) { touched[l] = 1; }
                }
            }
            size_t t = 0;
            for (size_t l = 0; l < nlines; ++l) { t += touched[l]; }
            lines += (double) t / nlines / MASKS;
        }
        free(touched);
        double ta[N_WAYS][REPS], ts[N_WAYS][REPS], ma[N_WAYS], ms[N_WAYS], best_all = 1e30;
        for (int k = 0; k < REPS; ++k) {
            for (int w = 0; w < n_ways; ++w) {
                ta[w][k] = timed_call(all_l, all_n, w);
                ts[w][k] = timed_call((const int * const *) lists, nl, w);
            }
        }
        for (int w = 0; w < n_ways; ++w) {
            ma[w] = median(ta[w], REPS);
            ms[w] = median(ts[w], REPS);
            if (ma[w] < best_all) { best_all = ma[w]; }
        }
        for (int w = 0; w < n_ways; ++w) {
            if (ways) {
                printf("| %zu x %d | %.0f%% | %s | %.1f | %.1f | %.2fx | %.2fx |\n", rb, rows, 100 * dens[di], way_names[w],
                       ma[w], ms[w], ma[w] / ms[w], best_all / ms[w]);
            } else {
                printf("| %zu x %d | %.0f%% | %.1f | %.1f | %.2fx | %.0f%% |\n", rb, rows, 100 * dens[di], ma[w], ms[w],
                       ma[w] / ms[w], 100 * lines);
            }
        }
        fflush(stdout);
        for (int m = 0; m < MASKS; ++m) { free(lists[m]); }
    }
    free(all);
    free(buf);
}

int main(int argc, char ** argv) {
    srand(1);
    pthread_t t[NTH];
    for (int i = 1; i < NTH; ++i) { pthread_create(&t[i], NULL, worker, (void *) (intptr_t) i); }
    int first = 1, ways = 0;
    if (argc > first && strcmp(argv[first], "--huge") == 0) { huge = 1; ++first; }
    if (argc > first && strcmp(argv[first], "--ways") == 0) { ways = 1; ++first; }
    if (ways) {
        printf("| row bytes x rows | rows read | way | all (us) | those rows (us) | all / those | fastest all / those |\n");
        printf("|---|---|---|---|---|---|---|\n");
    } else {
        printf("| row bytes x rows | rows read | all (us) | those rows (us) | all / those | lines touched |\n");
        printf("|---|---|---|---|---|---|\n");
    }
    if (argc > first) {
        for (int i = first; i < argc; ++i) {
            size_t rb; int rows;
            if (sscanf(argv[i], "%zu:%d", &rb, &rows) != 2 || rb == 0 || rows <= 0) {
                fprintf(stderr, "row_reads: expected row_bytes:rows, got '%s'\n", argv[i]);
                return 1;
            }
            run_shape(rb, rows, ways);
        }
    } else {
        // Q4_0 576x1536 (gate/up and down_t rows), Q8_0 576x1536, Q4_0 4096x11008, Q6_K 4096x11008
        run_shape(324, 1536, ways);
        run_shape(612, 1536, ways);
        run_shape(2304, 11008, ways);
        run_shape(3360, 11008, ways);
    }
    atomic_store(&S.go, -1);
    for (int i = 1; i < NTH; ++i) { pthread_join(t[i], NULL); }
    return 0;
}
