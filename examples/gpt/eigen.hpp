#pragma once
// Eigen, included as a system header: its own code trips -Wextra/-Wpedantic on some
// compilers, and our targets build with -Werror. Include Eigen through this file only.
#pragma GCC system_header
#include <Eigen/Dense>
