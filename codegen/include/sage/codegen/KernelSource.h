// A generated kernel: its CUDA C++ text and how to launch it.
#pragma once

#include "sage/schedules/GpuArch.h"
#include "sage/schedules/KernelPlan.h"

#include <array>
#include <string>

namespace sage::codegen {

struct KernelSource {
  std::string name;               // identifies the kernel (also the file stem sagegen writes)
  std::string source;             // one CUDA C++ translation unit (no #include but the device library's)
  std::string entry_point;        // the extern "C" __global__ function; takes one SageAttentionParams by value
  std::array<int, 3> block_dim{}; // threads per CTA
  schedules::GridMapping grid;    // grid.gridFor(shape) gives the launch grid
  std::string grid_description;   // grid.description(), for logs and manifests
  int dynamic_shared_bytes = 0;   // needs cudaFuncAttributeMaxDynamicSharedMemorySize above 48 KiB
  schedules::GpuArch arch = schedules::GpuArch::sm80; // compile with --gpu-architecture=archName(arch)
  // The source #includes headers of the device library (DeviceLibrary.h): NVRTC must receive them, and they are
  // part of what the kernel is (its cache key hashes them too).
  bool uses_device_library = false;
};

} // namespace sage::codegen
