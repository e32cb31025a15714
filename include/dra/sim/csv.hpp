#pragma once
// A small CSV reader for the simulator's inputs (profiles, workloads). Plain comma-separated
// values with a header row, no quoting (none of the inputs uses it). Every error names the file,
// the line and the column, so a user can open the file at the right place and fix it.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace dra::sim {

/// A parsed CSV file: header plus rows, each row remembering its line number in the file.
class csv_table {
 public:
  csv_table() = default;

  const std::string& source() const noexcept { return source_; }
  const std::vector<std::string>& header() const noexcept { return header_; }
  std::size_t rows() const noexcept { return cells_.size(); }
  std::size_t line_of(std::size_t row) const { return lines_.at(row); }

  /// Index of a named column; throws naming the file and the columns it does have.
  std::size_t column(const std::string& name) const {
    for (std::size_t i = 0; i < header_.size(); ++i)
      if (header_[i] == name) return i;
    std::string have;
    for (const auto& h : header_) have += (have.empty() ? "" : ", ") + h;
    throw std::invalid_argument(source_ + ":1: missing column '" + name + "' (the header has: " + have +
                                "); add the column to the header row");
  }

  const std::string& text(std::size_t row, std::size_t col) const { return cells_.at(row).at(col); }

  /// The cell as a finite decimal number (digits, a point, an exponent: no hexadecimal, no inf or
  /// nan); throws "<file>:<line>: column '<name>' (<n>): '<text>' is not a finite number".
  double number(std::size_t row, std::size_t col) const {
    const std::string& cell = text(row, col);
    if (cell.find_first_not_of("0123456789.eE+-") != std::string::npos)
      fail(row, col, "'" + cell + "' is not a finite decimal number; write it in plain digits (e.g. 16, 0.5, 1e3)");
    const char* begin = cell.c_str();
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(begin, &end);
    if (cell.empty() || end == begin || *end != '\0' || errno == ERANGE || !std::isfinite(v))
      fail(row, col, "'" + cell + "' is not a finite number");
    return v;
  }

  /// The cell as an integer (no fraction allowed).
  long long integer(std::size_t row, std::size_t col) const {
    const std::string& cell = text(row, col);
    const char* begin = cell.c_str();
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(begin, &end, 10);
    if (!cell.empty() && end != begin && *end == '\0' && errno == ERANGE)
      fail(row, col, "'" + cell + "' is too large an integer");
    if (cell.empty() || end == begin || *end != '\0') fail(row, col, "'" + cell + "' is not an integer");
    return v;
  }

  /// Throws std::invalid_argument naming the file, line and column of a cell.
  [[noreturn]] void fail(std::size_t row, std::size_t col, const std::string& problem) const {
    throw std::invalid_argument(source_ + ":" + std::to_string(line_of(row)) + ": column '" + header_.at(col) + "' (" +
                                std::to_string(col + 1) + "): " + problem);
  }

  /// Parses CSV text; `source` names it in error messages (usually the file path).
  static csv_table parse(std::istream& in, const std::string& source) {
    csv_table t;
    t.source_ = source;
    std::string line;
    std::size_t line_no = 0;
    bool have_header = false;
    while (std::getline(in, line)) {
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      // Blank lines (a trailing newline, a line of spaces an editor left) carry no data.
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      std::vector<std::string> cells = split(line);
      if (!have_header) {
        if (line_no == 1 && cells.size() >= 1 && cells[0].size() >= 3 && cells[0].compare(0, 3, "\xEF\xBB\xBF") == 0)
          cells[0].erase(0, 3);  // UTF-8 byte-order mark
        for (std::size_t i = 0; i < cells.size(); ++i)
          for (std::size_t k = 0; k < i; ++k)
            if (cells[i] == cells[k])
              throw std::invalid_argument(source + ":" + std::to_string(line_no) + ": column '" + cells[i] +
                                          "' appears twice in the header (columns " + std::to_string(k + 1) + " and " +
                                          std::to_string(i + 1) + "); keep one");
        t.header_ = std::move(cells);
        have_header = true;
        continue;
      }
      if (cells.size() != t.header_.size()) {
        const std::size_t col = std::min(cells.size(), t.header_.size());
        throw std::invalid_argument(source + ":" + std::to_string(line_no) + ": column " + std::to_string(col + 1) +
                                    ": expected " + std::to_string(t.header_.size()) +
                                    " comma-separated fields like the header, got " + std::to_string(cells.size()));
      }
      t.cells_.push_back(std::move(cells));
      t.lines_.push_back(line_no);
    }
    if (!have_header) throw std::invalid_argument(source + ":1: empty file; expected a header row");
    return t;
  }

  static csv_table parse_text(const std::string& text, const std::string& source) {
    std::istringstream in(text);
    return parse(in, source);
  }

  static csv_table read(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::invalid_argument(path + ": cannot open file; check the path");
    return parse(in, path);
  }

 private:
  static std::vector<std::string> split(const std::string& line) {
    std::vector<std::string> out;
    std::string cell;
    for (char c : line) {
      if (c == ',') {
        out.push_back(trim(cell));
        cell.clear();
      } else {
        cell.push_back(c);
      }
    }
    out.push_back(trim(cell));
    return out;
  }
  static std::string trim(const std::string& s) {
    const auto b = s.find_first_not_of(" \t");
    if (b == std::string::npos) return {};
    const auto e = s.find_last_not_of(" \t");
    return s.substr(b, e - b + 1);
  }

  std::string source_;
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> cells_;
  std::vector<std::size_t> lines_;
};

}  // namespace dra::sim
