/* y = x @ W.T + b for thin x (a few rows: a decoding step or a verify forward), float32, CPU.
 *
 * Built on the user's machine by specviz/models/thin_kernel.py (cc -O3 -march=native -fopenmp) and called
 * through ctypes. W is packed once into column panels: panel p holds outputs 16p .. 16p + 15 for every k, 16
 * floats per k, so one panel streams from memory front to back while up to MAX_ROWS rows of x are multiplied
 * against it in registers. Up to PAIR_ROWS rows, two neighbouring panels are read side by side instead: two
 * streams in flight keep the memory busy while the rows' arithmetic runs, which one stream with a long software
 * prefetch did not (docs/bench-log/notes.md, session 19). Every output is the same sum in the same order (k
 * ascending, one fused multiply-add per k) whatever the number of rows or panels, so a row's result does not
 * depend on the rows beside it.
 *
 * Vectors are the machine's own width (16 floats with AVX-512, 8 with AVX2: a panel row is then two registers),
 * so the accumulators stay in registers on both.
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
#define LANES 16    /* floats per vector register */
#define MAX_ROWS 16 /* 16 accumulators: a verify of up to 16 rows reads a panel once */
#define PAIR_ROWS 8 /* up to 8 rows read two panels at once: two streams in flight, one broadcast of x per pair */
#else
#define LANES 8     /* a panel row is two AVX2 registers */
#define MAX_ROWS 4  /* 8 accumulators */
#define PAIR_ROWS 2 /* 8 accumulators over two panels */
#endif
#define SLICES (PANEL / LANES)
#define PREFETCH_AHEAD 32 /* panel rows (of 16 floats) ahead of the one being read, into L1 */
#define PREFETCH_FAR 128  /* and, reading one panel, further ahead into L2 */

typedef float vec __attribute__((vector_size(LANES * sizeof(float)), aligned(4)));

int thin_max_rows(void) { return MAX_ROWS; }

int thin_pair_rows(void) { return PAIR_ROWS; }

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

/* R rows of x against P consecutive panels (P * 16 outputs, the last panel's first `width` of them kept). */
#define KERNEL(R, P)                                                                                            \
    static void rows_##R##_panels_##P(const float *restrict x, const float *restrict panel, float *restrict y,  \
                                      long k, long n, long width, const float *restrict bias) {                  \
        vec acc[P][R][SLICES];                                                                                  \
        _Pragma("GCC unroll 2") for (int q = 0; q < P; q++)                                                     \
            _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                                \
                _Pragma("GCC unroll 2") for (int s = 0; s < SLICES; s++) acc[q][r][s] = (vec){0};               \
        for (long kk = 0; kk < k; kk++) {                                                                       \
            vec w[P][SLICES];                                                                                   \
            _Pragma("GCC unroll 2") for (int q = 0; q < P; q++) {                                               \
                const float *stream = panel + q * k * PANEL;                                                    \
                __builtin_prefetch(stream + (kk + PREFETCH_AHEAD) * PANEL);                                     \
                if (P == 1) /* two streams keep enough in flight without it (measured) */                     \
                    __builtin_prefetch(stream + (kk + PREFETCH_FAR) * PANEL, 0, 1);                             \
                _Pragma("GCC unroll 2") for (int s = 0; s < SLICES; s++)                                        \
                    w[q][s] = *(const vec *)(stream + kk * PANEL + s * LANES);                                  \
            }                                                                                                   \
            _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                              \
                float xr = x[r * k + kk];                                                                       \
                _Pragma("GCC unroll 2") for (int q = 0; q < P; q++)                                             \
                    _Pragma("GCC unroll 2") for (int s = 0; s < SLICES; s++) acc[q][r][s] += xr * w[q][s];      \
            }                                                                                                   \
        }                                                                                                       \
        for (int q = 0; q < P; q++)                                                                             \
            for (int r = 0; r < R; r++) {                                                                       \
                float out[PANEL];                                                                               \
                long kept = q == P - 1 ? width : PANEL;                                                         \
                const float *b = bias ? bias + q * PANEL : 0;                                                   \
                __builtin_memcpy(out, acc[q][r], sizeof out);                                                   \
                for (long j = 0; j < kept; j++) y[r * n + q * PANEL + j] = b ? out[j] + b[j] : out[j];          \
            }                                                                                                   \
    }

typedef void (*kernel_fn)(const float *, const float *, float *, long, long, long, const float *);

KERNEL(1, 1) KERNEL(2, 1) KERNEL(3, 1) KERNEL(4, 1) KERNEL(1, 2) KERNEL(2, 2)
#if MAX_ROWS > 4
KERNEL(5, 1) KERNEL(6, 1) KERNEL(7, 1) KERNEL(8, 1)
KERNEL(9, 1) KERNEL(10, 1) KERNEL(11, 1) KERNEL(12, 1) KERNEL(13, 1) KERNEL(14, 1) KERNEL(15, 1) KERNEL(16, 1)
KERNEL(3, 2) KERNEL(4, 2) KERNEL(5, 2) KERNEL(6, 2) KERNEL(7, 2) KERNEL(8, 2)
#endif

static const kernel_fn ONE_PANEL[MAX_ROWS + 1] = {
    0, rows_1_panels_1, rows_2_panels_1, rows_3_panels_1, rows_4_panels_1,
#if MAX_ROWS > 4
    rows_5_panels_1, rows_6_panels_1, rows_7_panels_1, rows_8_panels_1, rows_9_panels_1, rows_10_panels_1,
    rows_11_panels_1, rows_12_panels_1, rows_13_panels_1, rows_14_panels_1, rows_15_panels_1, rows_16_panels_1,
#endif
};

static const kernel_fn TWO_PANELS[PAIR_ROWS + 1] = {
    0, rows_1_panels_2, rows_2_panels_2,
#if PAIR_ROWS > 2
    rows_3_panels_2, rows_4_panels_2, rows_5_panels_2, rows_6_panels_2, rows_7_panels_2, rows_8_panels_2,
#endif
};

/* x: [m, k], packed: thin_pack of W [n, k], bias: [n] or NULL, y: [m, n]; all contiguous float32. */
void thin_linear(const float *x, const float *packed, const float *bias, float *y, long m, long n, long k) {
    long panels = (n + PANEL - 1) / PANEL;
    long pairs = m <= PAIR_ROWS ? n / PANEL / 2 : 0; /* pairs of full panels; the rest one by one */
    long units = pairs + panels - 2 * pairs;
    #pragma omp parallel for schedule(static)
    for (long u = 0; u < units; u++) {
        long p = u < pairs ? 2 * u : u + pairs;
        const float *panel = packed + p * k * PANEL;
        const float *b = bias ? bias + p * PANEL : 0;
        if (u < pairs) {
            TWO_PANELS[m](x, panel, y + p * PANEL, k, n, PANEL, b);
            continue;
        }
        long width = n - p * PANEL < PANEL ? n - p * PANEL : PANEL;
        for (long first = 0; first < m; first += MAX_ROWS) {
            long rows = m - first < MAX_ROWS ? m - first : MAX_ROWS;
            ONE_PANEL[rows](x + first * k, panel, y + first * n + p * PANEL, k, n, width, b);
        }
    }
}
