/* y = x @ W.T + b for thin x (a few rows: a decoding step or a verify forward), CPU, float32 arithmetic.
 *
 * Built on the user's machine by specviz/models/thin_kernel.py (cc -O3 -march=native -fopenmp) and called only
 * from the torch operator specviz::thin_linear (specviz/models/linear_ops.py), which checks every argument. W
 * comes packed once (in torch, by linear_ops.pack) into column panels: panel p holds outputs 16p .. 16p + 15 for
 * every k, 16 values per k, the missing outputs of the last panel zero, so one panel streams from memory front to
 * back while up to MAX_ROWS rows of x are multiplied against it in registers. Up to PAIR_ROWS rows, two
 * neighbouring panels are read side by side instead: two streams in flight keep the memory busy while the rows'
 * arithmetic runs, which one stream with a long software prefetch did not (docs/bench-log/notes.md, session 19).
 * Every output is the same sum in the same order (k ascending, one fused multiply-add per k) whatever the number
 * of rows or panels, so a row's result does not depend on the rows beside it. The rows of x are interleaved first
 * (their k-th values side by side), so a step reads one cache line of x, not one per row.
 *
 * Two weight formats, one kernel: float32 (the target: exact), and for drafters, whose steps are memory-bound
 * and need not be exact, int8 with one float32 scale per output (a quarter of the bytes). The int8 weights are
 * widened to float32 in registers and the rows of x stay float32; an int8 product is scaled per output once,
 * after the sum.
 *
 * Vectors are the machine's own width (16 floats with AVX-512, 8 with AVX2: a panel row is then two registers),
 * so the accumulators stay in registers on both. AVX2's 16 registers hold 6 rows' accumulators (12), a panel row
 * (2) and a broadcast of x: up to 6 rows (the default 4-node tree verifies 5) read each panel once.
 *
 * Threads: OpenMP over panels. Loaded into a process whose torch runs on GNU OpenMP, this library shares
 * torch's libgomp and so its thread pool and thread count (the Python side checks that before loading).
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__AVX2__) || !defined(__FMA__)
#error "the thin kernel needs AVX2 and FMA"
#endif

#define PANEL 16
#ifdef __AVX512F__
#define LANES 16    /* floats per vector register */
#define MAX_ROWS 16 /* 16 accumulators: a verify of up to 16 rows reads a panel once */
#define PAIR_ROWS 12 /* up to 12 rows read two panels at once: two streams in flight, one broadcast of x per pair */
#define LOAD_F32(p) (*(const vec *)(p))
#define LOAD_I8(p) ((vec)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p)))))
#else
#define LANES 8     /* a panel row is two AVX2 registers */
#define MAX_ROWS 6  /* 12 accumulators, 2 weight registers and a broadcast: 15 of the 16 */
#define PAIR_ROWS 2 /* 8 accumulators over two panels */
#define LOAD_F32(p) (*(const vec *)(p))
#define LOAD_I8(p) ((vec)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p)))))
#endif
#define SLICES (PANEL / LANES)
#define STACK_FLOATS 32768 /* x up to 128 KB is interleaved on the stack */
#define PREFETCH_AHEAD 2048 /* bytes ahead of the panel row being read, into L1 */
#define PREFETCH_FAR 8192   /* and, reading one panel, further ahead into L2 */

typedef float vec __attribute__((vector_size(LANES * sizeof(float)), aligned(4)));

int thin_max_rows(void) { return MAX_ROWS; }

int thin_pair_rows(void) { return PAIR_ROWS; }

int thin_panel(void) { return PANEL; }

typedef void (*kernel_fn)(const float *, const void *, float *, long, long, long, const float *, const float *);

/* R rows of x against P consecutive panels of T (P * 16 outputs, the last panel's first `width` of them kept),
 * each output times scale[j] (when given) plus bias[j] (when given). */
