// EXPECT_THROW_MSG(statement, ExceptionType, substring): throws that type, and its message
// contains the substring (so tests check what the user is told, not only that it failed).
#pragma once

#include <gtest/gtest.h>

#include <string>

#define EXPECT_THROW_MSG(statement, exception_type, substring)                               \
  do {                                                                                       \
    bool datapar_thrown_ = false;                                                            \
    try {                                                                                    \
      (void)(statement);                                                                     \
    } catch (const exception_type& e) {                                                      \
      datapar_thrown_ = true;                                                                \
      EXPECT_NE(std::string(e.what()).find(substring), std::string::npos)                   \
          << "message: " << e.what() << "\nexpected to contain: " << (substring);            \
    }                                                                                        \
    EXPECT_TRUE(datapar_thrown_) << #statement " did not throw " #exception_type;            \
  } while (0)
