// The tuning database: schema round trip, lookup rules, the locked atomic merge and corrupt files.
#include "sage/runtime/TuningDatabase.h"
#include "../support/TemporaryDirectory.h"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

using namespace sage::runtime;
namespace fs = std::filesystem;

namespace {

// This program's scratch directories.
struct TemporaryDirectory : sage::test::TemporaryDirectory {
  TemporaryDirectory() : sage::test::TemporaryDirectory("sagegen-tuning-test") {}
};

const TuningDevice kH100{"NVIDIA H100 80GB HBM3", "sm_90a", "0.1.0"};
const TuningDevice kA100{"NVIDIA A100-SXM4-80GB", "sm_80", "0.1.0"};

TuningEntry entry(std::string variant, int64_t tokens, std::string tunables, double ms = 1.0) {
  TuningEntry e;
  e.variant = std::move(variant);
  e.head_dim = 128;
  e.causal = false;
  e.input = "f16";
  e.tokens = tokens;
  e.tunables = std::move(tunables);
  e.milliseconds = ms;
  e.default_milliseconds = ms * 1.2;
  e.date = "2026-11-23T11:00:00Z";
  return e;
}

TuningQuery query(const TuningDevice &device, int64_t hint = 0) {
  TuningQuery q;
  q.device = device;
  q.variant_names = {"sage-b", "fingerprint-123"};
  q.head_dim = 128;
  q.input = "f16";
  q.tokens_hint = hint;
  return q;
}

std::string slurp(const fs::path &path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

} // namespace

TEST_CASE("entries round-trip through JSON, grouped per device") {
  TuningDatabase database;
  database.put(kH100, entry("sage-b", 1024, "block_q=128,block_kv=64,warps=8,stages=3"));
  database.put(kA100, entry("sage-b", 1024, "block_q=128,block_kv=32,warps=4,stages=2"));
  database.put(kH100, entry("sage-t", 4096, "block_q=64,block_kv=64,warps=4,stages=4"));
  REQUIRE(database.groups().size() == 2);
  CHECK(database.groups()[0].entries.size() == 2);
  const TuningDatabase back = TuningDatabase::fromJson(parseJson(writeJson(database.toJson())), "test");
  REQUIRE(back.groups().size() == 2);
  CHECK(back.groups()[1].device == kA100);
  CHECK(back.groups()[0].entries[1].tunables == "block_q=64,block_kv=64,warps=4,stages=4");
  CHECK(back.groups()[0].entries[1].default_milliseconds == doctest::Approx(1.2));
}

TEST_CASE("a re-tune replaces its own key only") {
  TuningDatabase database;
  database.put(kH100, entry("sage-b", 1024, "warps=4", 2.0));
  database.put(kH100, entry("sage-b", 2048, "warps=8", 3.0));
  database.put(kH100, entry("sage-b", 1024, "warps=16", 1.5));
  REQUIRE(database.groups()[0].entries.size() == 2);
  CHECK(database.groups()[0].entries[0].tunables == "warps=16");
  CHECK(database.groups()[0].entries[0].milliseconds == 1.5);
}

TEST_CASE("lookup: same device only, the N closest to the hint, else the largest N") {
  TuningDatabase database;
  database.put(kH100, entry("sage-b", 1024, "a"));
  database.put(kH100, entry("sage-b", 4096, "b"));
  database.put(kH100, entry("sage-b", 16384, "c"));
  database.put(kH100, entry("fingerprint-123", 8192, "d"));
  database.put(kA100, entry("sage-b", 100000, "other gpu"));
  CHECK(database.lookup(query(kH100))->tunables == "c");       // no hint: the largest N
  CHECK(database.lookup(query(kH100, 1000))->tunables == "a"); // closest
  CHECK(database.lookup(query(kH100, 7000))->tunables == "d"); // the fingerprint is a name of the variant too
  CHECK(database.lookup(query(kH100, 2560))->tunables == "b"); // tie between 1024 and 4096: the larger N
  TuningQuery other = query(kH100);
  other.causal = true;
  CHECK_FALSE(database.lookup(other));
  other = query(kH100);
  other.input = "bf16";
  CHECK_FALSE(database.lookup(other));
  other = query(kH100);
  other.head_dim = 64;
  CHECK_FALSE(database.lookup(other));
  other = query({kH100.gpu, kH100.arch, "0.2.0"}); // another sagegen version: its kernels differ
  CHECK_FALSE(database.lookup(other));
  other = query(kH100);
  other.variant_names = {"sage-vb", ""};
  CHECK_FALSE(database.lookup(other));
}

TEST_CASE("a missing file is an empty database; malformed ones name the file and the place") {
  TemporaryDirectory directory;
  CHECK(TuningDatabase::read(directory.path / "none.json").empty());
  const fs::path path = directory.path / "bad.json";
  std::ofstream(path) << "{\n  \"format\": \"sagegen-tuning-db\",\n  \"version\": 1,\n  \"devices\": [,]\n}\n";
  CHECK_THROWS_WITH_AS(TuningDatabase::read(path), doctest::Contains("bad.json: line 4, column"), TuningDatabaseError);
  std::ofstream(path) << R"({"format": "sagegen-tuning-db", "version": 1, "devices": [{"gpu": "x", "arch": "sm_80",
    "sagegen_version": "0.1.0", "entries": [{"variant": "sage-b", "head_dim": 128, "causal": false, "input": "f8"}]}]})";
  CHECK_THROWS_WITH_AS(TuningDatabase::read(path), doctest::Contains("devices[0].entries[0].input: expected"),
                       TuningDatabaseError);
  std::ofstream(path) << R"({"format": "something-else", "version": 1, "devices": []})";
  CHECK_THROWS_WITH_AS(TuningDatabase::read(path), doctest::Contains("\"format\": expected \"sagegen-tuning-db\""),
                       TuningDatabaseError);
  std::ofstream(path) << R"({"format": "sagegen-tuning-db", "version": 7, "devices": []})";
  CHECK_THROWS_WITH_AS(TuningDatabase::read(path), doctest::Contains("reads version 1, the file has 7"),
                       TuningDatabaseError);
}