#define KERNEL(NAME, T, LOAD, R, P)                                                                             \
    static void NAME##_##R##_##P(const float *restrict x, const void *restrict packed, float *restrict y,      \
                                 long k, long n, long width, const float *restrict scale,                       \
                                 const float *restrict bias) {                                                  \
        const T *restrict panel = packed;                                                                       \
        vec acc[P][R][SLICES];                                                                                  \
        _Pragma("GCC unroll 2") for (int q = 0; q < P; q++)                                                     \
            _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                                \
                _Pragma("GCC unroll 2") for (int s = 0; s < SLICES; s++) acc[q][r][s] = (vec){0};               \
        for (long kk = 0; kk < k; kk++) {                                                                       \
            vec w[P][SLICES];                                                                                   \
            _Pragma("GCC unroll 2") for (int q = 0; q < P; q++) {                                               \
                const T *stream = panel + (q * k + kk) * PANEL;                                                 \
                __builtin_prefetch((const char *)stream + PREFETCH_AHEAD);                                      \
                if (P == 1) /* two streams keep enough in flight without it (measured) */                     \
                    __builtin_prefetch((const char *)stream + PREFETCH_FAR, 0, 1);                              \
                _Pragma("GCC unroll 2") for (int s = 0; s < SLICES; s++) w[q][s] = LOAD(stream + s * LANES);    \
            }                                                                                                   \
            _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                              \
                float xr = x[kk * R + r];                                                                       \
                _Pragma("GCC unroll 2") for (int q = 0; q < P; q++)                                             \
                    _Pragma("GCC unroll 2") for (int s = 0; s < SLICES; s++) acc[q][r][s] += xr * w[q][s];      \
            }                                                                                                   \
        }                                                                                                       \
        for (int q = 0; q < P; q++)                                                                             \
            for (int r = 0; r < R; r++) {                                                                       \
                float out[PANEL];                                                                               \
                long kept = q == P - 1 ? width : PANEL;                                                         \
                const float *a = scale ? scale + q * PANEL : 0, *b = bias ? bias + q * PANEL : 0;               \
                memcpy(out, acc[q][r], sizeof out);                                                             \
                for (long j = 0; j < kept; j++) {                                                               \
                    float v = a ? out[j] * a[j] : out[j];                                                       \
                    y[r * n + q * PANEL + j] = b ? v + b[j] : v;                                                \
                }                                                                                               \
            }                                                                                                   \
    }

/* Every kernel of one weight format, and its two dispatch tables (by rows: one panel, two panels). */
#ifdef __AVX512F__
#define FORMAT(NAME, T, LOAD)                                                                                   \
    KERNEL(NAME, T, LOAD, 1, 1) KERNEL(NAME, T, LOAD, 2, 1) KERNEL(NAME, T, LOAD, 3, 1)                         \
    KERNEL(NAME, T, LOAD, 4, 1) KERNEL(NAME, T, LOAD, 5, 1) KERNEL(NAME, T, LOAD, 6, 1)                         \
    KERNEL(NAME, T, LOAD, 7, 1) KERNEL(NAME, T, LOAD, 8, 1) KERNEL(NAME, T, LOAD, 9, 1)                         \
    KERNEL(NAME, T, LOAD, 10, 1) KERNEL(NAME, T, LOAD, 11, 1) KERNEL(NAME, T, LOAD, 12, 1)                      \
    KERNEL(NAME, T, LOAD, 13, 1) KERNEL(NAME, T, LOAD, 14, 1) KERNEL(NAME, T, LOAD, 15, 1)                      \
    KERNEL(NAME, T, LOAD, 16, 1)                                                                                \
    KERNEL(NAME, T, LOAD, 1, 2) KERNEL(NAME, T, LOAD, 2, 2) KERNEL(NAME, T, LOAD, 3, 2)                         \
    KERNEL(NAME, T, LOAD, 4, 2) KERNEL(NAME, T, LOAD, 5, 2) KERNEL(NAME, T, LOAD, 6, 2)                         \
    KERNEL(NAME, T, LOAD, 7, 2) KERNEL(NAME, T, LOAD, 8, 2) KERNEL(NAME, T, LOAD, 9, 2)                         \
    KERNEL(NAME, T, LOAD, 10, 2) KERNEL(NAME, T, LOAD, 11, 2) KERNEL(NAME, T, LOAD, 12, 2)                      \
    static const kernel_fn NAME##_one[MAX_ROWS + 1] = {                                                         \
        0, NAME##_1_1, NAME##_2_1, NAME##_3_1, NAME##_4_1, NAME##_5_1, NAME##_6_1, NAME##_7_1, NAME##_8_1,     \
        NAME##_9_1, NAME##_10_1, NAME##_11_1, NAME##_12_1, NAME##_13_1, NAME##_14_1, NAME##_15_1, NAME##_16_1}; \
    static const kernel_fn NAME##_two[PAIR_ROWS + 1] = {                                                        \
        0, NAME##_1_2, NAME##_2_2, NAME##_3_2, NAME##_4_2, NAME##_5_2, NAME##_6_2, NAME##_7_2, NAME##_8_2,     \
        NAME##_9_2, NAME##_10_2, NAME##_11_2, NAME##_12_2};
