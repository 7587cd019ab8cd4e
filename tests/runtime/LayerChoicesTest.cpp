// Per-layer choices: the selection rule (threshold, speed order, fallbacks) and the JSON file's loader.
#include "sage/runtime/LayerChoices.h"

#include <doctest/doctest.h>

#include <chrono>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

using namespace sage::runtime;
namespace fs = std::filesystem;

namespace {

std::vector<CandidateAccuracy> accuracies(double vb, double vt, double b, double t) {
  return {{"sage-vb", vb, 0.1}, {"sage-vt", vt, 0.1}, {"sage-b", b, 0.01}, {"sage-t", t, 0.01}};
}

SelectionRule paperRule(SelectionFallback fallback = SelectionFallback::exact) {
  return {0.998, paperSpeedOrder(), fallback};
}

struct TemporaryFile {
  fs::path path;
  explicit TemporaryFile(const std::string &text) {
    std::string pattern = (fs::temp_directory_path() / "sagegen-layer-choices.XXXXXX").string();
    const int descriptor = ::mkstemp(pattern.data());
    REQUIRE(descriptor >= 0);
    ::close(descriptor);
    path = pattern;
    std::ofstream(path) << text;
  }
  ~TemporaryFile() { fs::remove(path); }
};

} // namespace

TEST_CASE("the fastest candidate that reaches the threshold is chosen") {
  CHECK(chooseLayerPreset("l", accuracies(0.9990, 0.9995, 0.9999, 0.9999), paperRule()).preset == "sage-vb");
  CHECK(chooseLayerPreset("l", accuracies(0.9970, 0.9985, 0.9999, 0.9999), paperRule()).preset == "sage-vt");
  const LayerChoice choice = chooseLayerPreset("l", accuracies(0.9970, 0.9975, 0.9999, 0.9999), paperRule());
  CHECK(choice.preset == "sage-b");
  CHECK(choice.reason == "the fastest of the 2 candidates with cos >= 0.998 (0.999900)");
  CHECK(choice.candidates.size() == 4);
  // exactly at the threshold passes
  CHECK(chooseLayerPreset("l", accuracies(0.998, 0.9, 0.9, 0.9), paperRule()).preset == "sage-vb");
}

TEST_CASE("a measured speed order overrides the paper's") {
  SelectionRule rule = paperRule();
  rule.fastest_first = {"sage-b", "sage-vb", "sage-t", "sage-vt"};
  CHECK(chooseLayerPreset("l", accuracies(0.9990, 0.9990, 0.9999, 0.9999), rule).preset == "sage-b");
  rule.fastest_first = {"sage-vt"}; // candidates missing from the order rank after it, in their own order
  CHECK(chooseLayerPreset("l", accuracies(0.9990, 0.9990, 0.9999, 0.9999), rule).preset == "sage-vt");
  CHECK(chooseLayerPreset("l", accuracies(0.9990, 0.9, 0.9999, 0.9999), rule).preset == "sage-vb");
}

TEST_CASE("when none passes: exact attention, or the most accurate candidate") {
  const LayerChoice exact = chooseLayerPreset("l", accuracies(0.90, 0.91, 0.995, 0.993), paperRule());
  CHECK(exact.preset == "exact");
  CHECK(exact.reason == "no candidate reaches cos 0.998 (best: sage-b at 0.995000): exact attention");
  const LayerChoice best =
      chooseLayerPreset("l", accuracies(0.90, 0.91, 0.995, 0.993), paperRule(SelectionFallback::most_accurate));
  CHECK(best.preset == "sage-b");
  CHECK(best.reason.find("the most accurate one (0.995000)") != std::string::npos);
}

TEST_CASE("the paper's order sorts any candidate list") {
  CHECK(paperOrdered({"sage-t", "mine", "sage-b", "sage-vb"}) ==
        std::vector<std::string>{"sage-vb", "sage-b", "sage-t", "mine"});
}

TEST_CASE("choices round-trip through their file and answer per layer") {
  LayerChoices choices;
  choices.threshold = 0.997;
  choices.speed_order = "paper";
  choices.layers.push_back(chooseLayerPreset("blocks.0", accuracies(0.9990, 0.9995, 0.9999, 0.9999), paperRule()));
  choices.layers.push_back(chooseLayerPreset("blocks.1", accuracies(0.90, 0.91, 0.92, 0.93), paperRule()));
  TemporaryFile file("");
  saveLayerChoices(file.path, choices);
  const LayerChoices loaded = loadLayerChoices(file.path);
  CHECK(loaded.threshold == 0.997);
  CHECK(loaded.speed_order == "paper");
  REQUIRE(loaded.layers.size() == 2);
  CHECK(loaded.presetFor("blocks.0") == "sage-vb");
  CHECK(loaded.presetFor("blocks.1") == "exact");
  CHECK(loaded.layers[0].candidates[2].cos_similarity == doctest::Approx(0.9999));
  CHECK(loaded.layers[1].reason == choices.layers[1].reason);
  CHECK_THROWS_WITH_AS(loaded.presetFor("blocks.7"),
                       "layer choices: no layer 'blocks.7' (the file has blocks.0, blocks.1)", std::out_of_range);
}

