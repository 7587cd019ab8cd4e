// The kernel cache in a temporary directory: memory and disk hits, damaged and foreign entries, unusable
// directories, concurrent builders (threads and processes), and the list/verify/clear maintenance calls.
#include "sage/runtime/KernelCache.h"
#include "../support/TemporaryDirectory.h"

#include "sage/runtime/CacheEntry.h"

#include <doctest/doctest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace sage::runtime;
namespace fs = std::filesystem;

namespace {

// This program's scratch directories.
struct TemporaryDirectory : sage::test::TemporaryDirectory {
  TemporaryDirectory() : sage::test::TemporaryDirectory("sagegen-cache-test") {}
};

KernelKey keyFor(const std::string &schedule) {
  KernelKey key;
  key.ir_hash = "ir-1";
  key.schedule = schedule;
  key.tunables = "warps=4";
  key.head_dim = 128;
  key.dtypes = "f16";
  key.layout = "HND";
  key.arch = "sm_80";
  key.compiler_version = "test";
  key.sagegen_version = sagegenVersion();
  return key;
}

// A payload that depends on the key, so mixed-up entries would show.
ByteBuffer imageFor(const KernelKey &key) {
  std::string digest = key.digest();
  ByteBuffer image(digest.begin(), digest.end());
  for (int index = 0; index < 500; ++index)
    image.push_back(std::uint8_t(index));
  return image;
}

// Collects warnings and counts builder calls.
struct Harness {
  std::vector<std::string> warnings;
  int builds = 0;

  KernelCacheOptions options(const fs::path &directory) {
    KernelCacheOptions options;
    options.directory = directory;
    options.warning_sink = [this](const std::string &warning) { warnings.push_back(warning); };
    return options;
  }
  CacheBuilder builder(const KernelKey &key) {
    return [this, key] {
      ++builds;
      return imageFor(key);
    };
  }
};

ByteBuffer readFile(const fs::path &path) {
  std::ifstream stream(path, std::ios::binary);
  return ByteBuffer(std::istreambuf_iterator<char>(stream), {});
}

void writeFile(const fs::path &path, const ByteBuffer &bytes) {
  std::ofstream stream(path, std::ios::binary | std::ios::trunc);
  stream.write(reinterpret_cast<const char *>(bytes.data()), std::streamsize(bytes.size()));
}

fs::path entryPath(const fs::path &directory, const KernelKey &key) { return directory / (key.digest() + ".kernel"); }

bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

// Builds `key` in a fresh cache, then damages its entry with `damage` and checks a new cache reports it (with
// `expected_problem` in the warning), rebuilds the right bytes and leaves a valid entry.
void checkDamageIsRepaired(const std::function<void(const fs::path &entry)> &damage, const std::string &expected_kind,
                           const std::string &expected_problem) {
  TemporaryDirectory directory;
  KernelKey key = keyFor("sm80.mma_sync");
  Harness first;
  KernelCache(first.options(directory.path)).getOrBuild(key, first.builder(key));
  damage(entryPath(directory.path, key));

  Harness second;
  KernelCache cache(second.options(directory.path));
  CacheResult result = cache.getOrBuild(key, second.builder(key));
  CHECK(result.source == CacheSource::built);
  CHECK(second.builds == 1);
  CHECK(*result.image == imageFor(key));
  REQUIRE(result.warnings.size() == 1);
  CHECK(contains(result.warnings[0], expected_kind));
  CHECK(contains(result.warnings[0], expected_problem));
  CHECK(second.warnings == result.warnings);
  CHECK(cache.stats().rejected_entries == 1);

  CacheVerifyReport report = cache.verify(false);
  CHECK(report.checked == 1);
  CHECK(report.invalid.empty());
  Harness third;
  CHECK(KernelCache(third.options(directory.path)).getOrBuild(key, third.builder(key)).source == CacheSource::disk);
}

} // namespace

