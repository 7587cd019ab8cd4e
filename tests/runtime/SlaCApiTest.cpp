// SLA's C ABI (sage/sage_sla_c.h, issue 13): what is refused before any GPU is touched, with the argument named.
// (The forward and backward themselves run in python/tests/test_sla_gpu.py on a GPU.)
#include "sage/sage_sla_c.h"

#include <doctest/doctest.h>

#include <limits>
#include <string>

namespace {

sage_sla_config validConfig() { return {"sla-f16", 128, 0.0, -1.0, -1, 0, SAGE_DTYPE_F16}; }

} // namespace

TEST_CASE("sage_sla_create refuses bad configurations naming the field") {
  sage_sla_t sla = nullptr;
  CHECK(sage_sla_create(nullptr, &sla) == SAGE_INVALID_ARGUMENT);
  CHECK(std::string(sage_last_error()).find("config") != std::string::npos);
  sage_sla_config config = validConfig();
  CHECK(sage_sla_create(&config, nullptr) == SAGE_INVALID_ARGUMENT);
  CHECK(std::string(sage_last_error()).find("out") != std::string::npos);

  config.preset = "sage-b";
  CHECK(sage_sla_create(&config, &sla) == SAGE_INVALID_ARGUMENT);
  CHECK(std::string(sage_last_error()).find("config.preset: expected an SLA preset") != std::string::npos);
  CHECK(sla == nullptr);

  config = validConfig();
  config.feature_map = 7;
  CHECK(sage_sla_create(&config, &sla) == SAGE_INVALID_ARGUMENT);
  CHECK(std::string(sage_last_error()).find("config.feature_map") != std::string::npos);

  config = validConfig();
  config.critical_percent = 150.0;
  CHECK(sage_sla_create(&config, &sla) == SAGE_INVALID_ARGUMENT);
  CHECK(std::string(sage_last_error()).find("config.critical_percent: expected a percentage in (0, 100], got 150") !=
        std::string::npos);

  // Not a number or infinite: refused by name, not replaced by the preset's value (issue 26).
  for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                     -std::numeric_limits<double>::infinity()}) {
    config = validConfig();
    config.critical_percent = bad;
    CHECK(sage_sla_create(&config, &sla) == SAGE_INVALID_ARGUMENT);
    CHECK(std::string(sage_last_error()).find("config.critical_percent: expected a finite percentage") == 0);
    config = validConfig();
    config.negligible_percent = bad;
    CHECK(sage_sla_create(&config, &sla) == SAGE_INVALID_ARGUMENT);
    CHECK(std::string(sage_last_error()).find("config.negligible_percent: expected a finite percentage") == 0);
    CHECK(sla == nullptr);
  }

  // The dtype of q, k, v and O^s: f16 or bf16 (0: f16), refused before anything is compiled.
  config = validConfig();
  config.dtype = SAGE_DTYPE_F32;
  CHECK(sage_sla_create(&config, &sla) == SAGE_INVALID_ARGUMENT);
  CHECK(std::string(sage_last_error()).find("config.dtype: expected SAGE_DTYPE_F16 (1), SAGE_DTYPE_BF16 (2) or 0") ==
        0);
  CHECK(sla == nullptr);

  config = validConfig();
  config.head_dim = 100;
  CHECK(sage_sla_create(&config, &sla) == SAGE_INVALID_ARGUMENT);
}

TEST_CASE("the SLA calls refuse a null handle") {
  size_t bytes = 0, offset = 0;
  int q_blocks = 0, kv_blocks = 0;
  CHECK(sage_sla_workspace(nullptr, nullptr, nullptr, &bytes, &offset, &q_blocks, &kv_blocks) == SAGE_INVALID_ARGUMENT);
  CHECK(std::string(sage_last_error()).find("sla: must be a handle from sage_sla_create") != std::string::npos);
  CHECK(sage_sla_forward(nullptr, nullptr) == SAGE_INVALID_ARGUMENT);
  CHECK(sage_sla_backward(nullptr, nullptr) == SAGE_INVALID_ARGUMENT);
  sage_sla_destroy(nullptr); // a no-op
}
