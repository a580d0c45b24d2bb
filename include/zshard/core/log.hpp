#pragma once
// Where the engine and its policies say things worth a human's attention (a prefetch trace
// divergence, swept uses): a sink the user may set (engine_config::log), else standard error.
#include <cstdio>
#include <functional>
#include <string>

namespace zshard {

using log_sink = std::function<void(const std::string&)>;

// One line to `sink`, or to standard error prefixed "zshard: " when no sink is set. The line
// is written with one call, so lines of ranks (threads) that log at once never interleave.
inline void say(const log_sink& sink, const std::string& line) {
  if (sink) return sink(line);
  const std::string out = "zshard: " + line + "\n";
  std::fwrite(out.data(), 1, out.size(), stderr);
}

}  // namespace zshard
