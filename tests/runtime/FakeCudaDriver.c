/* A stand-in for libcuda.so.1 that counts the calls the runtime makes (runtime_host_path_test): one device of compute
 * capability 9.0, modules and kernels that are opaque handles, launches and memsets that do nothing. Built as
 * fake_cuda/libcuda.so.1 and found through LD_LIBRARY_PATH by that test alone. The values of the driver's enums are
 * those of cuda.h (the runtime checks its copies against it at build time). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef int CUresult;

struct sagegen_fake_cuda_counts {
  long calls;         /* every entry point */
  long launches;      /* cuLaunchKernel */
  long memsets;       /* cuMemsetD32Async */
  long encodes;       /* cuTensorMapEncodeTiled */
  long context_calls; /* cuCtxGetCurrent, cuCtxSetCurrent */
};

static struct sagegen_fake_cuda_counts counts;
static _Thread_local void *current_context;
static char primary_context, module, function;
static uint64_t next_allocation = 0x7f0000000000ull;

#define CALLED() (++counts.calls)

const struct sagegen_fake_cuda_counts *sagegen_fake_cuda_counts(void) { return &counts; }

CUresult cuInit(unsigned flags) {
  (void)flags;
  CALLED();
  return 0;
}
CUresult cuDriverGetVersion(int *version) {
  CALLED();
  *version = 13000;
  return 0;
}
CUresult cuGetErrorName(CUresult result, const char **name) {
  (void)result;
  *name = "CUDA_ERROR_FAKE";
  return 0;
}
CUresult cuGetErrorString(CUresult result, const char **text) {
  (void)result;
  *text = "an error of the fake driver";
  return 0;
}
CUresult cuDeviceGetCount(int *count) {
  CALLED();
  *count = 1;
  return 0;
}
CUresult cuDeviceGet(int *device, int ordinal) {
  CALLED();
  *device = ordinal;
  return ordinal == 0 ? 0 : 101; /* CUDA_ERROR_INVALID_DEVICE */
}
CUresult cuDeviceGetAttribute(int *value, int attribute, int device) {
  (void)device;
  CALLED();
  switch (attribute) {
  case 16: /* MULTIPROCESSOR_COUNT */
    *value = 132;
    break;
  case 75: /* COMPUTE_CAPABILITY_MAJOR */
    *value = 9;
    break;
  case 76: /* COMPUTE_CAPABILITY_MINOR */
    *value = 0;
    break;
  case 97: /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    *value = 232448;
    break;
  default:
    *value = 0;
  }
  return 0;
}
CUresult cuDeviceGetName(char *name, int length, int device) {
  (void)device;
  CALLED();
  strncpy(name, "sagegen fake GPU", (size_t)length);
  name[length - 1] = '\0';
  return 0;
}
CUresult cuDevicePrimaryCtxRetain(void **context, int device) {
  (void)device;
  CALLED();
  *context = &primary_context;
  return 0;
}
CUresult cuCtxGetCurrent(void **context) {
  CALLED();
  ++counts.context_calls;
  *context = current_context;
  return 0;
}
CUresult cuCtxSetCurrent(void *context) {
  CALLED();
  ++counts.context_calls;
  current_context = context;
  return 0;
}
CUresult cuCtxGetDevice(int *device) {
  CALLED();
  *device = 0;
  return 0;
}
CUresult cuCtxSynchronize(void) {
  CALLED();
  return 0;
}
CUresult cuStreamSynchronize(void *stream) {
  (void)stream;
  CALLED();
  return 0;
}
CUresult cuModuleLoadData(void **out, const void *image) {
  (void)image;
  CALLED();
  *out = &module;
  return 0;
}
CUresult cuModuleUnload(void *handle) {
  (void)handle;
  CALLED();
  return 0;
}
CUresult cuModuleGetFunction(void **out, void *handle, const char *name) {
  (void)handle;
  (void)name;
  CALLED();
  *out = &function;
  return 0;
}
CUresult cuFuncSetAttribute(void *handle, int attribute, int value) {
  (void)handle;
  (void)attribute;
  (void)value;
  CALLED();
  return 0;
}
CUresult cuFuncGetAttribute(int *value, int attribute, void *handle) {
  (void)attribute;
  (void)handle;
  CALLED();
  *value = 0;
  return 0;
}
CUresult cuLaunchKernel(void *handle, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *stream, void **parameters, void **extra) {
  (void)handle, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)stream;
  (void)parameters, (void)extra;
  CALLED();
  ++counts.launches;
  return 0;
}
CUresult cuEventCreate(void **event, unsigned flags) {
  (void)flags;
  CALLED();
  *event = &function;
  return 0;
}
CUresult cuEventDestroy_v2(void *event) {
  (void)event;
  CALLED();
  return 0;
}
CUresult cuEventRecord(void *event, void *stream) {
  (void)event, (void)stream;
  CALLED();
  return 0;
}
CUresult cuEventSynchronize(void *event) {
  (void)event;
  CALLED();
  return 0;
}
CUresult cuEventElapsedTime_v2(float *milliseconds, void *start, void *end) {
  (void)start, (void)end;
  CALLED();
  *milliseconds = 0.0f;
  return 0;
}
CUresult cuMemAlloc_v2(uint64_t *pointer, size_t bytes) {
  CALLED();
  *pointer = next_allocation;
  next_allocation += (bytes + 0xffffu) & ~(uint64_t)0xffffu;
  return 0;
}
CUresult cuMemFree_v2(uint64_t pointer) {
  (void)pointer;
  CALLED();
  return 0;
}
CUresult cuMemcpyHtoD_v2(uint64_t destination, const void *source, size_t bytes) {
  (void)destination, (void)source, (void)bytes;
  CALLED();
  return 0;
}
CUresult cuMemcpyDtoH_v2(void *destination, uint64_t source, size_t bytes) {
  (void)source;
  CALLED();
  memset(destination, 0, bytes);
  return 0;
}
CUresult cuMemsetD8_v2(uint64_t destination, unsigned char value, size_t bytes) {
  (void)destination, (void)value, (void)bytes;
  CALLED();
  return 0;
}
CUresult cuMemsetD32Async(uint64_t destination, unsigned value, size_t words, void *stream) {
  (void)destination, (void)value, (void)words, (void)stream;
  CALLED();
  ++counts.memsets;
  return 0;
}
CUresult cuTensorMapEncodeTiled(void *map, int data_type, unsigned rank, void *address, const uint64_t *dims,
                                const uint64_t *strides, const unsigned *box, const unsigned *element_strides,
                                int interleave, int swizzle, int l2_promotion, int oob_fill) {
  (void)data_type, (void)dims, (void)strides, (void)box, (void)element_strides, (void)interleave, (void)swizzle;
  (void)l2_promotion, (void)oob_fill;
  CALLED();
  ++counts.encodes;
  memset(map, 0, 128);
  memcpy(map, &address, sizeof address); /* something of the request, so that maps differ */
  memcpy((char *)map + 8, &rank, sizeof rank);
  return 0;
}

/* NVRTC's builtins ask a loaded libcuda for its private export tables: this driver has none (as an old one would). */
CUresult cuGetExportTable(const void **table, const void *id) {
  (void)id;
  *table = NULL;
  return 801; /* CUDA_ERROR_NOT_SUPPORTED */
}