#else
#define FORMAT(NAME, T, LOAD)                                                                                   \
    KERNEL(NAME, T, LOAD, 1, 1) KERNEL(NAME, T, LOAD, 2, 1) KERNEL(NAME, T, LOAD, 3, 1)                         \
    KERNEL(NAME, T, LOAD, 4, 1) KERNEL(NAME, T, LOAD, 5, 1) KERNEL(NAME, T, LOAD, 6, 1)                         \
    KERNEL(NAME, T, LOAD, 1, 2) KERNEL(NAME, T, LOAD, 2, 2)                                                     \
    static const kernel_fn NAME##_one[MAX_ROWS + 1] = {0, NAME##_1_1, NAME##_2_1, NAME##_3_1, NAME##_4_1,       \
                                                       NAME##_5_1, NAME##_6_1};                                 \
    static const kernel_fn NAME##_two[PAIR_ROWS + 1] = {0, NAME##_1_2, NAME##_2_2};
#endif

FORMAT(f32, float, LOAD_F32)
FORMAT(i8, int8_t, LOAD_I8)

/* x's rows in blocks of up to MAX_ROWS (the blocks the kernels read), each block interleaved: its rows' k-th values
 * side by side, so one step of a kernel reads one cache line of x instead of one per row. */
static void interleave(const float *restrict x, float *restrict out, long m, long k) {
    for (long first = 0; first < m; first += MAX_ROWS) {
        long rows = m - first < MAX_ROWS ? m - first : MAX_ROWS;
        for (long kk = 0; kk < k; kk++)
            for (long r = 0; r < rows; r++) out[first * k + kk * rows + r] = x[(first + r) * k + kk];
    }
}

static void run(const kernel_fn *one, const kernel_fn *two, long size, const float *rows_of_x, const void *packed,
                const float *scale, const float *bias, float *y, long m, long n, long k) {
    float stack[m > 1 && m * k <= STACK_FLOATS ? m * k : 1];
    float *x = (float *)rows_of_x;
    if (m > 1) {
        x = m * k <= STACK_FLOATS ? stack : malloc(m * k * sizeof(float));
        if (!x) { /* out of memory: the rows as they are, through one-row kernels (the same sums) */
            for (long r = 0; r < m; r++)
                run(one, two, size, rows_of_x + r * k, packed, scale, bias, y + r * n, 1, n, k);
            return;
        }
        interleave(rows_of_x, x, m, k);
    }
    long panels = (n + PANEL - 1) / PANEL;
    long pairs = m <= PAIR_ROWS ? n / PANEL / 2 : 0; /* pairs of full panels; the rest one by one */
    long units = pairs + panels - 2 * pairs;
    #pragma omp parallel for schedule(static)
    for (long u = 0; u < units; u++) {
        long p = u < pairs ? 2 * u : u + pairs;
        const char *panel = (const char *)packed + p * k * PANEL * size;
        const float *a = scale ? scale + p * PANEL : 0, *b = bias ? bias + p * PANEL : 0;
        if (u < pairs) {
            two[m](x, panel, y + p * PANEL, k, n, PANEL, a, b);
            continue;
        }
        long width = n - p * PANEL < PANEL ? n - p * PANEL : PANEL;
        for (long first = 0; first < m; first += MAX_ROWS) {
            long rows = m - first < MAX_ROWS ? m - first : MAX_ROWS;
            one[rows](x + first * k, panel, y + first * n + p * PANEL, k, n, width, a, b);
        }
    }
    if (x != rows_of_x && x != stack)
        free(x);
}

/* x: [m, k] float32; packed: W [n, k] in panels (float32 or int8); scale: [n] for int8 W, else
 * NULL; bias: [n] or NULL; y: [m, n] float32. All contiguous. */
void thin_linear(const float *x, const float *packed, const float *bias, float *y, long m, long n, long k) {
    run(f32_one, f32_two, sizeof(float), x, packed, 0, bias, y, m, n, k);
}