TEST_CASE("a miss builds, the next call is a memory hit with the same bytes") {
  TemporaryDirectory directory;
  Harness harness;
  KernelCache cache(harness.options(directory.path));
  KernelKey key = keyFor("sm80.mma_sync");

  CacheResult first = cache.getOrBuild(key, harness.builder(key));
  CHECK(first.source == CacheSource::built);
  CHECK(first.digest == key.digest());
  CHECK(*first.image == imageFor(key));
  CacheResult second = cache.getOrBuild(key, harness.builder(key));
  CHECK(second.source == CacheSource::memory);
  CHECK(second.image == first.image);
  CHECK(harness.builds == 1);
  CHECK(harness.warnings.empty());
  CacheStats stats = cache.stats();
  CHECK(stats.builds == 1);
  CHECK(stats.memory_hits == 1);
  CHECK(stats.disk_hits == 0);
  CHECK(fs::is_regular_file(entryPath(directory.path, key)));
  CHECK(std::string(cacheSourceName(second.source)) == "memory");
}

TEST_CASE("a new cache instance finds the entry on disk") {
  TemporaryDirectory directory;
  KernelKey key = keyFor("sm80.mma_sync");
  Harness writer;
  KernelCache(writer.options(directory.path)).getOrBuild(key, writer.builder(key));

  Harness reader;
  KernelCache cache(reader.options(directory.path));
  CacheResult result = cache.getOrBuild(key, reader.builder(key));
  CHECK(result.source == CacheSource::disk);
  CHECK(*result.image == imageFor(key));
  CHECK(reader.builds == 0);
  CHECK(cache.getOrBuild(key, reader.builder(key)).source == CacheSource::memory);
  CHECK(cache.stats().disk_hits == 1);
  CHECK(cache.stats().memory_hits == 1);
}

TEST_CASE("different keys get different entries") {
  TemporaryDirectory directory;
  Harness harness;
  KernelCache cache(harness.options(directory.path));
  KernelKey first = keyFor("sm80.mma_sync"), second = keyFor("sm89.mma_sync");
  CHECK(*cache.getOrBuild(first, harness.builder(first)).image == imageFor(first));
  CHECK(*cache.getOrBuild(second, harness.builder(second)).image == imageFor(second));
  CHECK(harness.builds == 2);
  CHECK(cache.list().size() == 2);
}

TEST_CASE("a corrupted payload byte is detected, reported, removed and rebuilt") {
  checkDamageIsRepaired(
      [](const fs::path &entry) {
        ByteBuffer bytes = readFile(entry);
        bytes[bytes.size() - 7] ^= 0x01;
        writeFile(entry, bytes);
      },
      "corrupt", "checksum");
}

TEST_CASE("a truncated entry is detected, reported, removed and rebuilt") {
  checkDamageIsRepaired(
      [](const fs::path &entry) {
        ByteBuffer bytes = readFile(entry);
        bytes.resize(bytes.size() / 2);
        writeFile(entry, bytes);
      },
      "corrupt", "size mismatch");
}

TEST_CASE("a file that is not an entry at all is detected and rebuilt") {
  checkDamageIsRepaired(
      [](const fs::path &entry) {
        writeFile(entry, ByteBuffer{'h', 'e', 'l', 'l', 'o'});
      },
      "corrupt", "truncated");
}

TEST_CASE("an entry stored for another key is foreign: reported, removed and rebuilt") {
  // Simulates a digest collision (or another key format): key A's intact entry under key B's file name.
  KernelKey other = keyFor("sm89.mma_sync");
  checkDamageIsRepaired(
      [&](const fs::path &entry) { writeFile(entry, encodeCacheEntry(other.text(), imageFor(other))); }, "foreign",
      "another key");
}