TEST_CASE("bad files get errors naming the file and the place") {
  auto errorOf = [](const std::string &text) {
    TemporaryFile file(text);
    try {
      loadLayerChoices(file.path);
    } catch (const LayerChoicesError &error) {
      const std::string message = error.what();
      CHECK(message.rfind(file.path.string() + ": ", 0) == 0);
      return message.substr(file.path.string().size() + 2);
    }
    FAIL("expected a LayerChoicesError");
    return std::string();
  };
  const std::string head = R"({"format": "sagegen-layer-choices", "version": 1, "threshold": 0.998, )";
  CHECK(errorOf("{\n  \"layers\": [\n    {\"layer\": }\n]}").rfind("line 3, column", 0) == 0);
  CHECK(errorOf(R"({"format": "sagegen-tuning-db", "version": 1})") ==
        "\"format\": expected \"sagegen-layer-choices\"");
  CHECK(errorOf(R"({"format": "sagegen-layer-choices", "version": 2, "threshold": 1, "layers": []})") ==
        "\"version\": this sagegen reads version 1, the file has 2");
  CHECK(errorOf(head + R"("layers": [{"layer": "a"}]})") == "layers[0]: missing \"preset\"");
  CHECK(errorOf(head + R"("layers": [{"layer": "a", "preset": ""}]})") == "layers[0].preset: must not be empty");
  CHECK(errorOf(head + R"("layers": [{"layer": "a", "preset": "sage-x",
      "candidates": [{"preset": "sage-b", "cos_similarity": 0.999, "relative_l1": 0.01}]}]})") ==
        "layers[0].preset: \"sage-x\" is neither \"exact\" nor one of the candidates");
  CHECK(errorOf(head + R"("layers": [{"layer": "a", "preset": "sage-b"}, {"layer": "a", "preset": "exact"}]})") ==
        "layers[1].layer: \"a\" appears twice");
  CHECK(errorOf(head + R"("layers": [{"layer": "a", "preset": "sage-b", "candidates": [{"preset": "sage-b",
      "cos_similarity": "high", "relative_l1": 0.01}]}]})")
            .find("layers[0].candidates[0].cos_similarity") != std::string::npos);
  CHECK_THROWS_WITH_AS(loadLayerChoices("/nonexistent/choices.json"), "/nonexistent/choices.json: no such file",
                       LayerChoicesError);
  // Issue 10: values out of their range and names no preset has are errors, not silently kept.
  CHECK(errorOf(R"({"format": "sagegen-layer-choices", "version": 1, "threshold": 1e308, "layers": []})") ==
        "the file.threshold: expected a number in [-1, 1], got 1e+308");
  CHECK(errorOf(head + R"("layers": [{"layer": "a", "preset": "sage-b", "candidates": [{"preset": "sage-b",
      "cos_similarity": 2.5, "relative_l1": 0.01}]}]})") ==
        "layers[0].candidates[0].cos_similarity: expected a number in [-1, 1], got 2.5");
  CHECK(errorOf(head + R"("layers": [{"layer": "a", "preset": "sage-b", "candidates": [{"preset": "sage-b",
      "cos_similarity": 0.99, "relative_l1": -1}]}]})") ==
        "layers[0].candidates[0].relative_l1: expected a number in [0, 1e+300], got -1");
  CHECK(errorOf(head + R"("layers": [{"layer": "a", "preset": "Sage B; rm"}]})") ==
        "layers[0].preset: expected a preset name (at most 64 of [a-z0-9_.-]), got \"Sage B; rm\"");
}

TEST_CASE("many layers load in O(n log n): duplicates are found through a set") {
  std::string text = R"({"format": "sagegen-layer-choices", "version": 1, "threshold": 0.998, "layers": [)";
  for (int index = 0; index < 50000; ++index)
    text +=
        std::string(index ? "," : "") + R"({"layer": "blocks.)" + std::to_string(index) + R"(", "preset": "exact"})";
  text += "]}";
  const JsonValue json = parseJson(text);
  const auto start = std::chrono::steady_clock::now();
  CHECK(layerChoicesFromJson(json, "big.json").layers.size() == 50000);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 5.0);
}