void thin_linear_i8(const float *x, const int8_t *packed, const float *scale, const float *bias, float *y, long m,
                    long n, long k) {
    run(i8_one, i8_two, sizeof(int8_t), x, packed, scale, bias, y, m, n, k);
}

/* ---- attention over a cache ----------------------------------------------------------------------------------
 *
 * A few query rows, each against its own list of cached positions, every sum in float32, the query heads that share
 * a key/value head (grouped-query attention) served by one read of each key and value from memory. Two entries, each
 * called only from its torch operator, which checks every argument:
 *
 * - decode_attention_bf16 (specviz::decode_attention, specviz/models/decode_attention.py): one query per row (a
 *   decoding step of many answers at once, specviz/training/slot_decoder.py) against that row's cache slot in
 *   bfloat16, positions 0 .. lengths[r] (decode_row). Torch's batched products read a slice of the cache buffer only
 *   after copying it (the slice is not contiguous) and keep the scores in bfloat16.
 * - verify_attention_f32 (specviz::verify_attention, specviz/models/verify_attention.py): the target's own float32
 *   cache, the new tokens of a plain step or a verify forward: row r sees the committed positions 0 .. prefix - 1,
 *   then its own visible new positions (a chain's earlier tokens, a tree node's ancestors) in cache order
 *   (verify_row). A row's result depends only on the keys and values of its own positions, in their order: they
 *   are read in blocks counted from the row's first position, whatever the other rows see, so a verify row whose
 *   positions are the ones a one-token step would see gets that step's output bit for bit.
 *
 * Softmax is online; exp is a polynomial accurate to about one float32 ulp on the range softmax uses. The head size is
 * a multiple of LANES (thin_lanes()) for a float32 cache, of 2 * LANES for a bfloat16 one. */

#ifdef __AVX512F__
#define MAX(a, b) ((vec)_mm512_max_ps((__m512)(a), (__m512)(b)))
#define ROUND(a) ((vec)_mm512_roundscale_ps((__m512)(a), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
#else
#define MAX(a, b) ((vec)_mm256_max_ps((__m256)(a), (__m256)(b)))
#define ROUND(a) ((vec)_mm256_round_ps((__m256)(a), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
#endif
typedef int32_t ivec __attribute__((vector_size(LANES * sizeof(int32_t)), aligned(4)));

int thin_lanes(void) { return LANES; }

/* A vector's lanes reduced to one float by a tree of vector operations (a loop over the lanes would be one long
 * chain): hsum adds them, hmax takes the largest. */
#ifdef __AVX512F__
#define REDUCTION(NAME, WHOLE, PAIRS, LAST)                                                                     \
    static inline float NAME(vec v) { return WHOLE((__m512)v); }
#else
#define REDUCTION(NAME, WHOLE, PAIRS, LAST)                                                                     \
    static inline float NAME(vec v) {                                                                           \
        __m128 half = PAIRS(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));           \
        half = PAIRS(half, _mm_movehl_ps(half, half));                                                          \
        return _mm_cvtss_f32(LAST(half, _mm_movehdup_ps(half)));                                                \
    }
#endif
REDUCTION(hsum, _mm512_reduce_add_ps, _mm_add_ps, _mm_add_ss)
REDUCTION(hmax, _mm512_reduce_max_ps, _mm_max_ps, _mm_max_ss)

/* e^x for x <= 0 (scores minus their maximum): 2^n * 2^f with n = round(x log2 e), |f| <= 1/2, 2^f by its Taylor
 * series to degree 7 (truncation below 1e-8 relative); below -87 it returns e^-87 (~1e-38), which a sum of
 * weights that includes the maximum's 1 cannot tell from zero. */
static inline vec exp_nonpositive(vec x) {
    x = MAX(x, (vec){0} - 87.0f);
    vec t = x * 1.4426950408889634f;
    vec n = ROUND(t);
    vec f = (t - n) * 0.6931471805599453f;
    vec p = 1.0f + f * (1.0f + f * (0.5f + f * (1.0f / 6 + f * (1.0f / 24 + f * (1.0f / 120 + f * (1.0f / 720
            + f * (1.0f / 5040)))))));
    ivec bits = (__builtin_convertvector(n, ivec) + 127) << 23;
    return p * (vec)bits;
}

