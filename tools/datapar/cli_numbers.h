// Integer options that say so when a value does not fit: CLI11 turns an integer past its
// variable's range into the largest value without a word (--epochs 99999999999999999999
// trained "forever", issue 27), and the tools' own checks then see a valid number.
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdint>
#include <limits>
#include <string>

namespace datapar::tools {

// A whole number of type Int, at least `min`: "12", not "1e3", "0x10" or one past Int's range.
template <typename Int>
CLI::Validator whole_number(Int min = std::numeric_limits<Int>::min()) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        Int value{};
        const char* end = text.data() + text.size();
        const auto [ptr, error] = std::from_chars(text.data(), end, value);
        if (error == std::errc::result_out_of_range) {
          return text + " is out of range (at most " + std::to_string(std::numeric_limits<Int>::max()) + ")";
        }
        if (error != std::errc() || ptr != end) return text + " is not a whole number";
        if (value < min) return text + " is less than " + std::to_string(min);
        return "";
      },
      "INT");
}

}  // namespace datapar::tools
