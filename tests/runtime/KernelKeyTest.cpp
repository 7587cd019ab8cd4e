// The kernel key: canonical text, digest stability, and that every field takes part in the digest.
#include "sage/runtime/KernelKey.h"

#include "sage/runtime/Sha256.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <vector>

using namespace sage::runtime;

namespace {

KernelKey sampleKey() {
  KernelKey key;
  key.ir_hash = "3f9a";
  key.schedule = "sm80.mma_sync";
  key.tunables = "warps=4,stages=2";
  key.head_dim = 128;
  key.causal = true;
  key.dtypes = "qkv=f16,o=f16";
  key.layout = "HND";
  key.arch = "sm_80";
  key.compiler_version = "13.0";
  key.sagegen_version = sagegenVersion();
  key.extra = "";
  return key;
}

} // namespace

TEST_CASE("the key text names every field once, after a versioned header line") {
  std::string text = sampleKey().text();
  CHECK(text.starts_with("sagegen-kernel-key " + std::to_string(kKernelKeyFormatVersion) + "\n"));
  for (const char *line :
       {"ir_hash=3f9a\n", "schedule=sm80.mma_sync\n", "tunables=warps=4,stages=2\n", "head_dim=128\n", "causal=1\n",
        "dtypes=qkv=f16,o=f16\n", "layout=HND\n", "arch=sm_80\n", "compiler_version=13.0\n", "extra=\n"})
    CHECK(text.find(line) != std::string::npos);
  CHECK(std::count(text.begin(), text.end(), '\n') == 12);
}

TEST_CASE("the digest is the SHA-256 of the text and is the same for equal keys") {
  KernelKey key = sampleKey();
  CHECK(key.digest() == sha256Hex(key.text()));
  CHECK(key.digest().size() == 64);
  CHECK(key.digest().find_first_not_of("0123456789abcdef") == std::string::npos);
  KernelKey copy = key;
  CHECK(copy == key);
  CHECK(copy.digest() == key.digest());
}

TEST_CASE("changing any field changes the digest") {
  std::vector<std::function<void(KernelKey &)>> changes = {[](KernelKey &key) { key.ir_hash += "0"; },
                                                           [](KernelKey &key) { key.schedule = "sm89.mma_sync"; },
                                                           [](KernelKey &key) { key.tunables = "warps=8"; },
                                                           [](KernelKey &key) { key.head_dim = 64; },
                                                           [](KernelKey &key) { key.causal = false; },
                                                           [](KernelKey &key) { key.dtypes = "qkv=bf16"; },
                                                           [](KernelKey &key) { key.layout = "NHD"; },
                                                           [](KernelKey &key) { key.arch = "sm_90a"; },
                                                           [](KernelKey &key) { key.compiler_version = "12.8"; },
                                                           [](KernelKey &key) { key.sagegen_version = "0.0.0"; },
                                                           [](KernelKey &key) { key.extra = "lineinfo"; }};
  std::set<std::string> digests = {sampleKey().digest()};
  for (const auto &change : changes) {
    KernelKey key = sampleKey();
    change(key);
    digests.insert(key.digest());
  }
  CHECK(digests.size() == changes.size() + 1);
}

TEST_CASE("escaping keeps values with newlines or backslashes from forging other fields") {
  KernelKey forged = sampleKey();
  forged.tunables = "warps=4\nhead_dim=64";
  std::string forged_text = forged.text();
  CHECK(std::count(forged_text.begin(), forged_text.end(), '\n') == 12);
  CHECK(forged_text.find("tunables=warps=4\\nhead_dim=64\n") != std::string::npos);

  KernelKey newline = sampleKey(), backslash_n = sampleKey();
  newline.extra = "a\nb";
  backslash_n.extra = "a\\nb";
  CHECK(newline.text() != backslash_n.text());
  CHECK(newline.digest() != backslash_n.digest());
}

TEST_CASE("parseKernelKeyText inverts text() and rejects anything else") {
  KernelKey key = sampleKey();
  key.extra = "entry;with\\backslash\nand newline";
  std::optional<KernelKey> parsed = parseKernelKeyText(key.text());
  REQUIRE(parsed.has_value());
  CHECK(*parsed == key);
  const std::string text = key.text();
  CHECK(!parseKernelKeyText(text.substr(0, text.size() - 1)));                              // no final newline
  CHECK(!parseKernelKeyText(text + "more=1\n"));                                            // a field too many
  CHECK(!parseKernelKeyText("sagegen-kernel-key 99\n" + text.substr(text.find('\n') + 1))); // another version
  std::string swapped = text;
  swapped.replace(swapped.find("causal=1"), 8, "causal=x");
  CHECK(!parseKernelKeyText(swapped));
  std::string bad_head_dim = text;
  bad_head_dim.replace(bad_head_dim.find("head_dim=128"), 12, "head_dim=12a");
  CHECK(!parseKernelKeyText(bad_head_dim));
  CHECK(!parseKernelKeyText(""));
}