/* A bfloat16 value is the top half of a float32, so 2 * LANES of them loaded as LANES 32-bit words widen by a shift
 * (the even elements: each word's low half) and a mask (the odd ones: its high half), with no shuffle. Query and
 * output are kept in that even/odd order; the sums are the same. */
#define EVEN(words) ((vec)((words) << 16))
#define ODD(words) ((vec)((words) & (int32_t)0xFFFF0000))

/* decode_row: one (row, key/value head) of a bfloat16 cache: its `group` query heads against positions 0 .. span - 1,
 * in blocks of LANES positions, each block's keys and then its values read once (two streams read side by side, so
 * neither waits for memory alone). Softmax is online: each block's weights are e^(score - the largest score so far),
 * and what was summed before a larger score arrived is scaled down by e^(old - new largest). Inlined per group and
 * head size, so the query heads' accumulators stay in registers. */
static inline __attribute__((always_inline)) void
decode_row(const float *restrict q, const uint16_t *restrict keys, const uint16_t *restrict values,
           float *restrict out, long span, const long group, const long dim, float scale) {
    const long pairs = dim / (2 * LANES);
    vec query[group][pairs][2], acc[group][pairs][2];
    float top[group], total[group];
    for (long j = 0; j < group; j++) {
        top[j] = -1e30f;
        total[j] = 0;
        for (long p = 0; p < pairs; p++) { /* through plain arrays: indexing a vector's lanes would keep the
                                             * accumulators out of registers */
            float even[LANES], odd[LANES];
            for (long i = 0; i < LANES; i++) {
                even[i] = q[j * dim + p * 2 * LANES + 2 * i] * scale;
                odd[i] = q[j * dim + p * 2 * LANES + 2 * i + 1] * scale;
            }
            query[j][p][0] = LOAD_F32(even);
            query[j][p][1] = LOAD_F32(odd);
            acc[j][p][0] = acc[j][p][1] = (vec){0};
        }
    }
    for (long first = 0; first < span; first += LANES) {
        long count = span - first < LANES ? span - first : LANES;
        float weights[group][LANES] __attribute__((aligned(64)));
        for (long t = 0; t < LANES; t++) { /* every query head against each key of the block, read once */
            const uint16_t *key = keys + (first + t) * dim;
            vec sum[group];
            for (long j = 0; j < group; j++) sum[j] = (vec){0};
            if (t < count)
                for (long p = 0; p < pairs; p++) {
                    ivec words = *(const ivec *)(key + p * 2 * LANES);
                    vec even = EVEN(words), odd = ODD(words);
                    for (long j = 0; j < group; j++) sum[j] += query[j][p][0] * even + query[j][p][1] * odd;
                }
            for (long j = 0; j < group; j++) weights[j][t] = t < count ? hsum(sum[j]) : -1e30f;
        }
        for (long j = 0; j < group; j++) {
            vec scores = LOAD_F32(weights[j]);
            float largest = hmax(scores) > top[j] ? hmax(scores) : top[j];
            vec rescale = exp_nonpositive((vec){0} + (top[j] - largest));
            vec w = exp_nonpositive(scores - largest); /* the padding's weights are ~1e-38 */
            *(vec *)weights[j] = w;
            total[j] = total[j] * rescale[0] + hsum(w);
            top[j] = largest;
            for (long p = 0; p < pairs; p++) {
                acc[j][p][0] *= rescale;
                acc[j][p][1] *= rescale;
            }
        }
        for (long t = 0; t < count; t++) { /* every query head's weighted values, each value read once */
            const uint16_t *value = values + (first + t) * dim;
            for (long p = 0; p < pairs; p++) {
                ivec words = *(const ivec *)(value + p * 2 * LANES);
                vec even = EVEN(words), odd = ODD(words);
                for (long j = 0; j < group; j++) {
                    acc[j][p][0] += weights[j][t] * even;
                    acc[j][p][1] += weights[j][t] * odd;
                }
            }
        }
    }
    for (long j = 0; j < group; j++)
        for (long p = 0; p < pairs; p++) {
            float even[LANES], odd[LANES];
            *(vec *)even = acc[j][p][0] / total[j];
            *(vec *)odd = acc[j][p][1] / total[j];
            for (long i = 0; i < LANES; i++) {
                out[j * dim + p * 2 * LANES + 2 * i] = even[i];
                out[j * dim + p * 2 * LANES + 2 * i + 1] = odd[i];
            }
        }
}

