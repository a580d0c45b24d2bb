#pragma once
// g++ 12 at -O3 (the plain Release build, scripts/test.sh plain) reports -Wrestrict false
// positives inside libstdc++'s operator+(const char*, std::string&&) where a test builds names
// in a loop ("p" + std::to_string(i)): GCC bug 105329. Code between these two is compiled with
// that warning off, so it is silenced where it arises and nowhere else.
#if defined(__GNUC__) && !defined(__clang__)
#define ZSHARD_TEST_NO_RESTRICT_WARNING_BEGIN \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wrestrict\"")
#define ZSHARD_TEST_NO_RESTRICT_WARNING_END _Pragma("GCC diagnostic pop")
#else
#define ZSHARD_TEST_NO_RESTRICT_WARNING_BEGIN
#define ZSHARD_TEST_NO_RESTRICT_WARNING_END
#endif