TEST_CASE("store merges with the file: other devices and keys are kept, the same key is replaced") {
  TemporaryDirectory directory;
  const fs::path path = directory.path / "sub" / "tuning.json";
  std::vector<std::string> warnings;
  TuningDatabase::store(path, kA100, {entry("sage-b", 1024, "block_q=128,block_kv=32,warps=4,stages=2")}, warnings);
  TuningDatabase::store(path, kH100,
                        {entry("sage-b", 1024, "block_q=128,block_kv=64,warps=4,stages=2"),
                         entry("sage-t", 1024, "block_q=64,block_kv=64,warps=4,stages=4")},
                        warnings);
  TuningDatabase::store(path, kH100, {entry("sage-b", 1024, "block_q=128,block_kv=64,warps=8,stages=3", 0.5)},
                        warnings);
  CHECK(warnings.empty());
  const TuningDatabase database = TuningDatabase::read(path);
  REQUIRE(database.groups().size() == 2);
  CHECK(database.groups()[0].device == kA100);
  REQUIRE(database.groups()[1].entries.size() == 2);
  CHECK(database.groups()[1].entries[0].tunables == "block_q=128,block_kv=64,warps=8,stages=3");
  CHECK(database.groups()[1].entries[0].milliseconds == 0.5);
  CHECK(database.groups()[1].entries[1].tunables == "block_q=64,block_kv=64,warps=4,stages=4");
  // Atomic replacement leaves no temporary files behind; the lock file stays (see ExclusiveFileLock).
  int files = 0;
  for (const auto &item : fs::directory_iterator(path.parent_path()))
    files += item.path().filename().string().find("tmp") == std::string::npos;
  CHECK(files == 2); // tuning.json and tuning.json.lock
  CHECK(slurp(path).find("\"format\": \"sagegen-tuning-db\"") != std::string::npos);
}

TEST_CASE("a corrupt database is moved aside with a warning, not silently overwritten") {
  TemporaryDirectory directory;
  const fs::path path = directory.path / "tuning.json";
  std::ofstream(path) << "{ not json";
  std::vector<std::string> warnings;
  TuningDatabase::store(path, kH100, {entry("sage-b", 1024, "block_q=64,block_kv=32,warps=4,stages=2")}, warnings);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("tuning.json: line 1, column 3") != std::string::npos);
  CHECK(warnings[0].find("moved it to " + (path.string() + ".corrupt")) != std::string::npos);
  CHECK(slurp(path.string() + ".corrupt") == "{ not json");
  CHECK(TuningDatabase::read(path).lookup(query(kH100))->tunables == "block_q=64,block_kv=32,warps=4,stages=2");
}