/* LANES vectors' lane sums, as one vector (lane t: the sum of partial[t]'s lanes). AVX2: a tree of horizontal adds
 * that transposes as it sums (7 operations for 8 vectors); AVX-512: one reduction per vector. */
static inline __attribute__((always_inline)) vec lanes_summed(const vec *partial) {
#ifdef __AVX512F__
    float sums[LANES] __attribute__((aligned(64)));
    for (long t = 0; t < LANES; t++) sums[t] = hsum(partial[t]);
    return LOAD_F32(sums);
#else
    __m256 a = _mm256_hadd_ps(_mm256_hadd_ps((__m256)partial[0], (__m256)partial[1]),
                              _mm256_hadd_ps((__m256)partial[2], (__m256)partial[3]));
    __m256 b = _mm256_hadd_ps(_mm256_hadd_ps((__m256)partial[4], (__m256)partial[5]),
                              _mm256_hadd_ps((__m256)partial[6], (__m256)partial[7]));
    return (vec)_mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
#endif
}

/* verify_row: one (row, key/value head) of a float32 cache: its `group` query heads against `span` positions, the
 * first `prefix` of them 0 .. prefix - 1 and the rest extras[0 ..], in blocks of BLOCK positions (the online
 * softmax's maximum, exponentials and rescaling once a block). Each query head takes the block in turn, its keys and
 * values in L1 meanwhile: its scores (a tree of horizontal adds turns each key's partial sums into one score), then
 * its weighted values, with the head's query and output in registers. Inlined per group and head size. */
#define BLOCK 32

static inline __attribute__((always_inline)) void
verify_row(const float *restrict q, const float *restrict keys, const float *restrict values, float *restrict out,
           long span, long prefix, const int32_t *restrict extras, const long group, const long dim, float scale) {
    const long vectors = dim / LANES;
    vec query[group][vectors], acc[group][vectors];
    float top[group], total[group];
    for (long j = 0; j < group; j++) {
        top[j] = -1e30f;
        total[j] = 0;
        for (long v = 0; v < vectors; v++) {
            query[j][v] = LOAD_F32(q + j * dim + v * LANES) * scale;
            acc[j][v] = (vec){0};
        }
    }
    for (long first = 0; first < span; first += BLOCK) {
        long count = span - first < BLOCK ? span - first : BLOCK;
        long at[BLOCK]; /* where each position of the block starts in the cache (past the span: position 0's) */
        for (long t = 0; t < BLOCK; t++)
            at[t] = t >= count ? 0 : (first + t < prefix ? first + t : extras[first + t - prefix]) * dim;
        for (long j = 0; j < group; j++) {
            float weights[BLOCK] __attribute__((aligned(64)));
            vec scores[BLOCK / LANES], largest = (vec){0} + top[j];
            for (long s = 0; s < BLOCK / LANES; s++) {
                vec partial[LANES];
                for (long t = 0; t < LANES; t++) { /* the head's query against each key (unrolled, the library
                                                     * took three times as long to build, no faster) */
                    const float *key = keys + at[s * LANES + t];
                    vec sums[2] = {(vec){0}, (vec){0}};
                    for (long v = 0; v < vectors; v++) sums[v & 1] += query[j][v] * LOAD_F32(key + v * LANES);
                    partial[t] = sums[0] + sums[1];
                }
                *(vec *)(weights + s * LANES) = lanes_summed(partial);
            }
            for (long t = count; t < BLOCK; t++) weights[t] = -1e30f;
            for (long s = 0; s < BLOCK / LANES; s++) {
                scores[s] = LOAD_F32(weights + s * LANES);
                largest = MAX(largest, scores[s]);
            }
            float new_top = hmax(largest);
            vec rescale = exp_nonpositive((vec){0} + (top[j] - new_top)), sum = (vec){0};
            for (long s = 0; s < BLOCK / LANES; s++) { /* the padding's weights are ~1e-38 */
                vec w = exp_nonpositive(scores[s] - new_top);
                *(vec *)(weights + s * LANES) = w;
                sum += w;
            }
            total[j] = total[j] * rescale[0] + hsum(sum);
            top[j] = new_top;
            for (long v = 0; v < vectors; v++) acc[j][v] *= rescale;
            for (long t = 0; t < count; t++) { /* the head's weighted values */
                const float *value = values + at[t];
                for (long v = 0; v < vectors; v++) acc[j][v] += weights[t] * LOAD_F32(value + v * LANES);
            }
        }
    }
    for (long j = 0; j < group; j++)
        for (long v = 0; v < vectors; v++) {
            vec result = acc[j][v] / total[j];
            memcpy(out + j * dim + v * LANES, &result, sizeof result);
        }
}

