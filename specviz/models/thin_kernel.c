/* y = x @ W.T + b for thin x (a few rows: a decoding step or a verify forward), float32, CPU.
 *
 * Built on the user's machine by specviz/models/thin_kernel.py (cc -O3 -march=native -fopenmp) and called
 * through ctypes. W is packed once into column panels: panel p holds outputs 16p .. 16p + 15 for every k, 16
 * floats per k, so one panel streams from memory front to back while up to MAX_ROWS rows of x are multiplied
 * against it in registers. Every output is the same sum in the same order (k ascending, one fused multiply-add
 * per k) whatever the number of rows, so a row's result does not depend on the rows beside it.
 *
 * Threads: OpenMP over panels. Loaded into a process whose torch runs on GNU OpenMP, this library shares
 * torch's libgomp and so its thread pool and thread count (the Python side checks that before loading).
 */
#include <stddef.h>

#if !defined(__AVX2__) || !defined(__FMA__)
#error "the thin kernel needs AVX2 and FMA"
#endif

#define PANEL 16
#ifdef __AVX512F__
#define MAX_ROWS 8 /* 8 accumulators of one 16-float register each */
#else
#define MAX_ROWS 4 /* 16 floats are two AVX2 registers: 8 accumulators */
#endif
#define PREFETCH_AHEAD 32 /* panel rows (of 16 floats) ahead of the one being read */

typedef float floats16 __attribute__((vector_size(64), aligned(4)));

int thin_max_rows(void) { return MAX_ROWS; }

long thin_packed_floats(long n, long k) { return (n + PANEL - 1) / PANEL * PANEL * k; }

/* w: [n, k] row-major -> out: thin_packed_floats(n, k) floats, missing outputs of the last panel zero. */
void thin_pack(const float *restrict w, float *restrict out, long n, long k) {
    long panels = (n + PANEL - 1) / PANEL;
    #pragma omp parallel for schedule(static)
    for (long p = 0; p < panels; p++)
        for (long kk = 0; kk < k; kk++)
            for (long j = 0; j < PANEL; j++) {
                long row = p * PANEL + j;
                out[(p * k + kk) * PANEL + j] = row < n ? w[row * k + kk] : 0.0f;
            }
}

#define ROWS_KERNEL(R)                                                                                          \
    static void rows_##R(const float *restrict x, const float *restrict panel, float *restrict y, long k,       \
                         long n, long width, const float *restrict bias) {                                      \
        floats16 acc[R];                                                                                        \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = (floats16){0};                             \
        for (long kk = 0; kk < k; kk++) {                                                                       \
            __builtin_prefetch(panel + (kk + PREFETCH_AHEAD) * PANEL);                                          \
            floats16 w = *(const floats16 *)(panel + kk * PANEL);                                               \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] += x[r * k + kk] * w;                    \
        }                                                                                                       \
        for (int r = 0; r < R; r++) {                                                                           \
            float out[PANEL];                                                                                   \
            __builtin_memcpy(out, &acc[r], sizeof out);                                                         \
            for (long j = 0; j < width; j++) y[r * n + j] = bias ? out[j] + bias[j] : out[j];                   \
        }                                                                                                       \
    }

ROWS_KERNEL(1)
ROWS_KERNEL(2)
ROWS_KERNEL(3)
ROWS_KERNEL(4)
#if MAX_ROWS > 4
ROWS_KERNEL(5)
ROWS_KERNEL(6)
ROWS_KERNEL(7)
ROWS_KERNEL(8)
#endif

typedef void (*rows_fn)(const float *, const float *, float *, long, long, long, const float *);
static const rows_fn ROWS[MAX_ROWS + 1] = {
    0, rows_1, rows_2, rows_3, rows_4,
#if MAX_ROWS > 4
    rows_5, rows_6, rows_7, rows_8,
#endif
};

/* x: [m, k], packed: thin_pack of W [n, k], bias: [n] or NULL, y: [m, n]; all contiguous float32. */
void thin_linear(const float *x, const float *packed, const float *bias, float *y, long m, long n, long k) {
    long panels = (n + PANEL - 1) / PANEL;
    #pragma omp parallel for schedule(static)
    for (long p = 0; p < panels; p++) {
        long width = n - p * PANEL < PANEL ? n - p * PANEL : PANEL;
        for (long first = 0; first < m; first += MAX_ROWS) {
            long rows = m - first < MAX_ROWS ? m - first : MAX_ROWS;
            ROWS[rows](x + first * k, packed + p * k * PANEL, y + first * n + p * PANEL, k, n, width,
                       bias ? bias + p * PANEL : NULL);
        }
    }
}