TEST_CASE("list shows every entry with its key; verify finds damaged and misnamed entries; clear empties") {
  TemporaryDirectory directory;
  Harness harness;
  KernelCache cache(harness.options(directory.path));
  KernelKey good = keyFor("good"), damaged = keyFor("damaged"), misnamed = keyFor("misnamed");
  for (const KernelKey &key : {good, damaged, misnamed})
    cache.getOrBuild(key, harness.builder(key));

  std::vector<CacheEntryInfo> entries = cache.list();
  REQUIRE(entries.size() == 3);
  for (const CacheEntryInfo &entry : entries) {
    CHECK(entry.valid);
    CHECK(contains(entry.key_text, "schedule="));
    CHECK(entry.file_bytes > kCacheEntryHeaderBytes);
  }

  ByteBuffer bytes = readFile(entryPath(directory.path, damaged));
  bytes[kCacheEntryHeaderBytes + 3] ^= 0x10; // inside the key text: the checksum covers it too
  writeFile(entryPath(directory.path, damaged), bytes);
  fs::copy_file(entryPath(directory.path, good), entryPath(directory.path, misnamed),
                fs::copy_options::overwrite_existing);

  CacheVerifyReport report = cache.verify(false);
  CHECK(report.checked == 3);
  REQUIRE(report.invalid.size() == 2);
  CHECK(fs::exists(entryPath(directory.path, damaged)));
  bool saw_checksum = false, saw_foreign = false;
  for (const CacheEntryInfo &entry : report.invalid) {
    saw_checksum |= entry.digest == damaged.digest() && contains(entry.problem, "checksum");
    saw_foreign |= entry.digest == misnamed.digest() && contains(entry.problem, "foreign");
  }
  CHECK(saw_checksum);
  CHECK(saw_foreign);

  CHECK(cache.verify(true).invalid.size() == 2);
  CHECK_FALSE(fs::exists(entryPath(directory.path, damaged)));
  CHECK(cache.verify(false).checked == 1);

  CHECK(cache.clear() == 1);
  CHECK(cache.list().empty());
  for (const auto &item : fs::directory_iterator(directory.path))
    FAIL("clear left " << item.path());
  int builds_before = harness.builds;
  CHECK(cache.getOrBuild(good, harness.builder(good)).source == CacheSource::built);
  CHECK(harness.builds == builds_before + 1);
}

TEST_CASE("a builder that throws propagates and caches nothing") {
  TemporaryDirectory directory;
  Harness harness;
  KernelCache cache(harness.options(directory.path));
  KernelKey key = keyFor("sm80.mma_sync");
  CHECK_THROWS_WITH_AS(cache.getOrBuild(key, []() -> ByteBuffer { throw std::runtime_error("nvrtc said no"); }),
                       "nvrtc said no", std::runtime_error);
  CHECK_FALSE(fs::exists(entryPath(directory.path, key)));
  CHECK(cache.getOrBuild(key, harness.builder(key)).source == CacheSource::built);
  CHECK(harness.builds == 1);
}

TEST_CASE("a directory under a regular file is unusable even for root: memory only, one warning") {
  TemporaryDirectory directory;
  fs::path blocker = directory.path / "not-a-directory";
  writeFile(blocker, ByteBuffer{'x'});
  Harness harness;
  KernelCache cache(harness.options(blocker / "cache"));
  KernelKey first = keyFor("first"), second = keyFor("second");

  CacheResult result = cache.getOrBuild(first, harness.builder(first));
  CHECK(result.source == CacheSource::built);
  CHECK(*result.image == imageFor(first));
  REQUIRE(result.warnings.size() == 1);
  CHECK(contains(result.warnings[0], "memory only"));
  CHECK(contains(result.warnings[0], (blocker / "cache").string()));
  CHECK(cache.getOrBuild(first, harness.builder(first)).source == CacheSource::memory);
  CacheResult later = cache.getOrBuild(second, harness.builder(second));
  CHECK(later.source == CacheSource::built);
  CHECK(later.warnings.empty());
  CHECK(harness.warnings.size() == 1);
  CHECK(cache.directory().empty());
  CHECK(cache.list().empty());
}

TEST_CASE("a read-only directory: memory only with one warning, or usable when running as root") {
  TemporaryDirectory directory;
  fs::path read_only = directory.path / "read-only";
  fs::create_directory(read_only);
  fs::permissions(read_only, fs::perms(0555), fs::perm_options::replace);
  Harness harness;
  KernelCache cache(harness.options(read_only));
  KernelKey key = keyFor("sm80.mma_sync");
  CacheResult result = cache.getOrBuild(key, harness.builder(key));
  CHECK(*result.image == imageFor(key));
  CHECK(cache.getOrBuild(key, harness.builder(key)).source == CacheSource::memory);
  if (::geteuid() == 0) {
    // Root ignores permission bits: the directory works (the regular-file case covers the fallback for root).
    MESSAGE("running as root: 0555 does not stop root, checking the directory is used");
    CHECK(harness.warnings.empty());
    CHECK(fs::exists(entryPath(read_only, key)));
  } else {
    REQUIRE(harness.warnings.size() == 1);
    CHECK(contains(harness.warnings[0], "memory only"));
    CHECK_FALSE(fs::exists(entryPath(read_only, key)));
  }
}

