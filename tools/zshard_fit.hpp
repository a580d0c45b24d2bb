#pragma once
// zshard_plan --fit (tools/zshard_fit.cpp): the fastest configuration that fits, before the run.
#include <string>
#include <vector>

namespace zshard_tools {

// Whether these arguments ask for the fit (--fit).
bool wants_fit(const std::vector<std::string>& args);

// Runs zshard_plan --fit on the command line's arguments; returns the exit status (0 found,
// 1 nothing fits or the engine refuses, 2 bad command line).
int run_fit(const std::vector<std::string>& args);

}  // namespace zshard_tools
