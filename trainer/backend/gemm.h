/* The one place a row-major matrix product becomes a column-major BLAS call.
 *
 * pstrain stores every matrix row-major (C convention, PyTorch's layout).
 * BLAS and cuBLAS are column-major. A row-major M x N matrix with leading
 * dimension ld is, read column-major, its N x M transpose with the same ld.
 * So C = op(A) op(B) in row-major is C^T = op(B)^T op(A)^T in column-major:
 * swap the operands and M with N, keep each operand's transpose flag and
 * leading dimension. Both the CPU backend (cblas_sgemm, CblasColMajor) and
 * the CUDA backend (cublasSgemm) execute the gemm_call this produces, so the
 * CPU tests check the mapping the GPU uses. */
#ifndef PSTRAIN_TRAINER_GEMM_H
#define PSTRAIN_TRAINER_GEMM_H

#include <stdbool.h>

/* A column-major SGEMM with BLAS's meaning of every argument:
 * C (m x n) = alpha * op(a) (m x k) * op(b) (k x n) + beta * C. */
typedef struct gemm_call {
  bool trans_a, trans_b;
  int m, n, k;
  float alpha;
  const float *a;
  int lda;
  const float *b;
  int ldb;
  float beta;
  float *c;
  int ldc;
} gemm_call;

/* Row-major C (M x N) = alpha * op(A) (M x K) * op(B) (K x N) + beta * C,
 * where lda, ldb, ldc are the row-major leading dimensions (row lengths) of
 * A, B and C as stored. */
static inline gemm_call gemm_row_major(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                                       const float *A, int lda, const float *B, int ldb,
                                       float beta, float *C, int ldc) {
  gemm_call call = {
      .trans_a = trans_b, .trans_b = trans_a,
      .m = N, .n = M, .k = K,
      .alpha = alpha,
      .a = B, .lda = ldb,
      .b = A, .ldb = lda,
      .beta = beta,
      .c = C, .ldc = ldc,
  };
  return call;
}

#endif
