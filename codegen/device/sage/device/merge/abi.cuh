// The parameter block of the LSE merge kernel (issue 30). Plain C, like sla/abi.cuh: the device header includes it
// and the host includes the same file, so both sides agree on the layout by construction.
//
// The kernel merges two partial attention results row by row. A row is one (batch, head, token); the rows are
// numbered in the order of three row dimensions (outer, middle, inner) that the host picks (the output's memory
// order: [b, h, n] for HND, [b, n, h] for NHD) and each tensor brings its own element strides for them. O's last
// dimension (head_dim) has stride 1.
#ifndef SAGE_MERGE_ABI_CUH
#define SAGE_MERGE_ABI_CUH

// Element types of O tensors: the kernel's template arguments and the generator's names.
#define SAGE_MERGE_F16 0
#define SAGE_MERGE_BF16 1
#define SAGE_MERGE_F32 2

// The elements one thread reads and writes at a time: 16 bytes of f16 / bf16 (two 16-byte accesses of f32).
#define SAGE_MERGE_CHUNK 8

struct SageMergeRowStrides {
  long long outer, middle, inner; // elements
};

struct SageMergeParams {
  const void *o_a, *o_b; // the parts' O (element types: the module's)
  void *o_out;           // may be o_a (the same strides): the running in-place form
  const float *lse_a, *lse_b;
  float *lse_out; // may be lse_a
  struct SageMergeRowStrides o_a_strides, o_b_strides, o_out_strides;
  struct SageMergeRowStrides lse_a_strides, lse_b_strides, lse_out_strides;
  long long rows;          // outer x middle x inner
  long long middle, inner; // sizes of the two inner row dimensions
  int head_dim;            // a multiple of SAGE_MERGE_CHUNK
  int lanes_per_row;       // a power of two <= 32: the lanes of a warp that share a row (sage_merge_lanes_per_row)
  int vectorized;          // 1: every O pointer and row stride allows 16-byte accesses
};

#ifdef __CUDACC__
#define SAGE_MERGE_HOST_DEVICE __host__ __device__
#else
#define SAGE_MERGE_HOST_DEVICE
#endif

// Lanes per row: one per chunk of 8 elements, rounded up to a power of two and at most a warp (a wider row loops).
static inline SAGE_MERGE_HOST_DEVICE int sage_merge_lanes_per_row(int head_dim) {
  int lanes = 1;
  while (lanes < 32 && lanes * SAGE_MERGE_CHUNK < head_dim)
    lanes *= 2;
  return lanes;
}

#endif
