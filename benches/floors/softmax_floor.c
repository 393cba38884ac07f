/* softmax:M=4096,N=4096 by hand, one row at a time, as RowWise schedules it: the row maximum
 * (8 vector chains), exp of (x - max) into a row on the stack with its sum (8 chains), then
 * the row divided by the sum. Variants: ordinary or non-temporal stores of the output, and
 * the exp left out (x - max stored instead) to show what the exp costs. The exp is the same
 * polynomial as tensortune's CPU code generation (src/codegen/llvm/expr.rs, vexp_f32).
 *
 *   bash benches/floors/run.sh          (gcc -O3 -march=x86-64-v4, needs AVX-512F)
 *
 * Prints the best of 7 runs of each variant, each after 64 MiB of other writes (the input
 * and output, 128 MiB, do not fit a 32 MiB L3 anyway). GB/s counts 128 MiB moved. */
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define M 4096
#define N 4096

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* exp as tensortune generates it on AVX-512: clamp keeping NaN, k = round(x log2 e),
 * r = x - k ln 2 in two parts, Cephes' degree-6 polynomial, then p * 2^k by vscalefps. */
static inline __m512 vexp(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-104.f), x);
    x = _mm512_min_ps(_mm512_set1_ps(89.f), x);
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(k, _mm512_set1_ps(0.6933594f)));
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.1219444e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.333452e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665796e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
    p = _mm512_add_ps(p, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, k);
}

static void softmax(const float *in, float *out, int nt, int with_exp) {
    float row[N] __attribute__((aligned(64)));
    for (int i = 0; i < M; i++) {
        const float *a = in + (size_t)i * N;
        float *o = out + (size_t)i * N;
        __m512 m[8], s[8];
        for (int c = 0; c < 8; c++) m[c] = _mm512_set1_ps(-INFINITY);
        for (int j = 0; j < N; j += 128)
            for (int c = 0; c < 8; c++) m[c] = _mm512_max_ps(m[c], _mm512_loadu_ps(a + j + 16 * c));
        for (int c = 1; c < 8; c++) m[0] = _mm512_max_ps(m[0], m[c]);
        __m512 vm = _mm512_set1_ps(_mm512_reduce_max_ps(m[0]));
        for (int c = 0; c < 8; c++) s[c] = _mm512_setzero_ps();
        for (int j = 0; j < N; j += 128)
            for (int c = 0; c < 8; c++) {
                __m512 d = _mm512_sub_ps(_mm512_loadu_ps(a + j + 16 * c), vm);
                __m512 e = with_exp ? vexp(d) : d;
                _mm512_store_ps(row + j + 16 * c, e);
                s[c] = _mm512_add_ps(s[c], e);
            }
        for (int c = 1; c < 8; c++) s[0] = _mm512_add_ps(s[0], s[c]);
        __m512 vs = _mm512_set1_ps(_mm512_reduce_add_ps(s[0]));
        for (int j = 0; j < N; j += 16) {
            __m512 v = _mm512_div_ps(_mm512_load_ps(row + j), vs);
            if (nt)
                _mm512_stream_ps(o + j, v);
            else
                _mm512_store_ps(o + j, v);
        }
    }
}

int main(void) {
    size_t n = (size_t)M * N;
    float *in = aligned_alloc(2 << 20, n * 4), *out = aligned_alloc(2 << 20, n * 4);
    char *other = malloc(64 << 20);
    if (!in || !out || !other) return 1;
    for (size_t i = 0; i < n; i++) {
        in[i] = (float)((i * 2654435761u) % 1000) / 100.f;
        out[i] = 0;
    }
    const char *names[4] = {"exp, ordinary stores", "exp, non-temporal stores",
                            "no exp, ordinary stores", "no exp, non-temporal stores"};
    for (int v = 0; v < 4; v++) {
        double best = 1e9;
        for (int r = 0; r < 7; r++) {
            memset(other, r, 64 << 20);
            double t = now();
            softmax(in, out, v & 1, !(v >> 1));
            t = now() - t;
            if (t < best) best = t;
        }
        printf("%-28s %6.2f ms %5.1f GB/s\n", names[v], best * 1e3, 2.0 * n * 4 / best / 1e9);
    }
    return 0;
}