/* The common shapes inlined with constant sizes, so their loops unroll into registers; ATTEND(group, dim). */
#define SIZES(ATTEND, G) if (dim == 64) ATTEND(G, 64); else if (dim == 128) ATTEND(G, 128); else ATTEND(G, dim)
#define BY_SHAPE(ATTEND)                                                                                        \
    switch (group) {                                                                                            \
    case 1: SIZES(ATTEND, 1); break;                                                                            \
    case 2: SIZES(ATTEND, 2); break;                                                                            \
    case 3: SIZES(ATTEND, 3); break;                                                                            \
    case 4: SIZES(ATTEND, 4); break;                                                                            \
    case 5: SIZES(ATTEND, 5); break;                                                                            \
    case 6: SIZES(ATTEND, 6); break;                                                                            \
    case 7: SIZES(ATTEND, 7); break;                                                                            \
    case 8: SIZES(ATTEND, 8); break;                                                                            \
    default: ATTEND(group, dim);                                                                                \
    }

/* q, out: [rows, kv_heads, group, dim] float32; keys, values: [slots, kv_heads, capacity, dim] bfloat16 (row r
 * reads slot slots[r], or r when slots is NULL, positions 0 .. lengths[r]: a decoding step has one row per slot, a
 * prefill one per prompt position). All contiguous. */
void decode_attention_bf16(const float *q, const uint16_t *keys, const uint16_t *values, const int64_t *lengths,
                           const int64_t *slots, float *out, long rows, long kv_heads, long group, long dim,
                           long capacity, float scale) {
    #pragma omp parallel for schedule(dynamic, 1)
    for (long task = 0; task < rows * kv_heads; task++) {
        long row = task / kv_heads, head = task % kv_heads, span = lengths[row] + 1;
        const long cache = ((slots ? slots[row] : row) * kv_heads + head) * capacity * dim;
        const float *query = q + task * group * dim;
        float *result = out + task * group * dim;
#define ATTEND(G, D) decode_row(query, keys + cache, values + cache, result, span, G, D, scale)
        BY_SHAPE(ATTEND)
#undef ATTEND
    }
}

/* q, out: [rows, kv_heads, group, dim] float32, contiguous; keys, values: float32, head h's position t at
 * h * head_stride + t * dim (a preallocated cache: head_stride = capacity * dim), t < length; row r sees positions
 * 0 .. prefix - 1, then extras[r * max_extra + i] for i < counts[r]. Returns how many rows it refused (a position
 * outside the cache, a count outside 0 .. max_extra, or no position at all), having computed nothing then. */
long verify_attention_f32(const float *q, const float *keys, const float *values, const int32_t *extras,
                          const int64_t *counts, float *out, long rows, long kv_heads, long group, long dim,
                          long head_stride, long length, long prefix, long max_extra, float scale) {
    long refused = 0;
    for (long row = 0; row < rows; row++) {
        int bad = prefix < 0 || prefix > length || counts[row] < 0 || counts[row] > max_extra
                  || prefix + counts[row] < 1;
        for (long i = 0; !bad && i < counts[row]; i++)
            bad = extras[row * max_extra + i] < 0 || extras[row * max_extra + i] >= length;
        refused += bad;
    }
    if (refused)
        return refused;
    #pragma omp parallel for schedule(dynamic, 1)
    for (long task = 0; task < rows * kv_heads; task++) {
        long row = task / kv_heads, head = task % kv_heads, span = prefix + counts[row];
        const int32_t *own = extras + row * max_extra;
        const float *query = q + task * group * dim;
        float *result = out + task * group * dim;
#define ATTEND(G, D)                                                                                            \
    verify_row(query, keys + head * head_stride, values + head * head_stride, result, span, prefix, own, G, D, scale)
        BY_SHAPE(ATTEND)
#undef ATTEND
    }
    return 0;
}