TEST_CASE("an unwritable location is an error naming the path") {
  TemporaryDirectory directory;
  const fs::path blocker = directory.path / "file";
  std::ofstream(blocker) << "x";
  std::vector<std::string> warnings;
  CHECK_THROWS_WITH_AS(TuningDatabase::store(blocker / "tuning.json", kH100, {entry("sage-b", 1, "x")}, warnings),
                       doctest::Contains("file"), TuningDatabaseError);
}

TEST_CASE("the default path: $SAGEGEN_TUNING_DB, else tuning.json in the kernel cache directory") {
  const char *saved = std::getenv("SAGEGEN_TUNING_DB");
  const std::string saved_value = saved ? saved : "";
  ::setenv("SAGEGEN_TUNING_DB", "/somewhere/db.json", 1);
  CHECK(TuningDatabase::defaultPath() == "/somewhere/db.json");
  ::unsetenv("SAGEGEN_TUNING_DB");
  const char *cache = std::getenv("SAGEGEN_CACHE_DIR");
  const std::string cache_value = cache ? cache : "";
  ::setenv("SAGEGEN_CACHE_DIR", "/cache/dir", 1);
  CHECK(TuningDatabase::defaultPath() == fs::path("/cache/dir/tuning.json"));
  if (cache)
    ::setenv("SAGEGEN_CACHE_DIR", cache_value.c_str(), 1);
  else
    ::unsetenv("SAGEGEN_CACHE_DIR");
  if (saved)
    ::setenv("SAGEGEN_TUNING_DB", saved_value.c_str(), 1);
}

TEST_CASE("timestamps are UTC ISO 8601") {
  const std::string now = utcTimestamp();
  REQUIRE(now.size() == 20);
  CHECK(now[4] == '-');
  CHECK(now[10] == 'T');
  CHECK(now.back() == 'Z');
}