TEST_CASE("memory_only never touches the disk") {
  TemporaryDirectory directory;
  Harness harness;
  KernelCacheOptions options = harness.options(directory.path / "unused");
  options.memory_only = true;
  KernelCache cache(options);
  KernelKey key = keyFor("sm80.mma_sync");
  CHECK(cache.getOrBuild(key, harness.builder(key)).source == CacheSource::built);
  CHECK(cache.getOrBuild(key, harness.builder(key)).source == CacheSource::memory);
  CHECK_FALSE(fs::exists(directory.path / "unused"));
  CHECK(harness.warnings.empty());
  CHECK(cache.directory().empty());
}

TEST_CASE("threads asking for the same key build it once and share the image") {
  TemporaryDirectory directory;
  KernelCacheOptions options;
  options.directory = directory.path;
  KernelCache cache(options);
  KernelKey key = keyFor("sm80.mma_sync");
  std::atomic<int> builds = 0;
  std::vector<CacheResult> results(8);
  std::vector<std::thread> threads;
  for (CacheResult &result : results)
    threads.emplace_back([&] {
      result = cache.getOrBuild(key, [&] {
        ++builds;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return imageFor(key);
      });
    });
  for (std::thread &thread : threads)
    thread.join();
  CHECK(builds == 1);
  for (const CacheResult &result : results)
    CHECK(result.image == results[0].image);
  CHECK(cache.stats().builds == 1);
  CHECK(cache.stats().memory_hits == 7);
}

TEST_CASE("two processes building the same key: one build, identical bytes, one valid entry") {
  TemporaryDirectory cache_directory, scratch;
  KernelKey key = keyFor("sm80.mma_sync");
  fs::path build_log = scratch.path / "builds.log";

  int start_pipe[2];
  REQUIRE(::pipe(start_pipe) == 0);
  std::vector<pid_t> children;
  for (int child = 0; child < 2; ++child) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // Child: wait for the start signal (the parent closing the pipe), build through its own cache, write what
      // it got to a file, and leave without running anything of doctest.
      ::close(start_pipe[1]);
      char byte;
      while (::read(start_pipe[0], &byte, 1) < 0 && errno == EINTR) {
      }
      int status = 0;
      try {
        KernelCacheOptions options;
        options.directory = cache_directory.path;
        options.warning_sink = [](const std::string &) {};
        KernelCache cache(options);
        CacheResult result = cache.getOrBuild(key, [&] {
          int log = ::open(build_log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
          if (log < 0 || ::write(log, "b", 1) != 1)
            ::_exit(3);
          ::close(log);
          std::this_thread::sleep_for(std::chrono::milliseconds(300)); // let the other process reach the lock
          ByteBuffer image = imageFor(key);
          std::string pid_text = std::to_string(::getpid()); // so two builds would give different bytes
          image.insert(image.end(), pid_text.begin(), pid_text.end());
          return image;
        });
        writeFile(scratch.path / ("child" + std::to_string(child) + ".bin"), *result.image);
      } catch (...) {
        status = 2;
      }
      ::_exit(status);
    }
    children.push_back(pid);
  }
  ::close(start_pipe[0]);
  ::close(start_pipe[1]);
  for (pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }

  CHECK(fs::file_size(build_log) == 1); // the builder ran once across both processes
  ByteBuffer first = readFile(scratch.path / "child0.bin"), second = readFile(scratch.path / "child1.bin");
  CHECK(!first.empty());
  CHECK(first == second);
  KernelCache cache(KernelCacheOptions{.directory = cache_directory.path, .memory_only = false, .warning_sink = {}});
  CacheVerifyReport report = cache.verify(false);
  CHECK(report.checked == 1);
  CHECK(report.invalid.empty());
  CacheResult from_disk = cache.getOrBuild(key, [] { return ByteBuffer{}; });
  CHECK(from_disk.source == CacheSource::disk);
  CHECK(*from_disk.image == first);
}

