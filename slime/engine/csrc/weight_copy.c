/* The engine's weight loads into its column-major linear weights (model_runner.column_major_linears):
 * a transposing copy dst[j*ld + i] = src[i*ls + j], 8x8 blocks transposed in AVX registers inside
 * 64x64 tiles, row tiles spread over the engine's threads. torch's strided copy_ runs this at about half the speed (measured in bench/weight_sync.py). */
#include <stdint.h>
#ifdef __AVX__
#include <immintrin.h>
#endif
#ifdef __AVX__
/* 8x8 float transpose in AVX registers: rows of s (stride ls) -> rows of d (stride ld). */
static inline void t8x8(const float* s, int64_t ls, float* d, int64_t ld) {
    __m256 r0 = _mm256_loadu_ps(s + 0 * ls), r1 = _mm256_loadu_ps(s + 1 * ls);
    __m256 r2 = _mm256_loadu_ps(s + 2 * ls), r3 = _mm256_loadu_ps(s + 3 * ls);
    __m256 r4 = _mm256_loadu_ps(s + 4 * ls), r5 = _mm256_loadu_ps(s + 5 * ls);
    __m256 r6 = _mm256_loadu_ps(s + 6 * ls), r7 = _mm256_loadu_ps(s + 7 * ls);
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_storeu_ps(d + 0 * ld, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(d + 1 * ld, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(d + 2 * ld, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(d + 3 * ld, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(d + 4 * ld, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(d + 5 * ld, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(d + 6 * ld, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(d + 7 * ld, _mm256_permute2f128_ps(u3, u7, 0x31));
}
#else
static inline void t8x8(const float* s, int64_t ls, float* d, int64_t ld) {
    for (int a = 0; a < 8; a++) for (int b = 0; b < 8; b++) d[b * ld + a] = s[a * ls + b];
}
#endif
#define TILE 64
void transpose_copy_32(const float* src, float* dst, int64_t rows, int64_t cols, int64_t ls, int64_t ld,
                       int64_t nthreads) {
    /* row tiles split among the threads: each writes its own span of every destination row */
    #pragma omp parallel for num_threads(nthreads) schedule(static) if(nthreads > 1)
    for (int64_t i0 = 0; i0 < rows; i0 += TILE) {
        int64_t i1 = i0 + TILE < rows ? i0 + TILE : rows;
        for (int64_t j0 = 0; j0 < cols; j0 += TILE) {
            int64_t j1 = j0 + TILE < cols ? j0 + TILE : cols;
            int64_t i = i0;
            for (; i + 8 <= i1; i += 8) {
                int64_t j = j0;
                for (; j + 8 <= j1; j += 8) t8x8(src + i * ls + j, ls, dst + j * ld + i, ld);
                for (; j < j1; j++) for (int64_t k = i; k < i + 8; k++) dst[j * ld + k] = src[k * ls + j];
            }
            for (; i < i1; i++) for (int64_t j = j0; j < j1; j++) dst[j * ld + i] = src[i * ls + j];
        }
    }
}
