// Where sagegen writes to a path the user names (layer choices, the tuning database, emitted files): a new path or a
// regular file only; a directory, FIFO, device or symbolic link is refused by name and left as it was.
#include "sage/runtime/OutputPath.h"

#include "sage/runtime/LayerChoices.h"
#include "sage/runtime/TuningDatabase.h"

#include "../support/TemporaryDirectory.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <sys/stat.h>
#include <vector>

using namespace sage::runtime;
namespace fs = std::filesystem;

namespace {

bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

} // namespace

TEST_CASE("a new path or a regular file may be written; anything else is named") {
  sage::test::TemporaryDirectory directory("sagegen-output-path");
  CHECK_FALSE(outputPathProblem(directory.path / "new.json"));
  std::ofstream(directory.path / "old.json") << "{}";
  CHECK_FALSE(outputPathProblem(directory.path / "old.json"));

  const std::optional<std::string> folder = outputPathProblem(directory.path);
  REQUIRE(folder);
  CHECK(*folder == directory.path.string() + ": expected a regular file or a new path, found a directory");
  REQUIRE(::mkfifo((directory.path / "fifo").c_str(), 0600) == 0);
  CHECK(contains(outputPathProblem(directory.path / "fifo").value_or(""), "found a FIFO"));
  fs::create_symlink(directory.path / "old.json", directory.path / "link.json");
  CHECK(contains(outputPathProblem(directory.path / "link.json").value_or(""), "found a symbolic link"));
  CHECK(contains(outputPathProblem("/dev/null").value_or(""), "/dev/null: expected a regular file or a new path, "
                                                              "found a character device"));
}

TEST_CASE("saving layer choices over a FIFO or a device is refused, and they stay") {
  sage::test::TemporaryDirectory directory("sagegen-output-path");
  LayerChoices choices;
  choices.threshold = 0.99;
  choices.layers.push_back({"blocks.0", "sage-b", "chosen", {}});
  const fs::path fifo = directory.path / "choices.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(saveLayerChoices(fifo, choices),
                       (fifo.string() + ": expected a regular file or a new path, found a FIFO").c_str(),
                       LayerChoicesError);
  CHECK(fs::is_fifo(fifo));
  std::vector<fs::path> left;
  for (const fs::directory_entry &entry : fs::directory_iterator(directory.path))
    left.push_back(entry.path());
  CHECK(left == std::vector<fs::path>{fifo}); // no temporary left behind
  CHECK_THROWS_AS(saveLayerChoices("/dev/null", choices), LayerChoicesError);
  CHECK(fs::is_character_file("/dev/null"));

  saveLayerChoices(directory.path / "new.json", choices);
  CHECK(loadLayerChoices(directory.path / "new.json").layers.at(0).preset == "sage-b");
}

TEST_CASE("the tuning database is neither written over nor moved aside when it is not a regular file") {
  sage::test::TemporaryDirectory directory("sagegen-output-path");
  const fs::path fifo = directory.path / "tuning.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::vector<std::string> warnings;
  CHECK_THROWS_WITH_AS(TuningDatabase::store(fifo, {"GPU", "sm_90a", "0.1.0"}, {}, warnings),
                       (fifo.string() + ": expected a regular file or a new path, found a FIFO").c_str(),
                       TuningDatabaseError);
  CHECK(fs::is_fifo(fifo));
  CHECK_FALSE(fs::exists(directory.path / "tuning.json.corrupt"));
}
