#pragma once
// Checks that a guide shows a test's example verbatim: the code between two `marker` lines of the
// test's source is the first ```cpp block after `heading` in the guide (paths from the repository
// root, DRA_SOURCE_DIR). Used by the tests whose example a guide prints.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace dra_test {

inline std::string read_repo_file(const std::string& relative) {
  const std::string path = std::string(DRA_SOURCE_DIR) + "/" + relative;
  std::ifstream in(path);
  REQUIRE_MESSAGE(in, path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void check_guide_shows_example(const std::string& source_file, const std::string& marker,
                                      const std::string& guide_file, const std::string& heading) {
  const std::string source = read_repo_file(source_file);
  const std::string line = marker + "\n";
  const auto a = source.find(line);
  REQUIRE(a != std::string::npos);
  const auto b = source.find(line, a + line.size());
  REQUIRE(b != std::string::npos);
  const std::string example = source.substr(a + line.size(), b - a - line.size());
  const std::string guide = read_repo_file(guide_file);
  const auto section = guide.find("\n" + heading + "\n");
  REQUIRE_MESSAGE(section != std::string::npos, heading);
  const auto open = guide.find("```cpp\n", section);
  REQUIRE(open != std::string::npos);
  const auto close = guide.find("```\n", open + 7);
  REQUIRE(close != std::string::npos);
  CHECK(guide.substr(open + 7, close - open - 7) == example);
}

}  // namespace dra_test