TEST_CASE("fields are checked against the vocabulary, and each key appears once") {
  auto file = [](const std::string &field) {
    return R"({"format": "sagegen-tuning-db", "version": 1, "devices": [{"gpu": "G", "arch": "sm_90a",
      "sagegen_version": "0.1.0", "entries": [{"variant": "sage-b", "head_dim": 128, "causal": false, "input": "f16",
      "tokens": 1024, "tunables": "block_q=128,block_kv=64,warps=8,stages=3", "milliseconds": 1.0,
      "default_milliseconds": 1.2, "date": "2026-11-23T11:00:00Z", )" +
           field + "}]}]}";
  };
  auto check = [&](const std::string &field, const std::string &expected) {
    CAPTURE(field);
    std::string text = file(field);
    // The field replaces the one of the same name given earlier: JSON objects keep the first, so drop it there.
    const std::string name = field.substr(0, field.find(':'));
    const size_t first = text.find(name);
    const size_t end = text.find(", \"", first + 1);
    text.erase(first, end - first + 2);
    CHECK_THROWS_WITH_AS(TuningDatabase::fromJson(parseJson(text), "db.json"), doctest::Contains(expected.c_str()),
                         TuningDatabaseError);
  };
  check(R"("head_dim": 100)", "entries[0].head_dim: expected a multiple of 16 in [16, 256], got 100");
  check(R"("head_dim": 4294967424)", "entries[0].head_dim: expected a multiple of 16");
  check(R"("tokens": -1)", "entries[0].tokens: expected an integer in [1, 2^40]");
  check(R"("tunables": "warps=4,warps=8")", "entries[0].tunables: expected");
  check(R"("tunables": "block_q=128,block_kv=64,warps=8")", "expected all of block_q, block_kv, warps and stages");
  check(R"("tunables": "block_q=128,block_kv=64,warps=8,stages=3,turbo=1")", "entries[0].tunables");
  check(R"("tunables": "block_q=-128,block_kv=64,warps=8,stages=3")", "entries[0].tunables");
  check(R"("tunables": "block_q=64,block_kv=128,warps=4,stages=2,inline_loads=2")", "entries[0].tunables");
  check(R"("tunables": "block_q=64,block_kv=128,warps=4,stages=2,inline_loads=1,ctas=0")", "entries[0].tunables");
  check(R"("tunables": "block_q=64,inline_loads=1,block_kv=128,warps=4,stages=2,inline_loads=1")",
        "entries[0].tunables");
  check(R"("variant": "../../x")", "entries[0].variant: expected a preset name or an IR fingerprint");

  // The sm90 schedule's flag, as tunablesText writes it, is a valid record
  std::string inline_text = file(R"("variant": "sage2-fp8")");
  inline_text.erase(inline_text.find(R"("variant": "sage-b", )"), std::string(R"("variant": "sage-b", )").size());
  const std::string old_tunables = "block_q=128,block_kv=64,warps=8,stages=3";
  inline_text.replace(inline_text.find(old_tunables), old_tunables.size(),
                      "block_q=64,block_kv=128,warps=4,stages=2,inline_loads=1,ctas=4");
  CHECK(TuningDatabase::fromJson(parseJson(inline_text), "db.json").groups().size() == 1);

  const std::string entry_text = R"({"variant": "sage-b", "head_dim": 128, "causal": false, "input": "f16",
    "tokens": 1024, "tunables": "block_q=128,block_kv=64,warps=8,stages=3", "milliseconds": 1.0,
    "default_milliseconds": 1.2, "date": "2026-11-23T11:00:00Z"})";
  const std::string duplicate = R"({"format": "sagegen-tuning-db", "version": 1, "devices": [{"gpu": "G",
    "arch": "sm_90a", "sagegen_version": "0.1.0", "entries": [)" +
                                entry_text + ", " + entry_text + "]}]}";
  CHECK_THROWS_WITH_AS(TuningDatabase::fromJson(parseJson(duplicate), "db.json"),
                       doctest::Contains("entries[1]: the same variant, head_dim, causal, input and tokens as "
                                         "devices[0].entries[0]"),
                       TuningDatabaseError);
  const std::string device = R"({"gpu": "G", "arch": "sm_90a", "sagegen_version": "0.1.0", "entries": []})";
  CHECK_THROWS_WITH_AS(TuningDatabase::fromJson(parseJson(R"({"format": "sagegen-tuning-db", "version": 1,
    "devices": [)" + device + ", " + device + "]}"),
                                                "db.json"),
                       doctest::Contains("devices[1]: the same gpu, arch and sagegen_version as devices[0]"),
                       TuningDatabaseError);
}

TEST_CASE("store refuses entries the reader would refuse, before touching the file") {
  TemporaryDirectory directory;
  std::vector<std::string> warnings;
  CHECK_THROWS_WITH_AS(
      TuningDatabase::store(directory.path / "tuning.json", kH100, {entry("sage-b", 1024, "warps=4")}, warnings),
      doctest::Contains("expected all of block_q"), TuningDatabaseError);
  CHECK_FALSE(fs::exists(directory.path / "tuning.json"));
}

TEST_CASE("80k entries load in linear time") {
  std::string text = R"({"format": "sagegen-tuning-db", "version": 1, "devices": [{"gpu": "G", "arch": "sm_90a",
    "sagegen_version": "0.1.0", "entries": [)";
  for (int n = 1; n <= 80000; ++n)
    text += std::string(n > 1 ? "," : "") + R"({"variant": "sage-b", "head_dim": 128, "causal": false, "input": "f16",
      "tokens": )" +
            std::to_string(n) + R"(, "tunables": "block_q=128,block_kv=64,warps=8,stages=3",
      "milliseconds": 1.0, "default_milliseconds": 1.2, "date": "2026-11-23T11:00:00Z"})";
  text += "]}]}";
  const JsonValue json = parseJson(text);
  const auto start = std::chrono::steady_clock::now();
  const TuningDatabase database = TuningDatabase::fromJson(json, "big.json");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(database.groups()[0].entries.size() == 80000);
  CHECK(seconds < 5.0); // quadratic took 39 s; linear takes well under one on a shared CI core
}