TEST_CASE("the default directory: SAGEGEN_CACHE_DIR, then XDG_CACHE_HOME/sagegen, then HOME/.cache/sagegen") {
  auto saved = [](const char *name) {
    const char *value = std::getenv(name);
    return value ? std::optional<std::string>(value) : std::nullopt;
  };
  std::optional<std::string> cache_dir = saved("SAGEGEN_CACHE_DIR"), xdg = saved("XDG_CACHE_HOME"),
                             home = saved("HOME");

  ::setenv("SAGEGEN_CACHE_DIR", "/tmp/explicit", 1);
  ::setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
  ::setenv("HOME", "/tmp/home", 1);
  CHECK(KernelCache::defaultCacheDirectory() == fs::path("/tmp/explicit"));
  ::unsetenv("SAGEGEN_CACHE_DIR");
  CHECK(KernelCache::defaultCacheDirectory() == fs::path("/tmp/xdg/sagegen"));
  ::setenv("XDG_CACHE_HOME", "relative/ignored", 1);
  CHECK(KernelCache::defaultCacheDirectory() == fs::path("/tmp/home/.cache/sagegen"));
  ::unsetenv("XDG_CACHE_HOME");
  ::unsetenv("HOME");
  CHECK(KernelCache::defaultCacheDirectory().empty());

  auto restore = [](const char *name, const std::optional<std::string> &value) {
    if (value)
      ::setenv(name, value->c_str(), 1);
    else
      ::unsetenv(name);
  };
  restore("SAGEGEN_CACHE_DIR", cache_dir);
  restore("XDG_CACHE_HOME", xdg);
  restore("HOME", home);
}

TEST_CASE("clear and verify --fix delete only files the cache wrote; a fix that cannot remove says so") {
  TemporaryDirectory directory;
  Harness harness;
  KernelCache cache(harness.options(directory.path));
  KernelKey good = keyFor("good");
  cache.getOrBuild(good, harness.builder(good));
  const std::string foreign_digest(64, 'a');
  const fs::path notes = directory.path / "notes.kernel", foreign = directory.path / (foreign_digest + ".kernel");
  writeFile(notes, ByteBuffer{'m', 'i', 'n', 'e'});
  writeFile(foreign, ByteBuffer{'n', 'o', 't', ' ', 'a', 'n', ' ', 'e', 'n', 't', 'r', 'y'});

  CacheVerifyReport report = cache.verify(true);
  REQUIRE(report.invalid.size() == 1); // notes.kernel is not named like an entry: not listed at all
  CHECK(report.invalid[0].digest == foreign_digest);
  CHECK_FALSE(report.invalid[0].removed);
  CHECK(contains(report.invalid[0].problem, "not written by sagegen, left in place"));
  CHECK(fs::exists(foreign));

  CHECK(cache.clear() == 1);
  CHECK(fs::exists(notes));
  CHECK(fs::exists(foreign));
  CHECK_FALSE(fs::exists(entryPath(directory.path, good)));
}

TEST_CASE("a FIFO or an oversized sparse file where an entry should be neither blocks nor is read") {
  TemporaryDirectory directory;
  KernelKey key = keyFor("sm80.mma_sync");
  REQUIRE(::mkfifo(entryPath(directory.path, key).c_str(), 0644) == 0);
  Harness harness;
  KernelCache cache(harness.options(directory.path));
  CHECK(cache.list().empty()); // not a regular file: not an entry
  CacheResult result = cache.getOrBuild(key, harness.builder(key));
  CHECK(result.source == CacheSource::built);
  CHECK(*result.image == imageFor(key));
  REQUIRE_FALSE(result.warnings.empty());
  CHECK(contains(result.warnings[0], "expected a regular file"));
  CHECK(fs::is_regular_file(entryPath(directory.path, key))); // the FIFO was replaced by the entry

  KernelKey sparse = keyFor("sparse");
  { std::ofstream(entryPath(directory.path, sparse)) << "x"; }
  fs::resize_file(entryPath(directory.path, sparse), std::uintmax_t(16) << 30); // 16 GiB, no blocks on disk
  Harness second;
  CacheResult rebuilt = KernelCache(second.options(directory.path)).getOrBuild(sparse, second.builder(sparse));
  CHECK(rebuilt.source == CacheSource::built);
  REQUIRE_FALSE(rebuilt.warnings.empty());
  CHECK(contains(rebuilt.warnings[0], "more than the limit"));
}
