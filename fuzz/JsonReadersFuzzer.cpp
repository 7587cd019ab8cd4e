// libFuzzer target: the readers of sagegen's JSON files, each fed the same input: the AOT manifest
// (parseAotManifest), the tuning database (TuningDatabase::fromJson) and the layer choices (layerChoicesFromJson).
// Property: what a reader accepts, written back, is accepted again.
#include "sage/runtime/AotManifest.h"
#include "sage/runtime/Json.h"
#include "sage/runtime/LayerChoices.h"
#include "sage/runtime/TuningDatabase.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace sage::runtime;
  const std::string_view text(reinterpret_cast<const char *>(data), size);
  try {
    const AotManifest manifest = parseAotManifest(text, "fuzz-manifest.json");
    (void)parseAotManifest(writeAotManifest(manifest), "rewritten-manifest.json");
  } catch (const AotManifestError &) {
  } catch (const JsonError &) {
  }
  JsonValue json;
  try {
    json = parseJson(text);
  } catch (const JsonError &) {
    return 0;
  }
  try {
    const TuningDatabase database = TuningDatabase::fromJson(json, "fuzz-tuning.json");
    (void)TuningDatabase::fromJson(parseJson(writeJson(database.toJson())), "rewritten-tuning.json");
  } catch (const TuningDatabaseError &) {
  }
  try {
    const LayerChoices choices = layerChoicesFromJson(json, "fuzz-choices.json");
    (void)layerChoicesFromJson(parseJson(writeJson(layerChoicesToJson(choices))), "rewritten-choices.json");
  } catch (const LayerChoicesError &) {
  }
  return 0;
}
